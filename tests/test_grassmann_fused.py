"""The fast Grassmann cores (factored torch, torch.compile, Triton) against the eager
reference ``grassmann_features``: outputs and the gradients of z / h and every weight.

On a CPU-only machine the Triton kernels run through Triton's interpreter: the
variable must be set before the kernels are decorated, which happens when
``zoo.ops.grassmann_triton`` is first imported (lazily, by the fused path).
"""
import itertools
import os
import sys
import time

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from zoo.mixers.grassmann import IMPL_FNS, Grassmann  # noqa: E402
from zoo.ops.grassmann import grassmann_features, plucker  # noqa: E402
from zoo.ops import grassmann as ops  # noqa: E402
from zoo.ops.grassmann import (grassmann_features_factored, grassmann_features_fused,  # noqa: E402
                               valid_counts)

DEVICE = "cuda" if CUDA else "cpu"
OFFSETS = (1, 3, 5, 40)  # 40 > L: never has a partner
CORE = list(itertools.product(("past", "future"), (True, False), ("mean", "sum")))


def _why_no_fused() -> str | None:
    if ops.triton is None:
        return "triton is not installed"
    if ops.fused_backend(torch.device(DEVICE)) is None:
        return ("the Triton kernels were imported before TRITON_INTERPRET=1 was set, "
                "or it is set to 0")
    return None


needs_triton = pytest.mark.skipif(_why_no_fused() is not None, reason=str(_why_no_fused()))
cuda_only = pytest.mark.skipif(not CUDA, reason="needs CUDA (Triton's interpreter gets half "
                                                "precision arithmetic wrong)")


