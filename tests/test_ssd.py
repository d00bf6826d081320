"""The chunked SSD scan and the Mamba-2 mixer against the step-by-step recurrence the
library ships beside it (zoo.ops.ssd_scan_ref)."""
import pytest
import torch
import torch.nn.functional as F

from zoo.mixers.mamba2 import Mamba2
from zoo.ops import ssd_scan, ssd_scan_chunked, ssd_scan_ref


def ssd_recurrence(*args, **kw):
    """(y, final state) of the library's step-by-step reference, zoo.ops.ssd_scan_ref."""
    return ssd_scan_ref(*args, **kw, return_final_states=True)


def make_inputs(b=2, L=7, h=4, p=3, g=1, n=5, D_hdim=False, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype)

    return dict(
        x=rnd(b, L, h, p), dt=rnd(b, L, h), A=-torch.rand(h, generator=gen, dtype=torch.float64).to(dtype) * 2 - 0.1,
        B=rnd(b, L, g, n), C=rnd(b, L, g, n), D=rnd(h, p) if D_hdim else rnd(h),
        z=rnd(b, L, h, p), dt_bias=rnd(h, scale=0.5), initial_states=rnd(b, h, p, n),
    )


def check_against_recurrence(inputs, chunk_size, with_init=True):
    """Outputs, final states and the gradient of every input must match."""
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    if not with_init:
        leaves.pop("initial_states")
    ref_in = {k: v.detach().clone().requires_grad_() for k, v in leaves.items()}
    y, final = ssd_scan_chunked(**leaves, chunk_size=chunk_size, dt_softplus=True,
                                return_final_states=True)
    y_ref, final_ref = ssd_recurrence(**ref_in, dt_softplus=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(final, final_ref, rtol=1e-9, atol=1e-9)
    gen = torch.Generator().manual_seed(1)
    gy, gf = torch.randn(y.shape, generator=gen, dtype=y.dtype), torch.randn(final.shape, generator=gen, dtype=y.dtype)
    ((y * gy).sum() + (final * gf).sum()).backward()
    ((y_ref * gy).sum() + (final_ref * gf).sum()).backward()
    for k in leaves:
        torch.testing.assert_close(leaves[k].grad, ref_in[k].grad, rtol=1e-8, atol=1e-8, msg=lambda m: f"d{k}: {m}")


@pytest.mark.parametrize("L", [1, 7, 63, 130])
@pytest.mark.parametrize("chunk_size", [1, 8, 16, 64, 256])
def test_matches_recurrence(L, chunk_size):
    check_against_recurrence(make_inputs(L=L, seed=L + chunk_size), chunk_size)


@pytest.mark.parametrize("g", [1, 2])
@pytest.mark.parametrize("with_init", [True, False])
def test_groups_and_initial_states(g, with_init):
    check_against_recurrence(make_inputs(L=37, g=g, seed=g), chunk_size=16, with_init=with_init)


def test_D_per_channel():
    check_against_recurrence(make_inputs(L=20, g=2, D_hdim=True), chunk_size=8)


def test_no_optional_inputs():
    """Without dt_bias, softplus, D, z: the plain discretised SSM."""
    inp = make_inputs(L=19)
    inp["dt"] = inp["dt"].abs() * 0.3
    y = ssd_scan(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], chunk_size=8)
    y_ref, _ = ssd_recurrence(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"])
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-9)


