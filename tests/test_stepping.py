"""The compiled decode steps (zoo.stepping) compute what the mixer's own step computes:
prefill a prompt, then step with each, in float64, for every fixed-state mixer; a KV
cache (whose shape grows) is never compiled; "auto" keeps one of the CPU forms; the
compiled form calls the fused CPU kernels and "compiled_torch" does not; "frozen" traces its
weights as constants and refuses to run once they are written."""
from __future__ import annotations

import pytest
import torch

import zoo
from zoo import MIXERS, mixer_class
from zoo.checks import decode
from zoo.stepping import fast_steps, fixed_state

D = 64
FIXED = sorted(n for n in MIXERS if mixer_class(n).has_step_form() and fixed_state(mixer_class(n)(D)))


def test_the_fixed_state_mixers_are_the_recurrent_ones_and_the_window():
    assert "attention" not in FIXED and {"mamba", "mamba2", "gla", "grassmann", "sliding_window"} <= set(FIXED)


@pytest.mark.parametrize("impl", ["compiled", "compiled_torch", "frozen", "graphed", "blas", "compiled_blas"])
@pytest.mark.parametrize("name", FIXED)
def test_the_compiled_step_equals_the_eager_one_in_float64(name, impl):
    torch.manual_seed(0)
    m = mixer_class(name)(D).to(torch.float64).eval()
    x = torch.randn(2, 30, D, dtype=torch.float64)
    with torch.no_grad():
        want, want_state = decode(m, x, 11)
    assert fast_steps(m, batch=2, impl=impl) == {"": impl}
    assert "step" in m.__dict__  # the instance's step is the compiled one
    with torch.no_grad():
        got, state = decode(m, x, 11)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for key, value in want_state.items():
        if torch.is_tensor(value):
            torch.testing.assert_close(state[key], value, rtol=1e-12, atol=1e-12)
    assert fast_steps(m, batch=2, impl="eager") == {"": "eager"} and "step" not in m.__dict__


def test_auto_picks_by_measurement_in_an_lm_and_leaves_attention_eager():
    cfg = zoo.ModelConfig(vocab_size=61, d_model=D, n_layers=2, max_len=64, mixer="gla",
                          hybrid={"mixer": "attention", "every": 2})
    lm = zoo.build_model(cfg, seed=0).eval()
    chosen = fast_steps(lm, batch=1, impl="auto")
    paths = [p for p, m in lm.named_modules() if isinstance(m, zoo.Mixer)]
    kinds = {p: type(m).__name__ for p, m in lm.named_modules() if isinstance(m, zoo.Mixer)}
    assert set(chosen) == {p for p in paths if kinds[p] == "GLA"}
    assert set(chosen.values()) <= {"eager", "compiled", "compiled_torch", "frozen", "blas", "compiled_blas"}
    tokens = torch.randint(61, (1, 20))
    out = zoo.generate(lm, tokens[:, :4], new_tokens=10)
    with torch.no_grad():
        assert torch.equal(out[:, 4:], lm(out[:, :-1]).argmax(-1)[:, 3:])
    with pytest.raises(ValueError, match="step_impl='fast' is not valid"):
        fast_steps(lm, batch=1, impl="fast")


