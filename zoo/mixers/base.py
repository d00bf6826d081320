"""The mixer contract every member of the zoo follows.

A mixer is an ``nn.Module`` built as ``Mixer(d_model, **options)`` that maps
``x: (B, L, D) -> (B, L, D)`` causally: output t may depend on inputs 0..t only. It
returns its update only, never its input: the block adds the residual (zoo.model), so
the identity path is the block's alone and no mixer can drop, rescale or dropout it.
Options are the keyword arguments of the subclass's ``__init__``; anything else is
refused with a ValueError that lists the valid names, so a typo in a sweep file
fails at construction instead of silently running the default.

Everything the rest of linbench needs to know about a mixer is asked of the mixer, never
kept in a list of mixer names elsewhere: its options (``option_names``, read by presets
such as wikitext2's "n_heads for every mixer that takes it"), its cost (``core_flops``
and ``bwd_ratio``, summed by zoo.flops), whether it needs position embeddings
(``needs_positions``), its state (``state_size``) and which of its parameters take no
weight decay (``p._no_weight_decay = True``, honoured by tasks.engine.train). So a new mixer is
one file and one registry line.
"""
from __future__ import annotations

import functools
import inspect
import warnings

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from ..config import check_choice  # noqa: F401  (re-exported for the mixers)
from ..ops.chunk_tuning import measured_chunk_size

# Layers whose FLOPs zoo.flops counts from their weights (2 per weight per token), so a
# mixer's core_flops leaves them out.
DENSE = (nn.Linear, nn.Conv1d)


