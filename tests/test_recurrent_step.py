"""The fused CPU decode recurrences (zoo.ops.recurrent_step) against the step-by-step
references they replace, on odd shapes, several tokens, with and without a state: the
output and the final state, in float64 to rounding and float32 closely; the given state is
never written; a gradient, another dtype or torch_only() runs the reference."""
from __future__ import annotations

import contextlib

import pytest
import torch

from zoo.ops import recurrent_step
from zoo.ops.delta_rule import delta_recurrent_backend, gated_delta_rule_recurrent, gated_delta_rule_ref
from zoo.ops.fastpath import torch_only
from zoo.ops.gla import gla_recurrent, gla_ref
from zoo.ops.retention import retention_recurrent, retention_ref
from zoo.ops.rwkv6 import recurrent_backend, rwkv6_recurrent, rwkv6_scan_ref

pytestmark = pytest.mark.skipif(not recurrent_step.step_kernel_runs(torch.zeros(1)),
                                reason="no C++ compiler here: the fused steps cannot build")

B, H, K, V = 3, 2, 7, 9  # odd sizes: no vector width divides them
TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=2e-5, atol=2e-6)}


def inputs(L: int, dtype, seed: int = 0):
    """q, k, w (log decay), v in the zoo's (B, L, H, X) layout, u, S0."""
    g = torch.Generator().manual_seed(seed)
    shape = (B, L, H)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=dtype)
    q, k, v = r(*shape, K), r(*shape, K), r(*shape, V)
    w = -r(*shape, K).abs()  # a log decay
    return q, k, v, w, r(H, K), r(B, H, K, V)


def check(got, want, dtype):
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("L", [1, 4])
@pytest.mark.parametrize("given_state", [True, False])
def test_rwkv6_form_equals_its_reference(dtype, L, given_state):
    q, k, v, w, u, S0 = inputs(L, dtype)
    S0 = S0 if given_state else None
    kept = None if S0 is None else S0.clone()
    with torch.no_grad():
        got = rwkv6_recurrent(q, k, v, w, u, None, S0, True)
        want = rwkv6_scan_ref(q, k, v, w, u, None, S0, True)
    check(got, want, dtype)
    if S0 is not None:
        assert torch.equal(S0, kept)  # a state is a value: the step wrote a new one


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("L", [1, 5])
def test_gla_form_equals_its_reference(dtype, L):
    q, k, v, w, _, S0 = inputs(L, dtype)
    kept = S0.clone()
    with torch.no_grad():
        got = gla_recurrent(q, k, v, w, 0.3, S0, True)
        want = gla_ref(q, k, v, w, 0.3, S0, True)
        check(gla_recurrent(q, k, v, w, None, None, False), gla_ref(q, k, v, w, None, None, False), dtype)
    check(got, want, dtype)
    assert torch.equal(S0, kept)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("L", [1, 3])
def test_delta_rule_equals_its_reference(dtype, L):
    q, k, v, _, _, S0 = inputs(L, dtype)
    k = torch.nn.functional.normalize(k, dim=-1)  # as Gated DeltaNet feeds it
    g = -torch.rand(B, L, H, dtype=dtype)
    beta = torch.rand(B, L, H, dtype=dtype)
    kept = S0.clone()
    with torch.no_grad():
        check(gated_delta_rule_recurrent(q, k, v, g, beta, None, S0, True),
              gated_delta_rule_ref(q, k, v, g, beta, None, S0, True), dtype)
        check(gated_delta_rule_recurrent(q, k, v, g, beta, 0.5, None, True),
              gated_delta_rule_ref(q, k, v, g, beta, 0.5, None, True), dtype)
    assert torch.equal(S0, kept)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("L", [1, 3])
@pytest.mark.parametrize("kernels", [True, False])
def test_retention_form_equals_its_reference(dtype, L, kernels):
    """Retention on the kernel's GLA form (log gamma as a fixed log decay), and with the
    kernels off on the reference given the decays it would otherwise compute."""
    q, k, v, _, _, S0 = inputs(L, dtype)
    log_gamma = -torch.rand(H, dtype=torch.float32)  # float32, as RetNet holds it
    kept = S0.clone()
    gamma = log_gamma.double().exp().to(torch.promote_types(dtype, torch.float32))
    with torch.no_grad(), (contextlib.nullcontext() if kernels else torch_only()):
        got = retention_recurrent(q, k, v, log_gamma, None, S0, True, gamma=None if kernels else gamma)
        none = retention_recurrent(q, k, v, log_gamma, 0.5, None, False)
    want = retention_ref(q, k, v, log_gamma, None, S0, True)
    check(got, want, dtype)
    check(none, retention_ref(q, k, v, log_gamma, 0.5, None, False), dtype)
    assert torch.equal(S0, kept)


def test_zero_tokens_return_the_given_state():
    q, k, v, w, u, S0 = inputs(0, torch.float32)
    with torch.no_grad():
        o, S = rwkv6_recurrent(q, k, v, w, u, None, S0, True)
    assert o.shape == (B, 0, H, V) and torch.equal(S, S0) and S.data_ptr() != S0.data_ptr()


def test_the_reference_runs_where_the_kernel_must_not(monkeypatch):
    """A gradient wanted, bfloat16, mixed dtypes or torch_only(): the torch step, and the
    backends say so; the kernel is never entered."""
    entered = []
    monkeypatch.setattr(recurrent_step.cpu_kernels, "row_address", lambda *a: entered.append(1) or 0)
    q, k, v, w, u, S0 = inputs(1, torch.float32)
    x = torch.zeros(2, 4)
    assert recurrent_backend(x) == "cpu_fused_step" and delta_recurrent_backend(x) == "cpu_fused_step"
    q.requires_grad_(True)
    o, _ = rwkv6_recurrent(q, k, v, w, u, None, S0, True)
    o.sum().backward()  # the reference's autograd
    assert q.grad is not None and recurrent_backend(x.requires_grad_(True)) == "torch_step"
    with torch.no_grad():
        rwkv6_recurrent(*(t.bfloat16() for t in (q, k, v, w, u)), None, S0.bfloat16(), True)
        rwkv6_recurrent(q, k, v, w.double(), u, None, S0, True)
        with torch_only():
            rwkv6_recurrent(q, k, v, w, u, None, S0, True)
            assert recurrent_backend(torch.zeros(2, 4)) == "torch_step"
    assert not entered


def test_delta_rule_streams_a_large_state_to_its_reference(monkeypatch):
    """A kernel call's state of 16 MiB or more is written with streaming stores (a float32
    row of whole vectors): the values are the reference's, and the given state is untouched.
    One thread: the call then holds the whole batch."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # what over_batch splits by
    g = torch.Generator().manual_seed(1)
    Bl, Hl, Kl, Vl, L = 4, 2, 256, 2048, 2  # 4 x 2 x 256 x 2048 float32: 16 MiB
    q, k = torch.randn(Bl, L, Hl, Kl, generator=g), torch.randn(Bl, L, Hl, Kl, generator=g)
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(Bl, L, Hl, Vl, generator=g)
    gate, beta = -torch.rand(Bl, L, Hl, generator=g), torch.rand(Bl, L, Hl, generator=g)
    S0 = torch.randn(Bl, Hl, Kl, Vl, generator=g)
    kept = S0.clone()
    with torch.no_grad():
        got = gated_delta_rule_recurrent(q, k, v, gate, beta, None, S0, True)
        want = gated_delta_rule_ref(q, k, v, gate, beta, None, S0, True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)
    assert torch.equal(S0, kept)
