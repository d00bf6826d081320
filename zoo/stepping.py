"""Fast decode steps: a fixed-state mixer's ``step`` under torch.compile, where that
measures faster.

At decode a step is one token: a few small matrix-vector products and a dozen
elementwise ops on a state of a few thousand floats. In eager PyTorch each op is a
dispatch (microseconds) and a pass over memory, so at d_model 256 a recurrent step costs
1.5-4x attention's at 1k of context although it reads less. torch.compile fuses each
mixer's step into a few generated loops (C++ on a CPU), one family at a time and with no
kernel of ours to keep in step with the mixer: whatever ``step`` computes, the compiled
form computes (``tests/test_stepping.py`` holds them equal in float64).

The matrix-state recurrences also have fused CPU kernels (``zoo.ops.recurrent_step``),
torch ops that a compiled step keeps in its graph. A kernel call costs tens of
microseconds of Python, which a small state does not repay and a large one does, so a
step has the forms "eager" (kernels where they run), "compiled" (the same, compiled
around the kernels), "compiled_torch" (compiled with every CPU kernel off, inductor's
loops in their place) and the two below. "auto" times them on a state after a short
context and keeps the fastest, as the training paths choose theirs
(zoo.ops.fastpath.fastest).

What is left after compiling is mostly the matrix products: a dozen library calls a
step, each a few microseconds of dispatch around a product that takes less at d_model
256. "frozen" compiles the torch-only step with inductor's freezing (the weights folded
in as constants) and its C++ GEMM templates: a product whose weights are constant may
then run as a loop generated into the step, where that times faster than the library's
call (inductor's own autotuning picks, per product). The weights are baked in, so the
form refuses to run once any weight or buffer of the mixer has been written since it was
compiled (its version counter moved): call ``fast_steps`` again after training. Freezing
takes effect when the step is first called without autograd (``torch.no_grad`` or
``inference_mode``), as decoding is.

On CUDA a step's small kernels are bound by their launches, not by the GPU; "graphed"
compiles the step with CUDA graphs (torch.compile's "reduce-overhead": one graph replay a
step, as mamba_ssm's ``cg=True`` decoding), and "auto" times it there in the place of
"frozen". A replay reuses the graph's output buffers, so the graphed step hands back copies
of its outputs: a state stays a value that two branches may step from. On a CPU the same
mode compiles without graphs; it is there so that the tests run its code.

At batch 16 and d_model 1,024 the products' arithmetic bounds a step, and torch's CPU BLAS
is not the fastest one on every CPU: "blas" runs the eager step with its ``nn.Linear``
products through numpy's BLAS (``zoo.ops.blas``; offered where numpy's BLAS is an OpenBLAS
whose threads can be pinned to torch's), "compiled_blas" compiles that step around those
products (a torch op of ours in the graph), and "auto" times both beside the others on a CPU.

Only mixers whose state does not grow (``state_size`` the same at 4k and 8k tokens) are
compiled: a KV cache changes shape every block of tokens, and each shape would be a new
compilation. A mixer whose compilation fails keeps its eager step.
"""
from __future__ import annotations

import functools
import types

import torch
import torch._inductor.config as inductor_config
import torch.nn as nn

from .mixers.base import Mixer
from .ops import blas as numpy_blas
from .ops.fastpath import fastest, torch_only

STEP_IMPLS = ("eager", "compiled", "compiled_torch", "frozen", "graphed", "blas", "compiled_blas", "auto")
# inductor's options for "frozen": constant weights, which its C++ GEMM template needs, and
# that template timed against the library's call for each product (ATEN alone where the
# template does not apply, float64 for one); the timings of every choice are not printed (a
# table per product, dozens a model, on the first run)
FROZEN = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
          "autotune_num_choices_displayed": 0}


def fixed_state(mixer: Mixer) -> bool:
    """Whether the mixer's state stops growing (a recurrent state, a window)."""
    return mixer.state_size(4096) == mixer.state_size(8192)


