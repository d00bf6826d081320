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

D, B, L = 32, 3, 40
STEPPED = sorted(n for n in MIXERS if mixer_class(n).has_step_form())
# small, and chunks of 16 so that the prompt lengths cross a chunk's edges
OPTIONS = {"attention": {"n_heads": 4, "rotary": 4}, "sliding_window": {"n_heads": 4, "window": 5},
           "grassmann": {"r": 6, "offsets": (1, 2, 4, 8)}, "mamba": {"chunk_size": 16},
           "mamba2": {"chunk_size": 16, "headdim": 16}, "rwkv6": {"chunk_size": 16, "head_size": 16},
           "retnet": {"chunk_size": 16, "n_heads": 4}, "gla": {"chunk_size": 16, "n_heads": 4},
           "gated_deltanet": {"chunk_size": 16, "n_heads": 4}}
PROMPTS = (0, 1, 7, 16, 17, 33, L)  # empty, one token, odd, around a 16-step chunk, whole


def build(name: str, dtype) -> zoo.Mixer:
    torch.manual_seed(0)
    return mixer_class(name)(D, **OPTIONS.get(name, {})).to(dtype).eval()


def decode(m: zoo.Mixer, x: torch.Tensor, prompt: int) -> tuple[torch.Tensor, dict]:
    """Outputs of prefill(x[:, :prompt]) then one step per remaining token, and the state."""
    state = m.init_state(x.shape[0], x.device, x.dtype)
    y, state = m.prefill(x[:, :prompt], state)
    ys = [y]
    for t in range(prompt, x.shape[1]):
        y_t, state = m.step(x[:, t], state)
        ys.append(y_t[:, None])
    return torch.cat(ys, 1), state


def floats(state: dict) -> int:
    return sum(v.numel() for v in state.values() if torch.is_tensor(v))


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", STEPPED)
def test_step_form_equals_the_parallel_form_in_float64(name, prompt):
    m = build(name, torch.float64)
    x = torch.randn(B, L, D, dtype=torch.float64)
    with torch.no_grad():
        want = m(x)
        got, state = decode(m, x, prompt)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # the state after the whole sequence is the one a prefill of all of it leaves
    _, whole = m.prefill(x, m.init_state(B, dtype=torch.float64))
    for key, value in whole.items():
        if torch.is_tensor(value):
            torch.testing.assert_close(state[key], value, rtol=1e-10, atol=1e-10)
    assert floats(state) == B * m.state_size(L)


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
