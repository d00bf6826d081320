"""Gated DeltaNet (Yang, Kautz & Hatamizadeh, ICLR 2025): the gated delta rule in its block.

    x -> [q | k | v] -> causal depthwise conv (width 4) -> SiLU      (fla's ShortConvolution)
    q, k -> L2-normalised per head
    beta = sigmoid(x W_b),   g = -exp(A_log) * softplus(x W_a + dt_bias)  (Mamba-2's decay, per head)
    o = gated_delta_rule(q, k, v, g, beta)                            (zoo.ops.delta_rule)
    out = W_o (RMSNorm(o) * weight * silu(x W_g))                     (RMSNorm per head, then gate)

As fla's ``GatedDeltaNet`` layer defines it (use_gate=True, conv_bias=False, no projection
biases, allow_neg_eigval=False, A ~ U(0, 16), dt log-uniform in [1e-3, 0.1]). fla's six
projections (q, k, v, a, b, g) are one ``in_proj`` here, and its three short convolutions
one depthwise conv over [q | k | v]: the same parameters and function, one matmul and one
conv on a CPU. The state is n_heads (head_dim x head_dim * expand_v) matrices.

Defaults: fla's layer is built with a key width of 0.75 d and value width 1.5 d (its
6 heads of 256 at d = 2048, expand_v = 2: about 6 d^2 parameters, like Mamba-2). Here
n_heads = 4 (the paper presets' heads; divides 64, 128, 256) and head_dim defaults to
0.75 d / n_heads, i.e. 12 / 24 / 48 at d = 64 / 128 / 256, with expand_v = 2.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.conv import causal_conv1d
from ..ops.delta_rule import delta_recurrent_backend, delta_rule_backend, gated_delta_rule, gated_delta_rule_recurrent
from ..ops.ssm_step import conv_step
from .base import Mixer, check_chunk_size, check_conv_width, check_positive, chunked_linear_attention_flops


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(|x|^2 + eps) over the last dim, as fla's l2norm (not F.normalize's
    max(|x|, eps)): smooth at 0. Computed in at least fp32, returned in x's dtype."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


class GatedDeltaNet(Mixer):
    name = "gated_deltanet"
    fast_path = "fla chunk_gated_delta_rule (CUDA); a fused C++ recurrence (CPU); else chunked torch WY"

    def __init__(self, d_model: int, n_heads: int = 4, head_dim: int | None = None,
                 expand_v: int = 2, d_conv: int = 4, chunk_size: int | str = 16):
        super().__init__()
        for option, value in [("n_heads", n_heads), ("expand_v", expand_v)]:
            check_positive(self.name, value, option)
        check_chunk_size(self.name, chunk_size)
        check_conv_width(self.name, d_conv)
        if head_dim is None:
            if (3 * d_model) % (4 * n_heads):
                raise ValueError(f"{self.name}: the default head_dim = 0.75 * d_model / n_heads "
                                 f"is not an integer for d_model={d_model}, n_heads={n_heads}; "
                                 f"pass head_dim")
            head_dim = 3 * d_model // (4 * n_heads)
        check_positive(self.name, head_dim, "head_dim")
        self.n_heads, self.head_dim, self.head_v_dim = n_heads, head_dim, head_dim * expand_v
        self.d_conv, self.chunk_size, self.norm_eps = d_conv, chunk_size, 1e-5
        self.key_dim, self.value_dim = n_heads * head_dim, n_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim  # q, k and v go through the conv
        H = n_heads

        # [q | k | v | gate | a | b]: fla's q/k/v/g/a/b projections stacked
        self.in_proj = nn.Linear(d_model, self.conv_dim + self.value_dim + 2 * H, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim,
                                padding=d_conv - 1, bias=False)
        # A in (0, 16] as fla draws it: a spread of memory lengths across heads (floored so
        # that the log stays finite).
        self.A_log = nn.Parameter(torch.empty(H).uniform_(0, 16).clamp_(min=1e-4).log())
        # dt = softplus(x W_a + dt_bias) starts log-uniform in [1e-3, 0.1] (Mamba-2's init).
        dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.norm_weight = nn.Parameter(torch.ones(self.head_v_dim))  # shared by the heads
        self.out_proj = nn.Linear(self.value_dim, d_model, bias=False)
        for p in (self.A_log, self.dt_bias):
            p._no_weight_decay = True  # as in fla; the training loop honours it (and never decays 1-D norm gains)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._mix(x, None, None)[0]

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        """The per-head K x V delta-rule state and the conv's last d_conv - 1 inputs."""
        H = self.n_heads
        return {"S": torch.zeros(batch, H, self.head_dim, self.head_v_dim, device=device, dtype=dtype),
                "conv": torch.zeros(batch, self.conv_dim, self.d_conv - 1, device=device, dtype=dtype)}

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token x (B, D): the conv and the delta rule advanced by one input (the conv
        through causal-conv1d's update on CUDA). fla 0.6's fused_recurrent_gated_delta_rule
        is not used: under Triton's interpreter it disagrees with the recurrence (and with
        its own chunk kernel, which agrees with it) at one token and gives NaN at more, so
        it cannot be checked here."""
        y, S, conv = self._mix(x[:, None], state["S"], state["conv"], recurrent=True)
        return y[:, 0], {"S": S.to(state["S"].dtype), "conv": conv}

    def prefill(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        y, S, conv = self._mix(x, state["S"], state["conv"])
        return y, {"S": S.to(state["S"].dtype), "conv": conv}

    def _mix(self, x: torch.Tensor, S0, conv0, recurrent: bool = False):
        """The update for x (B, L, D) after a context with delta-rule state S0 and conv
        inputs conv0 (B, conv_dim, d_conv - 1) (None, None: no context); the states after x.
        ``recurrent``: one token, through the step kernels (a decode step)."""
        B, L, _ = x.shape  # (B, L, D)
        H, K, V = self.n_heads, self.head_dim, self.head_v_dim
        qkv, gate, a, b = torch.split(self.in_proj(x), [self.conv_dim, self.value_dim, H, H], -1)
        if recurrent:
            qkv, conv0 = conv_step(qkv[:, 0], conv0, self.conv1d.weight[:, 0], None, silu=True)
            qkv = qkv[:, None]  # (B, 1, conv_dim)
        else:
            if conv0 is not None:  # the conv continues over the context's last inputs
                qkv = torch.cat([conv0.transpose(1, 2), qkv], 1)
                conv0 = qkv[:, -(self.d_conv - 1):].transpose(1, 2).contiguous()  # (B, conv_dim, d_conv - 1)
            qkv = causal_conv1d(qkv, self.conv1d.weight, activation="silu")
            if qkv.shape[1] > L:  # the context's inputs out again (a no-op slice's backward zero-fills)
                qkv = qkv[:, -L:]  # (B, L, conv_dim)
        q, k, v = torch.split(qkv, [self.key_dim, self.key_dim, self.value_dim], -1)
        q, k = (l2_normalize(t.unflatten(-1, (H, K))) for t in (q, k))  # (B, L, H, K)
        v = v.unflatten(-1, (H, V))  # (B, L, H, V)

        # The log decay in at least fp32: it is summed over time, and bf16 would round A.
        cdt = torch.promote_types(x.dtype, torch.float32)
        A = -torch.exp(self.A_log.to(cdt))  # (H,)
        g = A * F.softplus(a.to(cdt) + self.dt_bias.to(cdt))  # (B, L, H), <= 0
        beta = torch.sigmoid(b.to(cdt)).to(x.dtype)  # (B, L, H) in (0, 1)

        if recurrent:
            self.backend = delta_recurrent_backend(q)
            o, S = gated_delta_rule_recurrent(q, k, v, g, beta, initial_state=S0, output_final_state=True)
        else:
            self.backend = delta_rule_backend(q)
            o, S = self.chunked(gated_delta_rule, q, k, v, g, beta, initial_state=S0,
                                output_final_state=S0 is not None, length=q.shape[1])  # (B, L, H, V)

        # RMSNorm per head, then the SiLU output gate (fla's FusedRMSNormGated: norm first).
        o = o.to(cdt)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.norm_eps) * self.norm_weight.to(cdt)
        o = o * F.silu(gate.to(cdt).unflatten(-1, (H, V)))
        return self.out_proj(o.flatten(-2).to(x.dtype)), S, conv0

    def core_flops(self, B: int, L: int) -> float:
        # The chunked linear-attention work (scores, values, reading and updating the K x V
        # state), plus what the delta rule adds per token: the keys' gram matrix in its chunk
        # (chunk K), the triangular solve applied to [values | keys] (chunk (V + K)), and the
        # state's prediction W S0 that corrects the values (2 K V).
        K, V, C = self.head_dim, self.head_v_dim, self.flops_chunk_size()
        return (chunked_linear_attention_flops(B, L, self.n_heads, K, V, C)
                + B * L * self.n_heads * (C * K + C * (V + K) + 2 * K * V))

    def state_size(self, seq_len: int) -> int:
        # the per-head K x V delta-rule state plus the last d_conv - 1 inputs of the conv
        return self.n_heads * self.head_dim * self.head_v_dim + self.conv_dim * (self.d_conv - 1)
