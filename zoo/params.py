"""Parameter counting and matching: comparisons are only fair at equal size."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import collecting
from .model import LM, ModelConfig, build_model

KNOBS = ("d_model", "d_ff", "n_layers")  # the order knob="auto" tries them in


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
        return (f"{self.config.name}: {self.knob}={self.value} -> {self.params:,} params "
                f"vs base {self.base_params:,} ({self.rel_diff:+.2%})")


def _candidates(base: ModelConfig, knob: str) -> range:
    if knob == "n_layers":
        return range(1, 4 * base.n_layers + 1)
    if knob == "d_model":
        return range(8, 4 * base.d_model + 1, 8)
    return range(8, 16 * base.d_model + 1, 8)  # d_ff


def _search(template: ModelConfig, knob: str, base: ModelConfig, base_params: int,
            include_embeddings: bool) -> Match | None:
    """The value of ``knob`` whose count is closest to ``base_params``. Counts grow with
    every knob, so bisect for the first value at or above the target, then compare it
    with its neighbours (values a mixer refuses, e.g. d_model not divisible by its
    heads, are skipped)."""
    counts: dict[int, int | None] = {}

    def count(value: int) -> int | None:
        if value not in counts:
            try:
                # refused sizes are skipped by their ValueError: raise it even while a
                # sweep file is loaded under collecting(), which would return a stand-in
                with collecting(False):
                    counts[value] = config_params(template.replace(**{knob: value}), include_embeddings)
            except ValueError:
                counts[value] = None
        return counts[value]

    grid = list(_candidates(base, knob))
    lo, hi = 0, len(grid) - 1
    while lo < hi:  # first grid index whose (next valid) count reaches the target
        mid = (lo + hi) // 2
        valid = next((i for i in range(mid, hi + 1) if count(grid[i]) is not None), None)
        if valid is None or count(grid[valid]) >= base_params:
            hi = mid
        else:
            lo = valid + 1
    # the grid steps by 8 (d_model, d_ff): look at every value around the crossing
    step = 1 if knob == "n_layers" else 8
    near = range(max(1, grid[lo] - 2 * step), grid[lo] + 2 * step + 1)
    found = [(abs(n - base_params), v, n) for v in near if (n := count(v)) is not None]
    if not found:
        return None
    _, value, n = min(found)
    return Match(template.replace(**{knob: value}), knob, value, base_params, n)


def match_params(base_cfg: ModelConfig, mixer: str, knob: str = "d_model", tol: float = 0.02,
                 mixer_options: dict | None = None, include_embeddings: bool = True,
                 **overrides) -> Match:
    """A config of ``mixer`` whose parameter count is within ``tol`` (relative) of
    ``base_cfg``'s, found by moving one ``knob`` (``"auto"``: the first of d_model, d_ff,
    n_layers that lands within tol, else the closest of them). ``overrides`` set
    other fields of the candidate first (e.g. ``d_ff=0`` for MLP-free Mamba blocks).
    Raises a ValueError naming the closest count when nothing is within tol."""
    if knob not in (*KNOBS, "auto"):
        raise ValueError(f"match_params: unknown knob {knob!r}; valid knobs: {[*KNOBS, 'auto']}")
    base_params = config_params(base_cfg, include_embeddings)
    # the base's per-layer options are its mixer's: dropped, unless the overrides give the
    # candidate's own (the 12-layer Grassmann LM's offsets)
    template = base_cfg.replace(**{"mixer": mixer, "mixer_options": dict(mixer_options or {}),
                                   "layer_options": (), **overrides})
    knobs = KNOBS if knob == "auto" else (knob,)
    if template.ffn_width == 0:
        if knob == "d_ff":
            raise ValueError("match_params: knob='d_ff' needs an MLP, but the candidate has none (d_ff=0)")
        knobs = tuple(k for k in knobs if k != "d_ff")
    found = []
    for k in knobs:
        match = _search(template, k, base_cfg, base_params, include_embeddings)
        if match is not None and abs(match.rel_diff) <= tol:
            return match
        found += [match] if match is not None else []
    if not found:
        raise ValueError(f"match_params: no valid {knob} for mixer {mixer!r}")
    best = min(found, key=lambda m: abs(m.params - base_params))
    if abs(best.rel_diff) > tol:
        raise ValueError(f"match_params: cannot match within tol={tol:.1%}; closest is {best}")
    return best
