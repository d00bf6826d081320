"""The RWKV-6 linear recurrence with per-channel data-dependent decay, in chunks.

The semantics are those of flash-linear-attention's ``naive_recurrent_rwkv6``, in the
layout every op of the zoo takes, fla's (q, k, w: (B, L, H, K); v: (B, L, H, V); u: (H, K);
state (B, H, K, V)):

    o_t = (scale * q_t) . (S_{t-1} + (u * k_t)^T v_t)
    S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t

with w the LOG decay (w <= 0) and scale defaulting to K^-0.5 as in fla. RetNet's
retention is the special case of a constant w (see zoo/mixers/retnet.py).

Chunked form. Inside a chunk of C steps let b_t = w_0 + ... + w_t (inclusive
cumulative log decay, b_{-1} = 0) and S0 the state entering the chunk. Unrolling,

    o_t = (q_t * exp(b_{t-1})) S0                                       inter-chunk
        + sum_{s<t} [sum_c q_tc k_sc exp(b_{t-1,c} - b_{s,c})] v_s      intra-chunk
        + (q_t . (u * k_t)) v_t                                          bonus
    S_C = diag(exp(b_{C-1})) S0 + sum_s (k_s * exp(b_{C-1} - b_s))^T v_s

The intra-chunk scores are one matmul. With a reference r per chunk and channel,
exp(b_{t-1} - b_s) = exp(b_{t-1} - r) * exp(r - b_s), so

    A[t, s] = (q_t * exp(b_{t-1} - r)) . (k_s * exp(r - b_s))          for s < t.

With r halfway along the chunk's total decay (r = b_{C-1} / 2), each factor's exponent
lies within +-|b_{C-1}| / 2: a chunk whose total log decay stays within MATMUL_RANGE
(60 in fp32, 600 in fp64) has every factor a normal float, and each product in the sum
is as accurate as the directly formed exp(b_{t-1} - b_s). The product is <= 1 for
s < t; above the diagonal it may be large and is masked. A chunk whose decay is
steeper than that (a channel forgetting ~ -1 per step over 64 steps, say) is recomputed
in blocks of SUB steps (``chunks.blocked_scores``): between blocks the split is made at the start
of the later block, where both factors are <= 1 whatever the decay (as fla's sub-chunks
do), and inside a block by the same rule again, down to the pairwise form, where every
exponent is a sum of w's, i.e. <= 0, for a block steeper still: we never split
exp(b_{t-1} - b_s) where that split could overflow. Decays start mild (RWKV-6's init
gives |w| <= 0.37) but training steepens them: on MQAR every chunk of a trained RWKV-6
was steep, and forming the pairwise (C, C, K) tensor for each made a CPU step ~4x slower.
``rwkv6_scan_ref`` is the recurrence one step at a time, to check either path against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .chunks import chunk_plan, intra_chunk_scores, own_precision, split_chunks
from .matrix_scan import decay_scan_fused_cpu, fused_scan_runs
from .fastpath import Kernel
from .recurrent_step import decay_step, step_backend, step_kernel_runs

CHUNK_RWKV6 = Kernel("fla.ops.rwkv6", "chunk_rwkv6", "flash-linear-attention", "0.2.0",
                     "the (B, L, H, K) layout; 0.1.x read it as head-first")


# fused_recurrent_rwkv6: the recurrence token by token, fla's decode path.
FUSED_RECURRENT_RWKV6 = Kernel("fla.ops.rwkv6", "fused_recurrent_rwkv6", "flash-linear-attention", "0.2.0",
                               "the (B, L, H, K) layout; 0.1.x read it as head-first")


def ddlerp(x: torch.Tensor, dx: torch.Tensor, mixes) -> tuple[torch.Tensor, ...]:
    """RWKV-6's token-shift interpolations x + dx * m for each m of ``mixes``, all (B, L, D).
    Its backward sums the targets' gradients into x's and dx's in place, one pass per
    target, where autograd's addcmul would spend four (it also scales by the multiplier 1).
    ``ddlerp_ref`` is the same in plain torch ops."""
    return _DDLerp.apply(x, dx, *mixes)


def ddlerp_ref(x, dx, mixes):
    """``ddlerp`` as plain tensor ops."""
    return tuple(x + dx * m for m in mixes)


class _DDLerp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dx, *mixes):
        ctx.save_for_backward(dx, *mixes)
        return tuple(torch.addcmul(x, dx, m) for m in mixes)

    @staticmethod
    def backward(ctx, *grads):
        dx, *mixes = ctx.saved_tensors
        gx = gdx = None
        for g, m in zip(grads, mixes):  # a target whose output went unused has g None
            if g is None:
                continue
            if gx is None:
                gx, gdx = g.clone(), g * m
            else:
                gx += g
                gdx.addcmul_(g, m)
        return (gx, gdx, *(None if g is None else g * dx for g in grads))


def rwkv6_backend(x: torch.Tensor) -> str:
    """The implementation ``rwkv6_scan`` runs for inputs like ``x``."""
    if CHUNK_RWKV6.usable(x):
        return "fla"
    return "cpu_fused" if fused_scan_runs(x) else "torch_chunked"


def rwkv6_scan(q, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
               chunk_size=64):
    """RWKV-6 recurrence; returns (o (B, L, H, V), final state (B, H, K, V) or None).
    fla's fused kernel on CUDA when importable; on the CPU the fused recurrence
    (``zoo.ops.matrix_scan``, ``chunk_size`` steps between the states it keeps), else
    ``rwkv6_scan_chunked``."""
    backend = rwkv6_backend(q)
    if backend == "cpu_fused":
        return decay_scan_fused_cpu(q, k, v, w, u, scale, initial_state, output_final_state, chunk_size)
    if backend == "torch_chunked":
        return rwkv6_scan_chunked(q, k, v, w, u, scale, initial_state, output_final_state,
                                chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return CHUNK_RWKV6(q, k, v, w, u, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state)  # fla picks its own chunk size


def rwkv6_recurrent(q, k, v, w, u, scale=None, initial_state=None, output_final_state=False, chunk_size=None):
    """The recurrence token by token, for a decode step's few tokens: fla's
    ``fused_recurrent_rwkv6`` on CUDA when usable, on CPU the fused step
    (``zoo.ops.recurrent_step``) where it runs, else ``rwkv6_scan_ref``. Same arguments
    and returns as ``rwkv6_scan`` (``chunk_size`` unused)."""
    if not FUSED_RECURRENT_RWKV6.usable(q):
        if step_kernel_runs(q, k, v, w, u, initial_state):
            o, S = decay_step(q, k, v, w, u, initial_state, scale)
            return o, (S if output_final_state else None)
        return rwkv6_scan_ref(q, k, v, w, u, scale, initial_state, output_final_state)
    h0 = None if initial_state is None else initial_state.float()  # the kernel keeps its state in fp32
    return FUSED_RECURRENT_RWKV6(q, k, v, w, u, scale=q.shape[-1] ** -0.5 if scale is None else scale,
                                 initial_state=h0, output_final_state=output_final_state)


def recurrent_backend(x: torch.Tensor) -> str:
    """What ``rwkv6_recurrent`` runs for inputs like ``x``."""
    if FUSED_RECURRENT_RWKV6.usable(x):
        return "fla_recurrent"
    return step_backend(x)


@own_precision
def rwkv6_scan_ref(q, k, v, w, u, scale=None, initial_state=None, output_final_state=False):
    """The recurrence one step at a time (the readable reference, as fla's
    ``naive_recurrent_rwkv6``; cost L Python steps):
        o_t = (scale q_t) . (S + (u k_t)^T v_t);   S <- diag(exp(w_t)) S + k_t^T v_t.
    Same arguments and returns as ``rwkv6_scan`` less ``chunk_size``: o in v's dtype, the
    final state in the accumulation dtype (fp32, or fp64 for fp64 inputs), or None."""
    q, k, v, w = (t.transpose(1, 2) for t in (q, k, v, w))  # (B, H, L, X): a head's steps in a row
    B, H, L, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    out_dtype, acc = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v, w, u = (t.to(acc) for t in (q, k, v, w, u))
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(acc)
    outs = []
    for t in range(L):
        kv = k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, K, V)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t] * scale, S + u[..., None] * kv))
        S = w[:, :, t, :, None].exp() * S + kv  # read before the update, then decay and write
    o = torch.stack(outs, dim=2) if outs else q.new_zeros(B, H, 0, V)  # (B, H, L, V)
    return o.to(out_dtype).transpose(1, 2), (S if output_final_state else None)


@own_precision
def rwkv6_scan_chunked(q, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                     chunk_size=64):
    """Pure-PyTorch chunked RWKV-6 recurrence (proven against ``rwkv6_scan_ref``). Same signature
    as ``rwkv6_scan``. Accumulates in fp32 (fp64 for fp64 inputs); o is returned in
    v's dtype, the final state in the accumulation dtype."""
    q, k, v, w = (t.transpose(1, 2) for t in (q, k, v, w))  # (B, H, L, X): a head's chunks in a row
    B, H, L, K = q.shape
    V = v.shape[-1]
    out_dtype = v.dtype
    scale, acc, C, N, _ = chunk_plan("rwkv6", L, K, chunk_size, scale, v.dtype)  # N chunks of C

    # (B, H, L, X) -> (B, H, N, C, X). Padded steps have q = k = v = 0 and w = 0 (no decay):
    # they leave o and S alone.
    q, k, v, w = (split_chunks(t, N, C, acc) for t in (q, k, v, w))
    q = q * scale
    b = w.cumsum(-2)  # (B, H, N, C, K) inclusive cumulative log decay
    b_prev = F.pad(b, (0, 0, 1, -1))  # b_{t-1}: shifted rather than b - w, so it matches b exactly
    b_last = b[..., -1:, :]  # (B, H, N, 1, K)

    A = intra_chunk_scores(q, k, b_prev, b)  # (B, H, N, C, C), zero on and above the diagonal
    bonus = (q * u.to(acc)[:, None, None, :] * k).sum(-1)  # (B, H, N, C)
    o = (A + torch.diag_embed(bonus)) @ v  # (B, H, N, C, V)

    # Inter-chunk: each chunk's own contribution to the state it hands on, then a short
    # sequential pass over chunks (not steps) to get the state entering every chunk.
    local = (k * (b_last - b).exp()).transpose(-1, -2) @ v  # (B, H, N, K, V)
    carry = b_last.squeeze(-2).exp()[..., None]  # (B, H, N, K, 1)
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(acc)
    entering = []
    for carry_n, local_n in zip(carry.unbind(2), local.unbind(2)):  # unbind: one stack in the backward
        entering.append(S)
        S = carry_n * S + local_n
    o = o + (q * b_prev.exp()) @ torch.stack(entering, dim=2)  # (B, H, N, C, V)

    o = o.view(B, H, N * C, V)[:, :, :L].to(out_dtype)
    return o.transpose(1, 2), (S if output_final_state else None)  # o (B, L, H, V)
