"""Mamba-2 (Dao & Gu, 2024): the SSD scan inside its gated block.

    u -> in_proj -> [z | xBC | dt]
    xBC -> causal depthwise conv -> SiLU -> [x | B | C]
    y = SSD(x, dt, A, B, C) + D x                    (zoo.ops.ssd)
    out = out_proj(RMSNorm(y * silu(z)))             (RMSNorm per group of channels)

Parameters and initialisation follow mamba_ssm's ``Mamba2`` module (rmsnorm=True,
norm_before_gate=False, no projection biases, conv bias). On CUDA with mamba_ssm and
causal_conv1d importable, the whole block after in_proj runs as mamba_ssm's fused
``mamba_split_conv1d_scan_combined``; otherwise the readable path below runs.
Its defaults are smaller than mamba_ssm's (d_state 64, headdim 32, chunk 64 against 128,
64, 256) for the small widths of a CPU; with the same arguments it is mamba_ssm's module
(tests/test_peer_layers.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.conv import CAUSAL_CONV1D_NEEDS, causal_conv1d
from ..ops.fastpath import Kernel
from ..ops.ssd import ssd_backend, ssd_scan
from ..ops.ssm_step import conv_step, ssm_step, step_backend
from .base import Mixer, check_chunk_size, check_conv_width, check_positive, chunked_linear_attention_flops

MAMBA2_FUSED = Kernel("mamba_ssm.ops.triton.ssd_combined", "mamba_split_conv1d_scan_combined",
                      "mamba-ssm", "2.0.0", "the Mamba-2 SSD kernels", needs=CAUSAL_CONV1D_NEEDS)
# The fused CUDA kernel's chunk for chunk_size="auto" (which measures only the torch path):
# mamba_ssm's own Mamba2 default.
CUDA_CHUNK = 256


def gated_rmsnorm(y, z, weight, eps: float, ngroups: int):
    """RMSNorm(y * silu(z)) * weight, the RMS taken over each of ``ngroups`` equal
    slices of the channels (mamba_ssm's RMSNormGated, norm_before_gate=False).
    y, z: (B, L, d_inner). Computed in (at least) float32, returned in y's dtype."""
    cdt = torch.promote_types(y.dtype, torch.float32)
    h = (y.to(cdt) * F.silu(z.to(cdt))).unflatten(-1, (ngroups, -1))  # (B, L, g, d_inner/g)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h.flatten(-2) * weight.to(cdt)).to(y.dtype)


class Mamba2(Mixer):
    """The Mamba-2 block. nheads = expand * d_model / headdim scalar-decay heads, each
    with a (headdim, d_state) state; ngroups sets of (B, C) shared across heads."""

    name = "mamba2"
    uses_mlp = False  # Mamba blocks conventionally have no MLP
    fast_path = "mamba_ssm mamba_split_conv1d_scan_combined (CUDA); else chunked torch SSD"

    def __init__(self, d_model: int, d_state: int = 64, d_conv: int = 4, expand: int = 2,
                 headdim: int = 32, ngroups: int = 1, chunk_size: int | str = 64):
        super().__init__()
        for option, value in [("d_state", d_state), ("expand", expand), ("headdim", headdim),
                              ("ngroups", ngroups)]:
            check_positive(self.name, value, option)
        check_chunk_size(self.name, chunk_size)
        check_conv_width(self.name, d_conv)
        d_inner = expand * d_model
        if d_inner % headdim:
            raise ValueError(f"{self.name}: d_inner = expand * d_model = {d_inner} is not "
                             f"divisible by headdim={headdim}")
        nheads = d_inner // headdim
        if nheads % ngroups:
            raise ValueError(f"{self.name}: nheads = {nheads} is not divisible by ngroups={ngroups}")
        self.d_model, self.d_state, self.d_conv, self.headdim = d_model, d_state, d_conv, headdim
        self.d_inner, self.nheads, self.ngroups, self.chunk_size = d_inner, nheads, ngroups, chunk_size
        self.conv_dim = d_inner + 2 * ngroups * d_state  # x, B and C all go through the conv
        self.norm_eps = 1e-5

        self.in_proj = nn.Linear(d_model, d_inner + self.conv_dim + nheads, bias=False)  # [z, xBC, dt]
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim,
                                padding=d_conv - 1, bias=True)
        # dt = softplus(dt_proj + dt_bias) starts log-uniform in [1e-3, 0.1]: the bias is
        # the inverse softplus of such a sample (Mamba-2's init).
        dt = torch.exp(torch.rand(nheads) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        # A = -exp(A_log) in [-16, -1]: a spread of memory lengths across heads.
        self.A_log = nn.Parameter(torch.log(torch.empty(nheads).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(nheads))
        self.norm_weight = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)
        for p in (self.dt_bias, self.A_log, self.D):
            p._no_weight_decay = True  # as in mamba_ssm; the training loop honours it

    def _fused_ok(self, u: torch.Tensor) -> bool:
        # causal-conv1d's kernels take widths 2 to 4 only, and the fused block asserts
        # that the conv's channels are a multiple of 8
        return 2 <= self.d_conv <= 4 and self.conv_dim % 8 == 0 and MAMBA2_FUSED.usable(u)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        Bsz, L, _ = u.shape  # (B, L, D)
        zxbcdt = self.in_proj(u)  # (B, L, d_inner + conv_dim + nheads)
        # (nheads,); at least float32 so bf16/fp16 weights cannot round A to -inf
        A = -torch.exp(self.A_log.to(torch.promote_types(self.A_log.dtype, torch.float32)))
        if self._fused_ok(u):
            self.backend = "mamba_ssm_fused"
            self.chunk_size_used = CUDA_CHUNK if self.chunk_size == "auto" else self.chunk_size
            return MAMBA2_FUSED(
                zxbcdt, self.conv1d.weight.squeeze(1), self.conv1d.bias, self.dt_bias, A, self.D,
                self.chunk_size_used, activation="silu", rmsnorm_weight=self.norm_weight,
                rmsnorm_eps=self.norm_eps, outproj_weight=self.out_proj.weight, headdim=self.headdim,
                ngroups=self.ngroups, norm_before_gate=False)

        return self._scan(zxbcdt, A, None, None)[0]

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        """The SSM state (B, nheads, headdim, d_state) and the conv's last d_conv - 1 inputs
        (B, conv_dim, d_conv - 1), the decode kernels' layouts."""
        return {"S": torch.zeros(batch, self.nheads, self.headdim, self.d_state, device=device, dtype=dtype),
                "conv": torch.zeros(batch, self.conv_dim, self.d_conv - 1, device=device, dtype=dtype)}

    def step(self, u: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token u (B, D): the conv and the SSD state advanced by one input, through
        causal-conv1d's and mamba_ssm's decode kernels where they run (zoo.ops.ssm_step)."""
        Bsz, H, P, N, G = u.shape[0], self.nheads, self.headdim, self.d_state, self.ngroups
        z, xBC, dt = torch.split(self.in_proj(u), [self.d_inner, self.conv_dim, H], dim=-1)
        xBC, conv = conv_step(xBC, state["conv"], self.conv1d.weight[:, 0], self.conv1d.bias, silu=True)
        x, B, C = torch.split(xBC, [self.d_inner, G * N, G * N], dim=-1)
        A = -torch.exp(self.A_log.to(torch.promote_types(self.A_log.dtype, torch.float32)))  # (H,)
        self.backend = step_backend(x)
        # one dt, A, D and dt_bias per head, repeated over its P channels without copies
        # (mamba_ssm's Mamba-2 step passes them so: its kernel then reads each once)
        y, S = ssm_step(state["S"], x.view(Bsz, H, P), dt[..., None].expand(Bsz, H, P),
                        A[:, None, None].expand(H, P, N), B.view(Bsz, G, N), C.view(Bsz, G, N),
                        self.D[:, None].expand(H, P), dt_bias=self.dt_bias[:, None].expand(H, P))
        y = gated_rmsnorm(y.reshape(Bsz, 1, self.d_inner), z[:, None], self.norm_weight, self.norm_eps, G)
        return self.out_proj(y[:, 0]), {"S": S.to(state["S"].dtype), "conv": conv}

    def prefill(self, u: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """The chunked torch path (SSD with an initial state) over u after the state."""
        if u.shape[1] == 0:  # the chunked scan needs a token
            return torch.zeros_like(u), state
        A = -torch.exp(self.A_log.to(torch.promote_types(self.A_log.dtype, torch.float32)))
        y, S, conv = self._scan(self.in_proj(u), A, state["S"], state["conv"])
        return y, {"S": S.to(state["S"].dtype), "conv": conv}

    def _scan(self, zxbcdt: torch.Tensor, A: torch.Tensor, S0, conv0):
        """The torch path from the input projection (B, L, ...) after a context with SSM
        state S0 and conv inputs conv0 (None, None: no context); the states after it."""
        L = zxbcdt.shape[1]
        z, xBC, dt = torch.split(zxbcdt, [self.d_inner, self.conv_dim, self.nheads], dim=-1)
        if conv0 is not None:  # the conv continues over the context's last inputs
            xBC = torch.cat([conv0.transpose(1, 2), xBC], 1)
            conv0 = xBC[:, -(self.d_conv - 1):].transpose(1, 2).contiguous()  # (B, conv_dim, d_conv - 1)
        xBC = causal_conv1d(xBC, self.conv1d.weight, self.conv1d.bias, "silu")
        if xBC.shape[1] > L:  # the context's inputs out again (a no-op slice's backward zero-fills)
            xBC = xBC[:, -L:]  # (B, L, conv_dim)
        x, B, C = torch.split(xBC, [self.d_inner, self.ngroups * self.d_state,
                                    self.ngroups * self.d_state], dim=-1)
        self.backend = ssd_backend(x)
        out = self.chunked(
            ssd_scan, x.unflatten(-1, (self.nheads, self.headdim)), dt, A,
            B.unflatten(-1, (self.ngroups, self.d_state)), C.unflatten(-1, (self.ngroups, self.d_state)),
            D=self.D, dt_bias=self.dt_bias, dt_softplus=True,
            initial_states=S0, return_final_states=S0 is not None, length=L,
        )  # (B, L, nheads, headdim), and the final state when asked
        y, S = out if S0 is not None else (out, None)
        y = gated_rmsnorm(y.flatten(-2), z, self.norm_weight, self.norm_eps, self.ngroups)
        return self.out_proj(y), S, conv0

    def core_flops(self, B: int, L: int) -> float:
        # SSD as chunked linear attention: d_state-wide scores shared by each group's heads,
        # headdim-wide values (FlopCounterMode would add the chunks' masked halves, ~1.3x)
        return chunked_linear_attention_flops(B, L, self.nheads, self.d_state, self.headdim,
                                              self.flops_chunk_size(), self.ngroups)

    def state_size(self, seq_len: int) -> int:
        # The SSM state plus the last d_conv - 1 inputs of the conv; independent of L.
        return self.nheads * self.headdim * self.d_state + self.conv_dim * (self.d_conv - 1)
