"""The selective scan against the step-by-step loop the library ships beside it
(zoo.ops.selective_scan_ref), and the Mamba mixer's construction (init, options, state size).

The reference follows the recurrence literally, one time step at a time, in float64:
    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t;  y_t = <C_t, h_t> + D u_t;  y_t *= silu(z_t)
"""
import math

import pytest
import torch
import torch.nn.functional as F

from zoo.mixers.mamba import Mamba
from zoo.ops import selective_scan, selective_scan_chunked, selective_scan_ref


def loop_reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """(out, last state) of the library's step-by-step reference."""
    return selective_scan_ref(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                              return_last_state=True)


def make_inputs(L, batch=2, dim=4, dstate=3, bc="variable", with_D=True, with_z=True,
                with_bias=True, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    bc_shape = {"variable": (batch, dstate, L), "grouped": (batch, 2, dstate, L),
                "invariant": (dim, dstate)}[bc]
    return dict(
        u=r(batch, dim, L),
        delta=0.5 * r(batch, dim, L),
        A=-torch.exp(0.5 * r(dim, dstate)),
        B=r(*bc_shape),
        C=r(*bc_shape),
        D=r(dim) if with_D else None,
        z=r(batch, dim, L) if with_z else None,
        delta_bias=0.3 * r(dim) if with_bias else None,
    )


def outputs_and_grads(fn, inputs, **kw):
    """Output, last state, and the gradient of every input of a random linear loss
    (the same cotangents for both implementations)."""
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if v is not None}
    args = {k: leaves.get(k) for k in inputs}
    out, last = fn(**args, **kw)
    g = torch.Generator().manual_seed(1)
    loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum() \
        + (last * torch.randn(last.shape, generator=g, dtype=last.dtype)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return out, last, dict(zip(leaves, grads))


def assert_matches_loop(inputs, delta_softplus, chunk_size, tol=1e-10):
    ref_out, ref_last, ref_grads = outputs_and_grads(
        loop_reference, inputs, delta_softplus=delta_softplus)
    out, last, grads = outputs_and_grads(
        selective_scan_chunked, inputs, delta_softplus=delta_softplus,
        return_last_state=True, chunk_size=chunk_size)
    torch.testing.assert_close(out, ref_out, rtol=tol, atol=tol)
    torch.testing.assert_close(last, ref_last, rtol=tol, atol=tol)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=tol, atol=tol,
                                   msg=lambda m: f"grad of {name}: {m}")


@pytest.mark.parametrize("L", [1, 7, 63, 130])
@pytest.mark.parametrize("chunk_size", [1, 8, 64, 256])
def test_matches_loop_all_options(L, chunk_size):
    assert_matches_loop(make_inputs(L), delta_softplus=True, chunk_size=chunk_size)


@pytest.mark.parametrize("L", [1, 37])
@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_matches_loop_bare(L, chunk_size):
    inputs = make_inputs(L, with_D=False, with_z=False, with_bias=False)
    inputs["delta"] = inputs["delta"].abs()  # a positive step without softplus
    assert_matches_loop(inputs, delta_softplus=False, chunk_size=chunk_size)


@pytest.mark.parametrize("with_D, with_z, with_bias, softplus", [
    (True, False, False, False), (False, True, False, True), (False, False, True, True),
    (True, True, True, False)])
def test_matches_loop_option_subsets(with_D, with_z, with_bias, softplus):
    assert_matches_loop(make_inputs(37, with_D=with_D, with_z=with_z, with_bias=with_bias),
                        delta_softplus=softplus, chunk_size=8)


@pytest.mark.parametrize("bc", ["grouped", "invariant"])
@pytest.mark.parametrize("chunk_size", [4, 64])
def test_matches_loop_other_BC_layouts(bc, chunk_size):
    assert_matches_loop(make_inputs(23, bc=bc), delta_softplus=True, chunk_size=chunk_size)


def test_public_entry_point_and_no_last_state():
    inputs = make_inputs(19)
    out = selective_scan(**inputs, delta_softplus=True, chunk_size=4)
    ref, _ = loop_reference(**inputs, delta_softplus=True)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    with torch.no_grad():  # the path without recomputation in backward
        out2, last = selective_scan(**inputs, delta_softplus=True, return_last_state=True)
    torch.testing.assert_close(out2, ref, rtol=1e-10, atol=1e-10)
    assert last.shape == (2, 4, 3)


