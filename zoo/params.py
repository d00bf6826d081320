"""Parameter counting and matching: comparisons are only fair at equal size."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import LM, ModelConfig, build_model

KNOBS = ("d_model", "n_layers", "d_ff")


def count_params(model: LM, include_embeddings: bool = True) -> int:
    """Unique parameters (a tied head counts once). Without embeddings, the token and
    position tables are left out, as in the scaling-law convention."""
    total = sum(p.numel() for p in model.parameters())
    if not include_embeddings:
        total -= model.tok.weight.numel()
        if model.pos is not None:
            total -= model.pos.weight.numel()
    return total


def config_params(cfg: ModelConfig, include_embeddings: bool = True) -> int:
    """Count without allocating: the model is built on the meta device."""
    with torch.device("meta"):
        return count_params(build_model(cfg), include_embeddings)


@dataclass
class Match:
    config: ModelConfig
    knob: str
    value: int
    base_params: int
    params: int

    @property
    def rel_diff(self) -> float:
        return (self.params - self.base_params) / self.base_params

    def __str__(self) -> str:
        return (f"{self.config.mixer}: {self.knob}={self.value} -> {self.params:,} params "
                f"vs base {self.base_params:,} ({self.rel_diff:+.2%})")


def _candidates(base: ModelConfig, knob: str) -> range:
    if knob == "n_layers":
        return range(1, 4 * base.n_layers + 1)
    if knob == "d_model":
        return range(8, 4 * base.d_model + 1, 8)
    return range(8, 16 * base.d_model + 1, 8)  # d_ff


def match_params(base_cfg: ModelConfig, mixer: str, knob: str = "d_model", tol: float = 0.02,
                 mixer_options: dict | None = None, include_embeddings: bool = True,
                 **overrides) -> Match:
    """A config of ``mixer`` whose parameter count is within ``tol`` (relative) of
    ``base_cfg``'s, found by moving one ``knob``. ``overrides`` set other fields of
    the candidate first (e.g. ``d_ff=0`` for Mamba's MLP-free blocks). Raises a
    ValueError naming the closest count when no value of the knob is within tol."""
    if knob not in KNOBS:
        raise ValueError(f"match_params: unknown knob {knob!r}; valid knobs: {list(KNOBS)}")
    if knob == "d_ff" and overrides.get("d_ff", base_cfg.d_ff) == 0:
        raise ValueError("match_params: knob='d_ff' needs an MLP, but d_ff=0")
    base_params = config_params(base_cfg, include_embeddings)
    template = base_cfg.replace(mixer=mixer, mixer_options=dict(mixer_options or {}),
                                layer_options=(), **overrides)
    best = None
    for value in _candidates(base_cfg, knob):
        try:
            cfg = template.replace(**{knob: value})
            n = config_params(cfg, include_embeddings)
        except ValueError:  # e.g. d_model not divisible by the mixer's heads
            continue
        if best is None or abs(n - base_params) < abs(best.params - base_params):
            best = Match(cfg, knob, value, base_params, n)
        if n > base_params * (1 + tol) and best.params >= base_params:
            break  # counts grow with every knob: nothing further can be closer
    if best is None:
        raise ValueError(f"match_params: no valid {knob} for mixer {mixer!r}")
    if abs(best.rel_diff) > tol:
        raise ValueError(f"match_params: cannot match within tol={tol:.1%}; closest is {best}")
    return best
