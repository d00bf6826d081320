"""Every CUDA branch of the zoo, taken on CPU, through the real packages.

Each test lets one kernel run on CPU tensors (``Kernel.devices`` gains "cpu"), so the
mixer's own dispatch picks its CUDA branch and makes exactly the call it makes on a GPU,
from its own weights (moved off their init), at odd shapes. The call reaches the real
mamba-ssm / flash-linear-attention code: their Triton kernels under Triton's interpreter,
or, where the kernel is compiled CUDA, the package's own Python reference of the same
signature (tests/kernel_standins.py stands in for the compiled modules so that the
packages import). Output and every gradient are compared with the mixer's torch path
on the same weights (``torch_only()``). A spy counts the kernel's calls and the recorded
``backend`` must name the branch, so deleting a CUDA branch's call fails a test here.
fp32 throughout: the interpreter's bf16 arithmetic is wrong (the GPU check covers bf16).
"""
import functools
import warnings

import pytest
import torch

import kernel_standins
import zoo
from zoo.mixers.mamba import MAMBA_INNER
from zoo.mixers.mamba2 import MAMBA2_FUSED
from zoo.ops.delta_rule import CHUNK_GATED_DELTA_RULE, delta_recurrent_backend, gated_delta_rule, gated_delta_rule_chunked
from zoo.ops.fastpath import torch_only
from zoo.ops.gla import CHUNK_GLA, FUSED_RECURRENT_GLA, gla, gla_chunked
from zoo.ops.rwkv6 import CHUNK_RWKV6, FUSED_RECURRENT_RWKV6
from zoo.ops.selective_scan import SELECTIVE_SCAN
from zoo.ops.ssd import SSD_SCAN
from zoo.ops.ssm_step import CAUSAL_CONV1D_UPDATE, SELECTIVE_STATE_UPDATE

WHY = kernel_standins.available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"real kernel packages: {WHY}")


@pytest.fixture(scope="module")
def pkgs():
    return kernel_standins.install()


@pytest.fixture
def route(monkeypatch, pkgs):
    """route(kernel, fn=None): resolve the kernel against the installed package (its
    guard must pass), let it run on CPU, and count its calls; ``fn`` replaces a compiled
    kernel by its package's Python reference. Returns the list of calls."""
    def _route(kernel, fn=None):
        kernel.resolve()
        assert kernel.why_not is None, kernel.why_not
        calls, target = [], fn or kernel.fn

        def spy(*args, **kwargs):
            calls.append(1)
            return target(*args, **kwargs)

        monkeypatch.setattr(kernel, "fn", spy)
        monkeypatch.setattr(kernel, "devices", ("cuda", "cpu"))
        return calls
    return _route


def off(monkeypatch, kernel):
    """The kernel unusable, as on an install that lacks it (it warns once)."""
    monkeypatch.setattr(kernel, "fn", None)
    monkeypatch.setattr(kernel, "devices", ("cuda", "cpu"))


def compare(name, options, backend, d_model, B=2, L=37, rtol=2e-4, atol=2e-5):
    """The mixer's dispatched path against its torch path: output, dL/dx, every dL/dW."""
    torch.manual_seed(0)
    fast = zoo.build_mixer(name, d_model, **options)
    with torch.no_grad():
        for p in fast.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ref = zoo.build_mixer(name, d_model, **options)
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(B, L, d_model, requires_grad=True)
    dy = torch.randn(B, L, d_model)

    def run(m):
        y = m(x)
        return [y, *torch.autograd.grad(y, [x, *m.parameters()], dy)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the one fallback warning
        got = run(fast)
    with torch_only():
        want = run(ref)
    assert fast.backend == backend, fast.backend
    assert ref.backend == "torch_chunked"
    names = ["out", "x", *(n for n, _ in fast.named_parameters())]
    for n, a, b in zip(names, got, want):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol * b.abs().max().item(),
                                   msg=lambda m: f"{name} {n}: {m}")


def compare_op(fast, chunked, args, h0, names: str):
    """An op with what a mixer does not pass (an initial state, the final state, a scale)
    against its chunked torch path: output, final state and every gradient."""
    inputs = [t.requires_grad_() for t in (*args, h0)]
    got, want = (fn(*inputs[:-1], scale=0.3, initial_state=inputs[-1], output_final_state=True)
                 for fn in (fast, chunked))
    dy = [torch.randn_like(t) for t in want]
    loss = [sum((a * b).sum() for a, b in zip(out, dy)) for out in (got, want)]
    for n, a, b in zip(["o", "S", *(f"d{x}" for x in names.split()), "dh0"],
                       [*got, *torch.autograd.grad(loss[0], inputs)],
                       [*want, *torch.autograd.grad(loss[1], inputs)]):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5 * b.abs().max().item(), msg=n)