def test_initial_state_carries_a_split_sequence():
    """Scanning [0, k) then [k, L) from the returned state equals one scan of [0, L)."""
    inp = make_inputs(L=45, g=2)
    kw = dict(dt_softplus=True, chunk_size=16, return_final_states=True)
    full, final = ssd_scan(**inp, **kw)
    timed = ("x", "dt", "B", "C", "z")  # the inputs with a time axis
    first = {k: v[:, :20] if k in timed else v for k, v in inp.items()}
    rest = {k: v[:, 20:] if k in timed else v for k, v in inp.items()}
    y1, s1 = ssd_scan(**first, **kw)
    rest["initial_states"] = s1
    y2, s2 = ssd_scan(**rest, **kw)
    torch.testing.assert_close(torch.cat([y1, y2], 1), full, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(s2, final, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_steep_heads_take_the_pairwise_form(dtype, monkeypatch):
    """Heads whose decay over a chunk passes MATMUL_RANGE (A = -40 with dt ~ 1: ~ -40 per
    step) beside mild ones: still the recurrence, finite, with every gradient in fp64."""
    from zoo.ops import ssd

    inputs = make_inputs(b=2, L=70, h=4, p=3, g=2, n=5)
    inputs["A"] = torch.tensor([-0.5, -40.0, -1.0, -40.0], dtype=torch.float64)
    inputs["dt"] = inputs["dt"].abs() + 1.0
    if dtype == torch.float64:
        check_against_recurrence(inputs, chunk_size=32)
    counts = []
    real_index_put = torch.Tensor.index_put
    monkeypatch.setattr(torch.Tensor, "index_put",
                        lambda t, at, v, *a: counts.append(len(v)) or real_index_put(t, at, v, *a))
    y, final = ssd.ssd_scan_chunked(**{k: v.to(dtype) for k, v in inputs.items()}, chunk_size=32,
                                    dt_softplus=True, return_final_states=True)
    assert counts and 0 < counts[0] < 2 * 3 * 4  # some (batch, chunk, head) pairwise, not all
    y_ref, final_ref = ssd_recurrence(**inputs, dt_softplus=True)
    assert torch.isfinite(y).all() and torch.isfinite(final).all()
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final.double(), final_ref, rtol=1e-4, atol=1e-4)


def test_bfloat16_smoke():
    """bf16 in, bf16 out, float32 accumulation: close to the float64 recurrence on
    the same (bf16-rounded) inputs, and finite gradients in bf16."""
    inp = make_inputs(b=2, L=70, h=4, p=8, g=2, n=16, dtype=torch.bfloat16)
    leaves = {k: v.requires_grad_() for k, v in inp.items()}
    y, final = ssd_scan(**leaves, chunk_size=32, dt_softplus=True, return_final_states=True)
    assert y.dtype == torch.bfloat16 and final.dtype == torch.float32
    y_ref, final_ref = ssd_recurrence(**{k: v.detach().double() for k, v in inp.items()}, dt_softplus=True)
    torch.testing.assert_close(y.double(), y_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(final.double(), final_ref, rtol=1e-4, atol=1e-4)
    (y.float().square().sum() + final.sum()).backward()
    for k, v in leaves.items():
        assert v.grad.dtype == torch.bfloat16 and torch.isfinite(v.grad.float()).all(), k


def test_bad_groups_raise():
    inp = make_inputs(h=4, g=3)
    with pytest.raises(ValueError, match="ngroups"):
        ssd_scan_chunked(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"])


# ---------------------------------------------------------------- the mixer

def mamba2_step_by_step(m: Mamba2, u: torch.Tensor) -> torch.Tensor:
    """The Mamba-2 block written out with the test's recurrence and an explicit
    causal convolution, independent of the mixer's chunked path."""
    L = u.shape[1]
    z, xBC, dt = torch.split(m.in_proj(u), [m.d_inner, m.conv_dim, m.nheads], dim=-1)
    w = m.conv1d.weight[:, 0]  # (conv_dim, d_conv)
    xBC_pad = F.pad(xBC, (0, 0, m.d_conv - 1, 0))
    conv = sum(xBC_pad[:, k:k + L] * w[:, k] for k in range(m.d_conv)) + m.conv1d.bias
    x, B, C = torch.split(F.silu(conv), [m.d_inner, m.ngroups * m.d_state, m.ngroups * m.d_state], -1)
    b = u.shape[0]
    y, _ = ssd_recurrence(x.view(b, L, m.nheads, m.headdim), dt, -torch.exp(m.A_log),
                          B.view(b, L, m.ngroups, -1), C.view(b, L, m.ngroups, -1), D=m.D,
                          dt_bias=m.dt_bias, dt_softplus=True)
    y = y.reshape(b, L, m.d_inner) * F.silu(z)
    yg = y.view(b, L, m.ngroups, -1)  # RMS over each group of channels, then the weight
    y = (yg / torch.sqrt(yg.pow(2).mean(-1, keepdim=True) + m.norm_eps)).reshape(b, L, -1) * m.norm_weight
    return m.out_proj(y)


@pytest.mark.parametrize("ngroups", [1, 2])
def test_mixer_matches_step_by_step(ngroups):
    torch.manual_seed(0)
    m = Mamba2(32, d_state=8, headdim=8, ngroups=ngroups, chunk_size=8).double()
    with torch.no_grad():
        m.norm_weight.uniform_(0.5, 1.5)
    u = torch.randn(2, 21, 32, dtype=torch.float64)
    torch.testing.assert_close(m(u), mamba2_step_by_step(m, u), rtol=1e-9, atol=1e-9)
    assert m.backend == "torch_chunked"


def test_mixer_defaults_and_shapes():
    m = Mamba2(64)
    assert (m.nheads, m.headdim, m.d_state) == (4, 32, 64)
    for L in (1, 7, 130):
        assert m(torch.randn(1, L, 64)).shape == (1, L, 64)
    y = m.to(torch.bfloat16)(torch.randn(2, 37, 64, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()
    assert m.state_size(10) == m.state_size(1000) == 4 * 32 * 64 + (128 + 2 * 64) * 3


def test_mixer_init_and_errors():
    m = Mamba2(64)
    A = torch.exp(m.A_log)
    assert ((A >= 1) & (A <= 16)).all()
    dt = F.softplus(m.dt_bias)
    assert ((dt >= 1e-4 - 1e-7) & (dt <= 0.1 + 1e-6)).all()
    with pytest.raises(ValueError, match="headdim"):
        Mamba2(64, headdim=48)
    with pytest.raises(ValueError, match="ngroups"):
        Mamba2(64, ngroups=3)
    with pytest.raises(ValueError, match="unknown option"):
        Mamba2(64, d_sate=16)
