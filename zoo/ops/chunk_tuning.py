"""Chunk sizes chosen by measurement: ``chunk_size="auto"`` in the chunked mixers.

A chunked scan's best chunk size depends on the machine, the shape and the decays: a
longer chunk does more of its work in matmuls but forms larger (chunk x chunk) score
tensors. ``measured_chunk_size`` times the op itself, forward and backward when gradients
are wanted, on the first input of each shape in the process, at every size in
``CHUNK_SIZES`` below the length (and the first at or above it: a single chunk), and
keeps the fastest (``zoo.ops.fastpath.fastest``: interleaved rounds, best of each).

The defaults stay fixed numbers, so that two runs of one config compute the same bits;
they were set from what this measures, written down by ``python -m
tasks.benchmarks.chunk_sizes`` in results/reference/chunk_sizes_cpu.csv (docs/performance.md
reads it). A measured choice differs between machines, so a mixer records the size it ran
with (``Mixer.chunk_size_used``, in every record's ``chunk_sizes``) and a resumed run takes
the recorded one rather than measuring again (tasks.engine.train).
"""
from __future__ import annotations

from typing import Callable

import torch

from .fastpath import fastest

CHUNK_SIZES = (16, 32, 64, 128, 256)

# {(op, grad, inputs' shapes, dtypes and devices, other arguments): (size, {size: seconds})},
# shared by every layer of the process
choices: dict[tuple, tuple[int, dict[str, float]]] = {}


def candidates(length: int) -> tuple[int, ...]:
    """The sizes worth timing for a sequence of ``length``: every size below it, and the
    smallest at or above it (all of those run the sequence as one chunk)."""
    below = tuple(c for c in CHUNK_SIZES if c < length)
    holding = [c for c in CHUNK_SIZES if c >= length]
    return below + tuple(holding[:1])


def _key(op: Callable, args: tuple, kwargs: dict, grad: bool) -> tuple:
    def part(a):
        if torch.is_tensor(a):
            return (tuple(a.shape), a.dtype, a.device.type, a.requires_grad)
        return a if isinstance(a, (int, float, bool, str, type(None))) else type(a).__name__
    return (op.__module__, op.__qualname__, grad, tuple(part(a) for a in args),
            tuple((k, part(v)) for k, v in sorted(kwargs.items())))


@torch.compiler.disable  # timing cannot be traced; a compiled caller gets the size as a constant
def measured_chunk_size(op: Callable, args: tuple, kwargs: dict, length: int) -> int:
    """The fastest chunk size for ``op(*args, chunk_size=c, **kwargs)`` with a sequence of
    ``length``, measured on these inputs' shapes once per process (forward, plus backward of
    the first output when gradients are on and an input wants them)."""
    sizes = candidates(length)
    if len(sizes) == 1:
        return sizes[0]
    tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    key = _key(op, args, kwargs, grad)
    if key not in choices:
        # Detached copies: the measurement must leave no trace in the caller's graph.
        fresh = {id(t): t.detach().requires_grad_(grad and t.requires_grad) for t in tensors}
        a = [fresh.get(id(x), x) if torch.is_tensor(x) else x for x in args]
        kw = {k: fresh.get(id(x), x) if torch.is_tensor(x) else x for k, x in kwargs.items()}
        leaves = [t for t in fresh.values() if t.requires_grad]

        def run(size: int):
            def call():
                out = op(*a, chunk_size=size, **kw)
                first = out[0] if isinstance(out, tuple) else out
                if leaves:
                    torch.autograd.grad(first, leaves, torch.ones_like(first))
            return call

        device = tensors[0].device if tensors else torch.device("cpu")
        name, times = fastest({str(c): run(c) for c in sizes}, device)
        choices[key] = (int(name), times)
    return choices[key][0]
