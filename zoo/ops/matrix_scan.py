"""Matrix-state recurrences fused on the CPU for training: the decay recurrence of GLA and
RWKV-6 (``decay_scan_fused_cpu``) and the gated delta rule of Gated DeltaNet
(``delta_scan_fused_cpu``), each tested against its step-by-step reference
(``zoo.ops.gla.gla_ref``, ``zoo.ops.rwkv6.rwkv6_scan_ref``,
``zoo.ops.delta_rule.gated_delta_rule_ref``).

    u None (GLA):    S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t;   o_t = scale q_t S_t
    u (H, K) (RWKV-6): o_t = scale q_t (S_{t-1} + diag(u) k_t^T v_t);   S_t as above

The chunked torch forms turn this recurrence into matmuls, but on a CPU with small heads
(K = V = 32) their elementwise passes over (B, H, N, C, C) and (B, H, N, C, K) tensors
cost more than the products: RWKV-6's training step at L 64, d 64 spent as long outside
its matmuls as in them; the delta rule's chunked form adds a triangular solve per chunk.
Here one C++ pass steps the recurrence forward (matrix_scan_cpu.cpp),
keeping only the state entering each chunk of ``chunk_size`` steps, and one pass backward
recomputes a chunk's states and forms every gradient from them. A head's state stays in
cache throughout, and nothing of size (B, L, H, K, V) is ever formed.

Layout: q, k, w (B, L, H, K) (w may be (B, L, H, 1): one log decay per head); v (B, L, H,
V); state (B, H, K, V), as every op of the zoo. Inputs are read in place through their
strides (a broadcast view is fine) as long as the last dim is contiguous.
"""
from __future__ import annotations

import ctypes

import torch
from torch.autograd.function import once_differentiable

from . import cpu_kernels

SCAN_CPP = "matrix_scan_cpu.cpp"
_P, _N, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
# Both kernels take the same arguments: forward q, k, v, a, b, S0, strides, o, S, S_chunks,
# then batch, H, L, K, V, Kw, T and scale; backward q, k, v, a, b, strides, S_chunks, do, dS,
# dq, dk, dv, da, db, dS0 and the same sizes. (a, b) is (w, u) for the decay recurrence and
# (g, beta) for the delta rule.
SCAN_SIGNATURES = {f"{kind}_scan_{way}_{s}": (_P,) * n + (_N,) * 7 + (_D,)
                   for kind in ("decay", "delta") for way, n in (("fwd", 10), ("bwd", 15)) for s in ("f32", "f64")}


def fused_scan_runs(*tensors: torch.Tensor | None) -> bool:
    """Whether ``decay_scan_fused_cpu`` runs these inputs: CPU tensors, the kernel built
    (and CPU kernels not turned off)."""
    if any(t.device.type != "cpu" for t in tensors if t is not None):
        return False
    return cpu_kernels.library(SCAN_CPP, SCAN_SIGNATURES) is not None


def decay_scan_fused_cpu(q, k, v, w, u=None, scale=None, initial_state=None, output_final_state=False,
                         chunk_size=64):
    """The decay recurrence above through the C++ kernel; (o (B, L, H, V) in v's dtype, the
    final state (B, H, K, V) in the accumulation dtype (float32, or float64) or None), as the
    references return them. Every input, ``initial_state`` included, gets its gradient.
    ``chunk_size``: steps between the states the forward keeps for the backward."""
    K = q.shape[-1]
    if w.shape[-1] not in (1, K) or k.shape[-1] != K:
        raise ValueError(f"decay_scan: w's last dim must be 1 or K = {K}, got {tuple(w.shape)}")
    return _fused("decay", q, k, v, w, u, scale, initial_state, output_final_state, chunk_size)


def delta_scan_fused_cpu(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                         chunk_size=64):
    """The gated delta rule (``zoo.ops.delta_rule``) through the C++ kernel: q, k (B, L, H, K),
    v (B, L, H, V), g (log decay) and beta (B, L, H), state (B, H, K, V). Returns as
    ``gated_delta_rule_ref`` does: o in v's dtype, the final state in the accumulation dtype
    (or None). ``chunk_size``: steps between the states the forward keeps for the backward."""
    return _fused("delta", q, k, v, g[..., None], beta[..., None], scale, initial_state, output_final_state,
                  chunk_size)  # g, beta as (B, L, H, 1): strides as the others'


