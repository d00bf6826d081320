"""The causal depthwise convolution of Mamba, Mamba-2 and Gated DeltaNet, on (B, L, C).

    y_t = bias + sum_k weight[:, k] * x_{t - (W-1) + k}        (zeros before t = 0)

``causal_conv1d_ref`` is the definition through ``F.conv1d`` (left padding by W - 1,
first L outputs). ``causal_conv1d`` computes the same in the tokens-major layout the
mixers already hold, no transposes: on CPU in fp32/fp64 by a fused C++ kernel
(causal_conv1d_cpu.cpp, built on first use by cpu_kernels: one pass forward, one
backward), else as W shifted multiply-adds with a written-out backward. On one CPU thread
at (64, 256, 384), width 4, with a SiLU after it, forward plus backward took 77 ms by the
shifted sums, against 104 ms for the same sums through autograd and 172 ms for conv1d,
whose depthwise backward is slow. The kernel takes the SiLU inside (``activation="silu"``,
as causal-conv1d's CUDA function does) and reads a slice of a wider projection in place.
Off the CPU it is not measured, so ``causal_conv1d`` runs the reference there (cuDNN), where
the Mamba blocks' fused kernels do not call causal-conv1d's own.
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from . import cpu_kernels

CONV_CPP = "causal_conv1d_cpu.cpp"
# What mamba_ssm's fused kernels need of causal-conv1d: its C++ functions, which
# mamba_ssm imports under one name or another depending on its version (a Kernel's needs).
CAUSAL_CONV1D_NEEDS = (("causal_conv1d_fwd_function", "causal_conv1d_bwd_function"),
                       ("causal_conv1d_cuda",))
_P, _N = ctypes.c_void_p, ctypes.c_int64
CONV_SIGNATURES = {f"causal_conv1d_{way}_{s}": (_P,) * k + (_N,) * 7
                   for way, k in (("fwd", 4), ("bwd", 7)) for s in ("f32", "f64")}
ACTIVATIONS = (None, "silu")


def causal_conv1d_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      activation: str | None = None):
    """x: (B, L, C); weight: (C, 1, W) as nn.Conv1d(groups=C) stores it; bias: (C,) or None;
    activation: None or "silu", applied after (causal-conv1d's argument). Returns (B, L, C)."""
    _check_activation(activation)
    W, L = weight.shape[-1], x.shape[1]
    y = F.conv1d(x.transpose(1, 2), weight, bias, padding=W - 1, groups=x.shape[-1])
    y = y[..., :L].transpose(1, 2)  # keep the outputs that see no future
    return F.silu(y) if activation == "silu" else y


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  activation: str | None = None):
    """Same arguments and result as ``causal_conv1d_ref``. On CPU the kernel reads x in
    place when its channels are contiguous (a slice of a wider projection, say), and the
    SiLU runs inside it."""
    _check_activation(activation)
    if x.device.type != "cpu":
        return causal_conv1d_ref(x, weight, bias, activation)
    lib = cpu_kernels.library(CONV_CPP, CONV_SIGNATURES)
    if lib is None:
        y = _ShiftedConv.apply(x, weight, bias)
        return F.silu(y) if activation == "silu" else y
    # The kernel computes in float32 or float64. Half inputs (bf16 autocast hands the conv
    # a bf16 x and float32 taps) go through it in float32 and come back in x's dtype,
    # so autocast keeps the fused kernel instead of falling back to the shifted form.
    work = torch.float64 if torch.float64 in (x.dtype, weight.dtype) else torch.float32
    y = _FusedConv.apply(lib, x.to(work), weight.to(work), None if bias is None else bias.to(work),
                         activation == "silu")
    return y.to(x.dtype)


def _check_activation(activation) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"causal_conv1d: activation must be one of {list(ACTIVATIONS)}, got {activation!r}")


class _FusedConv(torch.autograd.Function):
    """The C++ kernel, forward and backward, over batch slices; x read in place when its
    channels are contiguous."""

    @staticmethod
    def forward(ctx, lib, x, weight, bias, silu):
        (B, L, C), W = x.shape, weight.shape[-1]
        f64 = x.dtype == torch.float64
        fwd = lib.causal_conv1d_fwd_f64 if f64 else lib.causal_conv1d_fwd_f32
        ctx.bwd = lib.causal_conv1d_bwd_f64 if f64 else lib.causal_conv1d_bwd_f32
        x = x if x.stride(-1) == 1 else x.contiguous()
        taps = weight.reshape(C, W).t().contiguous()  # (W, C)
        bias_c = None if bias is None else bias.contiguous()
        y = x.new_empty(B, L, C)
        at = cpu_kernels.row_address

        def run(b0, b1):
            fwd(at(x, b0), at(taps), at(bias_c), at(y, b0),
                b1 - b0, L, C, W, x.stride(0), x.stride(1), int(silu))

        cpu_kernels.over_batch(run, B)
        ctx.save_for_backward(x, taps, bias_c)
        ctx.weight_shape, ctx.silu = weight.shape, silu
        return y

    @staticmethod
    def backward(ctx, dy):
        x, taps, bias = ctx.saved_tensors
        (B, L, C), W = x.shape, taps.shape[0]
        dy = dy.contiguous()
        dx = x.new_empty(B, L, C)
        parts = []  # each slice's (dtaps, dbias), summed below
        at = cpu_kernels.row_address

        def run(b0, b1):
            dtaps, dbias = x.new_empty(W, C), x.new_empty(C)
            ctx.bwd(at(x, b0), at(taps), at(bias), at(dy, b0),
                    at(dx, b0), at(dtaps), at(dbias), b1 - b0, L, C, W, x.stride(0), x.stride(1),
                    int(ctx.silu))
            parts.append((dtaps, dbias))

        cpu_kernels.over_batch(run, B)
        dtaps = torch.stack([p[0] for p in parts]).sum(0)
        dweight = dtaps.t().reshape(ctx.weight_shape)
        dbias = torch.stack([p[1] for p in parts]).sum(0) if bias is not None else None
        return None, dx, dweight, dbias, None


class _ShiftedConv(torch.autograd.Function):
    """W shifted multiply-adds, with a backward written out: autograd's own would save a
    product per tap and scale every gradient by addcmul's value, 1."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        W, L = weight.shape[-1], x.shape[1]
        taps = weight.view(-1, W).t()  # (W, C): taps[k] multiplies x_{t - (W-1) + k}
        xp = F.pad(x, (0, 0, W - 1, 0))  # (B, L + W - 1, C)
        y = xp[:, W - 1:] * taps[-1] if bias is None else torch.addcmul(bias, xp[:, W - 1:], taps[-1])
        for k in range(W - 1):
            y.addcmul_(xp[:, k:k + L], taps[k])
        ctx.save_for_backward(xp, weight)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):  # dy: (B, L, C)
        xp, weight = ctx.saved_tensors
        W, L = weight.shape[-1], dy.shape[1]
        taps = weight.view(-1, W).t()
        dxp = dy.new_zeros(xp.shape)  # tap k sent x_{t - (W-1) + k} to y_t: send dy_t back
        for k in range(W):
            dxp[:, k:k + L].addcmul_(dy, taps[k])
        dw = torch.stack([(dy * xp[:, k:k + L]).sum((0, 1)) for k in range(W)], -1)  # (C, W)
        db = dy.sum((0, 1)) if ctx.has_bias else None
        return dxp[:, W - 1:], dw.view_as(weight), db
