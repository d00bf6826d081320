"""One decode step of the Mamba family: the short causal convolution and the selective
state update, each the package kernel where it can run (``CAUSAL_CONV1D_UPDATE``,
``SELECTIVE_STATE_UPDATE``) and a readable torch form beside it with the same
arguments. The kernels update the state in place, as a decode loop wants; the torch forms
return a new state. Either way the caller keeps what is returned.

Layouts are the kernels': the conv state (B, C, K - 1) holds the last K - 1 inputs of each
channel, oldest first; the SSM state is (B, D, N) for Mamba, (B, H, P, N) for Mamba-2.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .fastpath import Kernel

# causal_conv1d_update(x (B, C), conv_state (B, C, W - 1), weight (C, W), bias, activation):
# writes the shifted state in place and returns (B, C); compiled CUDA.
CAUSAL_CONV1D_UPDATE = Kernel("causal_conv1d", "causal_conv1d_update", "causal-conv1d", "1.2.0",
                              "the floor of the package in pyproject's cuda extra")
# selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus): Triton, the
# state updated in place; heads (B, H, P, N) or none (B, D, N).
SELECTIVE_STATE_UPDATE = Kernel("mamba_ssm.ops.triton.selective_state_update", "selective_state_update",
                                "mamba-ssm", "2.0.0", "the floor of the package in pyproject's cuda extra")


def conv_step_ref(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  silu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, C), the last K - 1 inputs conv_state (B, C, K - 1), weight (C, K) (its last
    tap is the current input's) -> (y (B, C), the state after x)."""
    window = torch.cat([conv_state, x[..., None]], -1)  # (B, C, K): oldest first
    y = (window * weight).sum(-1) + (0 if bias is None else bias)
    return (F.silu(y) if silu else y), window[..., 1:]


def conv_step(x, conv_state, weight, bias, silu):
    """``conv_step_ref``, through causal-conv1d's kernel where it can run (CUDA, widths 2-4)."""
    if 2 <= weight.shape[-1] <= 4 and CAUSAL_CONV1D_UPDATE.usable(x):
        conv_state = conv_state.contiguous()
        return CAUSAL_CONV1D_UPDATE(x, conv_state, weight, bias, "silu" if silu else None), conv_state
    return conv_step_ref(x, conv_state, weight, bias, silu)


def ssm_step_ref(h, x, dt, A, B, C, D, z=None, dt_bias=None):
    """One step of the selective SSM, in fp32 at least.

    h (B, H, P, N) state; x, dt (B, H, P); A (H, P, N); B, C (B, G, N), heads grouped in
    G groups; D (H, P); z (B, H, P) gate or None; dt_bias (H, P). dt is softplus'd after
    its bias. Returns (y (B, H, P), the state after x):
        dt' = softplus(dt + dt_bias);  h = exp(dt' A) h + dt' B x;  y = C.h + D x, times silu(z)."""
    cdt = torch.promote_types(x.dtype, torch.float32)
    heads_per_group = h.shape[1] // B.shape[1]
    Bh, Ch = (t.to(cdt).repeat_interleave(heads_per_group, 1)[:, :, None] for t in (B, C))  # (B, H, 1, N)
    delta = F.softplus(dt.to(cdt) + (0 if dt_bias is None else dt_bias.to(cdt)))[..., None]  # (B, H, P, 1)
    h = torch.exp(delta * A.to(cdt)) * h.to(cdt) + delta * Bh * x.to(cdt)[..., None]
    y = (h * Ch).sum(-1) + D.to(cdt) * x.to(cdt)
    if z is not None:
        y = y * F.silu(z.to(cdt))
    return y.to(x.dtype), h


def ssm_step(h, x, dt, A, B, C, D, z=None, dt_bias=None):
    """``ssm_step_ref``, through mamba_ssm's Triton kernel where it can run (CUDA)."""
    if SELECTIVE_STATE_UPDATE.usable(x):
        h = h.contiguous()
        y = SELECTIVE_STATE_UPDATE(h, x, dt, A, B, C, D, z=z, dt_bias=dt_bias, dt_softplus=True)
        return y, h
    return ssm_step_ref(h, x, dt, A, B, C, D, z=z, dt_bias=dt_bias)


def step_backend(x: torch.Tensor) -> str:
    """What ``ssm_step`` runs for x: "mamba_ssm_step" or "torch_step"."""
    return "mamba_ssm_step" if SELECTIVE_STATE_UPDATE.usable(x) else "torch_step"
