"""The invariants every mixer must hold, as functions: the shared tests run them over every
registered mixer (tests/test_mixers.py, tests/test_decode.py) and ``linbench vet`` runs them
on a researcher's mixer before it trains anything. Each raises AssertionError (a
``CausalityError`` for causality) with a message that says what broke."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .causality import assert_causal, check_mixer_causal
from .mixers import mixer_class
from .model import ModelConfig, build_model


def identity_path(cfg: ModelConfig) -> None:
    """Every block of the model, with each of its dropouts at p = 1 in train mode: the
    mixer's and the MLP's updates are dropped whole, and what is left is the identity
    path, x for a pre-LN block and LN2(LN1(x)) for a post-LN one (the block's own norms).
    A mixer that returns its input inside its output, a dropout on the stream, or a norm
    in the way fails this."""
    model = build_model(cfg, seed=0).train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 1.0
    x = torch.randn(2, 23, cfg.d_model)
    for i, block in enumerate(model.blocks):
        assert block.mlp is not None, f"{cfg.layout} layer {i}: the check needs an MLP (d_ff > 0)"
        expected = x if cfg.block == "prenorm" else block.norm2(block.norm1(x))
        torch.testing.assert_close(block(x), expected, rtol=0, atol=0,
                                   msg=lambda m: f"{cfg.layout} layer {i} ({cfg.block}): {m}")


def decode(m, x: torch.Tensor, prompt: int) -> tuple[torch.Tensor, dict]:
    """Outputs of prefill(x[:, :prompt]) then one step per remaining token, and the state."""
    state = m.init_state(x.shape[0], x.device, x.dtype)
    y, state = m.prefill(x[:, :prompt], state)
    ys = [y]
    for t in range(prompt, x.shape[1]):
        y_t, state = m.step(x[:, t], state)
        ys.append(y_t[:, None])
    return torch.cat(ys, 1), state


def state_floats(state: dict) -> int:
    return sum(v.numel() for v in state.values() if torch.is_tensor(v))


def steps_match(m, prompt: int, batch: int = 3, seq_len: int = 40) -> None:
    """In float64, prefill ``prompt`` tokens and step the rest: outputs, the final state and
    its size against the parallel forward (to round-off), and the state ``state_size``
    floats per sequence."""
    m = m.to(torch.float64).eval()
    x = torch.randn(batch, seq_len, m.d_model, dtype=torch.float64)
    with torch.no_grad():
        want = m(x)
        got, state = decode(m, x, prompt)
        # the state after the whole sequence is the one a prefill of all of it leaves
        _, whole = m.prefill(x, m.init_state(batch, dtype=torch.float64))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10,
                               msg=lambda s: f"{m.name}: prefill {prompt} then step differs from the forward: {s}")
    for key, value in whole.items():
        if torch.is_tensor(value):
            torch.testing.assert_close(state[key], value, rtol=1e-10, atol=1e-10)
    held = state_floats(state)
    assert held == batch * m.state_size(seq_len), \
        f"{m.name}: the state holds {held // batch} floats a sequence, state_size({seq_len}) says {m.state_size(seq_len)}"


def state_reusable(m, batch: int = 2, prompt: int = 7) -> None:
    """In float64, a state is a value: two steps from one state (beam search, speculative
    decoding) each give what the parallel forward gives on their own sequence, whichever
    runs first, and a 0-token prefill mid-stream changes nothing."""
    m = m.to(torch.float64).eval()
    x = torch.randn(batch, prompt + 2, m.d_model, dtype=torch.float64)
    other = torch.randn(batch, m.d_model, dtype=torch.float64)  # the second branch's token
    with torch.no_grad():
        want = m(x)[:, prompt:]  # (B, 2, D)
        want_other = m(torch.cat([x[:, :prompt], other[:, None]], 1))[:, -1]
        _, state = m.prefill(x[:, :prompt], m.init_state(batch, dtype=torch.float64))
        y, state = m.prefill(x[:, prompt:prompt], state)
        assert y.shape == (batch, 0, m.d_model), f"{m.name}: a 0-token prefill gave shape {tuple(y.shape)}"
        a, after_a = m.step(x[:, prompt], state)
        b, _ = m.step(other, state)  # a second branch from the same state
        a2, _ = m.step(x[:, prompt + 1], after_a)  # the first branch goes on after it
    for got, ref, what in ((a, want[:, 0], "the first branch"), (b, want_other, "a second branch from one state"),
                           (a2, want[:, 1], "the first branch after a second one stepped from its state")):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10,
                                   msg=lambda s, what=what: f"{m.name}: {what} differs from the forward: {s}")


def trains_finite(cfg: ModelConfig, bf16: bool = False) -> None:
    """One forward and backward of a fresh LM (under CPU bf16 autocast where ``bf16``)
    gives a finite loss and finite gradients, every parameter receiving one."""
    model = build_model(cfg, seed=0)
    tokens = torch.randint(cfg.vocab_size, (2, 33), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        logits = model(tokens[:, :-1])  # (B, L, V)
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    assert math.isfinite(loss.item()), f"{cfg.mixer}: loss {loss.item()} {'under bf16 autocast' if bf16 else ''}"
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not missing, f"{cfg.mixer}: no gradient reaches {missing[:3]}"
    assert not bad, f"{cfg.mixer}: non-finite gradients in {bad[:3]}"


def finite_forward(m) -> None:
    """The mixer's update on a random float32 batch is finite (checked before causality,
    whose comparisons a NaN would turn into a confusing mismatch)."""
    y = m(torch.randn(2, 19, m.d_model))
    assert y.shape == (2, 19, m.d_model), f"{m.name}: output shape {tuple(y.shape)}, expected (2, 19, {m.d_model})"
    assert torch.isfinite(y).all(), f"{m.name}: the forward gives non-finite values"


@dataclass
class Check:
    name: str
    passed: bool | None  # None: does not apply (a mixer without a step form)
    detail: str = ""


def mixer_checks(mixer: str, options: dict | None = None, d_model: int = 32) -> list[Check]:
    """Every invariant on one mixer, in order, stopping at the first that fails (a mixer
    that reads the future is not worth timing): builds, causal (the mixer, and the LM in a
    pre-LN and a post-LN block), returns its update (the identity path is the block's),
    trains with finite gradients in float32 and under bf16 autocast, and its step form
    equals its parallel form with ``state_size`` floats held. A shape or NaN problem is
    caught first (``finite_forward``)."""
    options = dict(options or {})
    cls = mixer_class(mixer)
    model = lambda block: ModelConfig(vocab_size=61, d_model=d_model, n_layers=2, mixer=mixer, max_len=48,
                                      mixer_options=options, block=block, d_ff=2 * d_model, dropout=0.1)
    steps = [("builds", lambda: cls(d_model, **options)),
             ("forward: finite outputs", lambda: finite_forward(cls(d_model, **options))),
             ("causal: the mixer", lambda: check_mixer_causal(cls(d_model, **options))),
             *((f"causal: the LM ({b})", lambda b=b: assert_causal(build_model(model(b), seed=0)))
               for b in ("prenorm", "postnorm")),
             *((f"returns its update ({b} block)", lambda b=b: identity_path(model(b))) for b in ("prenorm", "postnorm")),
             ("trains: finite loss and gradients", lambda: trains_finite(model("prenorm"))),
             ("trains under bf16 autocast", lambda: trains_finite(model("prenorm"), bf16=True))]
    out = []
    for name, run in steps:
        try:
            run()
        except Exception as exc:  # any failure is the verdict: say which and why, in one line
            out.append(Check(name, False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"))
            return out
        out.append(Check(name, True))
    if not cls.has_step_form():
        out.append(Check("step form = parallel form (float64)", None, "no step form: decoding is not measured"))
        return out
    try:
        for prompt in (0, 1, 17, 40):
            torch.manual_seed(0)
            steps_match(cls(d_model, **options), prompt)
        state_reusable(cls(d_model, **options))
    except Exception as exc:
        out.append(Check("step form = parallel form (float64)", False,
                         f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"))
        return out
    out.append(Check("step form = parallel form (float64)", True,
                     "prompts 0, 1, 17, 40; state_size floats held; two branches from one state; "
                     "a 0-token prefill mid-stream"))
    return out
