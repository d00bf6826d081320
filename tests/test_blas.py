"""Products through numpy's BLAS (zoo.ops.blas) equal torch's, forward, on odd shapes and
strides; under ``products()`` only calls autograd does not track leave torch, on torch's
thread count; the "blas" step form sends every fixed-state mixer's dense products there."""
from __future__ import annotations

import gc
import warnings

import pytest
import torch
import torch.nn as nn
from torch._dynamo.utils import counters

from zoo import MIXERS, mixer_class
from zoo.checks import decode
from zoo.ops import blas
from zoo.stepping import fast_steps, fixed_state

pytestmark = pytest.mark.skipif(not blas.available(), reason="numpy's BLAS is not an OpenBLAS with a thread setter")

D = 64
FIXED = sorted(n for n in MIXERS if mixer_class(n).has_step_form() and fixed_state(mixer_class(n)(D)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 37), (2, 3, 37), (1, 1, 37), (0, 37)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_equals_the_torch_product(shape, dtype, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    w = torch.randn(23, 37, generator=g, dtype=dtype)
    b = torch.randn(23, generator=g, dtype=dtype) if bias else None
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    got = blas.linear(x, w, b)
    assert got.shape == (*shape[:-1], 23) and got.dtype == dtype
    torch.testing.assert_close(got, blas.linear_ref(x, w, b), **tol)


def test_linear_reads_a_strided_input_and_a_strided_weight():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 6, generator=g, dtype=torch.float64).t()  # (6, 37), not contiguous
    w = torch.randn(37, 23, generator=g, dtype=torch.float64).t()  # (23, 37), not contiguous
    torch.testing.assert_close(blas.linear(x, w), blas.linear_ref(x, w), rtol=1e-12, atol=1e-12)


def test_a_weights_transposed_copy_is_made_once_again_after_a_write_and_goes_with_the_weight():
    layer = nn.Linear(16, 8, bias=False).double()
    x = torch.randn(3, 16, dtype=torch.float64)
    with torch.no_grad():
        first = blas.transposed(layer.weight)
        assert blas.transposed(layer.weight) is first and first.is_contiguous() and first.shape == (16, 8)
        with blas.products():
            torch.testing.assert_close(layer(x), blas.linear_ref(x, layer.weight), rtol=1e-12, atol=1e-12)
        layer.weight.mul_(2)  # written in place: the copy it held is stale
        with blas.products():
            torch.testing.assert_close(layer(x), blas.linear_ref(x, layer.weight), rtol=1e-12, atol=1e-12)
    assert blas.transposed(layer.weight) is not first
    blas.forget([layer.weight])
    assert layer.weight not in blas._kept
    blas.transposed(layer.weight)
    n = len(blas._kept)
    del layer
    gc.collect()
    assert len(blas._kept) == n - 1  # held weakly: no copy outlives its weight


def _counting(monkeypatch) -> list:
    calls = []
    real = blas.linear

    def counted(*args):
        calls.append(args[0].shape)
        return real(*args)  # x, weight, bias, weight_t

    monkeypatch.setattr(blas, "linear", counted)
    return calls


def test_products_route_untracked_linears_and_leave_the_rest_to_torch(monkeypatch):
    calls = _counting(monkeypatch)
    layer = nn.Linear(16, 8).double()
    x = torch.randn(4, 16, dtype=torch.float64)
    want = layer(x)
    with torch.no_grad(), blas.products():
        got = layer(x)
    assert calls == [(4, 16)]
    torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)
    with blas.products():  # autograd tracks the weight: torch's product, and its gradient
        y = layer(x)
    assert len(calls) == 1 and y.requires_grad
    y.sum().backward()
    assert layer.weight.grad is not None
    with torch.no_grad(), blas.products():  # a dtype BLAS is not given here
        layer.bfloat16()(x.bfloat16())
    assert len(calls) == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_blas_runs_on_torchs_thread_count(threads):
    lib, prefix, suffix = blas.openblas()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        blas.linear(torch.randn(2, 8), torch.randn(3, 8))
        assert getattr(lib, f"{prefix}get_num_threads{suffix}")() == threads
        getattr(lib, f"{prefix}set_num_threads{suffix}")(3 - threads)  # set behind blas's back
        blas.linear(torch.randn(2, 8), torch.randn(3, 8))
        assert getattr(lib, f"{prefix}get_num_threads{suffix}")() == threads
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("impl", ["blas", "compiled_blas"])
@pytest.mark.parametrize("name", FIXED)
def test_the_blas_steps_send_the_mixers_dense_products_to_numpy(name, impl, monkeypatch):
    torch.manual_seed(0)
    m = mixer_class(name)(D).to(torch.float64).eval()
    n_linear = sum(isinstance(layer, nn.Linear) for layer in m.modules())
    assert fast_steps(m, batch=2, impl=impl) == {"": impl}
    calls = _counting(monkeypatch)
    counters.clear()
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        decode(m, torch.randn(2, 5, D, dtype=torch.float64), 2)  # 2 prefilled (torch's products), 3 stepped
    assert len(calls) == 3 * n_linear, f"{name}: {len(calls)} products through numpy in 3 steps, {n_linear} layers"
    # compiled whole: the products are an op in the graph, not a break in it, and dynamo
    # traced nothing it had to give up on (the mode's setup, say)
    assert not counters["graph_break"], f"{name}: {dict(counters['graph_break'])}"
    assert not [w for w in seen if "_dynamo" in w.filename], [str(w.message)[:200] for w in seen]


def test_a_step_form_that_cannot_run_here_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(blas, "available", lambda: False)
    m = mixer_class("gla")(D)
    with pytest.raises(ValueError, match="step_impl='blas' cannot run here.*eager"):
        fast_steps(m, batch=1, impl="blas")


def test_auto_drops_the_transposed_copies_of_a_mixer_that_keeps_another_form(monkeypatch):
    import zoo.stepping as stepping

    def first_eager(fns, device, repeats):  # every form runs once, as timing them would
        for fn in fns.values():
            fn()
        return "eager", {}

    monkeypatch.setattr(stepping, "fastest", first_eager)
    m = mixer_class("gla")(D).eval()
    assert fast_steps(m, batch=1, impl="auto") == {"": "eager"}
    assert not any(p in blas._kept for p in m.parameters())
    fast_steps(m, batch=1, impl="blas")
    with torch.no_grad():
        decode(m, torch.randn(1, 3, D), 1)
    assert any(p in blas._kept for p in m.parameters())