def core_inputs(B=3, L=37, r=8, D=48, dtype=torch.float32, seed=0, degenerate=True):
    """z with a few degenerate pairs (z_t ∧ z_{t-1} = 0 and z_t ∥ z_{t-3})."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, L, r, generator=g, dtype=torch.float64)
    if degenerate and L > 20:
        z[:, 10] = z[:, 9]
        z[:, 20] = -2 * z[:, 17]
    weight = torch.randn(D, r * (r - 1) // 2, generator=g, dtype=torch.float64) / r
    bias = torch.randn(D, generator=g, dtype=torch.float64)
    return [x.to(DEVICE, dtype).requires_grad_() for x in (z, weight, bias)]


def grads(fn, inputs, seed=1):
    out = fn(*inputs)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64).to(out)
    return (out, *torch.autograd.grad(out, inputs, dout))


def assert_same(fast, ref, rtol, atol):
    for name, a, b in zip(("out", "d_first", "d_weight", "d_bias"), fast, ref):
        torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=atol,
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("n, chunk", [(37, 1), (37, 5), (37, 37), (37, 64)])
def test_chunked_bilinear_matches_the_outer_product(n, chunk):
    """The CPU form of identity 2 (chunks of tokens, the outer product recomputed in the
    backward) against the plain outer product and matmul, on every gradient, and with
    only some inputs needing one."""
    g = torch.Generator().manual_seed(n + chunk)
    z, W, K = (torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()
               for shape in ((n, 5), (n, 5), (25, 7)))
    assert torch.autograd.gradcheck(lambda *x: ops.ChunkedBilinear.apply(*x, chunk), (z, W, K))
    plain = ((z[:, :, None] * W[:, None, :]).flatten(1) @ K, *torch.autograd.grad(
        ((z[:, :, None] * W[:, None, :]).flatten(1) @ K).sum(), (z, W, K)))
    out = ops.ChunkedBilinear.apply(z, W, K, chunk)
    for a, b in zip((out, *torch.autograd.grad(out.sum(), (z, W, K))), plain):
        torch.testing.assert_close(a, b)
    dz, = torch.autograd.grad(ops.ChunkedBilinear.apply(z, W.detach(), K.detach(), chunk).sum(), (z,))
    torch.testing.assert_close(dz, plain[1])
    v = torch.ones_like(out, requires_grad=True)
    dz, = torch.autograd.grad(ops.ChunkedBilinear.apply(z, W, K, chunk), (z,), v, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):  # no silent second derivative
        dz.sum().backward()


def test_bilinear_runs_chunked_on_cpu_and_plain_under_compile(monkeypatch):
    z, W = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    K = torch.randn(4, 4, 6)
    plain = (z[..., :, None] * W[..., None, :]).flatten(-2) @ K.flatten(0, 1)
    calls, real = [], ops.ChunkedBilinear.apply
    monkeypatch.setattr(ops.ChunkedBilinear, "apply", lambda *a: calls.append(a[3]) or real(*a))
    torch.testing.assert_close(ops.bilinear(z, W, K), plain)
    assert calls == [(1 << 18) // 16]  # chunks of 1 MB of float32 outer products
    monkeypatch.setattr(ops.torch.compiler, "is_compiling", lambda: True)
    torch.testing.assert_close(ops.bilinear(z, W, K), plain)
    assert len(calls) == 1


def test_core_inputs_cover_both_sides_of_eps():
    z = core_inputs()[0].detach().double()
    norms = plucker(z[:, 1:], z[:, :-1]).norm(dim=-1)
    assert (norms < 6.0).any() and (norms > 6.0).any() and (norms < 1e-12).any()


@pytest.mark.parametrize("pairing,normalize,aggregate", CORE)
def test_factored_matches_eager_float64(pairing, normalize, aggregate):
    inputs = core_inputs(dtype=torch.float64)
    args = (OFFSETS, pairing, normalize, 6.0, aggregate)
    ref = grads(lambda *x: grassmann_features(*x, *args), inputs)
    fast = grads(lambda *x: grassmann_features_factored(*x, *args), inputs)
    assert_same(fast, ref, rtol=1e-9, atol=1e-9)


@needs_triton
@pytest.mark.parametrize("pairing,normalize,aggregate", CORE)
def test_fused_matches_eager_float32(pairing, normalize, aggregate):
    inputs = core_inputs()
    args = (OFFSETS, pairing, normalize, 6.0, aggregate)
    ref = grads(lambda *x: grassmann_features(*[t.double() for t in x], *args), inputs)
    fast = grads(lambda *x: grassmann_features_fused(*x, *args), inputs)
    assert fast[0].dtype == torch.float32
    assert_same(fast, ref, rtol=1e-4, atol=1e-4)


@needs_triton
@pytest.mark.parametrize("r,D,L", [(5, 20, 150), (8, 80, 9), (3, 17, 2)])
def test_fused_odd_sizes(r, D, L):
    """r below and off a power of two (padded to 16), D across several blocks, L over
    several token tiles and L shorter than most offsets."""
    inputs = core_inputs(B=2, L=L, r=r, D=D)
    args = ((1, 2, 33), "past", True, 1e-6, "mean")
    ref = grads(lambda *x: grassmann_features(*[t.double() for t in x], *args), inputs)
    fast = grads(lambda *x: grassmann_features_fused(*x, *args), inputs)
    assert_same(fast, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", ["factored", pytest.param("fused", marks=needs_triton)])
@pytest.mark.parametrize("mixing,pairing", [("blend", "past"), ("gated_residual", "future")])
def test_mixer_impls_match_eager(impl, mixing, pairing):
    """Gradients of the input and of every weight (W_red, W_plü + bias, W_gate)."""
    torch.manual_seed(0)
    opts = dict(r=8, offsets=OFFSETS, pairing=pairing, mixing=mixing, eps=1e-3)
    ref = Grassmann(48, impl="eager", **opts).to(DEVICE)
    fast = Grassmann(48, impl=impl, **opts).to(DEVICE)
    fast.load_state_dict(ref.state_dict())
    h = torch.randn(3, 37, 48, device=DEVICE, requires_grad=True)
    results = []
    for m in (ref, fast):
        y = m(h)
        dh, *dp = torch.autograd.grad(y, [h, *m.parameters()], torch.ones_like(y) / y.numel())
        results.append([y, dh, *dp])
    names = ["out", "dh"] + [n for n, _ in ref.named_parameters()]
    for name, a, b in zip(names, *results):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
    expected = {"factored": "factored", "fused": "triton" if CUDA else "triton_interpret"}
    assert ref.backend == "eager" and fast.backend == expected[impl]


def test_factored_handles_half_and_tiny_inputs():
    m = Grassmann(64, impl="factored")
    for dtype in (torch.float32, torch.bfloat16):
        for B, L in ((1, 1), (2, 7), (3, 37)):
            y = m.to(dtype)(torch.randn(B, L, 64, dtype=dtype))
            assert y.shape == (B, L, 64) and y.dtype == dtype and torch.isfinite(y.float()).all()


@pytest.mark.parametrize("impl", ["factored", pytest.param("fused", marks=needs_triton)])
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_repeated_tokens_match_eager_in_float32(impl, eps):
    """A repeated token (h_t = h_{t-Δ}, as at the first layer) wedges to exactly 0 in
    the reference. A naive factorisation adds that partner as w / eps = 1e6 w and
    rounds it back into O(1) errors; the projected partner keeps it exact.

    Gradients are compared at eps = 1e-2 against float64: at such a pair the
    reference's gradient is d(z_t ∧ w) / eps, whose two halves (through z_t and
    through w = z_t) cancel in dW_red; at eps = 1e-6 that cancellation amplifies
    float32 rounding by 1e6 in ANY formulation, the reference's included."""
    torch.manual_seed(0)
    ref = Grassmann(48, r=8, offsets=(1, 2, 4), eps=eps).to(DEVICE)
    fast = Grassmann(48, r=8, offsets=(1, 2, 4), eps=eps, impl=impl).to(DEVICE)
    fast.load_state_dict(ref.state_dict())
    h = torch.randn(2, 37, 48, device=DEVICE)
    h[:, 5:9] = h[:, 4:5]  # pairs at offsets 1, 2, 4 with identical tokens
    h[:, 20] = -2 * h[:, 18]  # an exactly (anti)parallel pair at offset 2
    torch.testing.assert_close(fast(h), ref(h), rtol=1e-4, atol=1e-5)
    if eps < 1e-3:
        return
    h.requires_grad_()
    outs = []
    for m, x in ((ref.double(), h.double()), (fast, h)):
        y = m(x)
        outs.append(torch.autograd.grad(y, [h, *m.parameters()], torch.ones_like(y)))
    for a, b in zip(outs[1], outs[0]):
        assert (a.double() - b).norm() <= 1e-4 * b.norm()


