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


def layer_offsets(model: nn.Module, seq_len: int, seed: int = 0) -> list[set[int]]:
    """Per block of an LM built by ``zoo.build_model``: the offsets s >= 1 at which its
    mixer's last output reads an earlier input (nonzero float64 gradient), measured on the
    mixer alone: a Grassmann layer's offsets, a window's 1..w, every offset for attention
    and the recurrent mixers."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for block in model.blocks:
        m = _float64_copy(block.mixer)
        x = torch.randn(1, seq_len, m.d_model, generator=g, dtype=torch.float64, requires_grad=True)
        m(x)[0, -1].sum().backward()
        seen = x.grad[0].abs().amax(-1) > 0  # (L,)
        out.append({seq_len - 1 - t for t in torch.nonzero(seen).flatten().tolist()} - {0})
    return out


def bound_pair_reach(model: nn.Module, seq_len: int, gap: int = 1, seed: int = 0) -> set[int]:
    """The distances t - a at which the model's output at t can hold a product of the
    tokens at a and a + gap together with its own token: where a query at t can read a
    value bound to its key (MQAR: key at a, value at a + 1).

    The model of a layer (``layer_offsets``): at each position it multiplies its own
    stream with one partner stream at one of its offsets (the Grassmann wedge, an
    attention score against a key) and adds the products up; a feature that holds two
    tokens came from one such product, at some layer, or is carried forward by later ones.
    What a nonlinearity could make of two products summed at one position (an MLP, the
    Grassmann gate) is not counted: this is the reach of pairwise binding, beside
    ``receptive_offsets``, which bounds what a stack reads at all."""
    L = seq_len
    has_a = torch.zeros(L, dtype=torch.bool)  # a feature at t holds the token at a = 0
    has_b = torch.zeros(L, dtype=torch.bool)  # ... the token at a + gap
    has_ab = torch.zeros(L, dtype=torch.bool)  # ... both, in one product
    has_a[0], has_b[gap] = True, True

    def back(x: torch.Tensor, s: int) -> torch.Tensor:  # x[t - s] at t, False before 0
        return torch.cat([torch.zeros(s, dtype=torch.bool), x[:L - s]]) if s < L else torch.zeros(L, dtype=torch.bool)

    for offsets in layer_offsets(model, L, seed):
        a, b, ab = has_a.clone(), has_b.clone(), has_ab.clone()
        for s in offsets:
            pa, pb, pab = back(has_a, s), back(has_b, s), back(has_ab, s)
            a |= pa
            b |= pb
            ab |= pab | (has_a & pb) | (has_b & pa)
        has_a, has_b, has_ab = a, b, ab
    return set(torch.nonzero(has_ab).flatten().tolist())
