"""The process's allocator, set to keep freed memory for the next allocation.

glibc serves a block above its mmap threshold (128 KiB, rising as such blocks are freed,
to 32 MiB at most) with a fresh mmap and unmaps it when freed, so a step whose
temporaries are larger faults every page of them in again on every call: a training step
of RWKV-6 at batch 64, L 256, d 128 takes about 55k minor faults that way, each several
microseconds on a virtual machine. A long-running server's allocator would keep the
pages. ``tune_malloc`` makes glibc do so for this process: the training loop and every
benchmark's measuring process call it, and records say whether it took.

Kept pages still have to be touched once: a heap that grows over a process's first calls
(as fragmentation settles) faults its new pages in then. ``reserve_heap`` touches a block
of a given size at the heap's top and frees it, so that the growth to come is served from
pages already in place (a benchmark's warm-up reserves what its first call faulted in).
"""
from __future__ import annotations

import ctypes
import os

# mallopt(3)'s parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
_TUNED = False


def tune_malloc() -> bool:
    """Raise glibc's mmap threshold to its largest value and never trim the heap's top,
    for the rest of this process. glibc on Linux only: returns whether it took (False,
    doing nothing, elsewhere)."""
    global _TUNED
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):  # not glibc (musl, macOS, Windows)
        glibc = ""
    if not glibc.startswith("glibc"):
        return False
    libc = ctypes.CDLL("libc.so.6")
    # mallopt takes an int: 2**31 - 1 is the largest threshold; -1 is SIZE_MAX as glibc reads it
    took = bool(libc.mallopt(M_MMAP_THRESHOLD, 2 ** 31 - 1)) and bool(libc.mallopt(M_TRIM_THRESHOLD, -1))
    _TUNED = _TUNED or took
    return took


def reserve_heap(nbytes: int) -> bool:
    """Grow the heap by ``nbytes`` of touched pages and free them back to it, where
    ``tune_malloc`` took (they then stay: no mmap for the block, no trim after it).
    Returns whether it did."""
    if not _TUNED or nbytes <= 0:
        return False
    nbytes = min(nbytes, MAX_RESERVE)
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(nbytes)
    if not block:
        return False
    ctypes.memset(block, 0, nbytes)
    libc.free(block)
    return True


# Below tune_malloc's mmap threshold, so the block comes from the heap itself.
MAX_RESERVE = 1 << 30


def malloc_tuned() -> bool:
    """Whether ``tune_malloc`` took in this process."""
    return _TUNED
