"""Empirical causality checks: a model whose output at t depends on inputs after t
must never be benchmarked silently.

Nothing here trusts a flag: the check runs the module on a float64 copy and looks
at (1) outputs under a perturbation of every input after t and (2) the gradient of
output t with respect to the inputs after t, which must be exactly zero.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn


class CausalityError(AssertionError):
    """Raised when an output depends on a later input."""


def check_causal(fn, x: torch.Tensor, positions=None, atol: float = 1e-9) -> None:
    """``fn: (B, L, D) -> (B, L, ...)`` in float64. Raises CausalityError naming the
    first position whose output sees the future."""
    L = x.shape[1]
    positions = sorted({0, L // 3, L // 2, L - 2} if positions is None else positions)
    positions = [t for t in positions if 0 <= t < L - 1]
    x = x.detach()
    with torch.no_grad():
        base = fn(x)
    for t in positions:
        # (1) perturbation: scramble everything after t, outputs up to t must not move
        y = x.clone()
        y[:, t + 1:] = torch.randn_like(y[:, t + 1:]) * 3
        with torch.no_grad():
            out = fn(y)
        moved = (out[:, : t + 1] - base[:, : t + 1]).abs().max().item()
        if moved > atol:
            raise CausalityError(f"output at or before position {t} changed by {moved:.3g} "
                                 f"when only inputs after {t} changed")
        # (2) gradients: d out[:, t] / d x[:, t+1:] must vanish
        xg = x.clone().requires_grad_(True)
        fn(xg)[:, t].sum().backward()
        leak = xg.grad[:, t + 1:].abs().max().item()
        if leak > atol:
            raise CausalityError(f"output at position {t} has gradient {leak:.3g} "
                                 f"with respect to later inputs")


def _float64_copy(module: nn.Module) -> nn.Module:
    m = copy.deepcopy(module).double().eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def check_mixer_causal(mixer: nn.Module, seq_len: int = 40, batch: int = 2, seed: int = 0) -> None:
    """Causality of a mixer ``(B, L, D) -> (B, L, D)``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq_len, mixer.d_model, generator=g, dtype=torch.float64)
    check_causal(_float64_copy(mixer), x)


def assert_causal(model: nn.Module, seq_len: int | None = None, batch: int = 2, seed: int = 0) -> None:
    """Causality of an LM built by ``zoo.build_model``: by gradients and perturbations
    of the embedded sequence, and by perturbing the tokens themselves. Tasks call this
    on the model they are about to train and refuse a model that fails it."""
    m = _float64_copy(model)
    L = seq_len or min(48, m.cfg.max_len)  # longer than the Grassmann window (16)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(m.cfg.vocab_size, (batch, L), generator=g)
    check_causal(m.forward_embedded, m.embed(tokens))
    with torch.no_grad():
        base = m(tokens)
        t = L // 2
        later = tokens.clone()
        later[:, t + 1:] = torch.randint(m.cfg.vocab_size, (batch, L - t - 1), generator=g)
        moved = (m(later)[:, : t + 1] - base[:, : t + 1]).abs().max().item()
    if moved > 1e-9:
        raise CausalityError(f"logits at or before position {t} changed by {moved:.3g} "
                             f"when only later tokens changed")


def receptive_offsets(model: nn.Module, seq_len: int, seed: int = 0) -> set[int]:
    """How far back the last position's output of an LM built by ``zoo.build_model``
    reads: every s >= 0 such that it has a nonzero gradient (float64) with respect to
    the embedded input s tokens earlier. A local stack's answer is the sums of one offset
    per layer (two 16-token windows: 0..32), attention's is every offset. A token beyond
    them cannot reach the output, whatever the weights: this bounds what a local mixer
    can recall."""
    m = _float64_copy(model)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(m.cfg.vocab_size, (1, seq_len), generator=g)
    h = m.embed(tokens).detach().requires_grad_(True)
    m.forward_embedded(h)[0, -1].sum().backward()
    seen = h.grad[0].abs().amax(-1) > 0  # (L,)
    return {seq_len - 1 - t for t in torch.nonzero(seen).flatten().tolist()}