def test_stable_for_long_sequences_and_large_steps():
    """Decay products underflow to 0 (never overflow) however long or steep the scan."""
    inputs = make_inputs(300, dim=3, dstate=16, with_z=False)
    inputs["A"] = -torch.arange(1, 17, dtype=torch.float64).repeat(3, 1)  # S4D-real, as in Mamba
    inputs["delta"] = 20 * inputs["delta"].abs()
    with torch.no_grad():
        out, last = selective_scan_chunked(**inputs, delta_softplus=True, return_last_state=True,
                                           chunk_size=128)
        ref, ref_last = loop_reference(**inputs, delta_softplus=True)
    assert torch.isfinite(out).all() and torch.isfinite(last).all()
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(last, ref_last, rtol=1e-10, atol=1e-10)


def test_bfloat16_smoke():
    inputs = make_inputs(70, dim=8, dstate=16, dtype=torch.float32)
    half = {k: (v.bfloat16() if k in ("u", "delta", "B", "C", "z") else v)
            for k, v in inputs.items()}  # A, D, delta_bias stay fp32 as in Mamba
    half["u"].requires_grad_()
    out, last = selective_scan(**half, delta_softplus=True, return_last_state=True, chunk_size=16)
    assert out.dtype == torch.bfloat16 and last.dtype == torch.float32
    assert torch.isfinite(out).all()
    out.float().square().sum().backward()
    assert half["u"].grad.dtype == torch.bfloat16 and torch.isfinite(half["u"].grad).all()
    with torch.no_grad():
        ref = selective_scan(**{k: v.float() for k, v in half.items()}, delta_softplus=True)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


def test_rejects_bad_arguments():
    inputs = make_inputs(5)
    with pytest.raises(ValueError, match="chunk_size"):
        selective_scan_chunked(**inputs, chunk_size=0)
    inputs["B"] = torch.randn(2, 3, 3, 5, dtype=torch.float64)  # 3 groups, dim 4
    with pytest.raises(ValueError, match="groups"):
        selective_scan_chunked(**inputs)


# ---- the Mamba mixer's construction ----

def test_mamba_init_and_state_size():
    m = Mamba(64)
    assert (m.d_inner, m.dt_rank) == (128, 4)
    assert m.x_proj.weight.shape == (4 + 2 * 16, 128) and m.x_proj.bias is None
    assert m.in_proj.bias is None and m.out_proj.bias is None and m.conv1d.bias is not None
    A = -torch.exp(m.A_log)
    torch.testing.assert_close(A, -torch.arange(1, 17.0).repeat(128, 1))
    torch.testing.assert_close(m.D, torch.ones(128))
    dt = F.softplus(m.dt_proj.bias)  # the initial step sizes
    assert dt.min() >= 1e-3 * (1 - 1e-4) and dt.max() <= 0.1 * (1 + 1e-4)
    assert m.state_size(1) == m.state_size(10_000) == 128 * 16 + 128 * 3
    assert Mamba(40, dt_rank=7, expand=3, d_state=4, d_conv=2).state_size(5) == 120 * 4 + 120


def test_mamba_options_are_checked():
    with pytest.raises(ValueError, match="valid options"):
        Mamba(64, n_heads=4)
    for bad in (dict(d_state=0), dict(expand=1.5), dict(dt_rank="big"), dict(chunk_size=-1)):
        with pytest.raises(ValueError):
            Mamba(64, **bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mamba_forward_chunk_size_invariant(dtype):
    torch.manual_seed(0)
    m = Mamba(32, chunk_size=4).to(dtype)
    x = torch.randn(2, 13, 32, dtype=dtype)
    y = m(x)
    assert y.shape == x.shape and y.dtype == dtype and torch.isfinite(y).all()
    assert m.backend == "cpu_fused"
    m.chunk_size = 1000
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(m(x), y, rtol=tol, atol=tol)
    assert m(x[:, :1]).shape == (2, 1, 32)
    assert math.isfinite(m(x).float().sum().item())
