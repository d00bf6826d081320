"""The Grassmann mixer against a hand-worked case and a per-position Python loop."""
import itertools
import math

import pytest
import torch

from zoo.mixers import MIXERS
from zoo.mixers.grassmann import Grassmann
from zoo.ops.grassmann import grassmann_features, plucker, valid_counts


def naive_grassmann(m: Grassmann, h: torch.Tensor) -> torch.Tensor:
    """The formula one position and one offset at a time: reduce, pair, wedge,
    normalise, project, aggregate over the offsets that exist, gate. Returns the
    paper's output h' (the blend a*h + (1-a)*g, or h + a*g), residual included: the
    mixer returns h' - h."""
    B, L, D = h.shape
    r = m.r
    pairs = [(i, j) for i in range(r) for j in range(i + 1, r)]
    first, second = torch.tensor(pairs).T
    Wr, br = m.w_red.weight, m.w_red.bias
    Wp, bp = m.w_plu.weight, m.w_plu.bias
    out = torch.empty_like(h)
    for t in range(L):
        z = h[:, t] @ Wr.T + br  # (B, r)
        feats = []
        for delta in m.offsets:
            s = t - delta if m.pairing == "past" else t + delta
            if not 0 <= s < L:
                continue
            w = h[:, s] @ Wr.T + br
            wedge = z[:, :, None] * w[:, None, :] - w[:, :, None] * z[:, None, :]  # (B, r, r)
            p = wedge[:, first, second]  # (B, r(r-1)/2)
            if m.normalize:
                norm = torch.sqrt((p * p).sum(-1, keepdim=True))
                p = p / torch.maximum(norm, torch.full_like(norm, m.eps))
            feats.append(p @ Wp.T + bp)  # (B, D)
        if not feats:
            g = torch.zeros(B, D, dtype=h.dtype)
        elif m.aggregate == "mean":
            g = sum(feats) / len(feats)
        else:
            g = sum(feats)
        a = torch.sigmoid(torch.cat([h[:, t], g], -1) @ m.w_gate.weight.T + m.w_gate.bias)
        out[:, t] = a * h[:, t] + (1 - a) * g if m.mixing == "blend" else h[:, t] + a * g
    return out


OPTIONS = list(itertools.product(("past", "future"), (True, False), ("mean", "sum"),
                                 ("blend", "gated_residual")))


@pytest.mark.parametrize("pairing,normalize,aggregate,mixing", OPTIONS)
def test_matches_naive_loop(pairing, normalize, aggregate, mixing):
    torch.manual_seed(0)
    # eps = 2 lies inside the spread of |p| here (about 1 to 5), so the max() matters
    m = Grassmann(48, r=8, offsets=(1, 3, 5, 40), pairing=pairing, normalize=normalize,
                  eps=2.0, aggregate=aggregate, mixing=mixing, impl="eager").double()
    h = torch.randn(3, 37, 48, dtype=torch.float64)  # offset 40 > L never has a partner
    z = m.w_red(h)
    norms = plucker(z[:, 1:], z[:, :-1]).norm(dim=-1)
    assert (norms < m.eps).any() and (norms > m.eps).any()
    torch.testing.assert_close(h + m(h), naive_grassmann(m, h), rtol=1e-10, atol=1e-10)
    assert m.backend == "eager"


@pytest.mark.parametrize("mixing", ["blend", "gated_residual"])
@pytest.mark.parametrize("block", ["postnorm", "prenorm"])
def test_block_computes_the_papers_layer_at_dropout_0(mixing, block):
    """In float64 at dropout 0 the zoo's block around the update is the paper's layer
    around the whole output: post-LN h = LN1(h'(h)); h = LN2(h + FFN(h)) (what revision
    1 ran), pre-LN x + (h'(u) - u) with u = LN1(x)."""
    import zoo
    cfg = zoo.ModelConfig(vocab_size=50, d_model=48, n_layers=1, mixer="grassmann", block=block,
                          mixer_options=dict(r=8, offsets=(1, 3, 5), mixing=mixing), dropout=0.0)
    layer = zoo.build_model(cfg, seed=0).double().blocks[0]
    x = torch.randn(2, 21, 48, dtype=torch.float64)
    if block == "postnorm":
        h = layer.norm1(naive_grassmann(layer.mixer, x))
        expected = layer.norm2(h + layer.mlp(h))
    else:
        u = layer.norm1(x)
        h = x + naive_grassmann(layer.mixer, u) - u
        expected = h + layer.mlp(layer.norm2(h))
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)


def test_plucker_by_hand():
    z = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    w = torch.tensor([4.0, 5.0, 6.0], dtype=torch.float64)
    # p_01 = 1*5 - 2*4, p_02 = 1*6 - 3*4, p_12 = 2*6 - 3*5
    assert plucker(z, w).tolist() == [-3.0, -6.0, -3.0]
    assert plucker(w, z).tolist() == [3.0, 6.0, 3.0]  # antisymmetric
    assert plucker(z, 2 * z).abs().max() == 0  # a degenerate plane has no coordinates