@pytest.mark.parametrize("impl", ["factored", pytest.param("fused", marks=needs_triton)])
def test_near_parallel_pairs_keep_gradients_finite(impl):
    """Nearly parallel pairs (|z ∧ w| at rounding level, where normalising is
    ill-conditioned in any formulation) give finite outputs and gradients."""
    z = torch.randn(2, 16, 8)
    z[:, 1::2] = z[:, 0::2] * 3.0 + 1e-7  # every odd token parallel to its predecessor
    inputs = [x.to(DEVICE).requires_grad_() for x in (z, torch.randn(12, 28), torch.randn(12))]
    fn = grassmann_features_factored if impl == "factored" else grassmann_features_fused
    for eps in (1e-6, 1e-30):
        out = grads(lambda *x: fn(*x, (1, 2), eps=eps), inputs)
        assert all(torch.isfinite(t).all() for t in out)


def test_fused_refuses_clearly(monkeypatch):
    z, w, b = core_inputs(B=1, L=5)
    if _why_no_fused() is None:
        with pytest.raises(ValueError, match="float64"):
            grassmann_features_fused(z.double(), w.double(), b.double(), (1,))
    if not CUDA:  # kernels compiled for a GPU cannot take CPU tensors
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        monkeypatch.delitem(sys.modules, "zoo.ops.grassmann_triton", raising=False)
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            grassmann_features_fused(z, w, b, (1,))
    monkeypatch.setattr(ops, "triton", None)
    with pytest.raises(RuntimeError, match="triton is not importable"):
        grassmann_features_fused(z, w, b, (1,))
    monkeypatch.setattr("zoo.mixers.grassmann.triton", None)
    with pytest.raises(ValueError, match="impl='fused' needs triton"):
        Grassmann(16, r=4, impl="fused")
    with pytest.raises(ValueError, match="impl="):
        Grassmann(16, r=4, impl="cuda")


