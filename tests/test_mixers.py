"""The shared harness: every registered mixer is checked for the same invariants,
so a new mixer is one file + one registry line and is tested here for free."""
import pytest
import torch

import zoo
from zoo import MIXERS, mixer_class
from zoo.checks import identity_path as check_identity_path

NAMES = sorted(MIXERS)
D = 64


def small_model(mixer: str, **kw) -> zoo.ModelConfig:
    base = dict(vocab_size=97, d_model=D, n_layers=2, mixer=mixer, max_len=64)
    return zoo.ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,L", [(1, 1), (2, 7), (3, 37)])
def test_shape_and_dtype(name, dtype, B, L):
    m = mixer_class(name)(D).to(dtype)
    y = m(torch.randn(B, L, D, dtype=dtype))
    assert y.shape == (B, L, D) and y.dtype == dtype
    assert torch.isfinite(y.float()).all()
    assert isinstance(m.backend, str) and m.backend


@pytest.mark.parametrize("name", NAMES)
def test_mixer_is_causal(name):
    zoo.check_mixer_causal(mixer_class(name)(D))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("block", ["prenorm", "postnorm"])
def test_model_is_causal(name, block):
    zoo.assert_causal(zoo.build_model(small_model(name, block=block), seed=0))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("block", ["prenorm", "postnorm"])
def test_identity_path_is_the_blocks_own(name, block):
    check_identity_path(small_model(name, block=block, d_ff=48, dropout=0.1))


