"""Fused CPU recurrences for a decode step's few tokens (``recurrent_step_cpu.cpp``).

A decode step advances a (K, V) state per head by one token. The torch step forms
(``rwkv6_scan_ref``, ``gla_ref``, ``gated_delta_rule_ref``) build the outer product,
the decayed state and their sum as separate (B, H, K, V) tensors and read the result
again for the output: five to nine passes over a state that at d_model 1,024 and
batch 16 is 8-34 MB, where one read and one write are needed. These kernels make that
one pass (two reads for the delta rule, the second from cache), for float32 and float64,
with the references' arguments, returns and accumulation dtype, and are checked against
them in tests/test_recurrent_step.py.

They serve inference only: with a gradient wanted, off the CPU, in another dtype, or
with CPU kernels off (``cpu_kernels.disabled``), ``step_kernel_runs`` says no and the
callers run their torch form. They are torch ops (``torch.ops.linbench``), so a step
compiled by ``zoo.stepping`` keeps them in its graph.
"""
from __future__ import annotations

import ctypes

import torch

from . import cpu_kernels

STEP_CPP = "recurrent_step_cpu.cpp"
_P, _N, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
STEP_SIGNATURES = {**{f"decay_step_{s}": (_P,) * 8 + (_N,) * 5 + (_D,) for s in ("f32", "f64")},
                   **{f"delta_step_{s}": (_P,) * 8 + (_N,) * 5 + (_D,) for s in ("f32", "f64")}}


@torch.compiler.assume_constant_result
def _kernels_built() -> bool:
    # a constant to torch.compile's tracer, which cannot follow the build and its lock
    return cpu_kernels.library(STEP_CPP, STEP_SIGNATURES) is not None


def step_kernel_runs(*tensors: torch.Tensor | None) -> bool:
    """Whether the fused steps run these inputs (None entries: absent arguments)."""
    given = [t for t in tensors if t is not None]
    dtype = given[0].dtype
    if dtype not in (torch.float32, torch.float64):
        return False
    if any(t.device.type != "cpu" or t.dtype != dtype for t in given):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in given):
        return False
    return not cpu_kernels.disabled() and _kernels_built()


def step_backend(x: torch.Tensor) -> str:
    """The ``backend`` a mixer reports for a CPU step on inputs like ``x``."""
    return "cpu_fused_step" if step_kernel_runs(x) else "torch_step"


# Registered as torch ops so that a compiled step (zoo.stepping) calls the kernel inside
# its graph, the projections and norms around it fused, rather than breaking the graph.
@torch.library.custom_op("linbench::decay_step", mutates_args=())
def decay_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, u: torch.Tensor | None,
               S0: torch.Tensor | None, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """GLA's recurrence (``u`` None: the state read after the token's update) or RWKV-6's
    (``u`` (H, K): read before, the token added with bonus u). q, k, w (log decay) are
    (B, L, H, K); v (B, L, H, V); S0 (B, H, K, V) or None (zeros); ``scale`` None: K^-0.5.
    Returns (o (B, L, H, V), the state after the last token)."""
    q, k, v, w = (t.contiguous() for t in (q, k, v, w))
    u = None if u is None else u.contiguous()
    S0 = None if S0 is None else S0.contiguous()
    B, H, L, K, V = _sizes(q, v)
    S, o = q.new_empty(B, H, K, V), torch.empty_like(v)
    lib = cpu_kernels.library(STEP_CPP, STEP_SIGNATURES)
    fn = lib.decay_step_f64 if q.dtype == torch.float64 else lib.decay_step_f32
    at = cpu_kernels.row_address

    def run(b0, b1):
        fn(at(q, b0), at(k, b0), at(v, b0), at(w, b0), None if u is None else u.data_ptr(),
           at(S0, b0), at(S, b0), at(o, b0), b1 - b0, H, L, K, V, K ** -0.5 if scale is None else scale)

    cpu_kernels.over_batch(run, B)
    return o, S


@decay_step.register_fake
def _(q, k, v, w, u, S0, scale):
    B, H, L, K, V = _sizes(q, v)
    return torch.empty_like(v), q.new_empty(B, H, K, V)


@torch.library.custom_op("linbench::delta_step", mutates_args=())
def delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               S0: torch.Tensor | None, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token: q, k (B, L, H, K); v (B, L, H, V); g (log
    decay), beta (B, L, H); S0 (B, H, K, V) or None (zeros); ``scale`` None: K^-0.5.
    Returns (o (B, L, H, V), the state after the last token), as ``gated_delta_rule_ref``."""
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    S0 = None if S0 is None else S0.contiguous()
    B, H, L, K, V = _sizes(q, v)
    S, o = q.new_empty(B, H, K, V), torch.empty_like(v)
    lib = cpu_kernels.library(STEP_CPP, STEP_SIGNATURES)
    fn = lib.delta_step_f64 if q.dtype == torch.float64 else lib.delta_step_f32
    at = cpu_kernels.row_address

    def run(b0, b1):
        fn(at(q, b0), at(k, b0), at(v, b0), at(g, b0), at(beta, b0), at(S0, b0),
           at(S, b0), at(o, b0), b1 - b0, H, L, K, V, K ** -0.5 if scale is None else scale)

    cpu_kernels.over_batch(run, B)
    return o, S


@delta_step.register_fake
def _(q, k, v, g, beta, S0, scale):
    B, H, L, K, V = _sizes(q, v)
    return torch.empty_like(v), q.new_empty(B, H, K, V)


def _sizes(q, v) -> tuple[int, int, int, int, int]:
    """B, H, L, K, V of (B, L, H, K) queries and (B, L, H, V) values."""
    B, L, H, K = q.shape
    return B, H, L, K, v.shape[-1]