@pytest.mark.parametrize("name", ["gla", "retnet", "rwkv6", "gated_deltanet"])
def test_compiled_keeps_the_fused_kernel_in_its_graph_and_compiled_torch_leaves_it_out(name, monkeypatch):
    from zoo.ops import recurrent_step
    calls = []
    real = recurrent_step.cpu_kernels.library
    monkeypatch.setattr(recurrent_step.cpu_kernels, "library",
                        lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    torch.manual_seed(0)
    m = mixer_class(name)(D).eval()
    x = torch.randn(2, 9, D)
    counts = {}
    for impl in ("eager", "compiled", "compiled_torch"):
        fast_steps(m, batch=2, impl=impl)
        with torch.no_grad():
            decode(m, x, 4)  # 5 steps
        counts[impl] = calls.count(recurrent_step.STEP_CPP)
        calls.clear()
    assert counts["eager"] >= 5 and counts["compiled"] >= 5 and counts["compiled_torch"] == 0, counts


@pytest.mark.parametrize("name", ["rwkv6", "mamba2"])
def test_frozen_traces_its_weights_as_constants_and_refuses_once_they_are_written(name, monkeypatch):
    from torch._dynamo.variables import builder
    traced = []
    real = builder.is_parameter_freezing  # what dynamo asks when it meets a weight
    monkeypatch.setattr(builder, "is_parameter_freezing", lambda: traced.append(real()) or traced[-1])
    torch.manual_seed(0)
    m = mixer_class(name)(D).eval()
    x = torch.randn(2, 9, D)
    with torch.no_grad():
        _, state = m.prefill(x[:, :8], m.init_state(2))
        fast_steps(m, batch=2, impl="frozen")
        m.step(x[:, 8], state)
        assert traced and all(traced)  # every weight traced as a constant
        weight = next(mod.weight for mod in m.modules() if isinstance(mod, torch.nn.Linear))
        weight.mul_(0.5)  # an in-place write, as an optimizer step makes
        with pytest.raises(RuntimeError, match="written after its frozen step was compiled.*fast_steps again"):
            m.step(x[:, 8], state)
        fast_steps(m, batch=2, impl="frozen")  # compiled afresh, with the new weights
        got, _ = m.step(x[:, 8], state)
        fast_steps(m, batch=2, impl="eager")
        torch.testing.assert_close(got, m.step(x[:, 8], state)[0], rtol=1e-4, atol=1e-5)


def test_every_layer_of_a_deep_lm_gets_its_own_frozen_graph():
    """A frozen graph holds its layer's weights; past dynamo's 8 graphs a function, a layer
    sharing one function's list with the others would run eagerly without a word."""
    from torch._dynamo.utils import counters
    cfg = zoo.ModelConfig(vocab_size=61, d_model=32, n_layers=10, max_len=64, mixer="gla")
    lm = zoo.build_model(cfg, seed=0).to(torch.float64).eval()
    tokens = torch.randint(61, (1, 4))
    want = zoo.generate(lm, tokens, new_tokens=3)
    counters.clear()
    assert set(fast_steps(lm, batch=1, impl="frozen").values()) == {"frozen"}
    assert torch.equal(zoo.generate(lm, tokens, new_tokens=3), want)
    assert counters["frames"]["ok"] == 10, dict(counters["frames"])


def test_graphed_hands_back_copies_of_the_buffers_a_replay_reuses(monkeypatch):
    """A CUDA graph writes every replay's outputs into the same buffers. Stood in for by a
    compile that does so on a CPU: two branches stepped from one state still see their own
    values, because the graphed step returns copies."""
    real = torch.compile

    def replaying(fn, mode=None, **kw):
        if mode != "reduce-overhead":
            return real(fn, **kw)
        buffers = {}

        def replay(x, state):
            y, new = fn(x, state)
            out = buffers.setdefault("out", (torch.empty_like(y), {k: torch.empty_like(v) for k, v in new.items()}))
            out[0].copy_(y)
            for k, v in new.items():
                out[1][k].copy_(v)
            return out
        return replay

    monkeypatch.setattr(torch, "compile", replaying)
    torch.manual_seed(0)
    m = mixer_class("gla")(D).eval()
    with torch.no_grad():
        _, state = m.prefill(torch.randn(1, 5, D), m.init_state(1))
        x1, x2 = torch.randn(2, 1, D)
        want1, want2 = m.step(x1, state), m.step(x2, state)
        fast_steps(m, batch=1, impl="graphed")
        got1, got2 = m.step(x1, state), m.step(x2, state)
    for got, want in ((got1, want1), (got2, want2)):
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1]["S"], want[1]["S"])