def test_mamba_fused_through_mamba_inner_ref(route, pkgs):
    calls = route(MAMBA_INNER, pkgs.mamba_inner_ref)
    compare("mamba", {"d_state": 5, "chunk_size": 16}, "mamba_ssm_fused", d_model=24)
    assert calls


def test_mamba_scan_through_selective_scan_ref(route, pkgs, monkeypatch):
    off(monkeypatch, MAMBA_INNER)
    calls = route(SELECTIVE_SCAN, pkgs.selective_scan_ref)
    compare("mamba", {"d_state": 5, "chunk_size": 16}, "mamba_ssm_scan", d_model=24)
    assert calls


@pytest.mark.parametrize("ngroups", [1, 2])
def test_mamba2_fused_block_through_its_triton_kernels(route, ngroups):
    calls = route(MAMBA2_FUSED)
    compare("mamba2", {"d_state": 8, "headdim": 16, "ngroups": ngroups, "chunk_size": 16},
            "mamba_ssm_fused", d_model=32)
    assert calls


def test_mamba2_scan_only_through_its_triton_kernels(route, monkeypatch):
    off(monkeypatch, MAMBA2_FUSED)
    calls = route(SSD_SCAN)
    compare("mamba2", {"d_state": 8, "headdim": 16, "chunk_size": 16}, "mamba_ssm_ssd",
            d_model=32)
    assert calls


@pytest.mark.parametrize("name,options", [("rwkv6", {"head_size": 16}), ("retnet", {"n_heads": 2})])
def test_rwkv6_and_retnet_through_fla_chunk_rwkv6(route, name, options):
    calls = route(CHUNK_RWKV6)
    compare(name, options, "fla", d_model=32)
    assert calls


def test_gla_through_fla_chunk_gla(route):
    calls = route(CHUNK_GLA)
    compare("gla", {"n_heads": 2}, "fla", d_model=32)
    assert calls
    # The op too, with what the mixer does not pass: an initial state (chunk_gla wants
    # it in fp32), the final state, a scale; against the chunked path, every gradient.
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 21, 2, 8, generator=g) for _ in range(2))
    v = torch.randn(2, 21, 2, 16, generator=g)
    gk = torch.nn.functional.logsigmoid(torch.randn(2, 21, 2, 8, generator=g)) / 4
    h0 = torch.randn(2, 2, 8, 16, generator=g)
    compare_op(gla, gla_chunked, [q, k, v, gk], h0, "q k v gk")
    assert len(calls) == 2


def test_gated_deltanet_through_fla_chunk_gated_delta_rule(route):
    calls = route(CHUNK_GATED_DELTA_RULE)
    compare("gated_deltanet", {"n_heads": 2}, "fla", d_model=32)  # head dims 12 and 24
    assert calls
    # The op with what the mixer does not pass: an initial state, the final state, a
    # scale; against the chunked path, outputs and every gradient.
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 21, 2, 8, generator=g)
    k = torch.nn.functional.normalize(torch.randn(2, 21, 2, 8, generator=g), dim=-1)
    v = torch.randn(2, 21, 2, 16, generator=g)
    gate = torch.nn.functional.logsigmoid(torch.randn(2, 21, 2, generator=g))
    beta = torch.rand(2, 21, 2, generator=g)
    h0 = torch.randn(2, 2, 8, 16, generator=g)
    compare_op(gated_delta_rule, functools.partial(gated_delta_rule_chunked, chunk_size=16),
               [q, k, v, gate, beta], h0, "q k v g beta")
    assert len(calls) == 2


def test_causal_conv1d_without_its_cpp_functions_falls_back(monkeypatch, pkgs):
    """A causal-conv1d that mamba_ssm imports without the C++ functions its fused blocks
    call (the 1.4-style install): the guards refuse both fused kernels, the mixers warn
    once, name the package, and run a path that works instead of crashing mid-run."""
    import mamba_ssm.ops.selective_scan_interface as ssi
    import mamba_ssm.ops.triton.ssd_combined as ssd

    for mod in (ssi, ssd):
        for name in ("causal_conv1d_fwd_function", "causal_conv1d_bwd_function"):
            monkeypatch.setattr(mod, name, None)
        monkeypatch.setattr(mod, "causal_conv1d_cuda", None, raising=False)
    for kernel in (MAMBA_INNER, MAMBA2_FUSED, SSD_SCAN, SELECTIVE_SCAN):
        monkeypatch.setattr(kernel, "devices", ("cuda", "cpu"))
        kernel.resolve()
    assert "causal_conv1d_fwd_function" in MAMBA_INNER.why_not
    assert "mamba-ssm" in MAMBA2_FUSED.why_not and SSD_SCAN.why_not is None
    x = torch.randn(1, 9, 32)
    with pytest.warns(RuntimeWarning, match="mamba_split_conv1d_scan_combined cannot run"):
        m2 = zoo.build_mixer("mamba2", 32, d_state=8, headdim=16)
        m2(x)
    assert m2.backend == "mamba_ssm_ssd"  # the scan kernel needs no conv: still taken
    monkeypatch.setattr(SELECTIVE_SCAN, "fn", pkgs.selective_scan_ref)
    with pytest.warns(RuntimeWarning, match="mamba_inner_fn cannot run.*mamba-ssm 2"):
        m1 = zoo.build_mixer("mamba", 32)
        m1(x)
    assert m1.backend == "mamba_ssm_scan"
    for kernel in (MAMBA_INNER, MAMBA2_FUSED, SSD_SCAN, SELECTIVE_SCAN):
        kernel.resolve()  # leave them as the installed packages make them


