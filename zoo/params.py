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


def _search(template: ModelConfig, knob: str, base: ModelConfig, base_params: int, tol: float,
            include_embeddings: bool) -> Match | None:
    best = None

    def consider(value: int) -> int | None:
        nonlocal best
        try:
            cfg = template.replace(**{knob: value})
            n = config_params(cfg, include_embeddings)
        except ValueError:  # e.g. d_model not divisible by the mixer's heads
            return None
        if best is None or abs(n - base_params) < abs(best.params - base_params):
            best = Match(cfg, knob, value, base_params, n)
        return n

    for value in _candidates(base, knob):
        n = consider(value)
        if n is not None and n > base_params * (1 + tol) and best.params >= base_params:
            break  # counts grow with every knob: nothing further can be closer
    if best is not None and knob != "n_layers":
        # the coarse grid steps by 8; look at the values in between around the best
        for value in range(max(1, best.value - 7), best.value + 8):
            consider(value)
    return best


def match_params(base_cfg: ModelConfig, mixer: str, knob: str = "d_model", tol: float = 0.02,
                 mixer_options: dict | None = None, include_embeddings: bool = True,
                 **overrides) -> Match:
    """A config of ``mixer`` whose parameter count is within ``tol`` (relative) of
    ``base_cfg``'s, found by moving one ``knob`` (``"auto"``: the knob among d_model,
    d_ff, n_layers that lands closest, d_model first on ties). ``overrides`` set
    other fields of the candidate first (e.g. ``d_ff=0`` for MLP-free Mamba blocks).
    Raises a ValueError naming the closest count when nothing is within tol."""
    if knob not in (*KNOBS, "auto"):
        raise ValueError(f"match_params: unknown knob {knob!r}; valid knobs: {[*KNOBS, 'auto']}")
    base_params = config_params(base_cfg, include_embeddings)
    template = base_cfg.replace(mixer=mixer, mixer_options=dict(mixer_options or {}),
                                layer_options=(), **overrides)
    knobs = KNOBS if knob == "auto" else (knob,)
    if template.ffn_width == 0:
        if knob == "d_ff":
            raise ValueError("match_params: knob='d_ff' needs an MLP, but the candidate has none (d_ff=0)")
        knobs = tuple(k for k in knobs if k != "d_ff")
    found = [m for k in knobs
             if (m := _search(template, k, base_cfg, base_params, tol, include_embeddings))]
    if not found:
        raise ValueError(f"match_params: no valid {knob} for mixer {mixer!r}")
    best = min(found, key=lambda m: abs(m.params - base_params))  # stable: d_model first
    if abs(best.rel_diff) > tol:
        raise ValueError(f"match_params: cannot match within tol={tol:.1%}; closest is {best}")
    return best
