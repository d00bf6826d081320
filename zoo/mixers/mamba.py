"""Mamba-1 (Gu & Dao, 2023): a gated selective state-space block.

in_proj -> (x, z); x -> causal depthwise conv -> SiLU -> x_proj -> (dt, B, C);
dt -> dt_proj (+ bias, softplus inside the scan); selective scan over x with
A = -exp(A_log), skip D, gate silu(z); out_proj. Layout and initialisation follow
mamba_ssm's ``Mamba`` so its fused CUDA kernels can run on the same parameters.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.conv import CAUSAL_CONV1D_NEEDS, causal_conv1d
from ..ops.fastpath import Kernel
from ..ops.selective_scan import selective_scan, selective_scan_backend
from ..ops.ssm_step import conv_step, ssm_step, step_backend
from .base import Mixer, check_chunk_size, check_conv_width, check_positive

# Fused conv + projections + scan; it calls causal-conv1d's C++ functions.
MAMBA_INNER = Kernel("mamba_ssm.ops.selective_scan_interface", "mamba_inner_fn", "mamba-ssm",
                     "2.0.0", "the argument layouts of mamba_ssm 2", needs=CAUSAL_CONV1D_NEEDS)

# Initial step sizes softplus(dt_proj.bias) are log-uniform in [DT_MIN, DT_MAX].
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 0.1, 1e-4


class Mamba(Mixer):
    name = "mamba"
    uses_mlp = False  # Mamba blocks conventionally have no MLP
    fast_path = ("mamba_ssm mamba_inner_fn + causal_conv1d (CUDA); else a fused C++ scan (CPU); "
                 "else chunked torch scan")

    def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: int = 2,
                 dt_rank: int | str = "auto", chunk_size: int | str = 64):
        super().__init__()
        for option, value in (("d_state", d_state), ("expand", expand)):
            check_positive(self.name, value, option)
        check_chunk_size(self.name, chunk_size)
        check_conv_width(self.name, d_conv)
        if dt_rank == "auto":
            dt_rank = math.ceil(d_model / 16)
        check_positive(self.name, dt_rank, "dt_rank (or 'auto')")
        self.d_model, self.d_state, self.d_conv = d_model, d_state, d_conv
        self.d_inner, self.dt_rank, self.chunk_size = expand * d_model, dt_rank, chunk_size
        di = self.d_inner

        self.in_proj = nn.Linear(d_model, 2 * di, bias=False)
        self.conv1d = nn.Conv1d(di, di, d_conv, groups=di, padding=d_conv - 1, bias=True)
        self.x_proj = nn.Linear(di, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, di, bias=True)
        self.out_proj = nn.Linear(di, d_model, bias=False)

        # dt_proj keeps the variance of dt at init; its bias is the inverse softplus of
        # log-uniform step sizes, so each channel starts with its own time scale.
        std = dt_rank ** -0.5
        nn.init.uniform_(self.dt_proj.weight, -std, std)
        log_dt = torch.rand(di) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)
        dt = torch.exp(log_dt).clamp(min=DT_FLOOR)
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.dt_proj.bias._no_reinit = True  # a backbone's generic init must not zero it

        # S4D-real: A = -(1, 2, ..., d_state) in every channel, stored as log(-A).
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0)).repeat(di, 1))
        self.D = nn.Parameter(torch.ones(di))
        self.A_log._no_weight_decay = self.D._no_weight_decay = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        xz = self.in_proj(x)  # (B, L, 2*di)
        A = -torch.exp(self.A_log.float())  # (di, N), fp32 whatever the module dtype
        D, dt_bias = self.D.float(), self.dt_proj.bias.float()

        if 2 <= self.d_conv <= 4 and MAMBA_INNER.usable(x):  # causal-conv1d: widths 2-4
            self.backend = "mamba_ssm_fused"
            return MAMBA_INNER(xz.transpose(1, 2), self.conv1d.weight, self.conv1d.bias,
                               self.x_proj.weight, self.dt_proj.weight, self.out_proj.weight,
                               self.out_proj.bias, A, None, None, D, delta_bias=dt_bias,
                               delta_softplus=True)  # xz as (B, 2*di, L): L innermost

        # selective_scan itself runs the CUDA scan kernel, or the fused CPU one, when it can.
        self.backend = selective_scan_backend(x)
        u, z = xz.chunk(2, dim=-1)  # (B, L, di) each
        u = causal_conv1d(u, self.conv1d.weight, self.conv1d.bias, "silu")  # (B, L, di)
        dt, Bs, Cs = self.x_proj(u).split(
            [self.dt_rank, self.d_state, self.d_state], dim=-1)  # (B, L, R), (B, L, N) x2
        dt = F.linear(dt, self.dt_proj.weight)  # (B, L, di), bias in the scan
        y = self.chunked(selective_scan, *(t.transpose(1, 2) for t in (u, dt)), A, Bs.transpose(1, 2),
                         Cs.transpose(1, 2), D, z=z.transpose(1, 2), delta_bias=dt_bias,
                         delta_softplus=True, length=L)  # (B, di, L)
        return self.out_proj(y.transpose(1, 2))

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        """The SSM state (B, d_inner, d_state) and the conv's last d_conv - 1 inputs
        (B, d_inner, d_conv - 1), the decode kernels' layouts."""
        return {"h": torch.zeros(batch, self.d_inner, self.d_state, device=device, dtype=dtype),
                "conv": torch.zeros(batch, self.d_inner, self.d_conv - 1, device=device, dtype=dtype)}

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token x (B, D): the conv and the SSM advanced by one input, through
        causal-conv1d's and mamba_ssm's decode kernels where they run (zoo.ops.ssm_step)."""
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, di) each
        u, conv = conv_step(u, state["conv"], self.conv1d.weight[:, 0], self.conv1d.bias, silu=True)
        dt, Bs, Cs = self.x_proj(u).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.linear(dt, self.dt_proj.weight)  # (B, di), bias in the step
        A = -torch.exp(self.A_log.float())  # (di, N)
        self.backend = step_backend(u)
        # one "head" of d_inner channels: the kernel's (B, H, P, N) layout with H = 1
        y, h = ssm_step(state["h"][:, None], u[:, None], dt[:, None], A[None], Bs[:, None], Cs[:, None],
                        self.D.float()[None], z=z[:, None], dt_bias=self.dt_proj.bias.float()[None])
        return self.out_proj(y[:, 0]), {"h": h[:, 0].to(state["h"].dtype), "conv": conv}

    def prefill(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """The scan over x from a zero state, plus what the context's state h0 adds, which
        is linear in h0: silu(z_t) C_t . exp(sum_{s <= t} dt_s A) h0 at step t, and that
        decay over all of x times h0 to the last state (selective_scan takes no initial state,
        as mamba_ssm's does not)."""
        B, L, _ = x.shape
        A = -torch.exp(self.A_log.float())  # (di, N), as the forward
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, L, di) each
        u = torch.cat([state["conv"].transpose(1, 2), u], 1)  # the conv continues over the context's last inputs
        conv = u[:, -(self.d_conv - 1):].transpose(1, 2).contiguous()  # (B, di, d_conv - 1)
        u = causal_conv1d(u, self.conv1d.weight, self.conv1d.bias, "silu")[:, -L:]  # (B, L, di)
        dt, Bs, Cs = self.x_proj(u).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.linear(dt, self.dt_proj.weight)  # (B, L, di), bias in the scan
        self.backend = selective_scan_backend(x)
        y, last = self.chunked(selective_scan, *(t.transpose(1, 2) for t in (u, dt)), A, Bs.transpose(1, 2),
                               Cs.transpose(1, 2), self.D.float(), z=z.transpose(1, 2),
                               delta_bias=self.dt_proj.bias.float(), delta_softplus=True,
                               return_last_state=True, length=L)  # (B, di, L)
        cdt = torch.promote_types(x.dtype, torch.float32)
        delta = F.softplus(dt.to(cdt) + self.dt_proj.bias.to(cdt))  # (B, L, di)
        carried = torch.cumsum(delta[..., None] * A.to(cdt), 1).exp() * state["h"].to(cdt)[:, None]  # (B, L, di, N)
        y = y.transpose(1, 2) + (F.silu(z.to(cdt)) * torch.einsum("bldn,bln->bld", carried, Cs.to(cdt))).to(y.dtype)
        last = last.to(cdt) + carried[:, -1]
        return self.out_proj(y), {"h": last.to(state["h"].dtype), "conv": conv}

    def core_flops(self, B: int, L: int) -> float:
        # per (token, channel, state): exp(dt*A) 1, dt*B*x 2, h = dA*h + dBx 2, y += C*h 2.
        # All elementwise: FlopCounterMode, which counts matmuls and convolutions, sees none of it.
        return 7 * B * L * self.d_inner * self.d_state

    def state_size(self, seq_len: int) -> int:
        # The SSM state plus the last d_conv - 1 inputs of the convolution.
        return self.d_inner * self.d_state + self.d_inner * (self.d_conv - 1)