def step_forms(m: Mixer) -> dict:
    """The forms a fixed-state mixer's step can take, by name (see the module doc)."""
    m.__dict__.pop("step", None)  # back to the class's step
    # dynamic=None: a value that changes from step to step (RetNet's position, a window
    # filling up) is made symbolic after its first change instead of compiled again each time
    compiled = torch.compile(_own_step(m), dynamic=None)
    replayed = torch.compile(_own_step(m), dynamic=None, mode="reduce-overhead")

    def compiled_torch(x, state):
        with torch_only():  # traced and run with the kernels off: a graph of its own
            return compiled(x, state)

    frozen_step = torch.compile(_own_step(m), dynamic=None, options=FROZEN)
    held = [t for t in (*m.parameters(), *m.buffers()) if not t.is_inference()]  # an inference tensor keeps no count
    seen = []  # their versions when the frozen step first ran (and compiled)

    def frozen(x, state):
        now = [t._version for t in held]
        if not seen:
            seen.append(now)
        elif now != seen[0]:
            raise RuntimeError(f"{type(m).__name__}: a weight or buffer was written after its frozen step "
                               "was compiled, which still holds the old values; call zoo.fast_steps again")
        # dynamo reads inductor's freezing flag when it traces (a recompile too), not from
        # the options: set here for the call, as plain attribute writes (a config.patch costs
        # tens of microseconds a step)
        was, inductor_config.freezing = inductor_config.freezing, True
        try:
            with torch_only():
                return frozen_step(x, state)
        finally:
            inductor_config.freezing = was

    def graphed(x, state):
        torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs are given up ...
        y, new = replayed(x, state)
        return y.clone(), _copied(new)  # ... because the caller holds copies of them

    eager = m.step
    forms = {"eager": eager, "compiled": compiled, "compiled_torch": compiled_torch, "frozen": frozen,
             "graphed": graphed}
    if not numpy_blas.available():
        return forms
    products = numpy_blas.products()  # made here: the compiled form only enters it

    def blas(x, state):
        with products:
            return eager(x, state)

    # traced through the function mode: the products stay numpy's, the rest is compiled around them
    compiled_blas = torch.compile(_own(blas), dynamic=None)
    return forms | {"blas": blas, "compiled_blas": compiled_blas}


def _own_step(m: Mixer):
    """``m.step`` over a code object of its own. Dynamo keeps a function's compiled graphs
    on its code object, at most ``recompile_limit`` (8) of them, and past that runs the
    function eagerly without a word. Every mixer's step is one function (base's state
    check around the class's step), and a frozen graph holds one mixer's weights: the
    layers of an LM would each need an entry in that one list, and exhaust it."""
    return types.MethodType(_own(type(m).step), m)


def _own(fn):
    """``fn`` over a copy of its code object (see _own_step)."""
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return functools.wraps(fn)(own)


def _copied(state):
    if torch.is_tensor(state):
        return state.clone()
    if isinstance(state, dict):
        return {k: _copied(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_copied(v) for v in state)
    return state


def fast_steps(module: nn.Module, batch: int, impl: str = "auto", context: int = 16) -> dict[str, str]:
    """Give every fixed-state mixer in ``module`` (a mixer or an LM) the step ``impl`` says
    (one of STEP_IMPLS; "auto": the fastest over a state after ``context`` tokens, of
    eager, compiled and compiled_torch, frozen and blas on a CPU or graphed on CUDA). The step is set on the
    instance, so an LM's ``step`` takes it through its blocks. Returns {module path: the
    form chosen}."""
    if impl not in STEP_IMPLS:
        raise ValueError(f"step_impl={impl!r} is not valid; choose one of {list(STEP_IMPLS)}")
    chosen = {}
    for path, m in module.named_modules():
        if not (isinstance(m, Mixer) and m.has_step_form() and fixed_state(m)):
            continue
        forms = step_forms(m)
        p = next(m.parameters(), torch.empty(0))  # a mixer without weights: CPU, float32
        if impl != "auto":
            if impl not in forms:
                raise ValueError(f"step_impl={impl!r} cannot run here: numpy's BLAS is not an OpenBLAS whose "
                                 f"threads can be set; choose one of {sorted(forms)}")
            name = impl
        else:
            # the other device's forms
            for other in (("graphed",) if p.device.type != "cuda" else ("frozen", "blas", "compiled_blas")):
                forms.pop(other, None)
            with torch.inference_mode():
                _, state = m.prefill(torch.randn(batch, context, m.d_model, device=p.device, dtype=p.dtype),
                                     m.init_state(batch))
                x = torch.randn(batch, m.d_model, device=p.device, dtype=p.dtype)

                def steps(fn):  # 32 tokens on from the same state (a state is a value), as decoding goes
                    s = state
                    for _ in range(32):
                        _, s = fn(x, s)
                name, _ = fastest({k: (lambda fn=fn: steps(fn)) for k, fn in forms.items()}, p.device, repeats=5)
        if name != "eager":
            m.step = forms[name]
        if name not in ("blas", "compiled_blas"):
            numpy_blas.forget(m.parameters())  # timed, not kept: the transposed copies go
        chosen[path] = name
    return chosen
