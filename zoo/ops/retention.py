"""Multi-scale retention (RetNet): a linear attention with a fixed decay per head, run on
fla's RWKV-6 kernel where it imports (``retention_as_rwkv6``), on the CPU as GLA's fused
recurrence with a constant decay (``zoo.ops.matrix_scan``), else chunked in PyTorch, with
the step-by-step ``retention_ref`` beside it."""
from __future__ import annotations

import torch

from .chunks import chunk_plan, own_precision, split_chunks
from .matrix_scan import decay_scan_fused_cpu
from .recurrent_step import decay_step, step_kernel_runs
from .rwkv6 import FUSED_RECURRENT_RWKV6, rwkv6_backend, rwkv6_recurrent, rwkv6_scan

def retention(q, k, v, log_gamma, scale=None, initial_state=None, output_final_state=False,
              chunk_size=64):
    """o_t = scale * q_t S_t with S_t = gamma S_{t-1} + k_t^T v_t, per head.
    q, k: (B, L, H, K); v: (B, L, H, V); log_gamma: (H,). Returns like rwkv6_scan:
    (o (B, L, H, V) in v's dtype, final state (B, H, K, V) in fp32/fp64, or None).
    fla's chunk_rwkv6 on CUDA when usable (``retention_as_rwkv6``); on the CPU the fused
    recurrence with log gamma as every step's log decay (``chunk_size`` steps between the
    states it keeps); else ``retention_chunked``."""
    backend = rwkv6_backend(q)
    if backend == "fla":
        return retention_as_rwkv6(q, k, v, log_gamma, scale, initial_state, output_final_state)
    if backend == "cpu_fused":
        w = log_gamma.view(1, 1, -1, 1).expand(*q.shape[:3], 1)  # (B, L, H, 1), read in place
        return decay_scan_fused_cpu(q, k, v, w, None, scale, initial_state, output_final_state, chunk_size)
    return retention_chunked(q, k, v, log_gamma, scale, initial_state, output_final_state,
                             chunk_size)


def retention_recurrent(q, k, v, log_gamma, scale=None, initial_state=None, output_final_state=False,
                        chunk_size=None, gamma=None):
    """Retention token by token, for a decode step's few tokens; same arguments and returns
    as ``retention`` (``chunk_size`` unused). On CUDA fla's ``fused_recurrent_rwkv6`` through
    ``retention_as_rwkv6``. On CPU the fused step where it runs: retention is GLA's
    recurrence (the state read after the update) with the same decay at every token, so
    the kernel takes log gamma as GLA's log decay directly. Else ``retention_ref``.
    ``gamma``: exp(log_gamma), where the caller holds it, for ``retention_ref``."""
    if FUSED_RECURRENT_RWKV6.usable(q):
        return retention_as_rwkv6(q, k, v, log_gamma, scale, initial_state, output_final_state, scan=rwkv6_recurrent)
    B, L, H, K = q.shape
    w = log_gamma.to(q.dtype).view(1, 1, H, 1).expand(B, L, H, K)
    if step_kernel_runs(q, k, v, w, initial_state):
        o, S = decay_step(q, k, v, w, None, initial_state, scale)
        return o, (S if output_final_state else None)
    return retention_ref(q, k, v, log_gamma, scale, initial_state, output_final_state, gamma=gamma)


def retention_as_rwkv6(q, k, v, log_gamma, scale=None, initial_state=None,
                       output_final_state=False, chunk_size=64, scan=rwkv6_scan):
    """Retention on the RWKV-6 core (zoo.ops.rwkv6_scan), same arguments and returns.

    RWKV-6 reads the state *before* the current update, S_{t-1}, and adds the current
    token with a bonus u. Retention reads after it:
        q_t S_t = gamma q_t S_{t-1} + q_t k_t^T v_t.
    So feed rwkv6_scan q' = gamma q, w = log gamma, u = 1/gamma: it computes
        q'_t S_{t-1} + q'_t (u k_t)^T v_t = gamma q_t S_{t-1} + q_t k_t^T v_t,
    the same thing, with the same state sequence (the recurrences are identical).
    ``scan``: the RWKV-6 form to run it on (``rwkv6_recurrent`` for a decode step).
    """
    B, L, H, K = q.shape
    log_gamma = log_gamma.to(torch.promote_types(q.dtype, torch.float32))
    gamma = log_gamma.exp()
    w = log_gamma.view(1, 1, H, 1).expand(B, L, H, K)
    u = (1 / gamma)[:, None].expand(H, K)
    q = (q * gamma.view(H, 1)).to(q.dtype)
    return scan(q, k, v, w, u, scale, initial_state, output_final_state, chunk_size)


