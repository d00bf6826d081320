"""What the chunked scans share: inside a chunk, the decayed scores between its steps as
one matmul where that is numerically safe (the decays split about the chunk's middle),
in blocks or pairwise where it is not (rwkv6.py's module docstring derives the split);
and the unit-lower-triangular solve of the delta rule's UT transform."""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F

# The largest total log decay of a chunk whose decayed products are split about its
# middle into one matmul: every factor exp(+-x) then has |x| <= MATMUL_RANGE / 2 (far from
# fp32's 88 and fp64's 709). Shared by the chunk forms of rwkv6.py, ssd.py and delta_rule.py.
MATMUL_RANGE = {torch.float64: 600.0}
MATMUL_RANGE_DEFAULT = 60.0


def matmul_range(dtype: torch.dtype) -> float:
    return MATMUL_RANGE.get(dtype, MATMUL_RANGE_DEFAULT)


def own_precision(op):
    """Run a torch-path scan with autocast off. Each scan picks its accumulation dtype
    itself (float32 at least, as the CUDA kernels it stands in for do); under autocast its
    matmuls would round the decayed products and the states passed between chunks to bf16
    (measured: 5.3x the reference error of the bf16 harness test on Mamba-2's dt_bias gradient). The
    inputs may come in bf16; the output keeps the scan's documented dtype."""
    @functools.wraps(op)
    def run(*args, **kwargs):
        device = next((a.device.type for a in (*args, *kwargs.values()) if torch.is_tensor(a)), "cpu")
        with torch.autocast(device, enabled=False):
            return op(*args, **kwargs)
    return run


SUB = 16  # steps per block of a steep chunk (blocked_scores)


def intra_chunk_scores(q, k, b_prev, b):
    """A[..., t, s] = sum_c q_tc k_sc exp(b_prev_tc - b_sc) for s < t, 0 for s >= t.
    q, k, b_prev, b: (..., C, K) with b the inclusive cumulative log decay of the chunk
    (non-increasing, 0 >= b) and b_prev = b shifted by one step (b_prev_0 = 0).
    One matmul for chunks whose total decay -b_{C-1} is within MATMUL_RANGE (see the
    module docstring); for the others, stable for any decay, ``blocked_scores`` (chunks
    longer than SUB) or the pairwise form."""
    C = q.shape[-2]
    limit = matmul_range(q.dtype)
    strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)  # (t, s): s < t
    steep = (-b[..., -1, :]).amax(-1) > limit  # (...,) chunks the split would overflow
    steep_scores = blocked_scores if C > SUB else (lambda *t: pairwise_scores(*t, strict))
    if steep.all():  # a trained model's usual case: no matmul form to form and discard
        flat = (lambda t: t.reshape(-1, C, t.shape[-1]))  # (S, C, K)
        return steep_scores(flat(q), flat(k), flat(b_prev), flat(b)).view(*q.shape[:-2], C, C)
    r = b[..., -1:, :] / 2  # (..., 1, K) halfway along the chunk's decay
    # The clamp changes nothing in the chunks the matmul serves; it keeps the steep ones,
    # overwritten below, finite (an inf times a zero gradient would make a NaN).
    qe = q * (b_prev - r).clamp(max=limit / 2).exp()
    ke = k * (r - b).clamp(max=limit / 2).exp()
    A = (qe @ ke.transpose(-1, -2)).masked_fill(~strict, 0.0)  # (..., C, C)
    if steep.any():
        at = steep.nonzero(as_tuple=True)
        A = A.index_put(at, steep_scores(q[at], k[at], b_prev[at], b[at]))
    return A


def blocked_scores(q, k, b_prev, b):
    """``intra_chunk_scores`` of (S, C, K) steep chunks in blocks of SUB steps. For t in
    block i (starting at step i0) and s in an earlier block, the decay splits at i0:
        exp(b_{t-1} - b_s) = exp(b_{t-1} - g_i) * exp(g_i - b_s),   g_i = b_{i0-1} = b_prev_{i0},
    both exponents <= 0 (b never rises), so one matmul per block row at any decay; the
    diagonal blocks, rebased to start at 0, go back through ``intra_chunk_scores``."""
    S, C, K = q.shape
    pad = -C % SUB  # padded steps: q = k = 0 and no decay, so they add nothing
    if pad:
        q, k = (F.pad(t, (0, 0, 0, pad)) for t in (q, k))
        b_prev = torch.cat([b_prev, b[:, -1:].expand(S, pad, K)], 1)
        b = torch.cat([b, b[:, -1:].expand(S, pad, K)], 1)
    n, Cp = (C + pad) // SUB, C + pad
    blocks = (lambda t: t.view(S, n, SUB, K))  # (S, Cp, K) -> (S, n, SUB, K)
    g = b_prev[:, ::SUB, None]  # (S, n, 1, K) each block's reference
    qf = blocks(q) * (blocks(b_prev) - g).exp()  # (S, n, SUB, K)
    # exponent <= 0 for the earlier blocks' steps; the clamp keeps the masked rest finite
    kf = k[:, None] * (g - b[:, None]).clamp(max=0).exp()  # (S, n, Cp, K)
    block_of = torch.arange(Cp, device=q.device) // SUB
    earlier = block_of[None, :] < torch.arange(n, device=q.device)[:, None]  # (n, Cp): s before block i
    A = (qf @ kf.transpose(-1, -2)).masked_fill(~earlier[:, None, :], 0.0)  # (S, n, SUB, Cp)
    diag = intra_chunk_scores(blocks(q), blocks(k), blocks(b_prev) - g, blocks(b) - g)  # (S, n, SUB, SUB)
    A.view(S, n, SUB, n, SUB).diagonal(0, 1, 3).copy_(diag.permute(0, 2, 3, 1))  # into the zeroed blocks
    return A.reshape(S, Cp, Cp)[:, :C, :C]


