"""Our recurrent mixers against the peers' own layers, with the same weights.

The fast-path tests (test_fastpath_kernels.py) prove that our *calls* of the peers' kernels
match our torch paths; this proves the *blocks* around them are the layers they claim to be:
mamba_ssm's Mamba and Mamba2, fla's GatedDeltaNet, RWKV6Attention, GatedLinearAttention and
MultiScaleRetention, built with the arguments our docstrings name, their weights moved off
init and copied into ours (a pure renaming or re-indexing, so the same map carries the
peer's gradients into our layout), then output, input gradient and every weight gradient
compared. The peers run their own code (kernel_standins: Triton kernels under the
interpreter; mamba_simple's CUDA scan replaced by mamba_ssm's selective_scan_ref), our side
its pure-torch path.

RetNet differs from fla's layer in two documented choices (zoo/mixers/retnet.py): its decay
spread and its GroupNorm. Its test puts fla's decays and per-head RMSNorm into our instance
and checks that everything else (projections, rotary, the retention core, the gate) agrees.

Lengths: 100 takes fla's chunk kernels (with gradients it always does); a forward at 40 in
eval mode without gradients takes its fused_recurrent ones where it has them."""
from __future__ import annotations

import types
import warnings

import pytest
import torch
import torch.nn as nn

import kernel_standins
from zoo.ops.fastpath import torch_only

pytestmark = pytest.mark.skipif(kernel_standins.available() is not None,
                                reason=str(kernel_standins.available()))
D = 64
RTOL = 1e-4  # max |ours - fla| / max |fla| per tensor; measured 1e-6 to 1e-5 in float32


@pytest.fixture(scope="module")
def peers():
    ks = kernel_standins.install()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fla warns that Triton has no GPU here
        from fla import layers as fla
        from mamba_ssm.modules import mamba2, mamba_simple
    kernel_standins._pin_autotuners()  # the modules imported just now
    return types.SimpleNamespace(fla=fla, mamba_simple=mamba_simple, mamba2=mamba2, ks=ks)


def rename(names: dict):
    return lambda f: {ours: f[theirs] for ours, theirs in names.items()}


def mamba(peers, monkeypatch):
    from zoo.mixers.mamba import Mamba
    ours = Mamba(D)  # d_state 16, expand 2, dt_rank 4
    # use_fast_path=False scans with selective_scan_fn, the CUDA scan: its reference instead
    monkeypatch.setattr(peers.mamba_simple, "selective_scan_fn", peers.ks.selective_scan_ref)
    theirs = peers.mamba_simple.Mamba(d_model=D, d_state=16, d_conv=4, expand=2, dt_rank=4, conv_bias=True,
                                      bias=False, use_fast_path=False)
    same = ["in_proj.weight", "conv1d.weight", "conv1d.bias", "x_proj.weight", "dt_proj.weight",
            "dt_proj.bias", "out_proj.weight", "A_log", "D"]
    return ours, theirs, rename({n: n for n in same})


def mamba2_options(ngroups):
    def build(peers, monkeypatch):
        from zoo.mixers.mamba2 import Mamba2
        opts = dict(d_state=16, headdim=16, ngroups=2) if ngroups > 1 else {}  # 8 heads, 4 a group
        ours = Mamba2(D, **opts)
        theirs = peers.mamba2.Mamba2(d_model=D, d_state=ours.d_state, d_conv=4, expand=2, headdim=ours.headdim,
                                     ngroups=ours.ngroups, D_has_hdim=False, rmsnorm=True, norm_before_gate=False,
                                     bias=False, conv_bias=True, chunk_size=ours.chunk_size,
                                     use_mem_eff_path=ngroups == 1)  # its fused block, else its separate kernels
        same = ["in_proj.weight", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "out_proj.weight"]
        return ours, theirs, rename({**{n: n for n in same}, "norm_weight": "norm.weight"})
    build.__name__ = "mamba2" if ngroups == 1 else f"mamba2_ngroups{ngroups}"
    return build


def gated_deltanet(peers, monkeypatch):
    from zoo.mixers.gated_deltanet import GatedDeltaNet
    fla = peers.fla
    ours = GatedDeltaNet(D)  # 4 heads of 12, values 2x wider
    theirs = fla.GatedDeltaNet(hidden_size=D, expand_v=2, head_dim=12, num_heads=4, mode="chunk",
                               use_gate=True, use_short_conv=True, allow_neg_eigval=False, conv_size=4,
                               conv_bias=False, norm_eps=1e-5)
    cat = lambda *ts: torch.cat(ts, 0)  # noqa: E731  our stacked projections and convolutions
    to_ours = lambda f: {  # noqa: E731
        "in_proj.weight": cat(*(f[f"{n}_proj.weight"] for n in "qkvgab")),
        "conv1d.weight": cat(*(f[f"{n}_conv1d.weight"] for n in "qkv")),
        "A_log": f["A_log"], "dt_bias": f["dt_bias"], "norm_weight": f["o_norm.weight"],
        "out_proj.weight": f["o_proj.weight"]}
    return ours, theirs, to_ours


