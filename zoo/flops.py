"""FLOP estimates for tasks.benchmarks.scaling's FLOP/s column. Conventions of FlashAttention's
benchmarks: a multiply-add is 2 FLOPs; elementwise work (norms, activations, gates) is
not counted; causal attention does half the L^2 work; backward = 2x forward for
matmuls, 2.5x for the attention core (FlashAttention recomputes the scores).

The dense layers (nn.Linear, nn.Conv1d) are counted here from their weights, 2 FLOPs per
weight per token forward. Everything else a mixer runs, its sequence-mixing core, is the
mixer's own report: ``Mixer.core_flops(B, L)`` (a formula in the mixer's file, or by
default torch's FlopCounterMode on a meta forward) and ``Mixer.bwd_ratio``. No mixer is
named here, so a new mixer needs nothing in this file. A mixer without an estimate
(``core_flops`` returns None) makes the whole estimate None, not a wrong one.
"""
from __future__ import annotations

import torch.nn as nn

import zoo
from zoo.mixers.base import DENSE


def _mixers(module: nn.Module, seen: set | None = None):
    """The mixers in ``module``, outermost only: a mixer's core_flops covers any mixer
    inside it (a stack of mixers counted twice would double its cost)."""
    seen = set() if seen is None else seen
    if id(module) in seen:  # a module reachable twice is visited once, as module.modules() does
        return
    seen.add(id(module))
    if isinstance(module, zoo.Mixer):
        yield module
        return
    for child in module.children():
        yield from _mixers(child, seen)


def flops(module: nn.Module, B: int, L: int) -> dict[str, float] | None:
    """{"fwd": ..., "fwd_bwd": ...} for a mixer or an LM on a (B, L) batch."""
    dense = 2 * B * L * sum(m.weight.numel() for m in module.modules() if isinstance(m, DENSE))
    fwd, fwd_bwd = dense, 3 * dense
    for m in _mixers(module):
        core = m.core_flops(B, L)
        if core is None:
            return None
        fwd, fwd_bwd = fwd + core, fwd_bwd + core * (1 + m.bwd_ratio)
    return {"fwd": float(fwd), "fwd_bwd": float(fwd_bwd)}
