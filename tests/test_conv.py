"""The shifted-sum causal depthwise conv against F.conv1d, forward and every gradient."""
import pytest
import torch

from zoo.ops import causal_conv1d, causal_conv1d_ref


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("W", [1, 2, 4, 5])
@pytest.mark.parametrize("L", [1, 3, 37])
def test_matches_conv1d(L, W, bias):
    g = torch.Generator().manual_seed(L * 10 + W)
    x = torch.randn(2, L, 7, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 1, W, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    inputs = [t for t in (x, w, b) if t is not None]
    y, y_ref = causal_conv1d(x, w, b), causal_conv1d_ref(x, w, b)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, inputs, dy), torch.autograd.grad(y_ref, inputs, dy)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_causal():
    x = torch.randn(1, 10, 3, requires_grad=True)
    y = causal_conv1d(x, torch.randn(3, 1, 4), torch.randn(3))
    (grad,) = torch.autograd.grad(y[0, 5].sum(), x)
    assert grad[0, 6:].abs().sum() == 0 and grad[0, 2:6].abs().sum() > 0
