"""The step (decode) form equals the parallel one: prefill a prompt, then feed the rest one
token at a time, and compare every output and the final state with the parallel forward
over the whole sequence, at prompt lengths around a chunk's edges, batch > 1, in float64
to round-off and in float32 within flash-linear-attention's relative rule. The state holds
exactly ``state_size`` floats per sequence."""
from __future__ import annotations

import pytest
import torch

import zoo
from zoo import MIXERS, mixer_class
from zoo.checks import decode, state_floats as floats, state_reusable, steps_match
from zoo.generate import pick

D, B, L = 32, 3, 40
STEPPED = sorted(n for n in MIXERS if mixer_class(n).has_step_form())
# small, and chunks of 16 so that the prompt lengths cross a chunk's edges
OPTIONS = {"attention": {"n_heads": 4, "rotary": 4}, "sliding_window": {"n_heads": 4, "window": 5},
           "grassmann": {"r": 6, "offsets": (1, 2, 4, 8)}, "mamba": {"chunk_size": 16},
           "mamba2": {"chunk_size": 16, "headdim": 16}, "rwkv6": {"chunk_size": 16, "head_size": 16},
           "retnet": {"chunk_size": 16, "n_heads": 4}, "gla": {"chunk_size": 16, "n_heads": 4},
           "gated_deltanet": {"chunk_size": 16, "n_heads": 4}}
PROMPTS = (0, 1, 7, 15, 16, 17, 33, L)  # empty, one token, odd, a 16-step chunk -1, +0, +1, chunks, whole


def build(name: str, dtype) -> zoo.Mixer:
    torch.manual_seed(0)
    return mixer_class(name)(D, **OPTIONS.get(name, {})).to(dtype).eval()


def assert_steps_match(m: zoo.Mixer, prompt: int) -> None:
    """The harness (``zoo.checks.steps_match``) at this file's batch and length: any mixer
    (tests/test_toy_mixer.py's and docs/extending.md's skeleton too)."""
    steps_match(m, prompt, B, L)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", STEPPED)
def test_step_form_equals_the_parallel_form_in_float64(name, prompt):
    assert_steps_match(build(name, torch.float64), prompt)


