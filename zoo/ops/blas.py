"""Dense products through numpy's BLAS, for CPU decode steps.

At batch 16 and d_model 1,024 a decode step multiplies each weight it reads 16 times, so
its products' arithmetic, not the memory they read, bounds it on one CPU thread. Which
BLAS does that arithmetic then matters: torch's CPU wheel calls MKL, and numpy's wheels
ship OpenBLAS, whose kernels for AVX2 ran a (16, 1,024) x (1,024, 4,096) float32 product
1.3-1.8x faster than MKL's on this project's AMD EPYC (docs/performance.md has the
measurement). Both are zero-copy views of the same memory, so a product can go either way.

``products()`` is a torch function mode under which ``F.linear`` (every ``nn.Linear``) on CPU
float32 / float64 tensors that autograd does not track runs as a numpy product, on as many
BLAS threads as torch uses; every other call, and every call that needs a gradient, is
torch's. The product is the torch op ``linbench::blas_linear``, opaque to torch.compile, so
a compiled step keeps it in its graph and fuses the rest around it. The step forms "blas"
and "compiled_blas" (``zoo.stepping``) run a mixer's step under it, eager and compiled, and
"auto" keeps one only where it times faster. ``linear_ref`` is the torch product it replaces.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

DTYPES = (torch.float32, torch.float64)
# how OpenBLAS prefixes its functions, by build: numpy's own wheels (scipy-openblas), others
_PREFIXES = ("scipy_openblas_", "openblas_")


@functools.cache
def openblas() -> tuple[ctypes.CDLL, str, str] | None:
    """numpy's OpenBLAS, the prefix and the suffix of its symbols ("64_" for the 64-bit-int builds numpy's
    wheels ship), or None (another BLAS, or none found)."""
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in glob.glob(os.path.join(libs, "*openblas*")):
        lib = ctypes.CDLL(path)  # numpy has loaded it already: this is the same handle
        for prefix in _PREFIXES:
            for suffix in ("64_", ""):
                if hasattr(lib, f"{prefix}set_num_threads{suffix}"):
                    return lib, prefix, suffix
    return None


@functools.cache
def _threads(verb: str):
    """OpenBLAS's thread count setter ("set") or getter ("get"). Without the setter a product
    could spread over every core while torch keeps to its threads."""
    lib, prefix, suffix = openblas()
    return getattr(lib, f"{prefix}{verb}_num_threads{suffix}")


def available() -> bool:
    """Whether numpy's BLAS can run here at torch's thread count."""
    return openblas() is not None


def _pin_threads() -> None:
    n = torch.get_num_threads()
    if _threads("get")() != n:  # read each time: numpy's users (threadpoolctl) may set it too
        _threads("set")(n)


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           weight_t: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` as a numpy product: x (..., K), weight (N, K), bias (N,) -> (..., N),
    for CPU tensors of one dtype in DTYPES that need no gradient. ``weight_t``: weight's
    transpose as a contiguous (K, N) copy, which OpenBLAS multiplies 1.4x faster than
    the transposed view it reads otherwise (docs/performance.md)."""
    _pin_threads()
    rows = x.reshape(-1, x.shape[-1]).detach().numpy()  # (R, K), a view
    kn = weight_t.numpy() if weight_t is not None else weight.detach().numpy().T  # (K, N)
    out = torch.from_numpy(rows @ kn)  # (R, N)
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.shape[0])


# each weight's (K, N) copy and the version it was made at, for as long as the weight lives
_kept = WeakIdKeyDictionary()


def transposed(weight: torch.Tensor) -> torch.Tensor:
    """weight's (K, N) contiguous copy, made once and kept while the weight is unchanged
    (its version counter; an inference tensor keeps none and cannot be written outside
    inference mode)."""
    version = 0 if weight.is_inference() else weight._version
    held = _kept.get(weight)
    if held is None or held[0] != version:
        held = _kept[weight] = (version, weight.detach().t().contiguous())
    return held[1]


def forget(weights) -> None:
    """Drop the transposed copies of ``weights`` (a mixer that decodes in another form)."""
    for w in weights:
        _kept.pop(w, None)


@torch.library.custom_op("linbench::blas_linear", mutates_args=())
def blas_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transpose: bool) -> torch.Tensor:
    """``linear`` as a torch op; with ``transpose``, on the weight's kept (K, N) copy."""
    return linear(x, weight, bias, transposed(weight) if transpose else None)


@blas_linear.register_fake
def _(x, weight, bias, transpose):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _eligible(x, weight, bias) -> bool:
    tensors = [t for t in (x, weight, bias) if t is not None]
    return (all(t.device.type == "cpu" and t.dtype == x.dtype and t.layout == torch.strided for t in tensors)
            and x.dtype in DTYPES and x.dim() >= 1
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)))


class _Products(TorchFunctionMode):
    def __init__(self, transpose: bool):
        super().__init__()
        self.transpose = transpose

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            if _eligible(x, weight, bias):
                return blas_linear(x, weight, bias, self.transpose)
        if func is torch.Tensor.unflatten:  # its Python wrapper's super() call stops torch.compile's trace
            func = torch.unflatten
        return func(*args, **kwargs)


def products(transpose: bool = True) -> TorchFunctionMode:
    """A mode (``with products(): ...``, entered as often as wanted) within which eligible
    ``F.linear`` calls run through numpy's BLAS (see the module doc), on each weight's
    transposed copy (``transposed``: twice the weights' memory, for the faster product)
    or, without ``transpose``, on the weight as it is. torch.compile traces through it:
    make it outside the compiled function, which then only enters it."""
    if not available():
        raise RuntimeError("numpy's BLAS is not OpenBLAS with a thread setter here; the 'blas' step forms need it")
    return _Products(transpose)