def pairwise_scores(q, k, b_prev, b, strict):
    """``intra_chunk_scores`` through the (..., C, C, K) tensor of pairwise decays, every
    exponent a sum of w's (<= 0). Masked before exp, so that the positive differences
    above the diagonal are never exponentiated."""
    diff = b_prev[..., :, None, :] - b[..., None, :, :]  # (..., C, C, K)
    decay = diff.masked_fill(~strict[..., None], float("-inf")).exp()
    return (q[..., :, None, :] * decay * k[..., None, :, :]).sum(-1)  # (..., C, C)


def split_chunks(t: torch.Tensor, N: int, C: int, dtype: torch.dtype) -> torch.Tensor:
    """(..., L, X) -> (..., N, C, X) in ``dtype``, the last chunk zero padded to C steps."""
    L, X = t.shape[-2:]
    return F.pad(t.to(dtype), (0, 0, 0, N * C - L)).view(*t.shape[:-2], N, C, X)


class ChunkPlan(NamedTuple):
    """What a chunked linear-attention scan settles first (``chunk_plan``)."""
    scale: float  # of the scores: 1/sqrt(K) by default
    acc: torch.dtype  # the accumulation dtype: fp32, fp64 for fp64 inputs
    C: int  # the chunk length, no longer than the sequence (a longer one would only pad)
    N: int  # the number of chunks
    pad: int  # N*C - L, the padding of the last chunk


def chunk_plan(op: str, L: int, K: int, chunk_size: int, scale, dtype: torch.dtype) -> ChunkPlan:
    """The ChunkPlan of a scan ``op`` over L tokens with keys K wide."""
    if chunk_size <= 0:
        raise ValueError(f"{op}: chunk_size must be positive, got {chunk_size}")
    C = max(1, min(chunk_size, L))
    N = -(-L // C)
    return ChunkPlan(K ** -0.5 if scale is None else scale, torch.promote_types(dtype, torch.float32), C, N, N * C - L)


def unit_lower_solve(A: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """X with (I + A) X = rhs, for A (..., C, C) strictly lower triangular (its other
    entries are ignored) and rhs (..., C, R): ``unit_lower_solve_ref`` by matmuls. A is
    nilpotent, so (I + A)^-1 = (I - A)(I + A^2)(I + A^4)... up to the power C: log2(C)
    squarings and products of small matmuls batched over every chunk, where LAPACK's
    solve runs one small matrix at a time (on CPU, C 16, forward and backward about
    1.6x faster). The
    backward reuses the inverse: two matmuls."""
    return _UnitLowerSolve.apply(A, rhs)


def unit_lower_solve_ref(A: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``unit_lower_solve`` by forward substitution (LAPACK's triangular solve)."""
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    return torch.linalg.solve_triangular(eye + A.tril(-1), rhs, upper=False, unitriangular=True)


class _UnitLowerSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, rhs):
        C = A.shape[-1]
        A = A.tril(-1)
        inv = torch.eye(C, dtype=A.dtype, device=A.device) - A  # the sum of (-A)^j for j < n
        power, n = A, 2
        while n < C:
            power = power @ power  # A^n: (-A)^n for even n
            inv = inv + inv @ power  # now the sum to j < 2n
            n *= 2
        x = inv @ rhs
        ctx.save_for_backward(inv, x)
        return x

    @staticmethod
    def backward(ctx, dx):
        inv, x = ctx.saved_tensors
        drhs = inv.transpose(-1, -2) @ dx
        # d(inv) = -inv dA inv, so dA = -inv^T (dx rhs^T) inv^T = -drhs x^T, strictly lower
        return -(drhs @ x.transpose(-1, -2)).tril(-1), drhs