def test_fused_blocks_are_not_taken_for_shapes_their_kernels_reject(route, pkgs):
    """mamba_ssm's fused Mamba-2 block asserts conv channels % 8 == 0 and causal-conv1d
    takes widths 2-4: such mixers take the next path instead of raising mid-run."""
    route(MAMBA2_FUSED)
    route(MAMBA_INNER, pkgs.mamba_inner_ref)
    m2 = zoo.build_mixer("mamba2", 32, d_state=5, headdim=16)  # conv channels 64 + 10
    m2(torch.randn(1, 9, 32))
    assert m2.conv_dim % 8 and m2.backend == "torch_chunked"
    m1 = zoo.build_mixer("mamba", 24, d_conv=5)
    m1(torch.randn(1, 9, 24))
    assert m1.backend == "cpu_fused"  # not mamba_ssm's fused block: on CPU, the C++ scan


@pytest.mark.parametrize("name, options", [("mamba", {"d_state": 5}),
                                           ("mamba2", {"d_state": 8, "headdim": 16, "ngroups": 2})])
def test_decode_steps_through_the_state_update_kernels(route, name, options):
    """The step form's CUDA branch: causal-conv1d's causal_conv1d_update (its Python
    reference, in place on the conv state) and mamba_ssm's selective_state_update (Triton,
    interpreted), against the torch step on the same weights, after a prefill."""
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_update_ref
    from test_decode import decode
    conv_calls = route(CAUSAL_CONV1D_UPDATE, causal_conv1d_update_ref)
    ssm_calls = route(SELECTIVE_STATE_UPDATE)
    torch.manual_seed(0)
    m = zoo.build_mixer(name, 32, **options).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
        x = torch.randn(3, 12, 32)
        got, state = decode(m, x, prompt=5)
        assert m.backend == "mamba_ssm_step"
        with torch_only():
            want, want_state = decode(m, x, prompt=5)
    assert len(conv_calls) == len(ssm_calls) == 7  # one per stepped token
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-5 * want.abs().max().item())
    for key in want_state:
        torch.testing.assert_close(state[key], want_state[key], rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("name, kernel, backend", [("gla", FUSED_RECURRENT_GLA, "fla_recurrent"),
                                                   ("rwkv6", FUSED_RECURRENT_RWKV6, "fla_recurrent"),
                                                   ("retnet", FUSED_RECURRENT_RWKV6, "fla_recurrent"),
                                                   ("gated_deltanet", CAUSAL_CONV1D_UPDATE, None)])
def test_linear_attention_decode_steps_through_their_step_kernels(route, name, kernel, backend):
    """The step on CUDA: GLA's, RWKV-6's and RetNet's through fla's fused_recurrent kernels
    (Triton, interpreted), Gated DeltaNet's conv through causal-conv1d's update (its Python
    reference; its delta rule on the CPU's fused step where it builds), against the torch
    step on the same weights after a prefill; deleting a branch fails the count."""
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_update_ref
    from test_decode import decode
    calls = route(kernel, causal_conv1d_update_ref if kernel is CAUSAL_CONV1D_UPDATE else None)
    torch.manual_seed(0)
    m = zoo.build_mixer(name, 32, **({"head_size": 16} if name == "rwkv6" else {"n_heads": 2})).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
        x = torch.randn(3, 12, 32)
        with torch_only():
            want, want_state = decode(m, x, prompt=5)
            assert m.backend == "torch_step"
        got, state = decode(m, x, prompt=5)  # the prefill's chunk kernel is not routed: it runs torch
        assert m.backend == (backend or delta_recurrent_backend(x))
    assert len(calls) == 7
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-5 * want.abs().max().item())
    for key in want_state:
        torch.testing.assert_close(state[key], want_state[key], rtol=2e-4, atol=2e-5)
