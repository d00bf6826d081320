"""rwkv6_scan (chunked) against the step-by-step loop the library ships beside it
(zoo.ops.rwkv6_scan_ref); RetNet's retention through it, against retention_ref."""
import pytest
import torch

from zoo.mixers.retnet import RetNet
from zoo.ops.retention import (retention, retention_as_rwkv6, retention_chunked,
                               retention_ref)
from zoo.mixers.rwkv6 import RWKV6
from zoo.ops import rwkv6_scan, rwkv6_scan_ref
from zoo.ops.fastpath import torch_only
from zoo.ops.rwkv6 import rwkv6_scan_chunked

B, H, K, V = 2, 2, 4, 3


def loop_rwkv6(q, k, v, w, u, scale, initial_state):
    """(o, final state) of the step-by-step reference."""
    return rwkv6_scan_ref(q, k, v, w, u, scale, initial_state, output_final_state=True)


def make_inputs(L, strong, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, w = (torch.randn(B, L, H, K, generator=g, dtype=dtype) for _ in range(3))  # the zoo's one layout
    v = torch.randn(B, L, H, V, generator=g, dtype=dtype)
    # log decay: mild in [-1, 0), or -exp(U(-4, 3)) reaching about -20 per step
    w = -torch.exp(3.5 * w.clamp(-1, 1) - 0.5) if strong else -torch.rand_like(w)
    if strong:
        w[0, :, 0, 0] = -20.0  # one channel forgets everything at every step
    u = torch.randn(H, K, generator=g, dtype=dtype)
    h0 = torch.randn(B, H, K, V, generator=g, dtype=dtype)
    return q, k, v, w, u, h0


@pytest.mark.parametrize("strong", [False, True], ids=["mild", "strong"])
@pytest.mark.parametrize("chunk_size", [1, 4, 16, 64, 1000])
@pytest.mark.parametrize("L", [1, 7, 63, 130])
def test_matches_loop_with_gradients(L, chunk_size, strong):
    inputs = [t.requires_grad_() for t in make_inputs(L, strong)]
    q, k, v, w, u, h0 = inputs
    o, S = rwkv6_scan(q, k, v, w, u, initial_state=h0, output_final_state=True,
                      chunk_size=chunk_size)
    o_ref, S_ref = loop_rwkv6(q, k, v, w, u, K ** -0.5, h0)  # fla's default scale
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)

    do, dS = torch.randn_like(o), torch.randn_like(S)
    grads = torch.autograd.grad((o * do).sum() + (S * dS).sum(), inputs)
    grads_ref = torch.autograd.grad((o_ref * do).sum() + (S_ref * dS).sum(), inputs)
    for name, g, g_ref in zip("q k v w u h0".split(), grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9, msg=name)


def test_steep_blocks_match_loop_with_gradients():
    """A decay so steep (-60 per step on one channel) that in float64 even a block of SUB
    steps forms the pairwise tensor: the blocked chunks' outputs, state and gradients."""
    inputs = list(make_inputs(70, strong=True))
    inputs[3][:, :, :, 0] = -60.0
    inputs = [t.requires_grad_() for t in inputs]
    q, k, v, w, u, h0 = inputs
    o, S = rwkv6_scan(q, k, v, w, u, initial_state=h0, output_final_state=True, chunk_size=64)
    o_ref, S_ref = loop_rwkv6(q, k, v, w, u, K ** -0.5, h0)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(o.sum() + S.sum(), inputs)
    grads_ref = torch.autograd.grad(o_ref.sum() + S_ref.sum(), inputs)
    for name, g, g_ref in zip("q k v w u h0".split(), grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9, msg=name)


