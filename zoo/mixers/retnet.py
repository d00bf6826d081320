"""Multi-scale retention, RetNet's token mixer (Sun et al., 2023).

    S_t = gamma_h S_{t-1} + k_t^T v_t,   o_t = q_t S_t

per head h with a fixed decay gamma_h, rotary positions on q and k, GroupNorm per
head, a swish gate and an output projection. The recurrence runs on the RWKV-6 core
(zoo.ops.rwkv6_scan) on CUDA, so fla's kernel serves it; on CPU it is GLA's fused
recurrence with a constant decay (``zoo.ops.matrix_scan``), and in the torch path its
fixed decay makes each chunk a masked, decayed attention (``zoo.ops.retention``, beside
its step-by-step reference).

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

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.retention import retention, retention_recurrent
from ..ops.rwkv6 import recurrent_backend, rwkv6_backend
from .base import Mixer, check_chunk_size, check_divisible, check_positive, chunked_linear_attention_flops


def rope(x: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Rotary positions start.. on (B, L, H, K), K even, rotate-half convention, base 10000."""
    L, K = x.shape[1], x.shape[-1]
    # float32 at least (a float64 model's angles in float64: a compiled float32 cos rounds
    # differently from the eager one)
    acc = torch.promote_types(x.dtype, torch.float32)
    inv_freq = 10000.0 ** -(torch.arange(0, K, 2, device=x.device, dtype=acc) / K)
    angle = (torch.arange(start, start + L, device=x.device, dtype=acc)[:, None] * inv_freq)[:, None]  # (L, 1, K/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RetNet(Mixer):
    name = "retnet"
    fast_path = ("fla chunk_rwkv6 with fixed decay (CUDA); a fused C++ recurrence (CPU); "
                 "else chunked masked, decayed attention")

    def __init__(self, d_model: int, n_heads: int = 4, expand_v: int = 2, chunk_size: int | str = 32):
        super().__init__()
        check_divisible(self.name, d_model, n_heads)
        check_positive(self.name, expand_v, "expand_v")
        check_chunk_size(self.name, chunk_size)
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
        h = torch.linspace(0, 4, n_heads, dtype=torch.float32, device="cpu")  # also when built on meta
        self._log_gamma = torch.log1p(-(2.0 ** (-5 - h))).tolist()
        self._gamma = [math.exp(g) for g in self._log_gamma]  # in double: a float64 model's exp

    def log_gamma(self, device) -> torch.Tensor:
        """(H,) float32 log decays. Kept as Python floats, not a buffer: a bf16 buffer would
        round 1 - 1/512 visibly, and a compiled step would recompute the log1p and exp2 at
        every state element (inductor inlines them into the loops that read them)."""
        return torch.tensor(self._log_gamma, device=device, dtype=torch.float32)

    def gamma(self, x: torch.Tensor) -> torch.Tensor:
        """(H,) decays exp(log_gamma) in x's precision (float32 at least), held as Python
        floats for the same reason."""
        return torch.tensor(self._gamma, device=x.device, dtype=torch.promote_types(x.dtype, torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._retain(x, None, 0)[0]

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        """One (D/H) x (expand_v D/H) matrix per head, and the tokens seen (rotary positions)."""
        K = self.d_model // self.n_heads
        S = torch.zeros(batch, self.n_heads, K, self.expand_v * K, device=device, dtype=dtype)
        return {"S": S, "seen": 0}

    def prefill(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        y, S = self._retain(x, state["S"], state["seen"])
        return y, {"S": S.to(state["S"].dtype), "seen": state["seen"] + x.shape[1]}

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token x (B, D) through the recurrence itself (on CUDA fla's
        fused_recurrent_rwkv6, as the chunked form runs on its chunk_rwkv6)."""
        y, S = self._retain(x[:, None], state["S"], state["seen"], recurrent=True)
        return y[:, 0], {"S": S.to(state["S"].dtype), "seen": state["seen"] + 1}

    def _retain(self, x: torch.Tensor, S0, start: int, recurrent: bool = False):
        """The update for x (B, L, D) after ``start`` tokens whose state is S0 (None: none),
        and the state after x; ``recurrent``: token by token (a decode step)."""
        B, L, D = x.shape
        H = self.n_heads

        def heads(t):  # (B, L, H*X) -> (B, L, H, X)
            return t.view(B, L, H, -1)

        q, k = rope(heads(self.q_proj(x)), start), rope(heads(self.k_proj(x)), start)
        v = heads(self.v_proj(x))
        self.backend = (recurrent_backend if recurrent else rwkv6_backend)(x)
        # the default scale K^-0.5 is torchscale's key scaling
        args = (q, k, v, self.log_gamma(x.device))
        if recurrent:
            y, S = retention_recurrent(*args, initial_state=S0, output_final_state=True, gamma=self.gamma(x))
        else:
            y, S = self.chunked(retention, *args, initial_state=S0, output_final_state=S0 is not None, length=L)
        y = self.group_norm(y.reshape(B * L, -1)).view(B, L, -1)
        return self.out_proj(F.silu(self.g_proj(x)) * y), S

    def core_flops(self, B: int, L: int) -> float:
        # retention on the chunked linear-attention core: keys D/H wide, values expand_v times that
        K = self.d_model // self.n_heads
        return chunked_linear_attention_flops(B, L, self.n_heads, K, self.expand_v * K, self.flops_chunk_size())

    def state_size(self, seq_len: int) -> int:
        # one (D/H) x (expand_v D/H) matrix per head
        return self.expand_v * self.d_model ** 2 // self.n_heads
