"""The fused C++ matrix-state recurrences (zoo/ops/matrix_scan_cpu.cpp through
zoo.ops.matrix_scan) against the step-by-step references: the decay recurrence in RWKV-6's
form (``rwkv6_scan_ref``) and GLA's (``gla_ref``), and the gated delta rule
(``gated_delta_rule_ref``), on the output, the final state and every gradient (the bonus u,
the gates and the initial state included), at odd shapes and chunk sizes; one decay per head
and broadcast inputs; float32 against float64; and the mixers on them against their chunked
torch form.
"""
import pytest
import torch

from zoo.mixers.gated_deltanet import GatedDeltaNet
from zoo.mixers.gla import GLA
from zoo.mixers.retnet import RetNet
from zoo.mixers.rwkv6 import RWKV6
from zoo.ops import cpu_kernels
from zoo.ops.delta_rule import delta_rule_backend, gated_delta_rule_ref
from zoo.ops.matrix_scan import SCAN_CPP, decay_scan_fused_cpu, delta_scan_fused_cpu, fused_scan_runs
from zoo.ops.fastpath import torch_only
from zoo.ops.gla import gla_backend, gla_ref
from zoo.ops.rwkv6 import rwkv6_backend, rwkv6_scan_ref

needs_kernel = pytest.mark.skipif(not cpu_kernels.available(SCAN_CPP),
                                  reason="the CPU kernel cannot be built here (see its warning)")


def make_delta(B, L, H, K, V, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    k = torch.nn.functional.normalize(r(B, L, H, K), dim=-1)  # as the mixer's keys: beta k k^T contracts
    return {"q": r(B, L, H, K), "k": k, "v": r(B, L, H, V),
            "g": -torch.rand(B, L, H, generator=g, dtype=dtype), "beta": torch.rand(B, L, H, generator=g, dtype=dtype),
            "initial_state": r(B, H, K, V)}


def make(B, L, H, K, V, Kw=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    w = -torch.rand(B, L, H, Kw or K, generator=g, dtype=dtype) * 0.8  # log decays in (-0.8, 0]
    return {"q": r(B, L, H, K), "k": r(B, L, H, K), "v": r(B, L, H, V), "w": w, "u": r(H, K),
            "initial_state": r(B, H, K, V)}


def run(fn, x, **kw):
    """(o, final state, {input: gradient}) of a random linear loss of both outputs."""
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, S = fn(**leaves, output_final_state=True, **kw)
    g = torch.Generator().manual_seed(1)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype)).sum() for t in (o, S))
    return o, S, dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def reference(form):
    if form == "rwkv6":
        return lambda q, k, v, w, u, **kw: rwkv6_scan_ref(q, k, v, w, u, **kw)
    return lambda q, k, v, w, **kw: gla_ref(q, k, v, w.expand(q.shape), **kw)


def fused(chunk_size):
    return lambda q, k, v, w, u=None, **kw: decay_scan_fused_cpu(q, k, v, w, u, chunk_size=chunk_size, **kw)


def assert_same(got, want, rtol, atol):
    (o, S, grads), (o_ref, S_ref, grads_ref) = got, want
    assert grads.keys() == grads_ref.keys()
    for name, a, b in [("o", o, o_ref), ("final state", S, S_ref),
                       *((f"grad of {n}", grads[n], grads_ref[n]) for n in grads)]:
        torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=atol * max(1.0, b.abs().max().item()),
                                   msg=lambda m: f"{name}: {m}")


@needs_kernel
@pytest.mark.parametrize("form", ["rwkv6", "gla"])
@pytest.mark.parametrize("B, L, H, K, V, chunk", [(2, 13, 3, 5, 7, 4), (1, 1, 1, 3, 2, 64), (3, 37, 2, 32, 32, 16),
                                                  (2, 9, 1, 8, 64, 3), (1, 20, 2, 4, 6, 1), (2, 64, 2, 16, 16, 64)])
def test_float64_equals_the_reference(form, B, L, H, K, V, chunk):
    x = make(B, L, H, K, V)
    if form == "gla":
        del x["u"]
    assert_same(run(fused(chunk), x, scale=0.7), run(reference(form), x, scale=0.7), rtol=1e-10, atol=1e-10)


@needs_kernel
@pytest.mark.parametrize("B, L, H, K, V, chunk", [(2, 13, 3, 5, 7, 4), (1, 1, 1, 3, 2, 64), (3, 37, 2, 12, 24, 16),
                                                  (2, 9, 1, 8, 8, 3), (1, 20, 2, 4, 6, 1)])
def test_delta_rule_float64_equals_the_reference(B, L, H, K, V, chunk):
    x = make_delta(B, L, H, K, V)
    fused_delta = lambda **kw: delta_scan_fused_cpu(chunk_size=chunk, **kw)  # noqa: E731
    assert_same(run(fused_delta, x, scale=0.6), run(gated_delta_rule_ref, x, scale=0.6), rtol=1e-10, atol=1e-10)


