"""The one timing helper of the project: latency, peak memory, and points that fail.

``measure`` times a function the way torch.utils.benchmark and FlashAttention's
benchmarks do: warm-up calls first (autotuning, caches, lazy init), then one timing
per call, summarised by the median and the 20th/80th percentiles; on CUDA each call
is bracketed by CUDA events and synchronised, so the time is the GPU's, not the
launch's. Beside them it returns the mean and the slowest call, which show a rare slow
call the median hides (a KV cache that regrows once in 64 steps), and the minor page
faults of the process over the timed calls (memory the allocator asked the kernel for
afresh; ``engine.allocator.tune_malloc`` removes glibc's share of them).

``run_point`` runs one measurement, optionally in an isolated child process, and turns
failure into data: an out-of-memory error, a memory cap or a time limit becomes a row
status ("oom", "timeout"), never an exception, so a sweep goes on to its next point.
Peak memory is ``torch.cuda.max_memory_allocated`` on CUDA and, on CPU, the peak
resident set (VmHWM) of the isolated child, both counted from the start of the point
(the runtime's own footprint -- CUDA context, imported libraries -- is left out).
"""
from __future__ import annotations

import multiprocessing as mp
import resource
import time
import traceback
import warnings
from typing import Callable, Iterator

import numpy as np
import torch

from ..engine.allocator import reserve_heap

# ``python -m tasks.benchmarks.scaling`` runs a module that the package ``tasks`` also imports; each
# child process re-imports the main module by name and runpy warns about exactly that.
# Harmless here; the filter is inherited by every child of the forkserver.
warnings.filterwarnings("ignore", message=r"'tasks(\.\w+)+' found in sys.modules", category=RuntimeWarning)


class PointTimeout(Exception):
    """The point ran past its deadline."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# A warm-up call that faults in fewer pages than this (1 MiB) found the heap at its
# high-water mark; until one does, up to SETTLE_CALLS more warm-up calls run. glibc's heap
# grows in steps over the first few calls as fragmentation settles (a Grassmann step at
# L 4096 grew by 8-64 MiB at call 3 in one process, call 8 in another, then never again
# in 30): timed calls that catch one of those steps measure the start of training, not
# its thousands of steps. So the first call is followed by a reserve as large as what it
# faulted in (tasks.engine.allocator.reserve_heap): an attention step at L 256, d 128 that
# grew its heap by 32 MiB at calls 2, 3, 5 and 8 of one process grew it in none after it.
SETTLED_FAULTS, SETTLE_CALLS = 256, 8


def measure(fn: Callable[[], object], warmup: int = 2, repeats: int = 10,
            device: torch.device | str = "cpu", deadline: float | None = None, settle: bool = False) -> dict:
    """Median, p20/p80, mean and max of ``repeats`` timed calls of ``fn`` after ``warmup``
    calls (with ``settle``, more, up to SETTLE_CALLS, while the last one still grew the
    heap; the count is returned as ``warmup_calls``), and the process's minor page faults over the timed
    calls: in all, and the median call's. ``deadline`` (a ``time.monotonic()`` value) raises PointTimeout
    between calls."""
    device = torch.device(device)

    def check():
        if deadline is not None and time.monotonic() > deadline:
            raise PointTimeout(f"past the time limit after warm-up/{len(times)} timed calls")

    times: list[float] = []
    faults: list[int] = []
    calls = 0
    while calls < warmup + (SETTLE_CALLS if settle else 0):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fn()
        _sync(device)
        calls += 1
        check()
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        if settle and calls == 1:  # room for the growth to come, its pages touched now
            reserve_heap(grew * resource.getpagesize())
        if calls >= warmup and grew < SETTLED_FAULTS:
            break
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # every thread of the process
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        check()
    p20, med, p80 = np.percentile(times, [20, 50, 80])
    return {"median_ms": med * 1e3, "p20_ms": p20 * 1e3, "p80_ms": p80 * 1e3, "mean_ms": np.mean(times) * 1e3,
            "max_ms": max(times) * 1e3, "repeats": len(times), "warmup_calls": calls, "minor_faults": sum(faults),
            "median_faults": float(np.median(faults))}


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    msg = str(exc).lower()
    return "out of memory" in msg or "can't allocate memory" in msg


def _proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> None:
    try:  # "5" resets the peak RSS to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class MemoryMeter:
    """Peak memory of one point, in MiB, counted from ``start()``. On CPU it is only
    meaningful in a fresh process (freed memory stays in the allocator's caches, so a
    second point in the same process would reuse it unseen): ``enabled=False`` there."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.device, self.enabled, self.base = device, enabled, 0

    def start(self) -> None:
        if not self.enabled:
            return
        if self.device.type == "cuda":
            _sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        _reset_peak_rss()
        self.base = _proc_status_kb("VmRSS") or 0

    def restart_peak(self) -> None:
        """Track the peak afresh from here, still counted from ``start()``'s base: the
        peak of a later phase (a decode after its prefill) apart from the earlier one's."""
        if not self.enabled:
            return
        if self.device.type == "cuda":
            _sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        _reset_peak_rss()

    def peak_mb(self) -> float | None:
        if not self.enabled:
            return None
        if self.device.type == "cuda":
            _sync(self.device)
            return (torch.cuda.max_memory_allocated(self.device) - self.base) / 2 ** 20
        hwm = _proc_status_kb("VmHWM")
        return None if hwm is None else (hwm - self.base) / 2 ** 10


