"""The fused C++ selective scan (zoo/ops/selective_scan_cpu.cpp through
zoo.ops.selective_scan_fused_cpu) against the step-by-step reference, the Mamba mixer on
it against the torch path, its float exp, and the build: cache, rebuild, fallback.

In float64 the kernel must match ``selective_scan_ref`` to rounding on the output, the
last state and every gradient; in float32 (its own exp) to about 1e-4.
"""
import itertools
import warnings

import pytest
import torch

import zoo
from test_selective_scan import make_inputs
from zoo.ops import cpu_kernels
from zoo.ops.fastpath import torch_only
from zoo.ops.selective_scan import (SCAN_CPP, SCAN_SIGNATURES, selective_scan,
                                    selective_scan_backend, selective_scan_chunked,
                                    selective_scan_fused_cpu, selective_scan_ref)

needs_kernel = pytest.mark.skipif(not cpu_kernels.available(SCAN_CPP),
                                  reason="the CPU kernel cannot be built here (see its warning)")


def outputs_and_grads(fn, inputs, **kw):
    """Output, last state and the gradient of every input of a random linear loss, its
    cotangents drawn in float64 whatever the dtype, so that dtypes can be compared."""
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if v is not None}
    out, last = fn(**{k: leaves.get(k) for k in inputs}, **kw)
    g = torch.Generator().manual_seed(1)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype)).sum()
               for t in (out, last))
    return out, last, dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def reference(**kw):
    return selective_scan_ref(**kw, return_last_state=True)


def fused(chunk_size):
    return lambda **kw: selective_scan_fused_cpu(**kw, return_last_state=True,
                                                 chunk_size=chunk_size)


def assert_same(got, want, rtol, atol):
    """(out, last, grads) of two implementations; atol relative to each tensor's scale."""
    (out, last, grads), (ref_out, ref_last, ref_grads) = got, want
    assert grads.keys() == ref_grads.keys()
    for name, a, b in [("out", out, ref_out), ("last state", last, ref_last),
                       *((f"grad of {k}", grads[k], ref_grads[k]) for k in grads)]:
        assert a.dtype == b.dtype, name
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol * max(1.0, b.abs().max().item()),
                                   msg=lambda m: f"{name}: {m}")


def assert_float32_close(x, softplus, chunk_size):
    """The kernel in float32 against the reference in float64."""
    want = outputs_and_grads(reference, x, delta_softplus=softplus)
    out, last, grads = outputs_and_grads(fused(chunk_size), {
        k: None if v is None else v.float() for k, v in x.items()}, delta_softplus=softplus)
    assert_same((out.double(), last.double(), {k: g.double() for k, g in grads.items()}), want,
                rtol=1e-4, atol=1e-4)


def inputs(L, n, G, dtype=torch.float64, **options):
    # batch 3: uneven slices over 2 threads; dim 6: not a multiple of a vector's width
    return make_inputs(L, batch=3, dim=6, dstate=n, bc="grouped" if G == 2 else "variable",
                       dtype=dtype, **options)


# every L with every T; n and G cycle through their values along the way
CASES = [(L, T, (1, 5, 16)[i % 3], (1, 2)[i % 2])
         for i, (L, T) in enumerate(itertools.product([1, 7, 63, 130], [1, 16, 64]))]


@needs_kernel
@pytest.mark.parametrize("L, T, n, G", CASES)
def test_float64_matches_reference(L, T, n, G):
    x = inputs(L, n, G)
    assert_same(outputs_and_grads(fused(T), x, delta_softplus=True),
                outputs_and_grads(reference, x, delta_softplus=True), rtol=1e-10, atol=1e-10)


@needs_kernel
@pytest.mark.parametrize("with_D, with_z, with_bias, softplus", [
    (False, False, False, False), (True, False, False, False), (False, True, False, True),
    (False, False, True, True), (True, True, True, False)])
def test_float64_option_subsets(with_D, with_z, with_bias, softplus):
    x = inputs(37, 5, 2, with_D=with_D, with_z=with_z, with_bias=with_bias)
    if not softplus:
        x["delta"] = x["delta"].abs()  # a positive step
    assert_same(outputs_and_grads(fused(8), x, delta_softplus=softplus),
                outputs_and_grads(reference, x, delta_softplus=softplus), rtol=1e-10, atol=1e-10)


@needs_kernel
def test_gradients_from_output_alone_and_last_state_alone():
    """The backward with no d(last state) (a null pointer) and with no d(out) (zeros)."""
    leaves = {k: v.requires_grad_() for k, v in inputs(21, 16, 1).items() if v is not None}
    for pick in (0, 1):  # out, last state
        got, want = (torch.autograd.grad(fn(**leaves, delta_softplus=True)[pick].square().sum(),
                                         list(leaves.values()), allow_unused=True,
                                         materialize_grads=True) for fn in (fused(4), reference))
        for name, a, b in zip(leaves, got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


@needs_kernel
def test_float32_and_bfloat16_close_to_float64():
    x = inputs(130, 16, 2)
    assert_float32_close(x, softplus=True, chunk_size=64)
    half = {k: v.bfloat16() if k in ("u", "delta", "B", "C", "z") else v.float()
            for k, v in x.items()}
    out, last = selective_scan_fused_cpu(**half, delta_softplus=True, return_last_state=True)
    ref = selective_scan_chunked(**half, delta_softplus=True)
    assert out.dtype == torch.bfloat16 and last.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)