class Mixer(nn.Module):
    name: str = "mixer"
    option_names: tuple = ()  # the keyword options of __init__, set for each subclass below

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _guard_step_form(cls)
        if "__init__" not in cls.__dict__:
            return
        init = cls.__init__
        params = list(inspect.signature(init).parameters)[2:]  # drop self, d_model
        valid = tuple(p for p in params if p != "kwargs")

        @functools.wraps(init)
        def checked_init(self, d_model: int, **options):
            unknown = sorted(set(options) - set(valid))
            if unknown and "kwargs" not in params:
                raise ValueError(
                    f"{cls.name}: unknown option(s) {unknown}; valid options: {sorted(valid)}"
                )
            init(self, d_model, **options)
            self.d_model = d_model

        cls.__init__ = checked_init
        cls.option_names = valid

    # The implementation the last forward actually ran ("sdpa", "flash_attn",
    # "torch_chunked", "mamba_ssm", ...). Recorded with every result.
    backend: str = "torch"

    # Where the fast path comes from, for docs/zoo.md's table and the records.
    fast_path: str = "none (pure PyTorch)"

    # Bumped when a change alters what an unchanged config of this mixer computes. A run's
    # id carries every revision past 1 (sweeps.spec.make_run_id), so a record of an
    # earlier revision is never taken for this one's (CHANGELOG.md lists the revisions).
    revision: int = 1

    # Whether a block of this mixer has an MLP when ModelConfig.d_ff is left unset
    # (Mamba's blocks conventionally have none).
    uses_mlp: bool = True

    # Whether the mixer is blind to token order without position embeddings (softmax
    # attention: apart from the causal mask, permuting the past permutes nothing).
    # Recipes that give only such mixers positions (Zoology's MQAR) read it.
    needs_positions: bool = False

    # Backward FLOPs / forward FLOPs of the core (zoo.flops): 2 for matmul-like work
    # (two products per product of the forward); attention says 2.5 (FlashAttention's
    # convention: its backward recomputes the scores).
    bwd_ratio: float = 2.0

    # The chunk size the last chunked call ran with: the ``chunk_size`` option, or for
    # "auto" the size measured fastest on its shapes (``chunked``). Recorded with every
    # result; a resumed run is given it back (zoo.model.pin_chunk_sizes).
    chunk_size_used: int | None = None

    def chunked(self, op, *args, length: int, **kwargs):
        """``op(*args, chunk_size=size, **kwargs)`` over a sequence of ``length``, with
        ``size`` this mixer's ``chunk_size``: an int as given, or for "auto" the fastest
        measured on these inputs' shapes (zoo.ops.chunk_tuning)."""
        size = self.chunk_size
        if size == "auto":
            size = measured_chunk_size(op, args, kwargs, length)
        self.chunk_size_used = size
        return op(*args, chunk_size=size, **kwargs)

    def flops_chunk_size(self) -> int:
        """The chunk size core_flops counts with: the one last run, else the option (for an
        "auto" that has not run yet, the middle size it may choose)."""
        if self.chunk_size_used is not None:
            return self.chunk_size_used
        return self.chunk_size if isinstance(self.chunk_size, int) else 64

    def core_flops(self, B: int, L: int) -> float | None:
        """Forward FLOPs on a (B, L) batch of everything the mixer runs outside its
        nn.Linear / nn.Conv1d layers (zoo.flops counts those from their weights).
        Conventions (zoo.flops): a multiply-add is 2 FLOPs, elementwise work is free.

        Default: torch's ``FlopCounterMode`` on a forward over meta tensors (no memory, no
        compute), minus what it counted inside the dense layers. It sees matmuls, bmm,
        einsums and convolutions as the forward runs them: masked halves of a chunk's
        products and padding included, elementwise recurrences (a selective scan) not at
        all. A mixer whose cost that misstates overrides this with its formula, as every
        shipped mixer does (docs/extending.md). Returns None (no estimate rather
        than a wrong one) when the forward cannot run on meta tensors."""
        return counted_core_flops(self, B, L)

    def state_size(self, seq_len: int) -> int:
        """Floats of recurrent/cache state one sequence needs at inference after
        ``seq_len`` tokens (zoology's convention: KV cache for attention, the
        fixed recurrent state for SSMs / linear attention)."""
        raise NotImplementedError

    # ---- the step (decode) form -------------------------------------------------
    # ``init_state(batch, device, dtype)`` is the state of an empty context (a dict of
    # batch-first tensors; device and dtype default to the mixer's parameters');
    # ``prefill(x, state)`` runs the parallel form over x (B, L, D), the tokens that
    # follow ``state``, and returns (y, state after them); ``step(x_t, state)`` does one
    # token (B, D). Prefilling a prompt and stepping through the rest equals the parallel
    # forward over the whole sequence (tests/test_decode.py), the state holds
    # ``state_size`` floats per sequence, and a state is a value: two steps from one
    # state give two independent branches (zoo.checks.state_reusable). A mixer without a
    # step form says so.

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        raise NotImplementedError(f"{self.name}: no step (decode) form yet")

    def prefill(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError(f"{self.name}: no step (decode) form yet")

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token: x (B, D) -> (y (B, D), state). By default a prefill of one token."""
        y, state = self.prefill(x[:, None], state)
        return y[:, 0], state

    @classmethod
    def has_step_form(cls) -> bool:
        return cls.prefill is not Mixer.prefill


def _guard_step_form(cls) -> None:
    """Every subclass's step form, checked at its door (wrapped once, where defined):
    ``init_state`` with no device or dtype takes the mixer's parameters' (a float64
    model gets float64 states), and ``prefill``/``step`` refuse a state that is not a
    dict from ``init_state`` or whose batch is not the input's, which broadcasting
    would otherwise accept silently."""
    if "init_state" in cls.__dict__:
        init_state = cls.__dict__["init_state"]

        @functools.wraps(init_state)
        def placed_init_state(self, batch: int, device=None, dtype=None):
            if device is None or dtype is None:
                p = next((t for t in self.parameters() if t.is_floating_point()), None)
                if p is not None:
                    device = p.device if device is None else device
                    dtype = p.dtype if dtype is None else dtype
            return init_state(self, batch, device, dtype)
        cls.init_state = placed_init_state
    for method in ("prefill", "step"):
        if method in cls.__dict__:
            setattr(cls, method, _checked_state(cls.__dict__[method], method))


def _checked_state(method, what: str):
    """``prefill``/``step`` of a mixer, refusing a state it cannot have made for x."""
    @functools.wraps(method)
    def checked(self, x: torch.Tensor, state: dict):
        if not isinstance(state, dict):
            raise TypeError(f"{self.name}.{what}: state is {type(state).__name__}, not a state dict; "
                            f"start from mixer.init_state(batch, device, dtype)")
        batch = _state_batch(state)
        if batch is not None and batch != x.shape[0]:
            raise ValueError(f"{self.name}.{what}: the state holds {batch} sequence(s), the input {x.shape[0]}; "
                             f"a state is never broadcast over a batch (copy it per sequence)")
        if what == "prefill" and x.shape[1] == 0:  # no tokens: nothing out, the state as it was
            return x.new_zeros(x.shape), state
        return method(self, x, state)
    return checked


def _state_batch(state) -> int | None:
    """The batch of a state: the first axis of its first tensor (every state tensor is
    batch-first), None if it holds none."""
    values = state.values() if isinstance(state, dict) else state if isinstance(state, (list, tuple)) else ()
    for v in values:
        b = v.shape[0] if torch.is_tensor(v) else _state_batch(v)
        if b is not None:
            return b
    return None


def check_positive(name: str, value: int, what: str) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: {what} must be a positive integer, got {value!r}")


def chunk_sizes(model: nn.Module) -> list[int | None]:
    """The chunk size each mixer in ``model`` last ran with, in module order (None where
    it has no chunks or has not run)."""
    return [m.chunk_size_used for m in model.modules() if isinstance(m, Mixer)]


def pin_chunk_sizes(model: nn.Module, sizes: list[int | None]) -> None:
    """Give each "auto" mixer in ``model`` the size it ran with before (``chunk_sizes`` of
    the same model), so that a resumed run computes exactly what the interrupted one did
    instead of measuring again."""
    mixers = [m for m in model.modules() if isinstance(m, Mixer)]
    for m, size in zip(mixers, sizes):
        if size is not None and getattr(m, "chunk_size", None) == "auto":
            m.chunk_size = size


def check_chunk_size(name: str, value: int | str) -> None:
    """A chunked mixer's ``chunk_size``: a positive int, or "auto" (measured, ``Mixer.chunked``)."""
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name}: chunk_size must be a positive integer or 'auto', got {value!r}")


