"""Backbone, configs, parameter counting/matching and the causality checker itself."""
import pytest
import torch

import zoo
from zoo.causality import receptive_offsets


def paper_transformer(**kw) -> zoo.ModelConfig:
    # Paper Table 1: 6 layers, d=256, d_ff=1024, 4 heads, WordPiece vocab, 128 positions.
    return zoo.ModelConfig(**{**dict(vocab_size=30522, d_model=256, n_layers=6, d_ff=1024,
                                     max_len=128, mixer_options={"n_heads": 4}), **kw})


def test_paper_transformer_has_12_59M_parameters():
    n = zoo.count_params(zoo.build_model(paper_transformer()))
    assert n == 12_585_472 and round(n / 1e6, 2) == 12.59
    assert zoo.config_params(paper_transformer()) == n  # meta-device count agrees


def test_count_without_embeddings():
    model = zoo.build_model(paper_transformer())
    n_emb = 30522 * 256 + 128 * 256
    assert zoo.count_params(model, include_embeddings=False) == 12_585_472 - n_emb


def test_forward_contract():
    cfg = zoo.ModelConfig(vocab_size=50, d_model=32, n_layers=2, max_len=16)
    logits = zoo.build_model(cfg)(torch.randint(50, (3, 16)))
    assert logits.shape == (3, 16, 50)
    with pytest.raises(ValueError, match="max_len"):
        zoo.build_model(cfg)(torch.randint(50, (1, 17)))


def test_untied_head_and_no_positions():
    cfg = zoo.ModelConfig(vocab_size=50, d_model=32, n_layers=1, tie_embeddings=False, positions="none")
    m = zoo.build_model(cfg)
    assert m.head.weight is not m.tok.weight and m.pos is None


@pytest.mark.parametrize("bad, message", [
    (dict(d_modle=64), "unknown field.*d_modle.*valid fields"),
    (dict(mixer="transformer"), "mixer='transformer'.*choose one of"),
    (dict(block="sandwich"), "block='sandwich'.*prenorm"),
    (dict(mixer_options={"heads": 4}), "unknown option.*heads.*valid options"),
    (dict(n_layers=2, layer_options=({},)), "layer_options has 1 entries"),
    (dict(d_ff=-1), "d_ff"),
])
def test_config_errors_name_the_field(bad, message):
    with pytest.raises(ValueError, match=message):
        zoo.ModelConfig(**bad)


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="valid fields"):
        zoo.ModelConfig.from_dict({"d_model": 64, "n_head": 4})
    assert zoo.ModelConfig.from_dict({"d_model": 64}).d_model == 64


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match="not divisible"):
        zoo.build_model(zoo.ModelConfig(d_model=30, mixer_options={"n_heads": 4}))


def test_unknown_mixer_lists_valid_ones():
    with pytest.raises(ValueError, match=r"mixer='transformer' is not valid; choose one of \[.*'attention'.*\], "
                                         r"or an import path"):
        zoo.build_mixer("transformer", 64)


@pytest.mark.parametrize("knob", ["d_model", "n_layers", "d_ff"])
def test_match_params_moves_one_knob(knob):
    base = paper_transformer(n_layers=4)
    m = zoo.match_params(base, "sliding_window", knob=knob, mixer_options={"window": 8, "n_heads": 2})
    assert m.knob == knob and abs(m.rel_diff) <= 0.02
    assert getattr(m.config, knob) == m.value
    assert m.config.mixer_options == {"window": 8, "n_heads": 2}
    assert "sliding_window" in str(m) and "base" in str(m)


def test_match_params_errors():
    base = paper_transformer(n_layers=2)
    with pytest.raises(ValueError, match="valid knobs"):
        zoo.match_params(base, "attention", knob="width")
    with pytest.raises(ValueError, match="cannot match within tol"):
        # moving n_layers changes the count in steps far larger than 0.01%
        zoo.match_params(base, "attention", knob="n_layers", tol=1e-4, d_ff=1000)
    with pytest.raises(ValueError, match="needs an MLP"):
        zoo.match_params(base, "attention", knob="d_ff", d_ff=0)


def test_layer_options_reach_each_layer():
    cfg = zoo.ModelConfig(d_model=32, n_layers=2, mixer="sliding_window",
                          layer_options=({"window": 2}, {"window": 5}))
    m = zoo.build_model(cfg)
    assert [b.mixer.window for b in m.blocks] == [2, 5]


def test_backends_are_observable():
    m = zoo.build_model(zoo.ModelConfig(vocab_size=20, d_model=32, n_layers=2))
    m(torch.randint(20, (1, 5)))
    assert m.backends() == {"0": "sdpa", "1": "sdpa"}


def test_causality_checker_catches_a_leak():
    # The checker must be able to fail: a tiny dependence on the future is caught
    # both by perturbation and by gradient.
    def leaky(x):
        return x + 1e-7 * x.roll(-1, dims=1)

    with pytest.raises(zoo.CausalityError):
        zoo.check_causal(leaky, torch.randn(1, 12, 3, dtype=torch.float64))
    zoo.check_causal(lambda x: x.cumsum(1), torch.randn(1, 12, 3, dtype=torch.float64))