def _fused(kind, q, k, v, a, b, scale, initial_state, output_final_state, chunk_size):
    if chunk_size <= 0:
        raise ValueError(f"{kind}_scan: chunk_size must be positive, got {chunk_size}")
    L, K = q.shape[1], q.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    out_dtype, acc = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v, a = (_last_contiguous(t.to(acc)) for t in (q, k, v, a))
    if b is not None:  # u (H, K) is read whole; beta (B, L, H, 1) through its strides
        b = b.to(acc).contiguous() if kind == "decay" else b.to(acc)
    S0 = None if initial_state is None else initial_state.to(acc).contiguous()
    o, S = _MatrixScan.apply(kind, q, k, v, a, b, S0, float(scale), int(min(chunk_size, max(L, 1))))
    return o.to(out_dtype), (S if output_final_state else None)


def _last_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _strides(*tensors: torch.Tensor) -> torch.Tensor:
    """Batch, time and head strides of each (B, L, H, X) input, in elements."""
    return torch.tensor([s for t in tensors for s in t.stride()[:3]], dtype=torch.int64)


class _MatrixScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kind, q, k, v, a, b, S0, scale, T):
        B, L, H, K = q.shape
        V, Kw = v.shape[-1], a.shape[-1]
        lib = cpu_kernels.library(SCAN_CPP, SCAN_SIGNATURES)
        suffix = "f64" if q.dtype == torch.float64 else "f32"
        fwd = getattr(lib, f"{kind}_scan_fwd_{suffix}")
        strides = _strides(q, k, v, a, a if kind == "decay" else b)  # the decay kernel reads the first four
        o, S = q.new_empty(B, L, H, V), q.new_empty(B, H, K, V)
        S_chunks = q.new_empty(B, H, -(-L // T), K, V)
        b_rows = kind == "delta"  # beta has batch rows; RWKV-6's u is one (H, K) for all
        at = cpu_kernels.row_address

        def run(b0, b1):
            fwd(at(q, b0), at(k, b0), at(v, b0), at(a, b0), at(b, b0 if b_rows else 0), at(S0, b0),
                strides.data_ptr(), at(o, b0), at(S, b0), at(S_chunks, b0), b1 - b0, H, L, K, V, Kw, T, scale)

        cpu_kernels.over_batch(run, B)
        ctx.save_for_backward(q, k, v, a, b, S0, S_chunks, strides)
        ctx.kind, ctx.scale, ctx.T = kind, scale, T
        ctx.set_materialize_grads(False)  # no zero-filled d(final state) when it is unused
        return o, S

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dS):
        q, k, v, a, b, S0, S_chunks, strides = ctx.saved_tensors
        B, L, H, K = q.shape
        V, Kw = v.shape[-1], a.shape[-1]
        lib = cpu_kernels.library(SCAN_CPP, SCAN_SIGNATURES)
        bwd = getattr(lib, f"{ctx.kind}_scan_bwd_{'f64' if q.dtype == torch.float64 else 'f32'}")
        do = q.new_zeros(B, L, H, V) if do is None else do.to(q.dtype).contiguous()
        dS = None if dS is None else dS.to(q.dtype).contiguous()
        dq, dk, dv, da = (q.new_empty(B, L, H, X) for X in (K, K, V, Kw))  # contiguous, as the kernel writes them
        b_rows = ctx.kind == "delta"
        # d beta per step; du per batch row (the slices run at once), summed below
        db = None if b is None else (q.new_empty(B, L, H, 1) if b_rows else q.new_empty(B, H, K))
        dS0 = None if S0 is None else q.new_empty(B, H, K, V)
        at = cpu_kernels.row_address

        def run(b0, b1):
            bwd(at(q, b0), at(k, b0), at(v, b0), at(a, b0), at(b, b0 if b_rows else 0), strides.data_ptr(),
                at(S_chunks, b0), at(do, b0), at(dS, b0), at(dq, b0), at(dk, b0), at(dv, b0), at(da, b0),
                at(db, b0), at(dS0, b0), b1 - b0, H, L, K, V, Kw, ctx.T, ctx.scale)

        cpu_kernels.over_batch(run, B)
        if db is not None and not b_rows:
            db = db.sum(0)
        # gradients in the inputs' full shapes: autograd sums those of broadcast views
        return None, dq, dk, dv, da, db, dS0, None, None
