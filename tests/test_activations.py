"""zoo.ops.activations.tanh against its reference, ATen's tanh: values and gradients on
odd shapes, the dtypes and paths that keep the reference, and the identity's exactness
(float64 through the same autograd function)."""
from __future__ import annotations

import pytest
import torch

from zoo.ops import activations
from zoo.ops.activations import _SigmoidTanh, tanh, tanh_ref
from zoo.ops.fastpath import torch_only


@pytest.mark.parametrize("shape", [(7,), (3, 5, 11), (4096, 160)])
def test_float32_values_and_gradients_match_the_reference(shape):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 3).requires_grad_()
    x.data[..., 0] = 0.0  # the identity's weakest point: an absolute error around 0
    dy = torch.randn(shape, generator=g)
    y = tanh(x)
    (dx,) = torch.autograd.grad(y, x, dy)
    exact = torch.tanh(x.detach().double())
    assert (y.detach().double() - exact).abs().max() < 3e-7
    assert (dx.double() - dy.double() * (1 - exact ** 2)).abs().max() < 1e-6 * (1 + dy.abs().max())
    assert y.grad_fn.name().endswith("_SigmoidTanhBackward")  # the fast path ran


def test_the_identity_is_exact_in_float64_on_values_and_gradients():
    x = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(_SigmoidTanh.apply(x), tanh_ref(x), rtol=0, atol=1e-15)
    assert torch.autograd.gradcheck(_SigmoidTanh.apply, (x,))


def test_other_dtypes_and_torch_only_keep_the_reference(monkeypatch):
    called = []
    monkeypatch.setattr(activations, "tanh_ref", lambda x: called.append(x.dtype) or torch.tanh(x))
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        x = torch.randn(5, dtype=dtype)
        assert torch.equal(activations.tanh(x), torch.tanh(x))
    with torch_only():
        activations.tanh(torch.randn(5))
    assert called == [torch.float64, torch.bfloat16, torch.float16, torch.float32]
    activations.tanh(torch.randn(5))  # float32 on the CPU: not the reference
    assert len(called) == 4