@pytest.mark.parametrize("mixer, options, want", [
    ("sliding_window", {"window": 4, "n_heads": 1}, set(range(9))),  # two layers of 4 back
    ("grassmann", {"offsets": [1, 3], "r": 4}, {0, 1, 2, 3, 4, 6}),  # sums of one of 0, 1, 3 per layer
    ("attention", {"n_heads": 1}, set(range(20))),
    # the paper's offsets 1, 2, 4, 8, 12, 16, two layers: 20 of the 33 distances 0..32 (the README says so)
    ("grassmann", {"r": 4}, {0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 13, 14, 16, 17, 18, 20, 24, 28, 32}),
])
def test_receptive_offsets_are_the_sums_of_each_layers_offsets(mixer, options, want):
    model = zoo.build_model(zoo.ModelConfig(vocab_size=20, d_model=8, n_layers=2, max_len=40, d_ff=0,
                                            mixer=mixer, mixer_options=options))
    assert receptive_offsets(model, 40 if mixer == "grassmann" else 20) == want


@pytest.mark.parametrize("mixer, options, n_layers, want", [
    # one layer: only the pair's own product, at the later token (a partner 1 back)
    ("grassmann", {"r": 4}, 1, {1}),
    # the paper's offsets, two layers: the pair bound at its second token and carried by
    # one offset (2 + 1, 4 + 1, ...), or two layer-1 products met at t (t = 2: the first
    # token 2 back times the second 1 back; t = 4: (4, 0) times (3, 1))
    ("grassmann", {"r": 4}, 2, {1, 2, 3, 4, 5, 9, 13, 17}),
    ("grassmann", {"r": 4, "offsets": [1, 3, 5, 9, 13, 17]}, 2, {1, 2, 3, 4, 5, 6, 9, 10, 13, 14, 17, 18}),
    ("sliding_window", {"window": 16, "n_heads": 1}, 2, set(range(1, 18))),  # bound at 1, carried 16
    ("attention", {"n_heads": 1}, 2, set(range(1, 40))),
])
def test_bound_pair_reach_is_where_a_product_holds_both_tokens(mixer, options, n_layers, want):
    from zoo.causality import bound_pair_reach
    model = zoo.build_model(zoo.ModelConfig(vocab_size=20, d_model=8, n_layers=n_layers, max_len=40, d_ff=0,
                                            mixer=mixer, mixer_options=options))
    assert bound_pair_reach(model, 40) == want


def test_seed_does_not_touch_global_rng():
    torch.manual_seed(1)
    expected = torch.rand(1)
    torch.manual_seed(1)
    zoo.build_model(zoo.ModelConfig(vocab_size=20, d_model=32, n_layers=1), seed=5)
    assert torch.equal(torch.rand(1), expected)


def test_future_pairing_grassmann_is_caught():
    # The paper's literal formula pairs z_t with z_{t+Δ}: a leak that must be detected,
    # never silently trained, at the mixer and at the model level.
    zoo.check_mixer_causal(zoo.MIXERS["grassmann"](64))
    with pytest.raises(zoo.CausalityError):
        zoo.check_mixer_causal(zoo.MIXERS["grassmann"](64, pairing="future"))
    cfg = zoo.ModelConfig(vocab_size=97, d_model=64, n_layers=2, max_len=64, mixer="grassmann",
                          mixer_options={"pairing": "future", "offsets": (1, 2)})
    with pytest.raises(zoo.CausalityError):
        zoo.assert_causal(zoo.build_model(cfg))


def test_mixer_table_cli(capsys):
    from zoo.__main__ import main

    main(["--d-model", "64", "--seq-len", "128"])
    out = capsys.readouterr().out
    for name in zoo.MIXERS:
        assert f"| {name} |" in out


def test_init_std_draws_every_linear_small_and_keeps_what_a_mixer_protects():
    base = zoo.ModelConfig(vocab_size=64, d_model=64, n_layers=2, mixer="mamba", d_ff=128)
    default, small = (zoo.build_model(base.replace(init_std=s), seed=0) for s in (None, 0.02))
    torch.testing.assert_close(default.blocks[0].mixer.in_proj.weight,  # None: the init of before
                               zoo.build_model(base, seed=0).blocks[0].mixer.in_proj.weight, rtol=0, atol=0)
    linears = [(n, m) for n, m in small.named_modules() if isinstance(m, torch.nn.Linear) and n != "head"]
    assert len(linears) >= 8
    for name, m in linears:
        assert abs(m.weight.std().item() - 0.02) < 0.004, name
        if m.bias is not None and name.endswith("dt_proj"):  # Mamba's step-size bias: its own init kept
            torch.testing.assert_close(m.bias, dict(default.named_modules())[name].bias, rtol=0, atol=0)
        elif m.bias is not None:
            assert not m.bias.any(), name
    assert default.blocks[0].mixer.in_proj.weight.std().item() > 0.05  # PyTorch's default is wider
    with pytest.raises(ValueError, match="init_std"):
        base.replace(init_std=0.0)


def test_match_params_takes_the_candidates_own_layer_options():
    """The 12-layer Grassmann LM matched to the TransformerLM with its one offset per layer."""
    base = zoo.ModelConfig(vocab_size=64, d_model=64, n_layers=4, d_ff=128)
    layers = tuple({"offsets": (o,)} for o in (1, 2, 4, 8))
    m = zoo.match_params(base, "grassmann", knob="auto", layer_options=layers)
    assert m.config.layer_options == layers and abs(m.rel_diff) <= 0.02
    back = zoo.match_params(base.replace(mixer="grassmann", layer_options=layers), "attention", knob="auto", tol=0.05)
    assert back.config.layer_options == ()  # the base's per-layer options are its mixer's