@needs_kernel
def test_float_exp_on_steep_decays():
    """Steps with |dt A| up to hundreds (decays from ~1 down to underflow) in float32."""
    x = inputs(64, 16, 1, with_z=False)
    x["A"] = -torch.arange(1, 17, dtype=torch.float64).repeat(6, 1)  # S4D-real, as in Mamba
    x["delta"] = 10 * x["delta"].abs()
    assert_float32_close(x, softplus=False, chunk_size=16)


@needs_kernel
def test_float_exp_within_one_ulp():
    lib = cpu_kernels.library(SCAN_CPP, SCAN_SIGNATURES)
    x = torch.cat([torch.linspace(-87.3, 88.3, 200_001),
                   torch.tensor([-1e4, -88.0, 0.0, float("-inf"), float("nan")])])
    out = torch.empty_like(x)
    lib.exp_approx_f32(x.data_ptr(), out.data_ptr(), x.numel())
    exact, got = torch.exp(x[:-5].double()), out[:-5].double()
    ulp = (torch.nextafter(exact.float(), torch.tensor(float("inf"))) - exact.float()).double()
    assert ((got - exact).abs() / ulp).max() <= 1.0
    assert out[-5:-1].tolist() == [0.0, 0.0, 1.0, 0.0] and out[-1].isnan()


@needs_kernel
def test_float_softplus_close_to_exact():
    lib = cpu_kernels.library(SCAN_CPP, SCAN_SIGNATURES)
    x = torch.cat([torch.linspace(-100.0, 100.0, 200_001), torch.tensor([0.0, -1e4, 1e4])])
    out = torch.empty_like(x)
    lib.softplus_f32(x.data_ptr(), out.data_ptr(), x.numel())
    xd = x.double()
    exact = xd.clamp(min=0) + torch.log1p(torch.exp(-xd.abs()))
    normal = x > -87  # below, the exact value is a float denormal at most; the kernel gives 0
    assert ((out.double() - exact).abs() / exact)[normal].max() < 3e-7
    assert (out[~normal] <= 1e-37).all() and (out[~normal] >= 0).all()
    assert out[-3:].tolist() == [pytest.approx(0.6931472), 0.0, 1e4]


@needs_kernel
def test_views_of_the_batch_length_dim_layout_are_read_in_place():
    """Mamba's inputs: u, delta and z transposed views of (batch, L, dim) tensors (z with
    the time stride of a half of a wider projection), B and C views of (batch, L, n) slices
    of one projection; the same results as contiguous copies, and no copy of them made."""
    x = inputs(45, 16, 1)
    batch, dim, L = x["u"].shape
    wide = torch.randn(batch, L, 2 * dim, dtype=torch.float64)
    proj = torch.randn(batch, L, 3 + 2 * 16, dtype=torch.float64)
    views = {**x, "u": x["u"].transpose(1, 2).contiguous().transpose(1, 2),
             "delta": x["delta"].transpose(1, 2).contiguous().transpose(1, 2),
             "z": wide[..., dim:].transpose(1, 2), "B": proj[..., 3:19].transpose(1, 2),
             "C": proj[..., 19:].transpose(1, 2)}
    copies = {k: None if v is None else v.contiguous() for k, v in views.items()}
    assert_same(outputs_and_grads(fused(16), views, delta_softplus=True),
                outputs_and_grads(fused(16), copies, delta_softplus=True), rtol=1e-12, atol=1e-12)
    assert_same(outputs_and_grads(fused(16), views, delta_softplus=True),
                outputs_and_grads(reference, copies, delta_softplus=True), rtol=1e-10, atol=1e-10)
    seen = []
    with torch.profiler.profile() as prof:
        selective_scan_fused_cpu(**views, delta_softplus=True)
    seen = [e.key for e in prof.key_averages()]
    assert "aten::clone" not in seen and "aten::contiguous" not in seen and "aten::copy_" not in seen


@needs_kernel
def test_thread_slices_give_the_same_result():
    x = inputs(50, 16, 2)
    threads = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 3):
            torch.set_num_threads(n)
            runs.append(outputs_and_grads(fused(16), x, delta_softplus=True))
    finally:
        torch.set_num_threads(threads)
    assert_same(runs[1], runs[0], rtol=1e-12, atol=1e-12)  # torch's own sums may regroup


