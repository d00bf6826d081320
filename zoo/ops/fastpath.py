"""The CUDA fast paths of the zoo: guarded, lazily resolved, version-checked.

flash-attn, mamba-ssm, causal-conv1d and flash-linear-attention are CUDA packages.
On a CPU machine they are absent or fail to import (sometimes with errors other than
ImportError, e.g. a missing libcudart); on a cluster they can be installed in a shape
that imports but cannot run: a causal-conv1d without the C++ functions that mamba_ssm's
fused blocks call, or an fla old enough to read our (B, L, H, K) layout as head-first.

So every fast path is a ``Kernel``: the callable, the package it comes from with the
lowest version whose behaviour we rely on, and the module globals it calls at run time
(``needs``: groups of names, any one group complete will do, since a package's
versions differ in what they import). It is resolved on first use. A mixer asks ``kernel.usable(x)``: True only
when the input is on a device and dtype the kernel supports and the install is whole;
an unusable install on such a device makes the mixer fall back to its torch path and
warns once, naming the package and why. Nothing here ever raises at import or mid-run.

``torch_only()`` turns every fast path off, e.g. to run the reference path on the same
weights; ``status()`` lists every kernel and why it can or cannot run.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import re
import time
import warnings
from typing import Callable

import torch

HALF = (torch.float16, torch.bfloat16)
FLOAT = (torch.float16, torch.bfloat16, torch.float32)

KERNELS: list["Kernel"] = []  # every kernel the zoo knows, in definition order
_DISABLED = 0  # > 0 inside torch_only()


def optional(module: str, attr: str | None = None):
    """Return ``module`` (or ``module.attr``), or None when it cannot be imported."""
    try:
        mod = importlib.import_module(module)
        return getattr(mod, attr) if attr else mod
    except Exception:  # ImportError, OSError (no libcuda), RuntimeError, AttributeError
        return None


def version_tuple(version: str) -> tuple[int, int, int]:
    """"2.3.2.post1" -> (2, 3, 2); "0.6.0rc1" -> (0, 6, 0); "2.3" -> (2, 3, 0)."""
    parts = [int(p) for p in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def installed_version(package: str, module: str) -> str | None:
    """The distribution's version, else the top-level module's ``__version__``."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        top = optional(module.split(".")[0])
        return getattr(top, "__version__", None) if top is not None else None


class Kernel:
    """One fast path: ``module.attr`` from pip package ``package`` (>= ``min_version``,
    because of ``min_reason``), which at run time also calls the module globals of one
    of the groups ``needs``; it runs on ``devices`` for inputs of ``dtypes``."""

    def __init__(self, module: str, attr: str, package: str, min_version: str,
                 min_reason: str, needs: tuple[tuple[str, ...], ...] = (),
                 devices: tuple[str, ...] = ("cuda",), dtypes: tuple = FLOAT):
        self.module, self.attr, self.package = module, attr, package
        self.min_version, self.min_reason, self.needs = min_version, min_reason, needs
        self.devices, self.dtypes = devices, dtypes
        self._fn: Callable | None = None
        self._why_not: str | None = None
        self._resolved = self._warned = False
        KERNELS.append(self)

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attr}"

    def resolve(self) -> None:
        """Import the kernel now (again, after a change of installed packages)."""
        self._fn, self._why_not, self._resolved, self._warned = None, None, True, False
        version = installed_version(self.package, self.module)
        if version is not None and version_tuple(version) < version_tuple(self.min_version):
            self._why_not = (f"{self.package} {version} is older than {self.min_version} "
                             f"({self.min_reason}); refused")
            return
        try:
            mod = importlib.import_module(self.module)
        except Exception as err:
            self._why_not = (f"{self.package} is not installed (make venv KERNELS=cuda)"
                             if version is None else
                             f"{self.package} {version} is installed but {self.module} does not "
                             f"import ({type(err).__name__}: {err})")
            return
        fn = getattr(mod, self.attr, None)
        missing = [[n for n in group if getattr(mod, n, None) is None] for group in self.needs]
        if fn is None:
            self._why_not = f"{self.package} {version} has no {self.name}"
        elif missing and all(missing):
            self._why_not = (f"{self.package} {version}: {self.attr} calls "
                             f"{', '.join(missing[0])}, "
                             f"which this install lacks (often causal-conv1d missing or built "
                             f"without its C++ functions)")
        else:
            self._fn = fn

    @property
    def fn(self) -> Callable | None:
        if not self._resolved:
            self.resolve()
        return self._fn

    @fn.setter
    def fn(self, fn: Callable | None) -> None:
        """Put another callable in the kernel's place (e.g. its package's Python
        reference, to run this dispatch where the compiled kernel cannot)."""
        self._fn, self._resolved, self._warned = fn, True, False
        self._why_not = None if fn is not None else f"{self.name} was set to None"

    @property
    def why_not(self) -> str | None:
        """None when the kernel imports whole, else why it cannot run."""
        if not self._resolved:
            self.resolve()
        return self._why_not

    def allows(self, device_type: str, dtype: torch.dtype) -> bool:
        """Whether the kernel would run for a tensor of this device type and dtype: the
        dispatch decision, separate from any tensor so that it can be tested anywhere."""
        if not enabled() or device_type not in self.devices or dtype not in self.dtypes:
            return False
        if self.fn is None:
            if not self._warned:
                self._warned = True
                warnings.warn(f"linbench: {self.name} cannot run, so the torch path runs "
                              f"instead: {self.why_not}", RuntimeWarning, stacklevel=3)
            return False
        return True

    def usable(self, x: torch.Tensor) -> bool:
        return self.allows(x.device.type, x.dtype)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Kernel({self.name}, {self.package}>={self.min_version})"


def enabled() -> bool:
    """False inside ``torch_only()``."""
    return not _DISABLED


@contextlib.contextmanager
def torch_only():
    """Within this block every mixer runs its pure-PyTorch path, whatever it was asked
    for (attention's backend='flash_attn', Grassmann's impl='fused' included)."""
    global _DISABLED
    _DISABLED += 1
    try:
        yield
    finally:
        _DISABLED -= 1


def status() -> list[dict]:
    """One row per kernel: what it is, which package and version, whether it imports."""
    return [{"kernel": k.name, "package": k.package, "min_version": k.min_version,
             "installed": installed_version(k.package, k.module), "importable": k.fn is not None,
             "why_not": k.why_not or ""} for k in KERNELS]


def fastest(candidates: dict[str, Callable[[], object]], device: torch.device,
            repeats: int = 3) -> tuple[str, dict[str, float]]:
    """Time each candidate (one warm-up call each, then ``repeats`` rounds that call every
    candidate once in turn) and return the fastest's name with each one's best time in
    seconds. Interleaved rounds, so that a slow spell of the machine (another process, a
    frequency change) lands on every candidate rather than on whichever ran then. A
    candidate that raises in its warm-up is left out (its time is inf); if all raise, the
    last error propagates."""
    def timed(fn) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    times, error = {}, None
    for name, fn in candidates.items():
        try:
            fn()
        except Exception as err:  # e.g. no compiler for torch.compile here
            times[name], error = float("inf"), err
    live = [name for name in candidates if name not in times]
    times.update({name: float("inf") for name in live})
    for _ in range(repeats):
        for name in live:
            times[name] = min(times[name], timed(candidates[name]))
    name = min(times, key=times.get)
    if times[name] == float("inf"):
        raise error
    return name, times