@pytest.mark.parametrize("name", STEPPED)
def test_step_form_in_float32_within_fla_relative_rule(name):
    """fla's generation check: decode a quarter-prefilled sequence, relative error <= 2e-3."""
    m = build(name, torch.float32)
    x = torch.randn(B, L, D)
    with torch.no_grad():
        want = m(x)
        got, _ = decode(m, x, L // 4)
    assert ((got - want).abs().max() / want.abs().max()).item() <= 2e-3


@pytest.mark.parametrize("name", STEPPED)
def test_state_holds_state_size_floats_at_every_context(name):
    m = build(name, torch.float32)
    state = m.init_state(B)
    for seen in range(1, 24):
        with torch.no_grad():
            _, state = m.step(torch.randn(B, D), state)
        assert floats(state) == B * m.state_size(seen), seen


def test_every_registered_mixer_steps_and_one_without_the_form_says_so():
    assert STEPPED == sorted(MIXERS)

    class Plain(zoo.Mixer):
        name = "plain"

        def __init__(self, d_model: int):
            super().__init__()

        def forward(self, x):
            return x

    assert not Plain.has_step_form()
    with pytest.raises(NotImplementedError, match="plain: no step"):
        Plain(D).init_state(1)


def test_a_future_pairing_has_no_step_form():
    m = mixer_class("grassmann")(D, pairing="future")
    with pytest.raises(NotImplementedError, match="reads later tokens"):
        m.init_state(1)


# ---- the whole LM: every layer its own state, positions carried, hybrids included ----

LMS = {name: {"mixer": name, "mixer_options": OPTIONS.get(name, {})} for name in STEPPED}
LMS["grassmann+attention"] = {**LMS["grassmann"], "hybrid": {"mixer": "attention", "every": 2,
                                                             "options": OPTIONS["attention"]}}
LMS["gated_deltanet+attention"] = {**LMS["gated_deltanet"], "hybrid": {"mixer": "attention", "every": 2,
                                                                       "options": OPTIONS["attention"]}}
VOCAB = 61


def build_lm(name: str, block: str = "postnorm") -> zoo.LM:
    """Two layers, learned positions (so the decode must carry the position) and the
    paper's post-LN block by default, dropout on (generate and eval must switch it off)."""
    cfg = zoo.ModelConfig(vocab_size=VOCAB, d_model=D, n_layers=2, max_len=64, block=block, dropout=0.1,
                          **LMS[name])
    return zoo.build_model(cfg, seed=0).to(torch.float64).eval()


def lm_decode(lm: zoo.LM, tokens: torch.Tensor, prompt: int) -> tuple[torch.Tensor, dict]:
    state = lm.init_state(tokens.shape[0], dtype=torch.float64)
    logits, state = lm.prefill(tokens[:, :prompt], state)
    out = [logits]
    for t in range(prompt, tokens.shape[1]):
        step, state = lm.step(tokens[:, t], state)
        out.append(step[:, None])
    return torch.cat(out, 1), state


@pytest.mark.parametrize("block", ("postnorm", "prenorm"))
@pytest.mark.parametrize("name", sorted(LMS))
def test_lm_prefill_then_steps_equal_the_parallel_logits(name, block):
    lm = build_lm(name, block)
    tokens = torch.randint(VOCAB, (B, L))
    with torch.no_grad():
        want = lm(tokens)
        for prompt in PROMPTS:
            got, state = lm_decode(lm, tokens, prompt)
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert state["pos"] == L
    assert sum(floats(layer) for layer in state["layers"]) == B * lm.state_size(L)


@pytest.mark.parametrize("name", sorted(LMS))
def test_greedy_generation_is_the_parallel_argmax(name):
    """mamba_ssm's check: each generated token is the argmax of the parallel forward over
    the sequence generated so far."""
    lm = build_lm(name)
    prompt = torch.randint(VOCAB, (B, 5))
    out = zoo.generate(lm, prompt, new_tokens=L - 5)
    assert out.shape == (B, L) and torch.equal(out[:, :5], prompt)
    with torch.no_grad():
        want = lm(out[:, :-1]).argmax(-1)[:, 4:]  # (B, L - 5): the prediction after each position from 4 on
    assert torch.equal(out[:, 5:], want)


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    lm = build_lm("grassmann+attention")
    prompt = torch.randint(VOCAB, (B, 3))
    draw = lambda **kw: zoo.generate(lm, prompt, new_tokens=20, temperature=1.0, **kw)  # noqa: E731
    torch.manual_seed(1)
    a = draw(seed=7)
    torch.manual_seed(2)  # the global RNG does not enter
    assert torch.equal(draw(seed=7), a)
    assert not torch.equal(draw(seed=8), a)
    assert torch.equal(draw(seed=8, top_k=1), zoo.generate(lm, prompt, new_tokens=20))
    # top-k keeps every draw among the k likeliest next tokens
    with torch.no_grad():
        out = draw(seed=3, top_k=3)
        logits = lm(out[:, :-1])[:, 2:]  # (B, 20, V)
    allowed = logits.topk(3, -1).indices
    assert (allowed == out[:, 3:, None]).any(-1).all()


def test_generate_refuses_an_empty_prompt_and_positions_past_the_table():
    lm = build_lm("attention")
    with pytest.raises(ValueError, match="prompt must be"):
        zoo.generate(lm, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="exceeds max_len=64"):
        zoo.generate(lm, torch.zeros(1, 60, dtype=torch.long), 10)


# ---- a state is a value: branches, empty prefills, batch, dtype, bad arguments ----


@pytest.mark.parametrize("name", STEPPED)
def test_two_branches_from_one_state_and_an_empty_prefill_change_nothing(name):
    """Beam search and speculative decoding step twice from one state; the KV cache written
    in place must not let the second branch overwrite the first's keys."""
    torch.manual_seed(0)
    state_reusable(build(name, torch.float64))


@pytest.mark.parametrize("name", STEPPED)
def test_a_state_follows_the_mixer_dtype_and_refuses_another_batch(name):
    m = build(name, torch.float64)
    state = m.init_state(1)  # no device, no dtype: the mixer's
    dtypes = {v.dtype for v in state.values() if torch.is_tensor(v)}
    assert dtypes == {torch.float64}, dtypes
    x = torch.randn(3, 4, D, dtype=torch.float64)
    with torch.no_grad():
        _, state = m.prefill(x[:1], state)
        with pytest.raises(ValueError, match="state holds 1 sequence"):
            m.prefill(x, state)  # a batch-1 state is never broadcast over 3
        with pytest.raises(ValueError, match="state holds 1 sequence"):
            m.step(x[:, 0], state)
        with pytest.raises(TypeError, match="init_state"):
            m.step(x[:, 0], None)  # stepping before init_state


@pytest.mark.parametrize("name", ["mamba", "mamba2", "gated_deltanet"])
def test_a_conv_of_width_1_is_refused(name):
    """Its state would be the conv's last 0 inputs, and x[:, -(d_conv - 1):] keeps them all."""
    with pytest.raises(ValueError, match="d_conv=1 must be >= 2"):
        mixer_class(name)(D, **{**OPTIONS.get(name, {}), "d_conv": 1})


def test_generate_leaves_a_training_model_training():
    lm = build_lm("attention").train()
    zoo.generate(lm, torch.randint(VOCAB, (1, 3)), new_tokens=4)
    assert lm.training and all(m.training for m in lm.modules())


def test_sampling_without_a_seed_draws_fresh_text():
    lm = build_lm("attention")
    prompt = torch.randint(VOCAB, (1, 3))
    draws = {tuple(zoo.generate(lm, prompt, new_tokens=12, temperature=5.0)[0].tolist()) for _ in range(3)}
    assert len(draws) > 1


def test_top_k_keeps_exactly_k_tokens_when_logits_tie():
    """bf16 logits tie often; a threshold at the k-th value would keep every tie."""
    logits = torch.zeros(1, 100, dtype=torch.bfloat16)
    logits[0, :3] = 1.0  # three clear favourites, then 97 tied
    gen = torch.Generator().manual_seed(0)
    picked = {pick(logits, 1.0, 5, gen).item() for _ in range(400)}
    assert picked <= set(range(100)) and len(picked) == 5


def test_sampling_refuses_bad_temperatures_and_a_tiny_one_is_greedy():
    lm = build_lm("attention")
    prompt = torch.randint(VOCAB, (2, 3))
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="temperature="):
            zoo.generate(lm, prompt, new_tokens=3, temperature=bad)
    with pytest.raises(ValueError, match="seed="):
        zoo.generate(lm, prompt, new_tokens=3, temperature=1.0, seed=1.5)
    tiny = zoo.generate(lm, prompt, new_tokens=8, temperature=1e-45, seed=0)
    assert torch.equal(tiny, zoo.generate(lm, prompt, new_tokens=8))


@pytest.mark.parametrize("d_model", [32, 256])
def test_grassmann_steps_a_repeated_token_in_float32_as_the_parallel_form(d_model):
    """A token repeated at an offset wedges to exactly 0 in the parallel form (its z is
    bitwise its partner's); the step computes its z alone, a few ulps off, and the 1/eps of
    the normalisation must not blow that up (4.7e-3 before, against 5e-7 elsewhere)."""
    torch.manual_seed(0)
    m = mixer_class("grassmann")(d_model).eval()
    x = torch.randn(2, 40, d_model)
    x[:, 20], x[:, 30] = x[:, 12], x[:, 29]  # repeats at offsets 8 and 1; the first copy in the prompt
    with torch.no_grad():
        want = m(x)
        got, _ = decode(m, x, 15)
    assert (got - want).abs().max().item() < 1e-5