def test_compile_failure_is_clear_and_auto_falls_back(monkeypatch):
    def broken(*args):
        raise OSError("no C++ compiler")

    monkeypatch.setattr(ops, "_compiled", broken)
    monkeypatch.setattr(Grassmann, "auto_choices", {})
    h = torch.randn(2, 9, 16)
    with pytest.raises(RuntimeError, match="torch.compile of the factored core failed"):
        Grassmann(16, r=4, impl="compiled")(h)
    auto, ref = Grassmann(16, r=4, impl="auto"), Grassmann(16, r=4)
    auto.load_state_dict(ref.state_dict())
    if not CUDA:
        torch.testing.assert_close(auto(h), ref(h))
        assert auto.backend == "factored"
        (choice, times), = Grassmann.auto_choices.values()
        assert choice == "factored" and times["compiled"] == float("inf") and times["factored"] > 0


def test_auto_runs_the_measured_fastest(monkeypatch):
    """auto runs whichever implementation its measurement found fastest, once per shape
    bucket: here 'compiled' is made slow, then fast, by a stand-in."""
    monkeypatch.setattr(Grassmann, "auto_choices", {})
    delay = {"compiled": 0.05}

    def slow_compiled(*args):
        time.sleep(delay["compiled"])
        return grassmann_features_factored(*args)

    monkeypatch.setitem(IMPL_FNS, "compiled", slow_compiled)
    ref = Grassmann(16, r=4)
    auto = Grassmann(16, r=4, impl="auto")
    auto.load_state_dict(ref.state_dict())
    h = torch.randn(2, 9, 16, requires_grad=True)
    torch.testing.assert_close(auto(h), ref(h))
    assert auto.backend == "factored"
    (bucket, (choice, times)), = Grassmann.auto_choices.items()
    assert bucket[:3] == ("cpu", torch.float32, True)  # timed with the backward pass
    # relative, not against the 0.05 s: on a loaded CPU even this tiny shape has taken 0.052 s
    assert times["compiled"] >= 0.05 and times["compiled"] > times["factored"]
    auto(torch.randn(2, 10, 16, requires_grad=True))  # same bucket: not measured again
    assert len(Grassmann.auto_choices) == 1
    with torch.no_grad():  # another bucket (forward only): measured anew, now compiled wins
        delay["compiled"] = 0.0
        monkeypatch.setitem(IMPL_FNS, "factored", lambda *a: time.sleep(0.05) or slow_compiled(*a))
        auto(h)
    assert auto.backend == "compiled" and len(Grassmann.auto_choices) == 2


@pytest.mark.slow
def test_compiled_and_auto_on_cpu():
    """torch.compile for real on a small shape (about a minute on 2 CPU cores)."""
    torch.manual_seed(0)
    ref = Grassmann(32, r=8, offsets=(1, 2, 40), eps=1e-3)
    fast = Grassmann(32, r=8, offsets=(1, 2, 40), eps=1e-3, impl="compiled")
    fast.load_state_dict(ref.state_dict())
    h = torch.randn(2, 37, 32, requires_grad=True)
    (dh_ref,) = torch.autograd.grad(ref(h).sum(), h)
    y = fast(h)
    (dh,) = torch.autograd.grad(y.sum(), h)
    torch.testing.assert_close(y, ref(h), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dh, dh_ref, rtol=1e-4, atol=1e-5)
    assert fast.backend == "compiled"