def test_module_internals_by_hand():
    """r=3 with identity reductions: g at t=1 is the wedge of h_1 and h_0, by hand."""
    m = Grassmann(3, r=3, offsets=(1,), normalize=False, aggregate="sum").double()
    with torch.no_grad():
        m.w_red.weight.copy_(torch.eye(3)), m.w_red.bias.zero_()
        m.w_plu.weight.copy_(torch.eye(3)), m.w_plu.bias.fill_(0.5)
    h = torch.tensor([[[4.0, 5.0, 6.0], [1.0, 2.0, 3.0]]], dtype=torch.float64)  # (1, 2, 3)
    z = m.w_red(h)
    g = grassmann_features(z, m.w_plu.weight, m.w_plu.bias, m.offsets, normalize=False,
                           aggregate="sum")
    assert g[0, 0].tolist() == [0.0, 0.0, 0.0]  # t=0: no partner, no bias
    assert g[0, 1].tolist() == [-3.0 + 0.5, -6.0 + 0.5, -3.0 + 0.5]
    # normalised: divide by |p| = sqrt(9 + 36 + 9)
    g = grassmann_features(z, m.w_plu.weight, None, m.offsets, normalize=True)
    torch.testing.assert_close(g[0, 1], torch.tensor([-3.0, -6.0, -3.0], dtype=torch.float64)
                               / math.sqrt(54))


def test_lagrange_identity():
    torch.manual_seed(1)
    z, w = torch.randn(2, 100, 32, dtype=torch.float64)
    p = plucker(z, w)
    assert p.shape == (100, 496)
    lagrange = (z * z).sum(-1) * (w * w).sum(-1) - (z * w).sum(-1) ** 2
    torch.testing.assert_close((p * p).sum(-1), lagrange)


@pytest.mark.parametrize("aggregate", ["mean", "sum"])
def test_no_valid_offset_gives_exact_zero(aggregate):
    torch.manual_seed(2)
    z = torch.randn(2, 9, 4)
    weight, bias = torch.randn(5, 6), torch.randn(5) + 3.0
    past = grassmann_features(z, weight, bias, (3, 20), "past", aggregate=aggregate)
    assert (past[:, :3] == 0).all() and (past[:, 3:] != 0).all()
    future = grassmann_features(z, weight, bias, (3, 20), "future", aggregate=aggregate)
    assert (future[:, -3:] == 0).all() and (future[:, :-3] != 0).all()
    # offsets all beyond L: no position ever has a partner
    assert (grassmann_features(z, weight, bias, (9, 50), aggregate=aggregate) == 0).all()


def test_valid_offsets_counts():
    assert valid_counts(5, (1, 3, 8), "past").tolist() == [0, 1, 1, 2, 2]
    assert valid_counts(5, (1, 3, 8), "future").tolist() == [2, 2, 1, 1, 0]


def test_future_leaks_and_past_does_not():
    torch.manual_seed(3)
    h = torch.randn(1, 12, 16, dtype=torch.float64)
    h2 = h.clone()
    h2[:, 6] += 1.0  # perturb token 6
    for pairing in ("past", "future"):
        m = Grassmann(16, r=4, offsets=(1, 2), pairing=pairing).double()
        changed = (m(h) - m(h2)).abs().amax(-1)[0] > 0  # (L,)
        assert changed[:6].any() == (pairing == "future")
        assert m.causal == (pairing == "past")
    # at the last position the future pairing has no partner: the output is the update
    # of the blend with g = 0, whatever the other tokens are
    m = Grassmann(16, r=4, offsets=(1, 2), pairing="future").double()
    h3 = h.clone()
    h3[:, :-1] = torch.randn(11, 16, dtype=torch.float64)
    torch.testing.assert_close(m(h)[:, -1], m(h3)[:, -1], rtol=0, atol=0)


def test_gradients_finite_with_missing_and_parallel_partners():
    m = Grassmann(8, r=4, offsets=(1, 2, 30))
    h = torch.randn(2, 7, 8)
    h[:, 3] = h[:, 2]  # identical tokens: z_3 ∧ z_2 = 0 exactly
    h.requires_grad_(True)
    m(h).sum().backward()
    assert torch.isfinite(h.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("L", [1, 7, 37])
def test_shapes_dtypes_and_defaults(L):
    m = Grassmann(64)
    assert m.w_plu.in_features == 496 and m.causal and m.revision == 2
    for dtype in (torch.float32, torch.bfloat16):
        y = m.to(dtype)(torch.randn(2, L, 64, dtype=dtype))
        assert y.shape == (2, L, 64) and y.dtype == dtype and torch.isfinite(y).all()
    assert m.state_size(1000) == 16 * 32
    assert MIXERS["grassmann"] is Grassmann


@pytest.mark.parametrize("options,field", [
    (dict(r=80), "r="), (dict(r=1), "r="), (dict(r=2.0), "r="),
    (dict(offsets=()), "offsets="), (dict(offsets=(1, 0)), "offsets="),
    (dict(offsets=(1, -2)), "offsets="), (dict(offsets=(1, 2.5)), "offsets="),
    (dict(offsets=4), "offsets="), (dict(offsets=(1, 1)), "offsets="),
    (dict(pairing="both"), "pairing="), (dict(aggregate="max"), "aggregate="),
    (dict(mixing="add"), "mixing="), (dict(eps=0.0), "eps="), (dict(eps=-1e-6), "eps="),
])
def test_validation_names_the_field(options, field):
    with pytest.raises(ValueError, match=field):
        Grassmann(64, **options)