def _cap_memory(device: torch.device, cap_mb: float) -> None:
    """Let the point allocate at most ``cap_mb`` more MiB: a larger allocation fails
    with the allocator's usual out-of-memory error."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_mb * 2 ** 20 / total), device)
        return
    # CPU: bound the address space at its current size plus the cap. Address space,
    # not resident memory, is what the kernel can refuse at allocation time.
    size = (_proc_status_kb("VmSize") or 0) * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (size + int(cap_mb * 2 ** 20), hard))


Target = Callable[..., Iterator[dict]]  # target(meter=, deadline=, **kwargs) yields rows


def _failure(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, PointTimeout):
        return "timeout", str(exc)
    kind = "oom" if is_oom(exc) else "error"
    return kind, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def _child(conn, target: Target, kwargs: dict, device: str, threads: int, time_limit_s: float,
           mem_cap_mb: float | None) -> None:
    device = torch.device(device)
    torch.set_num_threads(threads)
    torch.ones(64, 64) @ torch.ones(64, 64)  # start the thread pool before any memory cap
    try:
        if mem_cap_mb is not None:
            _cap_memory(device, mem_cap_mb)
        conn.send(("started", None))
        meter = MemoryMeter(device)
        for row in target(meter=meter, deadline=time.monotonic() + time_limit_s, **kwargs):
            conn.send(("row", row))
        conn.send(("done", None))
    except BaseException as exc:  # noqa: BLE001 -- every failure must reach the parent
        kind, msg = _failure(exc)
        if kind == "error":
            msg += "\n" + traceback.format_exc(limit=-3)
        conn.send(("failed", (kind, msg)))
    finally:
        conn.close()


_CONTEXT = None


def _context(preload: list[str]):
    """A forkserver: children fork from a clean server that has imported torch once,
    so each starts in milliseconds, yet none inherits threads, CUDA state or the
    parent's allocator caches (what makes a plain fork unsafe and its RSS unfair)."""
    global _CONTEXT
    if _CONTEXT is None:
        if "forkserver" in mp.get_all_start_methods():
            _CONTEXT = mp.get_context("forkserver")
            _CONTEXT.set_forkserver_preload(preload)
        else:
            _CONTEXT = mp.get_context("spawn")
    return _CONTEXT


def run_point(target: Target, kwargs: dict, *, device: torch.device, isolate: bool = True,
              time_limit_s: float = 600.0, mem_cap_mb: float | None = None,
              startup_timeout_s: float = 300.0) -> tuple[list[dict], str, str]:
    """Run ``target(meter=, deadline=, **kwargs)``, which yields one row per measurement.

    Returns ``(rows, status, error)``: the rows it yielded before finishing or failing,
    and "ok", "oom", "timeout" or "error". With ``isolate`` the target runs in a child
    process that is killed at the time limit (the target also stops itself between
    calls at ``deadline``). ``target`` must be a module-level function (it is pickled).
    """
    if not isolate:
        return _run_inline(target, kwargs, device, time_limit_s, mem_cap_mb)
    ctx = _context(["torch", target.__module__])
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, daemon=True, args=(
        send, target, kwargs, str(device), torch.get_num_threads(), time_limit_s, mem_cap_mb))
    proc.start()
    send.close()
    rows, status, error, started = [], "error", "child ended without a result", False
    deadline = time.monotonic() + startup_timeout_s
    try:
        while True:
            if not recv.poll(max(0.0, deadline - time.monotonic())):
                status = "timeout" if started else "error"
                error = f"no result within {time_limit_s:g} s" if started else "child did not start"
                break
            try:
                kind, payload = recv.recv()
            except EOFError:  # died without a word: the OOM killer (SIGKILL), or an abort
                proc.join(5)  # in the allocator under the cap (e.g. a thread that cannot start)
                code = proc.exitcode
                status = "oom" if started and (code == -9 or mem_cap_mb is not None) else "error"
                error = f"child process died (exit code {code})"
                break
            if kind == "started":  # the limit counts the point's work, not the start-up
                started = True
                grace = min(10.0, 1.0 + 0.1 * time_limit_s)  # the child stops itself first
                deadline = time.monotonic() + time_limit_s + grace
            elif kind == "row":
                rows.append(payload)
            elif kind == "done":
                status, error = "ok", ""
                break
            else:
                status, error = payload
                break
    finally:
        recv.close()
        if proc.is_alive():
            proc.kill()
        proc.join()
    return rows, status, error


def _run_inline(target, kwargs, device, time_limit_s, mem_cap_mb):
    if mem_cap_mb is not None and device.type != "cuda":
        raise ValueError("a memory cap on CPU needs isolate=True (the cap applies to a child process)")
    rows = []
    try:
        if mem_cap_mb is not None:
            _cap_memory(device, mem_cap_mb)
        meter = MemoryMeter(device, enabled=device.type == "cuda")
        for row in target(meter=meter, deadline=time.monotonic() + time_limit_s, **kwargs):
            rows.append(row)
        return rows, "ok", ""
    except Exception as exc:  # noqa: BLE001 -- a failed point is a data point
        kind, msg = _failure(exc)
        if kind == "error":
            msg += "\n" + traceback.format_exc(limit=-3)
        return rows, kind, msg
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            if mem_cap_mb is not None:
                torch.cuda.set_per_process_memory_fraction(1.0, device)