@pytest.mark.slow
def test_auto_picks_the_faster_of_factored_and_compiled_on_this_cpu(monkeypatch):
    """The issue's shape (d_model 256, 8,192 tokens, forward+backward): auto times both
    (never the interpreter's Triton) and runs the faster; its choice is no fixed rule."""
    monkeypatch.setattr(Grassmann, "auto_choices", {})
    m = Grassmann(256, impl="auto")
    h = torch.randn(8, 1024, 256, requires_grad=True)
    m(h).sum().backward()
    (choice, times), = Grassmann.auto_choices.values()
    assert set(times) == {"factored", "compiled"}
    assert m.backend == choice and times[choice] == min(times.values())
    print({k: round(v, 4) for k, v in times.items()})


def test_torch_only_runs_fused_as_factored():
    from zoo.ops import torch_only
    m = Grassmann(16, r=4, impl="fused")
    with torch_only():
        m(torch.randn(2, 9, 16))
    assert m.backend == "factored"


@cuda_only
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_half_precision_on_cuda(dtype):
    inputs = core_inputs(B=2, L=300, r=32, D=256, dtype=dtype, degenerate=False)
    args = ((1, 2, 4, 8, 12, 16), "past", True, 1e-6, "mean")
    ref = grads(lambda *x: grassmann_features(*[t.double() for t in x], *args), inputs)
    fast = grads(lambda *x: grassmann_features_fused(*x, *args), inputs)
    assert fast[0].dtype == dtype
    for a, b in zip(fast, ref):  # relative to each tensor's scale: half has 8-11 bits
        assert (a.double() - b).norm() <= 2e-2 * b.norm()


@cuda_only
@pytest.mark.cuda
def test_fused_activation_memory_is_linear_without_offsets_times_496():
    """Peak memory of forward + backward grows by a fixed number of bytes per token,
    below what one (|Δ|, 496) Plücker block per token would take; eager exceeds it."""
    D, r, offsets = 256, 32, (1, 2, 4, 8, 12, 16)
    plucker_bytes = len(offsets) * r * (r - 1) // 2 * 4  # per token, float32

    def peak(fn, L):
        z, w, _ = core_inputs(B=1, L=L, r=r, D=D)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn(z, w, None, offsets).sum().backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    fused = [peak(grassmann_features_fused, L) for L in (4096, 8192, 16384)]
    per_token = [(b - a) / L for a, b, L in zip(fused, fused[1:], (4096, 8192))]
    assert max(per_token) < plucker_bytes / 2, per_token  # no |Δ| x 496 term
    assert max(per_token) < 1.25 * min(per_token), per_token  # linear in L
    eager = [peak(grassmann_features, L) for L in (4096, 8192)]
    assert (eager[1] - eager[0]) / 4096 > plucker_bytes  # the bound can fail


@cuda_only
@pytest.mark.cuda
def test_auto_times_triton_on_cuda(monkeypatch):
    monkeypatch.setattr(Grassmann, "auto_choices", {})
    m = Grassmann(64, impl="auto").cuda()
    m(torch.randn(2, 33, 64, device="cuda"))
    (choice, times), = Grassmann.auto_choices.values()
    assert set(times) == {"fused", "factored", "compiled"}
    assert m.backend == ("triton" if choice == "fused" else choice)
    assert times[choice] == min(times.values())


def test_valid_counts():
    assert valid_counts(5, (1, 3, 8), "past").tolist() == [0, 1, 1, 2, 2]
    assert valid_counts(5, (1, 3, 8), "future").tolist() == [2, 2, 1, 1, 0]
