"""The gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh, ICLR 2025), in chunks.

Layout and semantics are those of flash-linear-attention's ``chunk_gated_delta_rule`` and
its step-by-step ``naive_recurrent_gated_delta_rule`` (q, k: (B, L, H, K); v: (B, L, H, V);
g, beta: (B, L, H); state (B, H, K, V), keys along rows):

    S'  = exp(g_t) S_{t-1}                                  decay (g is the LOG decay, <= 0)
    u_t = beta_t (v_t - S'^T k_t)                           what the state mispredicts for k_t
    S_t = S' + k_t u_t^T = (I - beta_t k_t k_t^T) exp(g_t) S_{t-1} + beta_t k_t v_t^T
    o_t = scale S_t^T q_t                                   (scale defaults to K^-0.5)

The paper writes the same state transposed, (V, K): S_t = S_{t-1} a_t (I - b_t k k^T) + b_t v k^T.

Chunked (WY / UT-transform) form. Inside a chunk of C steps let b_t = g_0 + ... + g_t (the
inclusive cumulative log decay), G_t = exp(b_t), S0 the state entering the chunk. Unrolling,
S_t = G_t S0 + sum_{s<=t} exp(b_t - b_s) k_s u_s^T, and putting that into u_t gives one
triangular system for all the chunk's u at once:

    (I + A) U = diag(beta) V - diag(beta G) K S0,   A[t, s] = beta_t exp(b_t - b_s) k_t.k_s  (s < t)

so with T = (I + A)^-1 (unit lower triangular, one solve per chunk; the "UT transform"),
U = U0 - W S0 where U0 = T diag(beta) V and W = T diag(beta G) K depend on the chunk alone.
Then

    O   = scale [(Q * G) S0 + (Q K^T * D) U],     D[t, s] = exp(b_t - b_s) for s <= t
    S_C = G_{C-1} S0 + (K * exp(b_{C-1} - b))^T U

Only the state S crosses chunks: a loop over L / C chunks of (C x K) @ (K x V) products, so
the cost is linear in L. The decayed products (Q K^T * D, and K K^T * D in A) are matmuls
of keys and queries scaled about the chunk's mid decay, as in zoo/ops/rwkv6.py; a chunk
whose decay is too steep for that split forms D with every exponent a sum of g's (<= 0),
masked before exp, so a strong decay underflows to 0 instead of overflowing.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .chunks import chunk_plan, matmul_range, own_precision, unit_lower_solve
from .fastpath import Kernel
from .matrix_scan import delta_scan_fused_cpu, fused_scan_runs
from .recurrent_step import delta_step, step_backend, step_kernel_runs

# 0.1.0 took (B, H, L, K) by default (head_first=True); 0.1.1 made (B, L, H, K), the layout we
# call it in, the default (we never pass head_first: 0.4 deprecates it, 0.6 refuses it). We ask
# for 0.2.0, the floor of the whole package in pyproject's cuda extra (chunk_rwkv6's), so
# that one bound per package holds for every kernel (tests/test_fastpaths.py checks it).
CHUNK_GATED_DELTA_RULE = Kernel("fla.ops.gated_delta_rule", "chunk_gated_delta_rule",
                                "flash-linear-attention", "0.2.0",
                                "the (B, L, H, K) layout by default; 0.1.0 read it as head-first")


def delta_rule_backend(x: torch.Tensor) -> str:
    """The implementation ``gated_delta_rule`` runs for inputs like ``x``."""
    if CHUNK_GATED_DELTA_RULE.usable(x):
        return "fla"
    return "cpu_fused" if fused_scan_runs(x) else "torch_chunked"


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                     chunk_size=32):
    """Returns (o (B, L, H, V), final state (B, H, K, V) or None). fla's chunk kernel on CUDA
    when importable (it picks its own chunk size); on the CPU the fused recurrence
    (``zoo.ops.matrix_scan``, ``chunk_size`` steps between the states it keeps); else
    ``gated_delta_rule_chunked``."""
    backend = delta_rule_backend(q)
    if backend == "cpu_fused":
        return delta_scan_fused_cpu(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)
    if backend == "torch_chunked":
        return gated_delta_rule_chunked(q, k, v, g, beta, scale, initial_state,
                                        output_final_state, chunk_size)
    return CHUNK_GATED_DELTA_RULE(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state)


def gated_delta_rule_recurrent(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """The recurrence token by token, for a decode step's few tokens: on CPU the fused
    step (``zoo.ops.recurrent_step``) where it runs, else ``gated_delta_rule_ref``. Same
    arguments and returns as the reference."""
    if step_kernel_runs(q, k, v, g, beta, initial_state):
        o, S = delta_step(q, k, v, g, beta, initial_state, scale)
        return o, (S if output_final_state else None)
    return gated_delta_rule_ref(q, k, v, g, beta, scale, initial_state, output_final_state)


def delta_recurrent_backend(x: torch.Tensor) -> str:
    """What ``gated_delta_rule_recurrent`` runs for inputs like ``x``."""
    return step_backend(x)


@own_precision
def gated_delta_rule_ref(q, k, v, g, beta, scale=None, initial_state=None,
                         output_final_state=False):
    """The recurrence one step at a time (the readable reference; cost L matrix updates).
    Same signature and return as ``gated_delta_rule_chunked``."""
    B, L, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    out_dtype, acc = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v, g, beta = (t.to(acc) for t in (q, k, v, g, beta))
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(acc)
    outs = []
    for t in range(L):
        S = g[:, t, :, None, None].exp() * S  # (B, H, K, V)
        k_t = k[:, t]  # (B, H, K)
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", k_t, S))  # (B, H, V)
        S = S + k_t[..., None] * u[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    o = torch.stack(outs, dim=1)  # (B, L, H, V)
    return o.to(out_dtype), (S if output_final_state else None)


@own_precision
def gated_delta_rule_chunked(q, k, v, g, beta, scale=None, initial_state=None,
                             output_final_state=False, chunk_size=32):
    """Pure-PyTorch chunked gated delta rule, linear in L (see the module docstring).
    Accumulates in fp32 (fp64 for fp64 inputs); o is returned in v's dtype, the final
    state in the accumulation dtype (as fla returns it in fp32)."""
    B, L, H, K = q.shape
    V = v.shape[-1]
    out_dtype = v.dtype
    scale, acc, C, N, pad = chunk_plan("gated_delta_rule", L, K, chunk_size, scale, v.dtype)  # N chunks of C, pad at the end

    def chunks(t):  # (B, L, H, *X) -> (B, H, N, C, *X), zero padded at the end
        t = t.to(acc).movedim(2, 1)  # (B, H, L, *X)
        t = F.pad(t, (0, 0) * (t.dim() - 3) + (0, pad))
        return t.reshape(B, H, N, C, *t.shape[3:])

    # Padded steps have k = v = q = 0, beta = 0 and g = 0 (no decay): u = 0 there, so they
    # change neither o nor S.
    q, k, v, g, beta = chunks(q) * scale, chunks(k), chunks(v), chunks(g), chunks(beta)
    b = g.cumsum(-1)  # (B, H, N, C) inclusive cumulative log decay
    G = b.exp()  # (B, H, N, C) decay from the chunk's start to step t, inclusive
    b_last = b[..., -1:]  # (B, H, N, 1)

    # The decayed products kk[t, s] = exp(b_t - b_s) k_t.k_s and qk[t, s] (s <= t), as
    # matmuls of keys and queries scaled about the chunk's mid decay (as zoo/ops/ssd.py
    # does); (chunk, head)s too steep for that split are formed with their decays.
    kk, qk = decayed_products(q, k, b)  # (B, H, N, C, C) each, valid on and below the diagonal
    # The UT transform: one unit-lower-triangular solve per chunk for both right-hand sides,
    # (I + A) [U0 W] = rhs with A strictly lower (the solve ignores the diagonal beta_t k_t.k_t).
    rhs = torch.cat([beta[..., None] * v, (beta * G)[..., None] * k], dim=-1)  # (B, H, N, C, V+K)
    U0, W = unit_lower_solve(beta[..., None] * kk, rhs).split([V, K], -1)

    # The state is the only thing that crosses chunks: a loop over chunks, not steps, with
    # only what needs the state inside it; the rest runs batched over chunks around it.
    k_out = (k * (b_last - b).exp()[..., None]).transpose(-1, -2)  # (B, H, N, K, C) decayed to the chunk's end
    carry = b_last.exp()[..., None]  # (B, H, N, 1, 1)
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(acc)
    entering, U = [], []
    # unbind, not U0[:, :, n]: one stack in the backward, where each slice's would zero-fill
    # and add a whole (B, H, N, ...) gradient
    for U0_n, W_n, carry_n, k_n in zip(U0.unbind(2), W.unbind(2), carry.unbind(2), k_out.unbind(2)):
        entering.append(S)
        U.append(U0_n - W_n @ S)  # (B, H, C, V) the chunk's corrected values
        S = carry_n * S + k_n @ U[-1]
    U, entering = torch.stack(U, dim=2), torch.stack(entering, dim=2)  # (B, H, N, C|K, V)
    o = (q * G[..., None]) @ entering + qk.tril() @ U  # (B, H, N, C, V): the past, the chunk

    o = o.reshape(B, H, N * C, V)[:, :, :L].transpose(1, 2).to(out_dtype)  # (B, L, H, V)
    return o, (S if output_final_state else None)


def decayed_products(q, k, b):
    """(k_t.k_s exp(b_t - b_s), q_t.k_s exp(b_t - b_s)) for s <= t; garbage above the
    diagonal, which the caller masks. q, k: (..., C, K); b: (..., C) inclusive cumulative
    log decay. exp(b_t - b_s) = exp(b_t - m) exp(m - b_s) with m = b_{C-1} / 2 keeps
    both factors within exp(+-|b_{C-1}| / 2); a chunk steeper than MATMUL_RANGE is
    recomputed with exp(b_t - b_s) masked before exp, where no exponent is positive."""
    limit = matmul_range(q.dtype)
    mid = b[..., -1:] / 2
    up = (b - mid).clamp(max=limit / 2).exp()[..., None]  # (..., C, 1); the clamp only
    down = (mid - b).clamp(max=limit / 2).exp()[..., None]  # bites in steep chunks
    k_down = (k * down).transpose(-1, -2)  # (..., K, C)
    kk, qk = (k * up) @ k_down, (q * up) @ k_down
    steep = -b[..., -1] > limit
    if steep.any():
        at = steep.nonzero(as_tuple=True)
        C = b.shape[-1]
        causal = torch.ones(C, C, dtype=torch.bool, device=b.device).tril()
        D = (b[at][:, :, None] - b[at][:, None, :]).masked_fill(~causal, float("-inf")).exp()
        k_at = k[at].transpose(-1, -2)
        kk = kk.index_put(at, (k[at] @ k_at) * D)
        qk = qk.index_put(at, (q[at] @ k_at) * D)
    return kk, qk
