"""Fast formulations of the Grassmann mixer core ``grassmann_features``.

The reference (``grassmann_features``, at the end of this file) lists a 496-long Plücker vector per token
and per offset: a (B, L, |Δ|, r(r-1)/2) worth of memory traffic. Two exact identities
remove it.

1. Every offset wedges the SAME z_t, and the wedge is bilinear, so the aggregate is
   one wedge with a combined partner:

       sum_Δ c_Δ (z_t ∧ w_Δ) = z_t ∧ W_t,   W_t = sum_Δ c_Δ w_Δ      (B, L, r)

   with c_Δ = [Δ valid] · s_t / max(|z_t ∧ w_Δ|, eps) (1 without normalisation) and
   s_t = 1 / max(n_t, 1) for the mean (1 for the sum), n_t = number of valid offsets.
   A missing partner is the zero vector in the reference; here it is simply skipped.
   Lagrange's identity |z ∧ w|^2 = |z|^2 |w|^2 - (z·w)^2 gives each norm in O(r).

   Numerics: z ∧ w only depends on the part of w orthogonal to z, so each partner is
   used as v = w - β z, β = z·w / |z|^2, and |z ∧ w|^2 = |z|^2 |v|^2 (Lagrange in a
   form that is >= 0 and does not cancel). Without it, a (near-)parallel pair below
   eps would add w/eps ~ 1e6 w to W_t, and the antisymmetric contraction of step 2
   would round that back into O(1) garbage where the reference has exactly 0 (a
   repeated token). β is a constant for the gradient: g does not depend on it (any
   multiple of z wedges to 0), and |v|^2 is stationary in β at z·w / |z|^2.
2. W_plü applied to the Plücker vector of (z, W) is a bilinear form,

       W_plü · plücker(z, W) = sum_ij K[i, j, :] z_i W_j,   K[i, j] = W_plü[:, (i,j)] for
                                                           i < j, K[j, i] = -K[i, j]

   so g_t = vec(z_t W_t^T) @ K, one (r*r, D) matmul with no index gathering: twice
   the flops of the 496-long triangle, but on CPU gathering the triangle (and
   scattering its gradient) costs more than the extra flops, and in Triton the
   r x r tile is what ``tl.dot`` wants anyway.

The bias rule is the reference's: b_plü once for the mean where n_t > 0, n_t times for
the sum, never where n_t = 0; it only depends on t, so it is added outside the core.

``eps``: the reference divides by max(|p|, eps), so the norm is constant (zero
gradient) where |p| < eps. Here the rsqrt of |p|^2 is only taken where |p|^2 > eps^2
(a double ``where``), so its gradient stays finite at |p| = 0.

``grassmann_features_factored`` is this formulation in plain torch (the readable
form of the Triton kernel, same signature as the reference; on a CPU its bilinear form
runs in chunks of tokens, ``ChunkedBilinear``); ``_compiled`` wraps it in
``torch.compile``; ``grassmann_features_fused`` runs the Triton kernels of
``grassmann_triton.py``.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .fastpath import optional

triton = optional("triton")

HALF = (torch.float16, torch.bfloat16)


def valid_counts(L: int, offsets, pairing: str, device=None) -> torch.Tensor:
    """(L,) int64: how many offsets have a partner at t (t-Δ >= 0 or t+Δ < L)."""
    t = torch.arange(L, device=device)
    return sum(((t >= d) if pairing == "past" else (t + d < L)).long() for d in offsets)


def bias_scale(L: int, offsets, pairing: str, aggregate: str, device, dtype) -> torch.Tensor:
    """(L, 1): how many times b_plü enters g_t (mean: 1 where n_t > 0, sum: n_t)."""
    n = valid_counts(L, offsets, pairing, device)
    return ((n > 0) if aggregate == "mean" else n).to(dtype)[:, None]


def partner_slices(L: int, delta: int, pairing: str):
    """(tokens that have a partner at offset Δ, their partners), as slices of L."""
    if pairing == "past":
        return slice(delta, L), slice(0, L - delta)
    return slice(0, L - delta), slice(delta, L)


def combine_partners(z: torch.Tensor, offsets, pairing: str = "past", normalize: bool = True,
                     eps: float = 1e-6, aggregate: str = "mean", parallel_below: float = 0.0) -> torch.Tensor:
    """W_t = sum over valid Δ of c_Δ w_Δ (identity 1; normalised: c_Δ v_Δ, see the
    module docstring). z: (B, L, r) -> (B, L, r).

    ``parallel_below`` (normalised only): a partner whose sine with z_t is below it counts
    as parallel (v = 0). The parallel forms leave it at 0, where only a bitwise repeat
    wedges to 0; the step form (one token's z from a one-row matmul, its partners' from
    the prefill's many-row one) sets it so that a repeated token, a few ulps off its
    cached copy, still wedges to 0 rather than to rounding noise times 1/eps."""
    B, L, r = z.shape
    W = torch.zeros_like(z)
    for delta in offsets:
        if delta >= L:
            continue  # no token has a partner at this offset
        t, s = partner_slices(L, delta, pairing)
        zt, w = z[:, t], z[:, s]  # (B, L-Δ, r) each: a token and its partner
        if normalize:
            # The same op on the same shapes for zz and dot, so that w == z_t gives
            # d == a bitwise, hence v = 0 exactly: a repeated token wedges to exactly 0.
            zz = (zt * zt).sum(-1, keepdim=True)
            dot = (zt * w).sum(-1, keepdim=True)
            beta = torch.where(zz > 0, dot / torch.where(zz > 0, zz, 1.0), 0.0).detach()
            v = w - beta * zt  # z_t ∧ v = z_t ∧ w, and v ⊥ z_t
            if parallel_below:
                vv, ww = (v * v).sum(-1, keepdim=True), (w * w).sum(-1, keepdim=True)
                v = torch.where(vv <= parallel_below ** 2 * ww, 0.0, v)
            p2 = zz * (v * v).sum(-1, keepdim=True)  # |z_t ∧ w|^2 (Lagrange), >= 0
            big = p2 > eps * eps
            w = torch.where(big, torch.rsqrt(torch.where(big, p2, 1.0)), 1.0 / eps) * v
        W[:, t] += w
    if aggregate == "mean":
        n = valid_counts(L, offsets, pairing, z.device).clamp_min(1)
        W = W / n.to(z.dtype)[:, None]
    return W


def bilinear_weight(weight: torch.Tensor, r: int) -> torch.Tensor:
    """W_plü (D, r(r-1)/2) -> K (r, r, D) antisymmetric (identity 2); differentiable,
    so autograd folds dK back into dW_plü[:, (i,j)] = dK[i, j] - dK[j, i]."""
    i, j = torch.triu_indices(r, r, offset=1, device=weight.device)
    wt = weight.t()  # (r(r-1)/2, D)
    K = wt.new_zeros(r, r, weight.shape[0])
    return K.index_put((i, j), wt).index_put((j, i), -wt)


class ChunkedBilinear(torch.autograd.Function):
    """g = vec(z W^T) @ K over ``chunk`` tokens at a time. z, W: (n, r); K: (r*r, D).

    The plain form writes the whole (n, r*r) outer product (64 MB at 16k tokens, r = 32)
    and reads it back at each of its three uses (forward, dK, and the outer's own
    gradient); on a CPU that memory traffic costs more than the matmuls. A chunk's outer
    product stays in cache, and the backward recomputes it instead of saving it."""

    # Broadcast products and sums, not bmm: batched 1-wide matmuls run several times slower
    # on a CPU than the elementwise form of the same arithmetic.
    @staticmethod
    def forward(ctx, z, W, K, chunk):
        r = z.shape[1]
        g = z.new_empty(z.shape[0], K.shape[1])
        for s in range(0, z.shape[0], chunk):
            outer = (z[s:s + chunk, :, None] * W[s:s + chunk, None, :]).view(-1, r * r)  # z_i W_j
            torch.mm(outer, K, out=g[s:s + chunk])
        ctx.save_for_backward(z, W, K)
        ctx.chunk = chunk
        return g

    @staticmethod
    @once_differentiable  # a second derivative would need its own formula: refuse it clearly
    def backward(ctx, dg):
        z, W, K = ctx.saved_tensors
        need_z, need_w, need_k = ctx.needs_input_grad[:3]
        r, chunk = z.shape[1], ctx.chunk
        dz = torch.empty_like(z) if need_z else None
        dW = torch.empty_like(W) if need_w else None
        dK = torch.zeros_like(K) if need_k else None
        for s in range(0, z.shape[0], chunk):
            part = slice(s, s + chunk)
            if need_k:
                outer = (z[part, :, None] * W[part, None, :]).view(-1, r * r)
                dK.addmm_(outer.t(), dg[part])
            d_outer = torch.mm(dg[part], K.t()).view(-1, r, r)  # d g / d (z_i W_j)
            if need_z:
                dz[part] = (d_outer * W[part, None, :]).sum(-1)
            if need_w:
                dW[part] = (d_outer * z[part, :, None]).sum(1)
        return dz, dW, dK, None


def bilinear(z: torch.Tensor, W: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """g_t = sum_ij K[i, j] z_i W_j (identity 2): (B, L, r) twice and K (r, r, D) ->
    (B, L, D). On a CPU in chunks (``ChunkedBilinear``); elsewhere, and under
    torch.compile (which fuses on its own), the plain outer product and one matmul."""
    B, L, r = z.shape
    Kf = K.flatten(0, 1).to(z.dtype)  # (r*r, D)
    if z.device.type == "cpu" and not torch.compiler.is_compiling():
        chunk = max(1, (1 << 18) // (r * r))  # a 1 MB float32 outer product per chunk (256 tokens at r 32)
        g = ChunkedBilinear.apply(z.reshape(B * L, r), W.reshape(B * L, r), Kf, chunk)
        return g.view(B, L, Kf.shape[1])
    return (z[..., :, None] * W[..., None, :]).flatten(-2) @ Kf  # (B, L, r*r) @ (r*r, D)


def grassmann_features_factored(z, weight, bias, offsets, pairing="past", normalize=True,
                                eps=1e-6, aggregate="mean"):
    """``grassmann_features`` through identities 1 and 2, in plain torch: the same
    function with O(L r^2) memory instead of O(L |Δ| r^2)."""
    B, L, r = z.shape
    # The norms are Lagrange differences: form them in float32 at least.
    zc = z.float() if z.dtype in HALF else z
    W = combine_partners(zc, offsets, pairing, normalize, eps, aggregate).to(z.dtype)  # (B, L, r)
    g = bilinear(z, W, bilinear_weight(weight, r))  # (B, L, D)
    if bias is None:
        return g
    return g + bias_scale(L, offsets, pairing, aggregate, z.device, z.dtype) * bias


_compiled = None


def grassmann_features_compiled(z, weight, bias, offsets, pairing="past", normalize=True,
                                eps=1e-6, aggregate="mean"):
    """The factored formulation under ``torch.compile`` (compiled once per process;
    Dynamo specialises on the options and re-traces per new option set)."""
    global _compiled
    try:
        if _compiled is None:
            _compiled = torch.compile(grassmann_features_factored, dynamic=None)
        return _compiled(z, weight, bias, tuple(offsets), pairing, normalize, eps, aggregate)
    except Exception as err:  # inductor needs a working C++ (CPU) or Triton (CUDA) toolchain
        raise RuntimeError(
            f"grassmann: torch.compile of the factored core failed ({type(err).__name__}: "
            f"{err}); use impl='factored' (the same formulation uncompiled) or 'auto', "
            f"which falls back to it"
        ) from err


def fused_backend(device: torch.device) -> str | None:
    """"triton" (CUDA), "triton_interpret" (Triton's CPU interpreter), or None where the
    Triton kernels cannot run on ``device``. Triton picks the interpreter when the
    kernels are decorated, i.e. when ``grassmann_triton`` is first imported: from then
    on that choice counts, before it the TRITON_INTERPRET variable."""
    if triton is None:
        return None
    kernels = sys.modules.get(__package__ + ".grassmann_triton")
    if kernels is not None:
        interpreted = kernels.INTERPRETED
    else:
        interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if interpreted:
        return "triton_interpret" if device.type == "cpu" else None
    return "triton" if device.type == "cuda" else None


def grassmann_features_fused(z, weight, bias, offsets, pairing="past", normalize=True,
                             eps=1e-6, aggregate="mean"):
    """The Triton kernels (forward and backward) of ``grassmann_triton.py``."""
    if fused_backend(z.device) is None:
        why = ("triton is not importable" if triton is None else
               f"tensors on {z.device.type} need CUDA, or TRITON_INTERPRET=1 set before the "
               f"kernels are first imported for the CPU interpreter")
        raise RuntimeError(f"grassmann: impl='fused' cannot run: {why}")
    from .grassmann_triton import grassmann_core_triton  # decorates the kernels on first use
    r = z.shape[-1]
    g = grassmann_core_triton(z, bilinear_weight(weight, r), tuple(offsets), pairing,
                              normalize, float(eps), aggregate)
    if bias is None:
        return g
    return g + bias_scale(z.shape[1], offsets, pairing, aggregate, z.device, g.dtype) * bias


# ------------------------------------------------ the eager reference (the paper's formula)

def plucker(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Plücker coordinates of the 2-plane span(z, w): p_ij = z_i w_j - z_j w_i, i < j.

    z, w: (..., r) -> (..., r(r-1)/2), coordinates in row-major upper-triangle order
    (0,1), (0,2), ..., (0,r-1), (1,2), ..., (r-2,r-1), the column order of W_plü.
    Lagrange's identity |p|^2 = |z|^2 |w|^2 - (z.w)^2 gives the norm without p.
    """
    r = z.shape[-1]
    i, j = torch.triu_indices(r, r, offset=1, device=z.device)  # (2, r(r-1)/2)
    return z[..., i] * w[..., j] - z[..., j] * w[..., i]


def partner(z: torch.Tensor, delta: int, pairing: str) -> torch.Tensor:
    """z_{t-Δ} ("past") or z_{t+Δ} ("future") for every t; the zero vector where that
    token does not exist. z: (B, L, r) -> (B, L, r)."""
    L = z.shape[1]
    shift = min(delta, L)
    if pairing == "past":
        return F.pad(z, (0, 0, shift, 0))[:, :L]
    return F.pad(z, (0, 0, 0, shift))[:, shift:]


def grassmann_features(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       offsets, pairing: str = "past", normalize: bool = True,
                       eps: float = 1e-6, aggregate: str = "mean") -> torch.Tensor:
    """The geometric feature g before the gate: the readable reference that a fused
    kernel must match, with the same signature.

    z: (B, L, r) reduced tokens; weight: (D, r(r-1)/2) and bias: (D,) or None, W_plü.
    Returns g: (B, L, D), with g_t = agg over valid Δ of (W_plü p̂^Δ_t + b_plü), where
    agg is the mean or the sum, and g_t = 0 exactly where no offset is valid.
    """
    B, L, r = z.shape
    p_sum = z.new_zeros(B, L, r * (r - 1) // 2)
    for delta in offsets:
        # A missing partner is the zero vector, whose wedge with z_t is exactly 0 (and
        # stays 0 after normalising, 0 / eps), so invalid offsets drop out of the sum.
        p = plucker(z, partner(z, delta, pairing))  # (B, L, r(r-1)/2)
        if normalize:
            p = p / p.norm(dim=-1, keepdim=True).clamp_min(eps)
        p_sum = p_sum + p
    n = valid_counts(L, offsets, pairing, z.device).to(z.dtype)[:, None]  # (L, 1)
    # W_plü is linear, so projecting the aggregate equals aggregating the per-offset
    # projections (one matmul instead of one per offset); the bias enters once per
    # valid offset: n times for the sum, once for the mean, never where n = 0.
    if aggregate == "mean":
        g = F.linear(p_sum / n.clamp_min(1), weight)  # (B, L, D)
        return g if bias is None else g + (n > 0).to(z.dtype) * bias
    g = F.linear(p_sum, weight)
    return g if bias is None else g + n * bias
