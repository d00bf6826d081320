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
from zoo.checks import decode, state_floats as floats, steps_match

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
