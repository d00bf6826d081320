"""GLA: the chunked path (RWKV-6 core, u = 0, plus the diagonal) against the step
reference gla_ref, forward and every gradient in float64; conventions against fla's
own naive_recurrent_gla; the mixer's options, size and no-decay marks."""
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from zoo.mixers.gla import GLA
from zoo.ops import gla, gla_chunked, gla_ref
from zoo.ops.fastpath import torch_only

B, H, K, V = 2, 2, 4, 3


def make_inputs(L, strong=False, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, gk = (torch.randn(B, L, H, K, generator=g, dtype=dtype) for _ in range(3))
    v = torch.randn(B, L, H, V, generator=g, dtype=dtype)
    # log decay: fla's logsigmoid(.) range, or about -20 per step (forget at once)
    gk = -20 + gk.clamp(-3, 3) if strong else F.logsigmoid(2 * gk)
    h0 = torch.randn(B, H, K, V, generator=g, dtype=dtype)
    return q, k, v, gk, h0


@pytest.mark.parametrize("with_h0", [False, True], ids=["no_h0", "h0"])
@pytest.mark.parametrize("L", [1, 7, 37, 65])
def test_chunked_matches_ref_with_gradients(L, with_h0):
    q, k, v, gk, h0 = make_inputs(L)
    inputs = [q, k, v, gk] + ([h0] if with_h0 else [])
    for t in inputs:
        t.requires_grad_()
    h = h0 if with_h0 else None
    o, S = gla_chunked(q, k, v, gk, initial_state=h, output_final_state=True, chunk_size=16)
    o_ref, S_ref = gla_ref(q, k, v, gk, initial_state=h, output_final_state=True)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)

    do, dS = torch.randn_like(o), torch.randn_like(S)
    grads = torch.autograd.grad((o * do).sum() + (S * dS).sum(), inputs)
    grads_ref = torch.autograd.grad((o_ref * do).sum() + (S_ref * dS).sum(), inputs)
    for name, a, b in zip("q k v gk h0".split(), grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=name)


@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_any_chunk_size_and_scale(chunk_size):
    q, k, v, gk, h0 = make_inputs(37, seed=1)
    o, S = gla_chunked(q, k, v, gk, scale=0.7, initial_state=h0, output_final_state=True,
                       chunk_size=chunk_size)
    o_ref, S_ref = gla_ref(q, k, v, gk, scale=0.7, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)


def test_strong_decay_stays_finite_forward_and_backward():
    q, k, v, gk, h0 = make_inputs(65, strong=True)
    gk[0, :, 0] = -40.0  # one head forgets everything at every step, harder still
    o_ref, S_ref = gla_ref(q, k, v, gk, initial_state=h0, output_final_state=True)
    inputs = [t.float().requires_grad_() for t in (q, k, v, gk, h0)]
    o, S = gla_chunked(*inputs[:4], initial_state=inputs[4], output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    torch.testing.assert_close(o, o_ref.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(S, S_ref.float(), rtol=1e-4, atol=1e-4)
    grads = torch.autograd.grad(o.sum() + S.sum(), inputs)
    assert all(torch.isfinite(g).all() for g in grads)


def test_same_convention_as_fla_naive_recurrent_gla():
    """fla's own step reference (pure PyTorch, fp32, loaded by path so that fla's
    Triton-importing package __init__ is not run): same layout, read-after-update."""
    spec = importlib.util.find_spec("fla")
    if spec is None:
        pytest.skip("flash-linear-attention is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "ops", "gla", "naive.py")
    if not os.path.exists(path):
        pytest.skip(f"no {path}")
    mod_spec = importlib.util.spec_from_file_location("fla_gla_naive", path)
    naive = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(naive)
    q, k, v, gk, h0 = make_inputs(23, seed=2)
    o_fla, S_fla = naive.naive_recurrent_gla(q, k, v, gk, initial_state=h0,
                                             output_final_state=True)
    o, S = gla_ref(q, k, v, gk, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o, o_fla.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, S_fla.double(), rtol=1e-5, atol=1e-5)


def test_dispatcher_on_cpu_and_dtypes():
    q, k, v, gk, _ = make_inputs(9)
    o, S = gla(q, k, v, gk)  # CPU: the chunked path
    assert S is None
    torch.testing.assert_close(o, gla_ref(q, k, v, gk)[0], rtol=1e-10, atol=1e-10)
    o, S = gla_chunked(*(t.bfloat16() for t in (q, k, v)), gk.float(), output_final_state=True)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32  # fp32 accumulation
    assert o.shape == (B, 9, H, V) and S.shape == (B, H, K, V)


def test_mixer_chunk_size_invariant():
    torch.manual_seed(0)
    x = torch.randn(2, 37, 64, dtype=torch.float64)
    a, b = GLA(64, chunk_size=1).double(), GLA(64, chunk_size=16).double()
    b.load_state_dict(a.state_dict())
    with torch_only():  # the chunked torch form (the fused recurrence runs otherwise)
        torch.testing.assert_close(a(x), b(x), rtol=1e-10, atol=1e-10)
        assert b.backend == "torch_chunked"
    torch.testing.assert_close(a(x), b(x), rtol=1e-10, atol=1e-10)
    assert b.backend == "cpu_fused"


def test_mixer_size_state_options_and_no_decay_marks():
    m = GLA(256)
    d, H = 256, 4  # q, k: d x d/2; v, g, o: d x d; gate d*16 + 16*d/2 + d/2; norm d/H
    assert sum(p.numel() for p in m.parameters()) == 4 * d * d + 24 * d + d // 2 + d // H
    assert (m.key_dim, m.value_dim, m.head_k_dim, m.head_v_dim) == (128, 256, 32, 64)
    assert m.state_size(10) == m.state_size(4096) == H * 32 * 64
    marked = {n for n, p in m.named_parameters() if getattr(p, "_no_weight_decay", False)}
    assert marked == {"gk_proj.1.bias", "norm_weight"}
    for bad in [dict(n_heads=3), dict(expand_k=0.3), dict(expand_v=0), dict(chunk_size=0),
                dict(gate_logit_normalizer=0)]:
        with pytest.raises(ValueError):
            GLA(64, **bad)