def rwkv6(peers, monkeypatch):
    from zoo.mixers.rwkv6 import RWKV6
    fla = peers.fla
    ours = RWKV6(D)  # heads of 32, mixing rank 32, decay rank 64, keys and values D wide
    theirs = fla.RWKV6Attention(mode="chunk", hidden_size=D, expand_k=1.0, expand_v=1.0, num_heads=D // 32,
                                proj_low_rank_dim=32, gate_low_rank_dim=64, norm_eps=64e-5)
    perm = [1, 2, 3, 0, 4]  # fla mixes the token shift into r, w, k, v, g; we into w, k, v, r, g
    R = 32

    def to_ours(f):
        return {"time_maa_x": f["x_proj.0.mu"], "time_maa": f["x_bias"][perm],
                "time_maa_w1": f["x_proj.0.linear.weight"].view(5, R, D)[perm].reshape(5 * R, D).t(),
                "time_maa_w2": f["x_proj.2.weight"].view(D, 5, R).permute(1, 2, 0)[perm],
                "time_decay": f["w_proj.linear.lora.2.bias"], "time_decay_w1": f["w_proj.linear.lora.0.weight"].t(),
                "time_decay_w2": f["w_proj.linear.lora.2.weight"].t(), "time_faaaa": f["bonus"],
                **{f"{ours}.weight": f[f"{n}_proj.linear.weight"]
                   for ours, n in [("receptance", "r"), ("key", "k"), ("value", "v"), ("gate", "g")]},
                "output.weight": f["o_proj.weight"], "ln_x.weight": f["g_norm.weight"], "ln_x.bias": f["g_norm.bias"]}
    return ours, theirs, to_ours


def gla(peers, monkeypatch):
    from zoo.mixers.gla import GLA
    fla = peers.fla
    ours = GLA(D)
    theirs = fla.GatedLinearAttention(mode="chunk", hidden_size=D, expand_k=0.5, expand_v=1.0, num_heads=4,
                                      use_short_conv=False, use_output_gate=True, gate_fn="swish", norm_eps=1e-5,
                                      gate_logit_normalizer=16, gate_low_rank_dim=16)
    same = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight", "gk_proj.0.weight",
            "gk_proj.1.weight", "gk_proj.1.bias", "o_proj.weight"]
    return ours, theirs, rename({**{n: n for n in same}, "norm_weight": "g_norm_swish_gate.weight"})


class HeadRMSNorm(nn.Module):
    """fla's retention norm, in our GroupNorm's place and call shape ((N, H * V) in and out):
    an RMSNorm per head with one gain shared by the heads, no bias."""

    def __init__(self, n_heads: int, head_v: int, eps: float):
        super().__init__()
        self.n_heads, self.eps = n_heads, eps
        self.weight = nn.Parameter(torch.ones(head_v))

    def forward(self, y):  # (N, H * V)
        y = y.unflatten(-1, (self.n_heads, -1))
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).flatten(-2)


def retnet(peers, monkeypatch):
    from zoo.mixers.retnet import RetNet
    fla = peers.fla
    H = 4
    ours = RetNet(D, n_heads=H)
    theirs = fla.MultiScaleRetention(mode="chunk", hidden_size=D, expand_k=1.0, expand_v=2.0, num_heads=H,
                                     use_short_conv=False, use_output_gate=True, gate_fn="swish", norm_eps=1e-5)
    # Our two documented choices, swapped for fla's: its decays 1 - 2^(-5 - h), h = 0..H-1
    # (an instance attribute shadows the method), and its norm.
    ours.log_gamma = lambda device: (1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float32, device=device))).log()
    ours.group_norm = HeadRMSNorm(H, 2 * D // H, 1e-5)
    same = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight"]
    return ours, theirs, rename({**{n: n for n in same}, "out_proj.weight": "o_proj.weight",
                                 "group_norm.weight": "g_norm_swish_gate.weight"})


def run(module, x, dy, grad: bool):
    """(y, dL/dx, {name: dL/dW}) for L = <y, dy>; only y without gradients."""
    x = x.clone().requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        y = module(x)
    y = y[0] if isinstance(y, tuple) else y  # fla's layers return (o, attentions, cache)
    if not grad:
        return y, None, None
    names, params = zip(*module.named_parameters())
    dx, *dw = torch.autograd.grad(y, [x, *params], dy)
    return y, dx, dict(zip(names, dw))


def close(ours, theirs, what):
    rel = (ours - theirs).abs().max().item() / max(theirs.abs().max().item(), 1e-30)
    assert rel <= RTOL, f"{what}: max |ours - fla| / max |fla| = {rel:.2e}"


@pytest.mark.filterwarnings("ignore:According to Bo")  # fla warns about its RWKV-6 on every build
@pytest.mark.parametrize("build", [mamba, mamba2_options(1), mamba2_options(2), gated_deltanet, rwkv6, gla, retnet],
                         ids=lambda b: b.__name__)
def test_mixer_is_the_peer_s_layer_with_the_same_weights(peers, monkeypatch, build):
    torch.manual_seed(0)
    ours, theirs, to_ours = build(peers, monkeypatch)
    with torch.no_grad():  # off init: norm gains of 1, zero biases and decays would hide a mix-up
        for p in theirs.parameters():
            p.add_(0.3 * (p.abs().mean() + 0.1) * torch.randn_like(p))
    mapped = to_ours(dict(theirs.named_parameters()))
    assert set(mapped) == {n for n, _ in ours.named_parameters()}  # every weight of ours, once
    ours.load_state_dict({k: v.detach() for k, v in mapped.items()}, strict=True)
    g = torch.Generator().manual_seed(1)
    for L, grad in [(100, True), (40, False)]:
        x, dy = torch.randn(2, L, D, generator=g), torch.randn(2, L, D, generator=g)
        ours.train(grad)
        theirs.train(grad)
        with torch_only():
            y, dx, dw = run(ours, x, dy, grad)
        y_fla, dx_fla, dw_fla = run(theirs, x, dy, grad)
        close(y, y_fla, f"output at L {L}")
        if grad:
            close(dx, dx_fla, "d/dx")
            for name, expected in to_ours(dw_fla).items():
                close(dw[name], expected, f"d/d {name}")
