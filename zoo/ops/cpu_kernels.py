"""Small C++ kernels for the CPU, compiled on first use and called through ctypes.

A kernel is a ``.cpp`` file in this package with plain ``extern "C"`` functions on raw
pointers: no torch headers, so it builds in a second or two with the system compiler
and needs no build step at install time. ``library(name, signatures)`` compiles it once
into a cache directory (``$LINBENCH_KERNEL_CACHE``, default ~/.cache/linbench/kernels)
under a name hashed from the source (with the shared headers, cpu_math.h), the flags, the
compiler and the CPU, so an edit or another machine rebuilds; it compiles to a temporary
file and renames it into place, so concurrent processes never load a half-written library. Without a compiler, or when the
build fails, it warns once, naming why, and returns None: callers then run their torch path.
``LINBENCH_NO_CPU_KERNELS=1`` and ``fastpath.torch_only()`` turn every kernel off.

The kernels are single-threaded and take a batch slice: ``over_batch`` runs one call per
slice from a thread pool (ctypes releases the GIL during the call). No OpenMP, whose
runtime would load beside the one torch brings.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch

from .fastpath import enabled

HERE = Path(__file__).parent
CXX = os.environ.get("CXX") or "g++"
# Not -ffast-math: GCC before 13 links crtfastmath.o into shared libraries too, whose
# constructor turns on flush-to-zero for the whole process (torch's denormals included).
# These are the parts the kernels need: reductions reassociated so that they vectorise.
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno",
         "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math")

_LIBS: dict[str, ctypes.CDLL | None] = {}  # source name -> loaded library, None if it cannot be
_WHY_NOT: dict[str, str] = {}
_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None


def disabled() -> bool:
    return os.environ.get("LINBENCH_NO_CPU_KERNELS", "") not in ("", "0") or not enabled()


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "linbench" / "kernels"
    return Path(os.environ.get("LINBENCH_KERNEL_CACHE") or default)


def library(name: str, signatures: dict[str, tuple] | None = None) -> ctypes.CDLL | None:
    """The compiled ``name`` (a .cpp file of this package) with ``signatures`` (function
    name -> ctypes argument types; every function returns void) set, or None when CPU
    kernels are off or it cannot be built (warned once per process)."""
    if disabled():
        return None
    with _LOCK:
        if name not in _LIBS:
            lib, why = _build(name)
            if lib is None:
                _WHY_NOT[name] = why
                warnings.warn(f"linbench: CPU kernel {name} cannot run, so the torch path runs "
                              f"instead: {why}", RuntimeWarning, stacklevel=3)
            _LIBS[name] = lib
        lib = _LIBS[name]
    if lib is not None:
        for fn, argtypes in (signatures or {}).items():
            func = getattr(lib, fn)  # ctypes keeps this object: set once, it stays set
            if func.argtypes is None:  # without them, addresses would pass as 32-bit ints
                func.argtypes, func.restype = argtypes, None
    return lib


def _build(name: str) -> tuple[ctypes.CDLL | None, str]:
    compiler = shutil.which(CXX)
    if compiler is None:
        return None, f"no C++ compiler: {CXX!r} is not on PATH (set CXX)"
    try:
        source = (HERE / name).read_text()  # absent from an install without package data
        source += "".join(h.read_text() for h in sorted(HERE.glob("*.h")))  # what it may include
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout.split("\n")[0]
        key = "\n".join([source, " ".join(FLAGS), compiler, version, _machine()])
        target = cache_dir() / f"{Path(name).stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=target.parent)
            os.close(fd)
            try:
                proc = subprocess.run([compiler, *FLAGS, "-o", tmp, str(HERE / name)],
                                      capture_output=True, text=True, timeout=300)
                if proc.returncode != 0:
                    tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
                    return None, f"{CXX} failed to compile {name}:\n{tail}"
                os.chmod(tmp, 0o755)  # mkstemp's 0600 would keep a shared cache to one user
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return ctypes.CDLL(str(target)), ""
    except (OSError, subprocess.SubprocessError) as err:  # unwritable cache, timeout, bad .so
        return None, f"{type(err).__name__}: {err}"


def _machine() -> str:
    """What -march=native compiles for: the architecture and the CPU's feature flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = platform.processor()
    return f"{platform.machine()} {flags.strip()}"


def available(name: str) -> bool:
    """Whether kernel ``name`` runs here (builds it if needed)."""
    return library(name) is not None


def status() -> list[dict]:
    """One row per kernel of this package, with fastpath.status()'s columns."""
    rows = []
    for path in sorted(HERE.glob("*.cpp")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ok = available(path.name)
        why = ("off (LINBENCH_NO_CPU_KERNELS or torch_only())" if disabled()
               else _WHY_NOT.get(path.name, ""))
        rows.append({"kernel": f"zoo/ops/{path.name}", "package": f"C++ compiler ({CXX})",
                     "min_version": "", "installed": shutil.which(CXX) or "",
                     "importable": ok, "why_not": why})
    return rows


def over_batch(call: Callable[[int, int], None], batch: int) -> None:
    """``call(b0, b1)`` on torch.get_num_threads() slices of range(batch) at once (the
    first in this thread); each call must write only its own rows."""
    k = max(1, min(torch.get_num_threads(), batch))
    bounds = [batch * i // k for i in range(k + 1)]
    if k == 1:
        call(0, batch)
        return
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="linbench-cpu")
    rest = [_POOL.submit(call, bounds[i], bounds[i + 1]) for i in range(1, k)]
    call(bounds[0], bounds[1])
    for future in rest:
        future.result()


def row_address(t: torch.Tensor | None, b0: int = 0) -> int | None:
    """Address of row b0 of contiguous tensor ``t`` (its first element for b0 = 0); None,
    a null pointer to the kernel, for an absent optional input."""
    return None if t is None else t.data_ptr() + b0 * t.stride(0) * t.element_size()