@own_precision
def retention_chunked(q, k, v, log_gamma, scale=None, initial_state=None,
                      output_final_state=False, chunk_size=64):
    """Retention in chunks of C, same arguments and returns as ``retention``. The decay
    is fixed, so inside a chunk it is a masked, decayed attention,
        o = ((q k^T) * D) v + (q * gamma^(t+1)) S0,   D[t, s] = gamma^(t-s) for s <= t,
    with D one (H, C, C) matrix for every chunk, and the state crosses chunks as
        S_C = gamma^C S0 + (k * gamma^(C-1-s))^T v.
    All matmuls; every exponent is log_gamma times a count >= 0, so nothing overflows."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, X): a head's chunks in a row
    B, H, L, K = q.shape
    V = v.shape[-1]
    out_dtype = v.dtype
    scale, acc, C, N, _ = chunk_plan("retention", L, K, chunk_size, scale, v.dtype)  # N chunks of C
    q, k, v = (split_chunks(t, N, C, acc) for t in (q, k, v))  # (B, H, N, C, X), zero padded at the end
    q = q * scale
    lg = log_gamma.to(acc).view(H, 1, 1)
    pos = torch.arange(C, device=q.device, dtype=acc)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    D = (lg * (pos[:, None] - pos)).masked_fill(~causal, float("-inf")).exp()  # (H, C, C)
    o = ((q @ k.transpose(-1, -2)) * D[:, None]) @ v  # (B, H, N, C, V)

    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(acc)
    if N > 1 or initial_state is not None or output_final_state:
        # The state entering each chunk: a loop over chunks, not steps. Padded steps
        # (k = v = 0) sit at the end of the last chunk, whose hand-on is computed apart.
        to_end = (lg * (C - 1 - pos)).exp()[..., None]  # (H, 1, C, 1): gamma^(C-1-s)
        local = (k[:, :, :-1] * to_end).transpose(-1, -2) @ v[:, :, :-1]  # (B, H, N-1, K, V)
        carry = (lg * C).exp()  # (H, 1, 1)
        entering = [S]
        for local_n in local.unbind(2):  # unbind: one stack in the backward
            S = carry * S + local_n
            entering.append(S)
        o = o + (q * (lg * (pos + 1)).exp()[..., None]) @ torch.stack(entering, dim=2)
        if output_final_state:
            n_last = L - (N - 1) * C
            tail = (lg * (n_last - 1 - pos).clamp(min=0)).exp().view(H, C, 1)
            S = (lg * n_last).exp() * S + (k[:, :, -1] * tail).transpose(-1, -2) @ v[:, :, -1]
    o = o.view(B, H, N * C, V)[:, :, :L].to(out_dtype)
    return o.transpose(1, 2), (S if output_final_state else None)  # o (B, L, H, V)


@own_precision
def retention_ref(q, k, v, log_gamma, scale=None, initial_state=None, output_final_state=False, gamma=None):
    """Retention one step at a time (the readable reference for ``retention``, same
    arguments and returns less ``chunk_size``): S_t = gamma S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.
    ``gamma``: exp(log_gamma) where the caller holds it (H,): compiled, the exp would be
    recomputed at every state element."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, X): a head's steps in a row
    B, H, L, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    out_dtype, acc = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v = (t.to(acc) for t in (q, k, v))
    gamma = (log_gamma.to(acc).exp() if gamma is None else gamma.to(acc))[:, None, None]  # (H, 1, 1)
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(acc)
    outs = []
    for t in range(L):  # read after the update, unlike RWKV-6
        S = gamma * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t] * scale, S))
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(B, H, 0, v.shape[-1])  # (B, H, L, V)
    return o.to(out_dtype).transpose(1, 2), (S if output_final_state else None)
