"""The causal depthwise conv, both CPU forms (the fused C++ kernel and the shifted sums it
falls back to), against F.conv1d, forward and every gradient."""
import pytest
import torch

from zoo.ops import causal_conv1d, causal_conv1d_ref, conv


def shifted(x, w, b=None, activation=None):
    y = conv._ShiftedConv.apply(x, w, b)
    return torch.nn.functional.silu(y) if activation == "silu" else y


@pytest.mark.parametrize("form", [causal_conv1d, shifted], ids=["fused", "shifted"])
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("W", [1, 2, 4, 5])
@pytest.mark.parametrize("L", [1, 3, 37])
def test_matches_conv1d(form, L, W, bias, activation):
    g = torch.Generator().manual_seed(L * 10 + W)
    # x a slice of a wider projection, as the mixers pass it: the kernel reads it in place
    wide = torch.randn(3, L, 11, generator=g, dtype=torch.float64, requires_grad=True)
    x = wide[..., 2:9]
    w = torch.randn(7, 1, W, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    inputs = [t for t in (wide, w, b) if t is not None]
    y, y_ref = form(x, w, b, activation), causal_conv1d_ref(x, w, b, activation)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, inputs, dy), torch.autograd.grad(y_ref, inputs, dy)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_fused_kernel_runs_over_batch_slices_in_fp32(monkeypatch):
    calls = []
    real = conv._FusedConv.apply
    monkeypatch.setattr(conv._FusedConv, "apply", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)  # three slices of the batch
    x = torch.randn(5, 40, 24, requires_grad=True)
    w, b = torch.randn(24, 1, 4, requires_grad=True), torch.randn(24, requires_grad=True)
    y = causal_conv1d(x, w, b)
    assert calls == [1]
    y_ref = causal_conv1d_ref(x, w, b)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, (x, w, b), dy), torch.autograd.grad(y_ref, (x, w, b), dy)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_silu_inside_the_kernel_in_fp32_and_a_bad_activation_refused():
    x = torch.randn(4, 33, 24, requires_grad=True)
    w, b = torch.randn(24, 1, 4, requires_grad=True), torch.randn(24, requires_grad=True)
    y, y_ref = causal_conv1d(x, w, b, "silu"), causal_conv1d_ref(x, w, b, "silu")
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, (x, w, b), dy), torch.autograd.grad(y_ref, (x, w, b), dy)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"activation must be one of \[None, 'silu'\], got 'relu'"):
        causal_conv1d(x, w, b, "relu")


def test_falls_back_to_shifted_sums(monkeypatch):
    monkeypatch.setenv("LINBENCH_NO_CPU_KERNELS", "1")
    monkeypatch.setattr(conv._FusedConv, "apply", lambda *a: pytest.fail("the kernel is off"))
    x, w = torch.randn(2, 9, 5, dtype=torch.float64), torch.randn(5, 1, 3, dtype=torch.float64)
    torch.testing.assert_close(causal_conv1d(x, w), causal_conv1d_ref(x, w))


def test_bf16_inputs_run_the_kernel_in_float32(monkeypatch):
    # What bf16 autocast hands the conv: a bf16 x, float32 taps. The kernel computes in
    # float32 and the result comes back in x's dtype, as autocast's conv1d would return.
    calls = []
    fused = conv._FusedConv.apply
    monkeypatch.setattr(conv._FusedConv, "apply", lambda *a: calls.append(a[1].dtype) or fused(*a))
    x = torch.randn(2, 9, 5).bfloat16().requires_grad_()
    w, b = torch.randn(5, 1, 3, requires_grad=True), torch.randn(5, requires_grad=True)
    y = causal_conv1d(x, w, b)
    assert calls == [torch.float32] and y.dtype == torch.bfloat16
    want = causal_conv1d_ref(x.detach().float(), w.detach(), b.detach()).bfloat16()
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    y.float().square().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and w.grad.dtype == b.grad.dtype == torch.float32


def test_causal():
    x = torch.randn(1, 10, 3, requires_grad=True)
    y = causal_conv1d(x, torch.randn(3, 1, 4), torch.randn(3))
    (grad,) = torch.autograd.grad(y[0, 5].sum(), x)
    assert grad[0, 6:].abs().sum() == 0 and grad[0, 2:6].abs().sum() > 0
