"""Multi-scale retention, RetNet's token mixer (Sun et al., 2023).

    S_t = gamma_h S_{t-1} + k_t^T v_t,   o_t = q_t S_t

per head h with a fixed decay gamma_h, rotary positions on q and k, GroupNorm per
head, a swish gate and an output projection. The recurrence runs on the RWKV-6 core
(zoo.ops.rwkv6_scan) on CUDA, so fla's kernel serves it; on CPU its fixed decay makes
each chunk a masked, decayed attention (``retention_chunked``).

Choices:
- decays: gamma_h = 1 - 2^(-5 - h') with h' = linspace(0, 4, H), i.e. memory spans
  1/(1 - gamma) from 32 to 512 tokens whatever the number of heads. This is the
  spread torchscale calls "use_lm_decay"; the paper's other form, h' = 0..H-1,
  would push 8+ heads to spans beyond any sequence in this benchmark.
- plain RoPE (base 10000) rather than xPos: torchscale's RetNet dropped the xPos
  scaling too, and the decay already provides the distance penalty.
- values are expand_v = 2 times wider than keys, as in the paper (the gate and the
  output projection follow the value width).
- the paper's GroupNorm per head (mean-centred, a gain and bias per channel); fla's
  MultiScaleRetention and torchscale's current code take an RMSNorm per head instead, and
  fla's decays are the h' = 0..H-1 form. With those two swapped for fla's, the rest of
  this mixer is fla's layer (tests/test_peer_layers.py).
- no retention-score normalisation: torchscale rescales each row of the parallel
  form for numerical range, which the per-token GroupNorm undoes anyway.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.rwkv6 import rwkv6_backend, rwkv6_scan
from .base import Mixer, check_divisible, check_positive, chunked_linear_attention_flops


def retention(q, k, v, log_gamma, scale=None, initial_state=None, output_final_state=False,
              chunk_size=64):
    """o_t = scale * q_t S_t with S_t = gamma S_{t-1} + k_t^T v_t, per head.
    q, k: (B, H, L, K); v: (B, H, L, V); log_gamma: (H,). Returns like rwkv6_scan:
    (o (B, H, L, V) in v's dtype, final state (B, H, K, V) in fp32/fp64, or None).
    fla's chunk_rwkv6 on CUDA when usable (``retention_as_rwkv6``), else
    ``retention_chunked``."""
    if rwkv6_backend(q) == "fla":
        return retention_as_rwkv6(q, k, v, log_gamma, scale, initial_state, output_final_state)
    return retention_chunked(q, k, v, log_gamma, scale, initial_state, output_final_state,
                             chunk_size)


def retention_as_rwkv6(q, k, v, log_gamma, scale=None, initial_state=None,
                       output_final_state=False, chunk_size=64):
    """Retention on the RWKV-6 core (zoo.ops.rwkv6_scan), same arguments and returns.

    RWKV-6 reads the state *before* the current update, S_{t-1}, and adds the current
    token with a bonus u. Retention reads after it:
        q_t S_t = gamma q_t S_{t-1} + q_t k_t^T v_t.
    So feed rwkv6_scan q' = gamma q, w = log gamma, u = 1/gamma: it computes
        q'_t S_{t-1} + q'_t (u k_t)^T v_t = gamma q_t S_{t-1} + q_t k_t^T v_t,
    the same thing, with the same state sequence (the recurrences are identical).
    """
    B, H, L, K = q.shape
    log_gamma = log_gamma.to(torch.promote_types(q.dtype, torch.float32))
    gamma = log_gamma.exp()
    w = log_gamma.view(1, H, 1, 1).expand(B, H, L, K)
    u = (1 / gamma)[:, None].expand(H, K)
    q = (q * gamma.view(H, 1, 1)).to(q.dtype)
    return rwkv6_scan(q, k, v, w, u, scale, initial_state, output_final_state, chunk_size)


def retention_chunked(q, k, v, log_gamma, scale=None, initial_state=None,
                      output_final_state=False, chunk_size=64):
    """Retention in chunks of C, same arguments and returns as ``retention``. The decay
    is fixed, so inside a chunk it is a masked, decayed attention,
        o = ((q k^T) * D) v + (q * gamma^(t+1)) S0,   D[t, s] = gamma^(t-s) for s <= t,
    with D one (H, C, C) matrix for every chunk, and the state crosses chunks as
        S_C = gamma^C S0 + (k * gamma^(C-1-s))^T v.
    All matmuls; every exponent is log_gamma times a count >= 0, so nothing overflows."""
    B, H, L, K = q.shape
    V = v.shape[-1]
    if chunk_size <= 0:
        raise ValueError(f"retention: chunk_size must be positive, got {chunk_size}")
    scale = K ** -0.5 if scale is None else scale
    out_dtype, acc = v.dtype, torch.promote_types(v.dtype, torch.float32)
    C = max(1, min(chunk_size, L))
    N = -(-L // C)  # number of chunks; the last holds L - (N-1) C real steps
    pad = N * C - L

    def chunks(t):  # (B, H, L, X) -> (B, H, N, C, X), zero padded at the end
        return F.pad(t.to(acc), (0, 0, 0, pad)).view(B, H, N, C, t.shape[-1])

    q, k, v = chunks(q) * scale, chunks(k), chunks(v)
    lg = log_gamma.to(acc).view(H, 1, 1)
    pos = torch.arange(C, device=q.device, dtype=acc)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    D = (lg * (pos[:, None] - pos)).masked_fill(~causal, float("-inf")).exp()  # (H, C, C)
    o = ((q @ k.transpose(-1, -2)) * D[:, None]) @ v  # (B, H, N, C, V)

    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(acc)
    if N > 1 or initial_state is not None or output_final_state:
        # The state entering each chunk: a loop over chunks, not steps. Padded steps
        # (k = v = 0) sit at the end of the last chunk, whose hand-on is computed apart.
        to_end = (lg * (C - 1 - pos)).exp()[..., None]  # (H, 1, C, 1): gamma^(C-1-s)
        local = (k[:, :, :-1] * to_end).transpose(-1, -2) @ v[:, :, :-1]  # (B, H, N-1, K, V)
        carry = (lg * C).exp()  # (H, 1, 1)
        entering = [S]
        for n in range(N - 1):
            S = carry * S + local[:, :, n]
            entering.append(S)
        o = o + (q * (lg * (pos + 1)).exp()[..., None]) @ torch.stack(entering, dim=2)
        if output_final_state:
            n_last = L - (N - 1) * C
            tail = (lg * (n_last - 1 - pos).clamp(min=0)).exp().view(H, C, 1)
            S = (lg * n_last).exp() * S + (k[:, :, -1] * tail).transpose(-1, -2) @ v[:, :, -1]
    o = o.view(B, H, N * C, V)[:, :, :L].to(out_dtype)
    return o, (S if output_final_state else None)


def retention_ref(q, k, v, log_gamma, scale=None, initial_state=None, output_final_state=False):
    """Retention one step at a time (the readable reference for ``retention``, same
    arguments and returns less ``chunk_size``): S_t = gamma S_{t-1} + k_t^T v_t, o_t = scale q_t S_t."""
    B, H, L, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    out_dtype, acc = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v = (t.to(acc) for t in (q, k, v))
    gamma = log_gamma.to(acc).exp()[:, None, None]  # (H, 1, 1)
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(acc)
    outs = []
    for t in range(L):  # read after the update, unlike RWKV-6
        S = gamma * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t] * scale, S))
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(B, H, 0, v.shape[-1])
    return o.to(out_dtype), (S if output_final_state else None)


def rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary positions on (B, H, L, K), K even, rotate-half convention, base 10000."""
    L, K = x.shape[-2:]
    inv_freq = 10000.0 ** -(torch.arange(0, K, 2, device=x.device, dtype=torch.float32) / K)
    angle = torch.arange(L, device=x.device, dtype=torch.float32)[:, None] * inv_freq  # (L, K/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RetNet(Mixer):
    name = "retnet"
    fast_path = "fla chunk_rwkv6 with fixed decay (CUDA); else chunked masked, decayed attention"

    def __init__(self, d_model: int, n_heads: int = 4, expand_v: int = 2, chunk_size: int = 64):
        super().__init__()
        check_divisible(self.name, d_model, n_heads)
        check_positive(self.name, expand_v, "expand_v")
        check_positive(self.name, chunk_size, "chunk_size")
        if (d_model // n_heads) % 2:
            raise ValueError(f"{self.name}: head dim d_model/n_heads={d_model // n_heads} "
                             "must be even for rotary positions")
        D, Dv = d_model, expand_v * d_model
        self.d_model, self.n_heads, self.expand_v, self.chunk_size = D, n_heads, expand_v, chunk_size
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, Dv, bias=False)
        self.g_proj = nn.Linear(D, Dv, bias=False)
        self.out_proj = nn.Linear(Dv, D, bias=False)
        self.group_norm = nn.GroupNorm(n_heads, Dv)

    def log_gamma(self, device) -> torch.Tensor:
        # computed, not stored: a bf16 buffer would round 1 - 1/512 visibly
        h = torch.linspace(0, 4, self.n_heads, device=device, dtype=torch.float32)
        return torch.log1p(-(2.0 ** (-5 - h)))  # (H,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        H = self.n_heads

        def heads(t):  # (B, L, H*X) -> (B, H, L, X)
            return t.view(B, L, H, -1).transpose(1, 2)

        q, k = rope(heads(self.q_proj(x))), rope(heads(self.k_proj(x)))
        v = heads(self.v_proj(x))
        self.backend = rwkv6_backend(x)
        # the default scale K^-0.5 is torchscale's key scaling
        y, _ = retention(q, k, v, self.log_gamma(x.device), chunk_size=self.chunk_size)
        y = self.group_norm(y.transpose(1, 2).reshape(B * L, -1)).view(B, L, -1)
        return self.out_proj(F.silu(self.g_proj(x)) * y)

    def core_flops(self, B: int, L: int) -> float:
        # retention on the chunked linear-attention core: keys D/H wide, values expand_v times that
        K = self.d_model // self.n_heads
        return chunked_linear_attention_flops(B, L, self.n_heads, K, self.expand_v * K, self.chunk_size)

    def state_size(self, seq_len: int) -> int:
        # one (D/H) x (expand_v D/H) matrix per head
        return self.expand_v * self.d_model ** 2 // self.n_heads