def check_conv_width(name: str, d_conv: int) -> None:
    """A short causal conv's width: its step form carries the last d_conv - 1 inputs, so a
    width of 1 (nothing carried) would make ``x[:, -(d_conv - 1):]`` keep every input."""
    check_positive(name, d_conv, "d_conv")
    if d_conv < 2:
        raise ValueError(f"{name}: d_conv={d_conv} must be >= 2 (the conv's state is its last d_conv - 1 inputs)")


def check_divisible(name: str, d_model: int, n_heads: int) -> None:
    check_positive(name, n_heads, "n_heads")
    if d_model % n_heads:
        raise ValueError(
            f"{name}: d_model={d_model} is not divisible by n_heads={n_heads}"
        )


def counted_core_flops(mixer: Mixer, B: int, L: int) -> float | None:
    """``Mixer.core_flops``'s default: FlopCounterMode's count of a no-grad forward of
    ``mixer`` on a meta (B, L, d_model) input, less the FLOPs it counted inside the
    DENSE layers. The mixer's own weights stay where they are: the forward runs on meta
    stand-ins (torch.func.functional_call), so a CUDA or CPU module costs nothing to
    count and takes its portable path, as the estimate's conventions want."""
    meta = {name: torch.empty_like(t, device="meta")
            for name, t in [*mixer.named_parameters(), *mixer.named_buffers()]}
    dtype = next((p.dtype for p in mixer.parameters() if p.is_floating_point()), torch.float32)
    # a forward records what it ran; counting must not change what the mixer reports
    recorded = ("backend", "chunk_size_used")
    saved = [(m, {k: m.__dict__.get(k) for k in recorded}) for m in mixer.modules() if isinstance(m, Mixer)]
    try:
        x = torch.empty(B, L, mixer.d_model, device="meta", dtype=dtype)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            torch.func.functional_call(mixer, meta, (x,))
    except Exception as exc:  # data-dependent Python, a tensor made on another device, ...
        warnings.warn(f"{mixer.name}: no FLOP estimate (a forward on meta tensors failed: "
                      f"{type(exc).__name__}: {exc}); define core_flops", stacklevel=2)
        return None
    finally:
        for m, values in saved:
            for k, v in values.items():
                if v is None:
                    m.__dict__.pop(k, None)
                else:
                    setattr(m, k, v)
    # The counter keys modules by path from the first module it saw, this mixer: its
    # class name, then attribute names ("GLA.gk_proj.0"). A Linear has no children, so
    # its count is its own matmul alone.
    counts = counter.get_flop_counts()
    root = type(mixer).__name__
    dense = sum(sum(counts.get(f"{root}.{name}", {}).values())
                for name, m in mixer.named_modules() if name and isinstance(m, DENSE))
    return float(counter.get_total_flops() - dense)


def chunked_linear_attention_flops(B: int, L: int, heads: int, K: int, V: int, chunk: int,
                                   score_groups: int | None = None) -> int:
    """Core FLOPs of chunked linear attention (SSD, RWKV-6, retention, GLA, the delta
    rule's share): per token, scores against chunk/2 earlier tokens of its chunk (K each,
    shared by ``score_groups`` if fewer than the heads) and their values (V), plus reading
    and updating the K x V state. The useful work of the algorithm, not what a kernel
    runs: FlopCounterMode would count the masked upper half of each chunk's products too."""
    groups = heads if score_groups is None else score_groups
    return B * L * (groups * chunk * K + heads * (chunk * V + 4 * K * V))