def _loss_and_grads(cfg: zoo.ModelConfig, mode: str) -> tuple[float, dict]:
    """One forward + backward of a fresh model on fixed tokens. ``mode``: "fp32"; "bf16"
    (everything under CPU bf16 autocast: the path a bf16 run takes); "reference" (fp32
    but with every Linear's weight, input and output rounded to bf16: what ideal bf16
    kernels would see and hand on, with every other op exact)."""
    model = zoo.build_model(cfg, seed=0)
    hooks = []
    if mode == "reference":
        to_bf16 = lambda t: t.to(torch.bfloat16).float()
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                with torch.no_grad():
                    module.weight.copy_(to_bf16(module.weight))
                hooks += [module.register_forward_pre_hook(lambda m, args: (to_bf16(args[0]),)),
                          module.register_forward_hook(lambda m, args, out: to_bf16(out))]
    tokens = torch.randint(cfg.vocab_size, (2, 301), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", torch.bfloat16, enabled=mode == "bf16"):
        logits = model(tokens[:, :-1])  # (B, L, V)
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    for hook in hooks:
        hook.remove()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


def check_bf16_autocast(cfg: zoo.ModelConfig) -> None:
    """FlashAttention's rule for a low-precision path, against a reference that rounds to
    bf16 only where ideal bf16 kernels must (every Linear's weight, input and output) and
    is exact elsewhere, both compared with fp32: under bf16 autocast the loss and the
    whole gradient are within twice the reference's error (plus 1e-3 of the loss and of
    the gradient's norm), and each parameter's gradient within 4 times (plus 1e-2 of its
    norm: per-head scalars such as A_log sum rounding over every position). A scan whose
    accumulation drops to bf16, a gate rounded before it weighs the whole stream, or a
    crash under autocast fails it."""
    loss, grads = _loss_and_grads(cfg, "fp32")
    loss_bf16, grads_bf16 = _loss_and_grads(cfg, "bf16")
    loss_ref, grads_ref = _loss_and_grads(cfg, "reference")
    what = f"{cfg.layout} ({cfg.block}) under bf16 autocast"
    assert abs(loss_bf16 - loss) <= 2 * abs(loss_ref - loss) + 1e-3 * abs(loss), \
        f"{what}: loss {loss_bf16} against fp32 {loss} (reference {loss_ref})"
    names = [n for n, g in grads.items() if g is not None and g.norm() > 0]
    flat = lambda gs: torch.cat([gs[n].flatten() for n in names])
    whole = flat(grads)
    err, err_ref = ((flat(other) - whole).norm() / whole.norm() for other in (grads_bf16, grads_ref))
    assert err <= 2 * err_ref + 1e-3, f"{what}: gradient error {err:.2e} (reference {err_ref:.2e})"
    worse = {}
    for name in names:
        g = grads[name]
        err, err_ref = ((other[name] - g).norm() / g.norm() for other in (grads_bf16, grads_ref))
        if err > 4 * err_ref + 1e-2:
            worse[name] = f"{err:.2e} (reference {err_ref:.2e})"
    assert not worse, f"{what}, gradients: {worse}"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("block", ["prenorm", "postnorm"])
def test_bf16_autocast_trains_like_fp32(name, block):
    check_bf16_autocast(small_model(name, block=block, max_len=512))


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_gets_a_gradient(name):
    # A parameter that never receives a gradient is dead weight that still counts
    # in the parameter match: that would make a comparison unfair. Zero inits (RWKV's
    # LoRA, say) legitimately give a zero first gradient, so jitter the weights first.
    m = mixer_class(name)(D)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.01 * torch.randn_like(p))
    m(torch.randn(2, 19, D)).square().mean().backward()
    dead = [n for n, p in m.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not dead, f"{name}: parameters without gradient: {dead}"


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_logits(name):
    cfg = small_model(name)
    tokens = torch.randint(cfg.vocab_size, (2, 33))
    a = zoo.build_model(cfg, seed=3)(tokens)
    b = zoo.build_model(cfg, seed=3)(tokens)
    c = zoo.build_model(cfg, seed=4)(tokens)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("name", NAMES)
def test_match_params_against_attention(name):
    base = zoo.ModelConfig(vocab_size=1000, d_model=128, n_layers=4, d_ff=512, max_len=128)
    match = zoo.match_params(base, name, knob="auto", tol=0.02)
    assert abs(match.rel_diff) <= 0.02
    assert match.config.mixer == name and match.knob in ("d_model", "d_ff", "n_layers")
    assert zoo.count_params(zoo.build_model(match.config)) == match.params
    assert match.base_params == zoo.count_params(zoo.build_model(base))


@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_lists_valid_ones(name):
    with pytest.raises(ValueError, match="valid options") as err:
        mixer_class(name)(D, no_such_option=1)
    for option in mixer_class(name).option_names:
        assert option in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_state_size_is_reported(name):
    m = mixer_class(name)(D)
    short, long = m.state_size(256), m.state_size(4096)
    assert isinstance(short, int) and 0 < short <= long


# --- hybrid stacks: the same invariants for models whose layers mix two mixers ---------

HYBRIDS = {"gated_deltanet+attention": ("gated_deltanet", {"mixer": "attention", "every": 2}),
           "grassmann+attention": ("grassmann", {"mixer": "attention", "every": 2})}


def hybrid_model(name: str, **kw) -> zoo.ModelConfig:
    mixer, hybrid = HYBRIDS[name]
    return small_model(mixer, hybrid=hybrid, **kw)


@pytest.mark.parametrize("name", sorted(HYBRIDS))
@pytest.mark.parametrize("block", ["prenorm", "postnorm"])
def test_hybrid_is_causal_and_runs_both_mixers(name, block):
    cfg = hybrid_model(name, block=block, n_layers=4)
    model = zoo.build_model(cfg, seed=0)
    zoo.assert_causal(model)
    base, other = name.split("+")
    assert cfg.name == name and cfg.layout == f"{base}+{other}+{base}+{other}"
    assert [type(b.mixer).name for b in model.blocks] == [base, other, base, other]
    logits = model(torch.randint(cfg.vocab_size, (2, 37)))
    assert logits.shape == (2, 37, cfg.vocab_size) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", sorted(HYBRIDS))
@pytest.mark.parametrize("block", ["prenorm", "postnorm"])
def test_hybrid_identity_path_is_the_blocks_own(name, block):
    check_identity_path(hybrid_model(name, block=block, d_ff=48, dropout=0.1))


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_hybrid_under_bf16_autocast(name):
    check_bf16_autocast(hybrid_model(name, max_len=512))


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_hybrid_has_no_dead_parameters(name):
    model = zoo.build_model(hybrid_model(name), seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model(torch.randint(97, (2, 19))).square().mean().backward()
    dead = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not dead, f"{name}: parameters without gradient: {dead}"


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_hybrid_is_matched_to_attention(name):
    base = zoo.ModelConfig(vocab_size=1000, d_model=128, n_layers=4, d_ff=512, max_len=128)
    mixer, hybrid = HYBRIDS[name]
    match = zoo.match_params(base, mixer, knob="auto", tol=0.02, hybrid=hybrid)
    assert abs(match.rel_diff) <= 0.02 and match.config.name == name
    assert zoo.count_params(zoo.build_model(match.config)) == match.params


def test_hybrid_config_names_the_bad_field():
    with pytest.raises(ValueError, match="hybrid\\['every'\\]=5 must be an integer from 1 to n_layers=2"):
        small_model("gla", hybrid={"mixer": "attention", "every": 5})
    with pytest.raises(ValueError, match="hybrid\\['mixer'\\]='attn' is not valid"):
        small_model("gla", hybrid={"mixer": "attn", "every": 2})
    with pytest.raises(ValueError, match="unknown option\\(s\\) \\['window'\\] for mixer 'attention'"):
        small_model("gla", hybrid={"mixer": "attention", "every": 2, "options": {"window": 3}})


def test_rotary_scores_depend_on_offsets_only():
    """Rotary q.k is the same for every pair of positions at one offset: shifting both
    by s changes nothing, and unrotated channels pass through."""
    from zoo.mixers.attention import rotary
    torch.manual_seed(0)
    q, k = torch.randn(2, 40, 3, 16, dtype=torch.float64), torch.randn(2, 40, 3, 16, dtype=torch.float64)
    q[:, :] = q[:, :1]  # every position holds the same vectors, so only positions differ
    k[:, :] = k[:, :1]
    rq, rk = rotary(q, 12), rotary(k, 12)
    scores = torch.einsum("blhd,bmhd->bhlm", rq, rk)  # (B, H, L, L)
    for off in (0, 3, 17):
        diag = scores.diagonal(-off, dim1=-2, dim2=-1)  # every (t, t - off)
        assert torch.allclose(diag, diag[..., :1].expand_as(diag)), off
    assert not torch.allclose(scores[..., 5, 5], scores[..., 5, 0])  # offsets do matter
    assert torch.equal(rq[..., 12:], q[..., 12:]) and torch.equal(rotary(q, 0), q)
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1))  # a rotation


@pytest.mark.parametrize("name", ["attention", "sliding_window"])
def test_rotary_attention_is_causal_and_every_backend_agrees(name):
    zoo.assert_causal(zoo.build_model(small_model(name, positions="none", mixer_options={"rotary": 8}), seed=0))
    mixer = mixer_class(name)(D, rotary=8)
    zoo.check_mixer_causal(mixer)
    x = torch.randn(2, 37, D)
    outs = {}
    for backend in ("math", "sdpa"):
        mixer.requested_backend = backend
        outs[backend] = mixer(x)
    torch.testing.assert_close(outs["sdpa"], outs["math"], atol=1e-5, rtol=1e-5)
    plain = mixer_class(name)(D)
    plain.load_state_dict(mixer.state_dict())  # the same weights: only the rotation differs
    assert not torch.allclose(plain(x), outs["sdpa"], atol=1e-3)


def test_rotary_option_names_the_valid_range():
    with pytest.raises(ValueError, match="rotary=7 must be an even number of channels from 0 to the head dim 16"):
        zoo.MIXERS["attention"](D, rotary=7)
