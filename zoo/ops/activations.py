"""tanh for float32 CPU hot paths (RWKV-6's low-rank token shift and decay), beside its
reference ``tanh_ref``, ATen's tanh.

ATen's CPU tanh is accurate to about an ulp and costs several times a sigmoid: on a
(4096, 160) float32 tensor on one thread it took about twice as long as the four cheap
passes of 2 sigmoid(2x) - 1 (a 2-core AVX2 EPYC, timed side by side in one process). The
identity is exact; in float32 it loses only absolute accuracy, a few ulp of 1 (within
3e-7 of tanh in float64, tests/test_activations.py), where the low-rank mixes it feeds
are added to terms of order 1. Other dtypes and devices keep ATen's tanh (in bf16 an
ulp of 1 is 8e-3; on CUDA tanh is one fused pass anyway), as does ``torch_only()``.
"""
from __future__ import annotations

import torch

from .fastpath import enabled

tanh_ref = torch.tanh


class _SigmoidTanh(torch.autograd.Function):
    """tanh(x) = 2 sigmoid(2x) - 1, its backward ATen's tanh_backward on the saved output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid_(x * 2).mul_(2).sub_(1)  # one new tensor, three passes in place
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)  # grad (1 - y^2), one pass


def tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh of ``x``, as ``tanh_ref``: by the sigmoid identity for float32 on the CPU."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or not enabled():
        return tanh_ref(x)
    return _SigmoidTanh.apply(x)
