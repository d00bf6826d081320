"""Gated linear attention (Yang, Wang, Shen, Panda & Kim, 2023, "Gated Linear Attention
Transformers with Hardware-Efficient Training"), the block as fla's
``GatedLinearAttention`` layer defines it (mode "chunk", no short conv, no feature map):

    q, k = x W_q, x W_k                      key width d_k = expand_k * d (d/2)
    v, g = x W_v, x W_g                      value width d_v = expand_v * d (d)
    gk = logsigmoid(x W_1 W_2 + b) / 16      low-rank (rank 16) per-key log decay
    o = GLA(q, k, v, gk)                     zoo.ops.gla, per head
    y = W_o (RMSNorm_head(o) * swish(g))     per-head RMSNorm, then the output gate

The normaliser 16 (fla's gate_logit_normalizer) keeps the decay mild: logsigmoid <= 0
divided by 16 gives exp(gk) in (0, 1) close to 1 for most inputs, so the state
remembers tens to hundreds of tokens at init. Inits are PyTorch's defaults, as for
every other mixer here (fla's GLA model re-inits linears N(0, 0.02); the zoo does not).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.gla import gla, gla_backend, gla_recurrent, recurrent_backend
from .base import Mixer, check_chunk_size, check_positive, chunked_linear_attention_flops


def _width(name: str, d_model: int, expand, what: str, n_heads: int) -> int:
    """d_model * expand as an int divisible by n_heads, else a ValueError (match_params
    skips sizes that raise one)."""
    if not isinstance(expand, (int, float)) or isinstance(expand, bool) or expand <= 0:
        raise ValueError(f"{name}: {what} must be a positive number, got {expand!r}")
    width = round(d_model * expand)
    if not math.isclose(width, d_model * expand) or width == 0:
        raise ValueError(f"{name}: d_model * {what} = {d_model * expand} is not a whole number")
    if width % n_heads:
        raise ValueError(f"{name}: d_model * {what} = {width} is not divisible by "
                         f"n_heads={n_heads}")
    return width


class GLA(Mixer):
    name = "gla"
    fast_path = "fla chunk_gla (CUDA); a fused C++ recurrence (CPU); else chunked torch scan (RWKV-6 core)"

    def __init__(self, d_model: int, n_heads: int = 4, expand_k: float = 0.5,
                 expand_v: float = 1.0, gate_low_rank_dim: int = 16,
                 gate_logit_normalizer: int = 16, norm_eps: float = 1e-5, chunk_size: int | str = 16):
        super().__init__()
        for option, value in [("n_heads", n_heads), ("gate_low_rank_dim", gate_low_rank_dim)]:
            check_positive(self.name, value, option)
        check_chunk_size(self.name, chunk_size)
        if not isinstance(gate_logit_normalizer, (int, float)) or gate_logit_normalizer <= 0:
            raise ValueError(f"{self.name}: gate_logit_normalizer must be positive, "
                             f"got {gate_logit_normalizer!r}")
        D = d_model
        Dk = _width(self.name, D, expand_k, "expand_k", n_heads)
        Dv = _width(self.name, D, expand_v, "expand_v", n_heads)
        self.d_model, self.n_heads, self.key_dim, self.value_dim = D, n_heads, Dk, Dv
        self.head_k_dim, self.head_v_dim = Dk // n_heads, Dv // n_heads
        self.gate_logit_normalizer, self.norm_eps = gate_logit_normalizer, norm_eps
        self.chunk_size = chunk_size

        self.q_proj = nn.Linear(D, Dk, bias=False)
        self.k_proj = nn.Linear(D, Dk, bias=False)
        self.v_proj = nn.Linear(D, Dv, bias=False)
        self.g_proj = nn.Linear(D, Dv, bias=False)  # output gate
        # the decay's low-rank projection; its bias sets the decay for a zero input
        self.gk_proj = nn.Sequential(nn.Linear(D, gate_low_rank_dim, bias=False),
                                     nn.Linear(gate_low_rank_dim, Dk, bias=True))
        # one RMSNorm weight of head_v_dim shared by every head (fla's g_norm)
        self.norm_weight = nn.Parameter(torch.ones(self.head_v_dim))
        self.o_proj = nn.Linear(Dv, D, bias=False)
        # The decay bias and the norm gain take no weight decay (the decay's matrices are
        # ordinary Linear weights and do, as in fla's training setups).
        for p in (self.gk_proj[1].bias, self.norm_weight):
            p._no_weight_decay = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._gla(x, None)[0]

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        """One head_k_dim x head_v_dim matrix per head."""
        S = torch.zeros(batch, self.n_heads, self.head_k_dim, self.head_v_dim, device=device, dtype=dtype)
        return {"S": S}

    def prefill(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        y, S = self._gla(x, state["S"])
        return y, {"S": S.to(state["S"].dtype)}

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token x (B, D) through the recurrence itself (fla's fused_recurrent_gla on
        CUDA), not the chunked form over a chunk of one."""
        y, S = self._gla(x[:, None], state["S"], recurrent=True)
        return y[:, 0], {"S": S.to(state["S"].dtype)}

    def _gla(self, x: torch.Tensor, S0, recurrent: bool = False):
        """The update for x (B, L, D) after a context whose state is S0 (None: none), and
        the state after x; ``recurrent``: token by token (a decode step)."""
        B, L, _ = x.shape  # (B, L, D)
        H, Kh, Vh = self.n_heads, self.head_k_dim, self.head_v_dim
        q = self.q_proj(x).view(B, L, H, Kh)
        k = self.k_proj(x).view(B, L, H, Kh)
        v = self.v_proj(x).view(B, L, H, Vh)
        # log decay in fp32: it is summed over time inside the scan
        gk = F.logsigmoid(self.gk_proj(x).float()) / self.gate_logit_normalizer
        self.backend = (recurrent_backend if recurrent else gla_backend)(q)  # decided as the op decides: on q
        args = (q, k, v, gk.view(B, L, H, Kh))
        if recurrent:
            o, S = gla_recurrent(*args, initial_state=S0, output_final_state=True)
        else:
            o, S = self.chunked(gla, *args, initial_state=S0, output_final_state=S0 is not None,
                                length=L)  # (B, L, H, Vh)

        # per-head RMSNorm, then the swish gate (fla's FusedRMSNormGated order), in fp32
        cdt = torch.promote_types(o.dtype, torch.float32)
        o = o.to(cdt)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        o = o * self.norm_weight.to(cdt) * F.silu(self.g_proj(x).view(B, L, H, Vh).to(cdt))
        return self.o_proj(o.reshape(B, L, self.value_dim).to(x.dtype)), S

    def core_flops(self, B: int, L: int) -> float:
        # The RWKV-6 chunk core (its low-rank gate is nn.Linear, counted with the dense
        # weights), plus the current token's score q.k and value term that zoo.ops.gla adds
        # beside the core (2K + 2V per token and head).
        K, V = self.head_k_dim, self.head_v_dim
        return (chunked_linear_attention_flops(B, L, self.n_heads, K, V, self.flops_chunk_size())
                + 2 * B * L * self.n_heads * (K + V))

    def state_size(self, seq_len: int) -> int:
        # one head_k_dim x head_v_dim matrix per head, whatever the length
        return self.n_heads * self.head_k_dim * self.head_v_dim