@needs_kernel
def test_delta_rule_float32_against_float64_and_empty_sequences():
    x = make_delta(2, 70, 2, 24, 48)
    want = run(gated_delta_rule_ref, x)
    got = run(lambda **kw: delta_scan_fused_cpu(chunk_size=32, **kw), {n: t.float() for n, t in x.items()})
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    assert_same(got, want, rtol=1e-4, atol=2e-5)
    x = make_delta(1, 0, 2, 4, 4)
    o, S, _ = run(lambda **kw: delta_scan_fused_cpu(**kw), x)
    assert o.shape == (1, 0, 2, 4)
    torch.testing.assert_close(S, x["initial_state"])
    with pytest.raises(ValueError, match="chunk_size"):
        delta_scan_fused_cpu(*(x[n] for n in ("q", "k", "v", "g", "beta")), chunk_size=-1)


@needs_kernel
def test_one_decay_per_head_and_broadcast_inputs():
    """w (B, L, H, 1), and keys shared by heads through a stride-0 view (as Mamba-2's groups
    would pass them): gradients summed over what was broadcast, by autograd."""
    B, L, H, K, V = 2, 11, 4, 6, 5
    x = make(B, L, H, K, V, Kw=1)
    del x["u"]
    x["k"] = x["k"][:, :, :1].expand(B, L, H, K)
    want = run(reference("gla"), x)
    assert_same(run(fused(4), x), want, rtol=1e-10, atol=1e-10)
    assert want[2]["k"].shape == (B, L, H, K)


@needs_kernel
@pytest.mark.parametrize("form", ["rwkv6", "gla"])
def test_float32_against_float64(form):
    x = make(2, 70, 2, 32, 32)
    if form == "gla":
        del x["u"]
    want = run(reference(form), x)
    got = run(fused(32), {n: t.float() for n, t in x.items()})
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    assert_same(got, want, rtol=1e-4, atol=2e-5)


@needs_kernel
def test_bf16_inputs_accumulate_in_float32_and_empty_sequences_pass_the_state():
    x = make(2, 5, 2, 4, 4)
    o, S = decay_scan_fused_cpu(*(x[n].bfloat16() for n in "qkvwu"), initial_state=x["initial_state"],
                                output_final_state=True)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    x = make(2, 0, 2, 4, 4)
    o, S, grads = run(fused(8), x)
    assert o.shape == (2, 0, 2, 4)
    torch.testing.assert_close(S, x["initial_state"])
    with pytest.raises(ValueError, match="chunk_size"):
        decay_scan_fused_cpu(*(x[n] for n in "qkvwu"), chunk_size=0)
    with pytest.raises(ValueError, match="w's last dim"):
        decay_scan_fused_cpu(x["q"], x["k"], x["v"], x["w"][..., :2])


@needs_kernel
@pytest.mark.parametrize("cls", [RWKV6, GLA, GatedDeltaNet, RetNet])
def test_the_mixers_run_it_and_match_their_chunked_form(cls):
    torch.manual_seed(0)
    m = cls(64).double()
    x = torch.randn(2, 37, 64, dtype=torch.float64, requires_grad=True)
    y = m(x)
    assert m.backend == "cpu_fused"
    grads = torch.autograd.grad(y.square().sum(), [x, *m.parameters()])
    with torch_only():
        y_ref = m(x)
        assert m.backend == "torch_chunked"
        grads_ref = torch.autograd.grad(y_ref.square().sum(), [x, *m.parameters()])
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_off_the_cpu_or_with_kernels_off_the_chunked_forms_run(monkeypatch):
    x = torch.zeros(1, 2, 1, 4)
    monkeypatch.setenv("LINBENCH_NO_CPU_KERNELS", "1")
    assert not fused_scan_runs(x)
    assert rwkv6_backend(x) == gla_backend(x) == delta_rule_backend(x) == "torch_chunked"
    assert not fused_scan_runs(torch.zeros(1, device="meta"))


@needs_kernel
def test_two_threads_split_the_batch_and_change_no_bit():
    """Each thread runs a slice of the batch and writes only its rows (RWKV-6's du per row,
    summed after): the results equal one thread's bit for bit."""
    x, xd = make(5, 33, 3, 8, 16, dtype=torch.float32), make_delta(5, 33, 3, 8, 16, dtype=torch.float32)
    threads = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            runs.append((run(fused(8), x), run(lambda **kw: delta_scan_fused_cpu(chunk_size=8, **kw), xd)))
    finally:
        torch.set_num_threads(threads)
    for (o1, S1, g1), (o2, S2, g2) in zip(*runs):
        assert torch.equal(o1, o2) and torch.equal(S1, S2) and all(torch.equal(g1[n], g2[n]) for n in g1)