@needs_kernel
def test_dispatch_and_unsupported_inputs():
    x = inputs(9, 5, 1)
    assert selective_scan_backend(x["u"], x["A"], x["B"], x["C"]) == "cpu_fused"
    with torch_only():
        assert selective_scan_backend(x["u"]) == "torch_chunked"
    torch.testing.assert_close(selective_scan(**x), selective_scan_ref(**x), rtol=1e-10, atol=1e-10)
    invariant = make_inputs(9, bc="invariant")  # (dim, n) B and C: the torch path runs
    assert selective_scan_backend(invariant["u"], invariant["A"], invariant["B"]) == "torch_chunked"
    torch.testing.assert_close(selective_scan_fused_cpu(**invariant),
                               selective_scan_ref(**invariant), rtol=1e-10, atol=1e-10)
    leaves = {k: v.requires_grad_() for k, v in x.items() if v is not None}
    out = selective_scan_fused_cpu(**leaves)
    with torch_only():  # the kernel that ran forward also runs backward
        out.sum().backward()
    assert all(v.grad is not None for v in leaves.values())
    with pytest.raises(ValueError, match="complex"):
        selective_scan_fused_cpu(**{**x, "A": x["A"].to(torch.complex128)})
    with pytest.raises(ValueError, match="chunk_size"):
        selective_scan_fused_cpu(**x, chunk_size=0)


@needs_kernel
def test_mamba_runs_the_kernel_and_matches_the_torch_path(monkeypatch):
    torch.manual_seed(0)
    m = zoo.build_mixer("mamba", 24, chunk_size=16)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x = torch.randn(3, 37, 24, requires_grad=True)
    dy = torch.randn(3, 37, 24)

    def run():
        y = m(x)
        return m.backend, [y, *torch.autograd.grad(y, [x, *m.parameters()], dy)]

    backend, got = run()
    monkeypatch.setenv("LINBENCH_NO_CPU_KERNELS", "1")
    torch_backend, want = run()
    assert (backend, torch_backend) == ("cpu_fused", "torch_chunked")
    for name, a, b in zip(["out", "x", *(n for n, _ in m.named_parameters())], got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * b.abs().max().item(), msg=name)


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """An empty kernel cache and no library loaded in this process yet."""
    monkeypatch.setenv("LINBENCH_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("LINBENCH_NO_CPU_KERNELS", raising=False)
    monkeypatch.setattr(cpu_kernels, "_LIBS", {})
    monkeypatch.setattr(cpu_kernels, "_WHY_NOT", {})
    return tmp_path


@pytest.mark.parametrize("breakage, why", [
    ({"CXX": "/nonexistent/g++"}, r"no C\+\+ compiler"),
    ({"FLAGS": cpu_kernels.FLAGS + ("-fno-such-flag",)}, "failed to compile")])
def test_falls_back_to_torch_when_it_cannot_build(fresh_build, monkeypatch, breakage, why):
    for name, value in breakage.items():
        monkeypatch.setattr(cpu_kernels, name, value)
    x = inputs(9, 5, 2)
    with pytest.warns(RuntimeWarning, match=why):
        assert selective_scan_backend(x["u"]) == "torch_chunked"
    with warnings.catch_warnings():
        # warned once only (the mixer's conv kernel, which cannot build either, warns once too)
        warnings.filterwarnings("error", message=".*selective_scan_cpu")
        out = selective_scan_fused_cpu(**x, delta_softplus=True)
        assert zoo.build_mixer("mamba", 16)(torch.randn(1, 5, 16)).shape == (1, 5, 16)
    torch.testing.assert_close(out, selective_scan_chunked(**x, delta_softplus=True))
    assert list(fresh_build.iterdir()) == []  # no half-written library left behind


@needs_kernel
def test_cache_reuses_and_rebuilds_on_change(fresh_build, monkeypatch):
    assert cpu_kernels.library(SCAN_CPP) is not None
    (built,) = fresh_build.iterdir()
    stamp = built.stat().st_mtime_ns
    monkeypatch.setattr(cpu_kernels, "_LIBS", {})
    assert cpu_kernels.library(SCAN_CPP) is not None  # loaded again, not rebuilt
    assert list(fresh_build.iterdir()) == [built] and built.stat().st_mtime_ns == stamp
    monkeypatch.setattr(cpu_kernels, "_LIBS", {})
    monkeypatch.setattr(cpu_kernels, "FLAGS", cpu_kernels.FLAGS + ("-DLINBENCH_VARIANT",))
    assert cpu_kernels.library(SCAN_CPP) is not None
    assert len(list(fresh_build.iterdir())) == 2
    (row,) = [r for r in cpu_kernels.status() if r["kernel"].endswith(SCAN_CPP)]
    assert row["importable"] and row["why_not"] == ""


@needs_kernel
def test_loading_keeps_denormals():
    """No -ffast-math: its crtfastmath.o would turn on flush-to-zero for the whole process."""
    assert cpu_kernels.library(SCAN_CPP) is not None
    assert (torch.tensor([1e-39]) * 1.0).item() > 0