def test_defaults_scale_and_no_state():
    q, k, v, w, u, _ = make_inputs(9, strong=False)
    o, S = rwkv6_scan(q, k, v, w, u, scale=0.7)
    assert S is None
    o_ref, S_ref = rwkv6_scan_ref(q, k, v, w, u, scale=0.7)  # no initial state: zeros
    assert S_ref is None
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("chunk_size", [0, -4])
def test_chunked_forms_refuse_a_chunk_size_below_one(chunk_size):
    q, k, v, w, u, _ = make_inputs(9, strong=False)
    with pytest.raises(ValueError, match=f"rwkv6: chunk_size must be positive, got {chunk_size}"):
        rwkv6_scan_chunked(q, k, v, w, u, chunk_size=chunk_size)
    with pytest.raises(ValueError, match=f"retention: chunk_size must be positive, got {chunk_size}"):
        retention_chunked(q, k, v, torch.full((H,), -0.1, dtype=q.dtype), chunk_size=chunk_size)


def test_float32_stable_under_strong_decay():
    q, k, v, w, u, h0 = make_inputs(130, strong=True)
    o_ref, S_ref = loop_rwkv6(q, k, v, w, u, K ** -0.5, h0)
    w32 = w.float() - 20.0 * (torch.rand_like(w.float()) < 0.3)  # even harsher: -40 steps
    o, S = rwkv6_scan(*(t.float() for t in (q, k, v)), w32, u.float(),
                      initial_state=h0.float(), output_final_state=True, chunk_size=64)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    o_ref, S_ref = loop_rwkv6(q, k, v, w32.double(), u, K ** -0.5, h0)
    torch.testing.assert_close(o, o_ref.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(S, S_ref.float(), rtol=1e-4, atol=1e-4)


def test_bfloat16_smoke():
    q, k, v, w, u, h0 = make_inputs(37, strong=True)
    o, S = rwkv6_scan(*(t.bfloat16() for t in (q, k, v, w, u)), initial_state=h0,
                      output_final_state=True)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32  # fp32 accumulation
    o_ref, S_ref = loop_rwkv6(*(t.bfloat16().double() for t in (q, k, v, w, u)), K ** -0.5, h0)
    torch.testing.assert_close(o.double(), o_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(S.double(), S_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("form", [retention_chunked, retention_as_rwkv6])
@pytest.mark.parametrize("chunk_size", [1, 16, 64])
@pytest.mark.parametrize("L", [1, 45, 64, 130])
def test_retention_matches_loop_with_gradients(form, chunk_size, L):
    Kr, Vr = 4, 6
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(B, L, H, Kr, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, L, H, Vr, generator=g, dtype=torch.float64)
    gamma = torch.tensor([1 - 2 ** -5, 0.5], dtype=torch.float64)  # (H,)
    h0 = torch.randn(B, H, Kr, Vr, generator=g, dtype=torch.float64)
    inputs = [t.requires_grad_() for t in (q, k, v, h0)]
    o, S_fin = form(q, k, v, gamma.log(), initial_state=h0, output_final_state=True,
                    chunk_size=chunk_size)
    # S_t = gamma S_{t-1} + k_t^T v_t;  o_t = q_t S_t (scale K^-0.5), one step at a time
    o_ref, S = retention_ref(q, k, v, gamma.log(), initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S_fin, S, rtol=1e-10, atol=1e-10)
    do, dS = torch.randn_like(o), torch.randn_like(S)
    grads = torch.autograd.grad((o * do).sum() + (S_fin * dS).sum(), inputs)
    grads_ref = torch.autograd.grad((o_ref * do).sum() + (S * dS).sum(), inputs)
    for name, gr, gr_ref in zip("q k v h0".split(), grads, grads_ref):
        torch.testing.assert_close(gr, gr_ref, rtol=1e-9, atol=1e-9, msg=name)


def test_retention_without_state_and_float32():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 100, 3, 8, generator=g) for _ in range(3))
    log_gamma = torch.log1p(-(2.0 ** -torch.tensor([1.0, 5.0, 9.0])))
    o, S = retention(q, k, v, log_gamma, chunk_size=32)
    assert S is None and o.dtype == torch.float32
    o_ref, _ = retention_ref(q.double(), k.double(), v.double(), log_gamma.double())
    torch.testing.assert_close(o.double(), o_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cls", [RWKV6, RetNet])
def test_mixer_chunk_size_invariant_and_bf16(cls):
    torch.manual_seed(0)
    x = torch.randn(2, 37, 64, dtype=torch.float64)
    a, b = cls(64, chunk_size=1).double(), cls(64, chunk_size=16).double()
    b.load_state_dict(a.state_dict())
    with torch_only():  # the chunked torch form (RWKV-6 runs the fused recurrence otherwise)
        torch.testing.assert_close(a(x), b(x), rtol=1e-10, atol=1e-10)
        assert b.backend == "torch_chunked"
    torch.testing.assert_close(a(x), b(x), rtol=1e-10, atol=1e-10)
    y = b.bfloat16()(x[:1, :1].bfloat16())
    assert y.shape == (1, 1, 64) and y.dtype == torch.bfloat16 and torch.isfinite(y).all()


def test_mixer_options_and_state_size():
    with pytest.raises(ValueError):
        RWKV6(64, head_size=24)
    with pytest.raises(ValueError):
        RetNet(64, n_heads=3)
    assert RWKV6(64).state_size(10) == RWKV6(64).state_size(1000) == 2 * 32 * 32 + 64
    assert RetNet(64).state_size(10) == RetNet(64).state_size(1000)


@pytest.mark.parametrize("C", [32, 37])  # whole blocks of SUB steps, and a padded last block
def test_intra_chunk_scores_split_only_where_safe(monkeypatch, C):
    """fp32 chunks whose total decay is just inside MATMUL_RANGE (one matmul, factors up to
    exp(+-29)), beyond it but not within a block of SUB steps (blocked: no pairwise tensor),
    and beyond it even within a block: all match the float64 pairwise scores, and only the
    steepest chunk's blocks form the pairwise tensor."""
    from zoo.ops import chunks as core

    K = 8
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(3, C, K, generator=g, dtype=torch.float64) for _ in range(2))
    w = -torch.rand(3, C, K, generator=g, dtype=torch.float64)  # (chunk, step, channel)
    limit = core.MATMUL_RANGE_DEFAULT
    w[0, :, 0] = -0.95 * limit / C
    w[1, :, 0] = -0.9 * limit / core.SUB  # a chunk past the limit, each block within it
    w[2, :, 0] = -20.0  # every block, the padded last one too (5 real steps at C 37), steep
    b = w.cumsum(-2)
    b_prev = torch.nn.functional.pad(b, (0, 0, 1, -1))
    strict = torch.ones(C, C, dtype=torch.bool).tril(-1)
    want = core.pairwise_scores(q, k, b_prev, b, strict)

    calls = []
    real = core.pairwise_scores
    monkeypatch.setattr(core, "pairwise_scores", lambda q, *a: calls.append(tuple(q.shape)) or real(q, *a))
    got = core.intra_chunk_scores(*(t.float() for t in (q, k, b_prev, b)))
    blocks = -(-C // core.SUB)
    assert calls == [(blocks, core.SUB, K)]  # the steepest chunk's blocks alone
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    assert (got.triu() == 0).all()


def test_ddlerp_equals_its_reference_in_outputs_and_every_gradient():
    """The token shift's fused backward against plain ops, in float64, with one target's
    output unused (its gradient None) as when a caller drops it."""
    from zoo.ops.rwkv6 import ddlerp, ddlerp_ref

    torch.manual_seed(0)
    x, dx = (torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    mixes = [torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True) for _ in range(5)]
    inputs = (x, dx, *mixes)
    grads = [torch.randn(3, 7, 5, dtype=torch.float64) for _ in range(4)]

    def run(fn):
        outs = fn(x, dx, mixes)
        return outs, torch.autograd.grad(outs[:4], inputs, grads, materialize_grads=True)  # the last unused

    (got, got_grads), (want, want_grads) = run(ddlerp), run(ddlerp_ref)
    for g, w in zip((*got, *got_grads), (*want, *want_grads)):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *t: ddlerp(t[0], t[1], t[2:]), inputs)
