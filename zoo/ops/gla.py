"""Gated linear attention (Yang et al., 2023): a matrix state with a data-dependent
decay per key channel, in fla's ``chunk_gla`` layout.

Layout and semantics are those of flash-linear-attention's ``naive_recurrent_gla``
(q, k, gk: (B, L, H, K); v: (B, L, H, V); state (B, H, K, V)):

    S_t = diag(exp(gk_t)) S_{t-1} + k_t^T v_t
    o_t = (scale * q_t) S_t                       (read AFTER the update)

with gk the LOG decay (gk <= 0) and scale defaulting to K^-0.5 as in fla.

Three forms, each checkable against the others:
- ``gla_ref``: the recurrence one step at a time, the readable definition;
- ``gla_chunked``: the same on the RWKV-6 chunk core (zoo.ops.rwkv6), linear in L;
- ``gla``: fla's fused ``chunk_gla`` on CUDA when usable, on the CPU the fused recurrence
  (``zoo.ops.matrix_scan``), else ``gla_chunked``;
- ``gla_recurrent`` (a decode step): fla's ``fused_recurrent_gla`` on CUDA, else ``gla_ref``.

Mapping onto the RWKV-6 core. RWKV-6 reads the state BEFORE the update and adds the
current token through a constant bonus u (H, K):

    RWKV-6:  o_t = q'_t S_{t-1} + (q'_t . (u * k_t)) v_t      (same S_t recurrence)
    GLA:     o_t = q_t S_t = (q_t * exp(gk_t)) S_{t-1} + (q_t . k_t) v_t

The past term matches with q' = q * exp(gk_t) (the current step's decay moved into
the query; exp(gk) <= 1, so this cannot overflow). The current-token term then needs
q'_t . (u * k_t) = q_t . k_t, i.e. u = exp(-gk_t): a PER-STEP value, which a constant
bonus cannot be. (RetNet gets away with u = 1/gamma because its decay is constant; u = 1
here would give q_t . (exp(gk_t) * k_t), decaying the current token once too often.)
So we run the core with u = 0 and add the diagonal term (q_t . k_t) v_t ourselves: it
is elementwise, O(L K V) like the rest, and makes the mapping exact. The state
recurrence is the same in both (w = gk), so initial and final states carry over as
they are. Every exponent the core forms is a sum of gk's, so strong decays
(gk ~ -20 per step) stay finite, as tests/test_gla.py checks.
"""
from __future__ import annotations

import torch

from .chunks import own_precision
from .matrix_scan import decay_scan_fused_cpu, fused_scan_runs
from .fastpath import Kernel
from .recurrent_step import decay_step, step_backend, step_kernel_runs
from .rwkv6 import rwkv6_scan_chunked

CHUNK_GLA = Kernel("fla.ops.gla", "chunk_gla", "flash-linear-attention", "0.2.0",
                   "the (B, L, H, K) layout; 0.1.x read it as head-first")


# fused_recurrent_gla: the recurrence token by token in one kernel, fla's decode path.
FUSED_RECURRENT_GLA = Kernel("fla.ops.gla", "fused_recurrent_gla", "flash-linear-attention", "0.2.0",
                             "the (B, L, H, K) layout; 0.1.x read it as head-first")


def gla_backend(x: torch.Tensor) -> str:
    """The implementation ``gla`` runs for inputs like ``x``."""
    if CHUNK_GLA.usable(x):
        return "fla"
    return "cpu_fused" if fused_scan_runs(x) else "torch_chunked"


@own_precision
def gla_ref(q, k, v, gk, scale=None, initial_state=None, output_final_state=False):
    """Step-by-step GLA recurrence (the definition; O(L) Python steps).
    q, k, gk: (B, L, H, K); v: (B, L, H, V); initial_state: (B, H, K, V).
    Returns (o (B, L, H, V) in v's dtype, final state (B, H, K, V) in the
    accumulation dtype, fp32 or fp64, or None)."""
    B, L, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    out_dtype, acc = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v, gk = (t.to(acc) for t in (q, k, v, gk))
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(acc)
    outs = []
    for t in range(L):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]  # (B, H, K, V)
        S = gk[:, t, :, :, None].exp() * S + kv  # decay per key row, then write
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))  # read after
    return torch.stack(outs, dim=1).to(out_dtype), (S if output_final_state else None)


@own_precision
def gla_chunked(q, k, v, gk, scale=None, initial_state=None, output_final_state=False,
                chunk_size=32):
    """GLA through ``rwkv6_scan_chunked`` (u = 0) plus the current-token term; exact (see
    the module docstring). Same arguments and returns as ``gla_ref``; ``chunk_size``
    is the core's."""
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    out_dtype, acc = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v, gk = (t.to(acc) for t in (q, k, v, gk))
    H = q.shape[2]
    # v in acc so that the core returns o unrounded and the sum below rounds once
    o, S = rwkv6_scan_chunked(q * gk.exp(), k, v, gk, q.new_zeros(H, K), scale, initial_state, output_final_state,
                              chunk_size)  # o: (B, L, H, V)
    diag = scale * (q * k).sum(-1, keepdim=True) * v  # (B, L, H, V): (q_t . k_t) v_t
    return (o + diag).to(out_dtype), S


def gla(q, k, v, gk, scale=None, initial_state=None, output_final_state=False,
        chunk_size=32):
    """GLA recurrence; fla's ``chunk_gla`` on CUDA when usable, on the CPU the fused
    recurrence (``zoo.ops.matrix_scan``), else ``gla_chunked``. Same arguments and returns
    as ``gla_chunked`` (fla picks its own chunk size)."""
    backend = gla_backend(q)
    if backend == "cpu_fused":
        return decay_scan_fused_cpu(q, k, v, gk, None, scale, initial_state, output_final_state, chunk_size)
    if backend == "torch_chunked":
        return gla_chunked(q, k, v, gk, scale, initial_state, output_final_state, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    # chunk_gla asserts an fp32 initial state (it accumulates the state in fp32)
    h0 = None if initial_state is None else initial_state.float()
    return CHUNK_GLA(q, k, v, gk, scale=scale, initial_state=h0,
                     output_final_state=output_final_state)


def gla_recurrent(q, k, v, gk, scale=None, initial_state=None, output_final_state=False, chunk_size=None):
    """The recurrence token by token, for a decode step's few tokens: fla's
    ``fused_recurrent_gla`` on CUDA when usable, on CPU the fused step
    (``zoo.ops.recurrent_step``) where it runs, else ``gla_ref``. Same arguments and
    returns as ``gla`` (``chunk_size`` unused: there are no chunks)."""
    if not FUSED_RECURRENT_GLA.usable(q):
        if step_kernel_runs(q, k, v, gk, initial_state):
            o, S = decay_step(q, k, v, gk, None, initial_state, scale)
            return o, (S if output_final_state else None)
        return gla_ref(q, k, v, gk, scale, initial_state, output_final_state)
    h0 = None if initial_state is None else initial_state.float()  # the kernel keeps its state in fp32
    return FUSED_RECURRENT_GLA(q, k, v, gk, scale=scale, initial_state=h0, output_final_state=output_final_state)


def recurrent_backend(x: torch.Tensor) -> str:
    """What ``gla_recurrent`` runs for inputs like ``x``."""
    if FUSED_RECURRENT_GLA.usable(x):
        return "fla_recurrent"
    return step_backend(x)
