"""gated_delta_rule_chunked (WY / UT form) against the step-by-step gated_delta_rule_ref,
the reference against fla's own naive recurrence, and the gated_deltanet mixer's options."""
import pytest
import torch
import torch.nn.functional as F

from tasks.engine.train import decays
from zoo.mixers.gated_deltanet import GatedDeltaNet
from zoo.ops import gated_delta_rule, gated_delta_rule_chunked, gated_delta_rule_ref
from zoo.ops.fastpath import torch_only

B, H, K, V = 2, 2, 5, 3


def make_inputs(L, strong=False, dtype=torch.float64, seed=0):
    """fla's layout: q, k (B, L, H, K) with unit-norm keys (as the mixer feeds them),
    v (B, L, H, V), g (B, L, H) log decay, beta (B, L, H) in (0, 1), h0 (B, H, K, V)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, L, H, K, generator=gen, dtype=dtype)
    k = F.normalize(torch.randn(B, L, H, K, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(B, L, H, V, generator=gen, dtype=dtype)
    g = -torch.rand(B, L, H, generator=gen, dtype=dtype)  # decay in (exp(-1), 1]
    if strong:
        g = g * 20  # down to exp(-20) per step: the chunk's cumulative decay underflows
    beta = torch.rand(B, L, H, generator=gen, dtype=dtype)
    h0 = torch.randn(B, H, K, V, generator=gen, dtype=dtype)
    return q, k, v, g, beta, h0


@pytest.mark.parametrize("with_h0", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("chunk_size", [16, 32])
@pytest.mark.parametrize("L", [1, 7, 37, 65])
def test_chunked_matches_step_loop_with_gradients(L, chunk_size, with_h0):
    q, k, v, g, beta, h0 = make_inputs(L)
    inputs = [q, k, v, g, beta] + ([h0] if with_h0 else [])
    for t in inputs:
        t.requires_grad_()
    state = h0 if with_h0 else None
    o, S = gated_delta_rule_chunked(q, k, v, g, beta, initial_state=state,
                                    output_final_state=True, chunk_size=chunk_size)
    o_ref, S_ref = gated_delta_rule_ref(q, k, v, g, beta, initial_state=state,
                                        output_final_state=True)
    assert o.shape == (B, L, H, V) and S.shape == (B, H, K, V) and o.dtype == torch.float64
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)

    do, dS = torch.randn_like(o), torch.randn_like(S)
    grads = torch.autograd.grad((o * do).sum() + (S * dS).sum(), inputs)
    grads_ref = torch.autograd.grad((o_ref * do).sum() + (S_ref * dS).sum(), inputs)
    for name, a, b in zip("q k v g beta h0".split(), grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m: f"d{name}: {m}")


def test_strong_decay_and_scale():
    q, k, v, g, beta, h0 = make_inputs(37, strong=True)
    o, S = gated_delta_rule_chunked(q, k, v, g, beta, scale=0.3, initial_state=h0,
                                    output_final_state=True, chunk_size=32)
    o_ref, S_ref = gated_delta_rule_ref(q, k, v, g, beta, scale=0.3, initial_state=h0,
                                        output_final_state=True)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)


def test_reference_matches_fla_naive_recurrence():
    """Our step loop is fla's naive_recurrent_gated_delta_rule (which computes in fp32;
    note its (beta, g) argument order) on the same inputs."""
    naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")
    q, k, v, g, beta, h0 = (t.float() for t in make_inputs(37))
    o, S = gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o_fla, S_fla = naive.naive_recurrent_gated_delta_rule(q, k, v, beta, g, initial_state=h0,
                                                          output_final_state=True)
    torch.testing.assert_close(o, o_fla, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, S_fla, rtol=1e-5, atol=1e-5)


def test_dispatch_defaults_and_bfloat16():
    q, k, v, g, beta, _ = make_inputs(9)
    o, S = gated_delta_rule(q, k, v, g, beta)  # CPU: the chunked path
    assert S is None
    o_ref, _ = gated_delta_rule_ref(q, k, v, g, beta)  # default scale K^-0.5, zero state
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    lo = [t.bfloat16() for t in (q, k, v)] + [g.float(), beta.bfloat16()]
    o, S = gated_delta_rule_chunked(*lo, output_final_state=True, chunk_size=4)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32  # fp32 accumulation
    o_ref, S_ref = gated_delta_rule_ref(*(t.double() for t in lo), output_final_state=True)
    torch.testing.assert_close(o.double(), o_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(S.double(), S_ref, rtol=1e-4, atol=1e-4)


def test_mixer_chunk_size_invariant_defaults_and_state():
    torch.manual_seed(0)
    x = torch.randn(2, 37, 64, dtype=torch.float64)
    a, b = GatedDeltaNet(64, chunk_size=1).double(), GatedDeltaNet(64, chunk_size=16).double()
    b.load_state_dict(a.state_dict())
    with torch_only():  # the chunked torch form (the fused recurrence runs otherwise)
        torch.testing.assert_close(a(x), b(x), rtol=1e-10, atol=1e-10)
        assert b.backend == "torch_chunked"
    torch.testing.assert_close(a(x), b(x), rtol=1e-10, atol=1e-10)
    for d, head_dim in [(64, 12), (128, 24), (256, 48)]:  # fla's key width 0.75 d, 4 heads
        m = GatedDeltaNet(d)
        assert (m.n_heads, m.head_dim, m.head_v_dim) == (4, head_dim, 2 * head_dim)
    assert GatedDeltaNet(256).state_size(10) == GatedDeltaNet(256).state_size(4096) \
        == 4 * 48 * 96 + (2 * 192 + 384) * 3
    m = GatedDeltaNet(64)
    assert m.A_log._no_weight_decay and m.dt_bias._no_weight_decay  # as fla marks them
    assert not any(decays(p) for p in (m.A_log, m.dt_bias, m.norm_weight))  # the gain: 1-D
    with pytest.raises(ValueError, match="head_dim"):
        GatedDeltaNet(40)  # 0.75 * 40 / 4 is not an integer
    assert GatedDeltaNet(40, head_dim=8).key_dim == 32
    with pytest.raises(ValueError):
        GatedDeltaNet(64, n_heads=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_steep_heads_take_the_pairwise_form(dtype):
    """One head forgetting ~25 per step (800 over a chunk of 32: past MATMUL_RANGE in fp64
    and fp32) beside a mild one: the step loop's outputs, state and every gradient."""
    q, k, v, g, beta, h0 = make_inputs(70)
    g = g.clone()
    g[:, :, 0] = -25.0 - g[:, :, 0].abs()
    inputs = [t.to(dtype).requires_grad_() for t in (q, k, v, g, beta, h0)]
    o, S = gated_delta_rule_chunked(*inputs[:5], initial_state=inputs[5], output_final_state=True,
                                    chunk_size=32)
    o_ref, S_ref = gated_delta_rule_ref(*(t.double() for t in inputs[:5]),
                                        initial_state=inputs[5].double(), output_final_state=True)
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    torch.testing.assert_close(o.double(), o_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(S.double(), S_ref, rtol=tol, atol=tol)
    if dtype == torch.float64:
        do, dS = torch.randn_like(o), torch.randn_like(S)
        grads = torch.autograd.grad((o * do).sum() + (S * dS).sum(), inputs)
        grads_ref = torch.autograd.grad((o_ref * do).sum() + (S_ref * dS).sum(), inputs)
        for name, a, b in zip("q k v g beta h0".split(), grads, grads_ref):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("C", [1, 2, 5, 16, 24])
def test_unit_lower_solve_equals_forward_substitution_in_value_and_gradients(C):
    """The UT transform's solve by matmuls against LAPACK's triangular solve, float64, on
    entries as large as the delta rule's (|A| <= 1) and with garbage above the diagonal."""
    from zoo.ops.chunks import unit_lower_solve, unit_lower_solve_ref

    torch.manual_seed(C)
    A = (2 * torch.rand(3, 2, C, C, dtype=torch.float64) - 1).requires_grad_()
    rhs = torch.randn(3, 2, C, 7, dtype=torch.float64, requires_grad=True)
    dx = torch.randn(3, 2, C, 7, dtype=torch.float64)
    got, want = unit_lower_solve(A, rhs), unit_lower_solve_ref(A, rhs)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for g, w in zip(torch.autograd.grad(got, (A, rhs), dx), torch.autograd.grad(want, (A, rhs), dx)):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradcheck(unit_lower_solve, (A, rhs))
