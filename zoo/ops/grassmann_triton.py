"""Triton kernels for the Grassmann mixer core, forward and backward.

The formulation (and its derivation) is ``zoo/ops/grassmann.py``: per token t, with
partners w_k = z_{t-Δk} ("past") or z_{t+Δk} ("future"),

    v_k = w_k - β_k z_t,  β_k = z_t·w_k / |z_t|^2      (same wedge as w_k, v_k ⊥ z_t)
    W_t = s_t sum_k c_k v_k,  c_k = 1 / max(|z_t| |v_k|, eps)   (w_k, c_k = 1 unnormalised)
    g_t = sum_ij K[i, j, :] z_ti W_tj                  K: (R, R, D) antisymmetric

with s_t = 1/max(n_t, 1) for the mean, 1 for the sum; a missing partner loads as 0
and adds 0. Nothing of size |Δ| x r^2 is written: the forward keeps W_t in registers
and feeds z_ti W_t (BT, R) tiles to ``tl.dot`` against K[i]. The backward recomputes
W_t from z and keeps O(L r) floats:

    G_t = sum_d dg_td K[:, :, d]                 (R, R) per token, row i at a time
    U_t = G_t^T z_t (= dW_t), dz_t = G_t W_t      kernel _bwd_tokens (also stores W_t)
    dK[i, j, :] = sum_t z_ti W_tj dg_t           kernel _bwd_weight (token splits, summed)
    the chain through W_t                        kernel _bwd_partners (O(|Δ| r) a token)

For the last one, β is a constant (g does not depend on it, see grassmann.py). With
a = |z_t|^2, d = z_t·w, m = |v|^2, P = a m and c = s/sqrt(P) where P > eps^2 (else the
constant s/eps): e = -(U_t·v) c / P (0 where clamped), and

    dz_t += -β c U_t + e (m z_t - d v),   d(partner) += c U_t + e a v.

Each token collects its partner role by gathering from t = u ± Δ, so no atomics.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _count_valid(t, L, offs_ptr, NOFF: tl.constexpr, PAST: tl.constexpr):
    n = tl.zeros(t.shape, dtype=tl.float32)
    for k in range(NOFF):
        delta = tl.load(offs_ptr + k)
        n += tl.where((t - delta >= 0) if PAST else (t + delta < L), 1.0, 0.0)
    return n


@triton.jit
def _pair(zt, w, eps):
    """For rows z_t (BT, R) and partners w (BT, R): v = w - β z_t (⊥ z_t, same wedge),
    β, |z_t|^2, z_t·w, |v|^2, 1/max(|z_t ∧ w|, eps) and whether |z_t ∧ w| > eps."""
    zz = tl.sum(zt * zt, 1)
    dot = tl.sum(zt * w, 1)
    # IEEE division: w == z_t must give β = 1 and v = 0 exactly (see grassmann.py)
    beta = tl.where(zz > 0, tl.math.div_rn(dot, tl.where(zz > 0, zz, 1.0)), 0.0)
    v = w - beta[:, None] * zt
    m = tl.sum(v * v, 1)
    p2 = zz * m
    big = p2 > eps * eps
    inv = tl.where(big, 1.0 / tl.sqrt_rn(tl.where(big, p2, 1.0)), 1.0 / eps)
    return v, beta, zz, dot, m, inv, big


@triton.jit
def _combine(zb, zt, t, c, L, r, offs_ptr, eps, NOFF: tl.constexpr, PAST: tl.constexpr,
             NORMALIZE: tl.constexpr, MEAN: tl.constexpr):
    """W (BT, R) for the tile of tokens t (BT,), whose z rows zt (BT, R) are loaded.
    A missing partner loads as 0, which adds 0 (its v is 0 too)."""
    W = tl.zeros(zt.shape, dtype=tl.float32)
    for k in range(NOFF):
        delta = tl.load(offs_ptr + k)
        s = t - delta if PAST else t + delta
        ok = (s >= 0) & (s < L) & (t < L)
        w = tl.load(zb + s[:, None] * r + c[None, :], mask=ok[:, None] & (c[None, :] < r),
                    other=0.0).to(tl.float32)
        if NORMALIZE:
            v, beta, zz, dot, m, inv, big = _pair(zt, w, eps)
            w = inv[:, None] * v
        W += w
    if MEAN:
        W = W / tl.maximum(_count_valid(t, L, offs_ptr, NOFF, PAST), 1.0)[:, None]
    return W


@triton.jit
def _fwd(z_ptr, K_ptr, g_ptr, offs_ptr, L, D, r, eps, NOFF: tl.constexpr, PAST: tl.constexpr,
         NORMALIZE: tl.constexpr, MEAN: tl.constexpr, PRECISION: tl.constexpr,
         R: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    b = tl.program_id(1)
    t = tl.program_id(0) * BT + tl.arange(0, BT)  # (BT,)
    dd = tl.program_id(2) * BD + tl.arange(0, BD)  # (BD,)
    c = tl.arange(0, R)
    zb = z_ptr + b * L * r
    zt = tl.load(zb + t[:, None] * r + c[None, :], mask=(t[:, None] < L) & (c[None, :] < r),
                 other=0.0).to(tl.float32)  # (BT, R)
    W = _combine(zb, zt, t, c, L, r, offs_ptr, eps, NOFF, PAST, NORMALIZE, MEAN)  # (BT, R)
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    for i in range(r):  # g += (z_i W) @ K[i]: the r*r outer product, one row block at a time
        zi = tl.load(zb + t * r + i, mask=t < L, other=0.0).to(tl.float32)  # (BT,)
        Ki = tl.load(K_ptr + i * R * D + c[:, None] * D + dd[None, :], mask=dd[None, :] < D,
                     other=0.0)  # (R, BD)
        acc = tl.dot((zi[:, None] * W).to(Ki.dtype), Ki, acc, input_precision=PRECISION)
    tl.store(g_ptr + (b * L + t[:, None]) * D + dd[None, :], acc.to(g_ptr.dtype.element_ty),
             mask=(t[:, None] < L) & (dd[None, :] < D))


@triton.jit
def _bwd_tokens(z_ptr, K_ptr, dg_ptr, W_ptr, dW_ptr, dz_ptr, offs_ptr, L, D, r, eps,
                NOFF: tl.constexpr, PAST: tl.constexpr, NORMALIZE: tl.constexpr,
                MEAN: tl.constexpr, PRECISION: tl.constexpr, R: tl.constexpr,
                BT: tl.constexpr, BD: tl.constexpr):
    """W_t (stored for _bwd_weight), dW_t = G_t^T z_t and the direct dz_t = G_t W_t."""
    b = tl.program_id(1)
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    c = tl.arange(0, R)
    zb = z_ptr + b * L * r
    tmask = t < L
    zt = tl.load(zb + t[:, None] * r + c[None, :], mask=tmask[:, None] & (c[None, :] < r),
                 other=0.0).to(tl.float32)
    W = _combine(zb, zt, t, c, L, r, offs_ptr, eps, NOFF, PAST, NORMALIZE, MEAN)  # (BT, R)
    dW = tl.zeros((BT, R), dtype=tl.float32)
    dz = tl.zeros((BT, R), dtype=tl.float32)
    for i in range(r):
        Gi = tl.zeros((BT, R), dtype=tl.float32)  # G[t, i, :]
        for d0 in range(0, D, BD):
            dd = d0 + tl.arange(0, BD)
            dgb = tl.load(dg_ptr + (b * L + t[:, None]) * D + dd[None, :],
                          mask=tmask[:, None] & (dd[None, :] < D), other=0.0)  # (BT, BD)
            KiT = tl.load(K_ptr + i * R * D + c[None, :] * D + dd[:, None],
                          mask=dd[:, None] < D, other=0.0)  # (BD, R)
            Gi = tl.dot(dgb.to(KiT.dtype), KiT, Gi, input_precision=PRECISION)
        zi = tl.load(zb + t * r + i, mask=tmask, other=0.0).to(tl.float32)
        dW += zi[:, None] * Gi
        dz += tl.where(c[None, :] == i, tl.sum(Gi * W, 1)[:, None], 0.0)
    rows = (b * L + t[:, None]) * R + c[None, :]
    tl.store(W_ptr + rows, W, mask=tmask[:, None])
    tl.store(dW_ptr + rows, dW, mask=tmask[:, None])
    tl.store(dz_ptr + rows, dz, mask=tmask[:, None])


@triton.jit
def _bwd_weight(z_ptr, W_ptr, dg_ptr, dK_ptr, L, D, r, n_tiles, SPLIT: tl.constexpr,
                PRECISION: tl.constexpr, R: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """dK[split, i, :, d-block] = sum over this split's tokens of (z_ti W_t)^T dg_t."""
    i = tl.program_id(0)
    dd = tl.program_id(1) * BD + tl.arange(0, BD)
    c = tl.arange(0, R)
    acc = tl.zeros((R, BD), dtype=tl.float32)
    tiles_per_b = tl.cdiv(L, BT)
    for tile in range(tl.program_id(2), n_tiles, SPLIT):
        b = tile // tiles_per_b
        t = (tile % tiles_per_b) * BT + tl.arange(0, BT)
        rows = b * L + t
        zi = tl.load(z_ptr + rows * r + i, mask=t < L, other=0.0).to(tl.float32)  # (BT,)
        W = tl.load(W_ptr + rows[:, None] * R + c[None, :], mask=t[:, None] < L, other=0.0)
        dgb = tl.load(dg_ptr + rows[:, None] * D + dd[None, :],
                      mask=(t[:, None] < L) & (dd[None, :] < D), other=0.0)  # (BT, BD)
        A = tl.trans(zi[:, None] * W).to(dgb.dtype)  # (R, BT)
        acc = tl.dot(A, dgb, acc, input_precision=PRECISION)
    tl.store(dK_ptr + ((tl.program_id(2) * R + i) * R + c[:, None]) * D + dd[None, :], acc,
             mask=dd[None, :] < D)


@triton.jit
def _bwd_partners(z_ptr, dW_ptr, dz_ptr, out_ptr, offs_ptr, L, r, eps, NOFF: tl.constexpr,
                  PAST: tl.constexpr, NORMALIZE: tl.constexpr, MEAN: tl.constexpr,
                  R: tl.constexpr, BT: tl.constexpr):
    """dz_u = direct + norm terms as a token + (c dW_t + norm terms) as a partner of t."""
    b = tl.program_id(1)
    u = tl.program_id(0) * BT + tl.arange(0, BT)
    c = tl.arange(0, R)
    umask = u < L
    cmask = c[None, :] < r
    zb = z_ptr + b * L * r
    zu = tl.load(zb + u[:, None] * r + c[None, :], mask=umask[:, None] & cmask,
                 other=0.0).to(tl.float32)
    dz = tl.load(dz_ptr + (b * L + u[:, None]) * R + c[None, :], mask=umask[:, None], other=0.0)
    dWu = tl.load(dW_ptr + (b * L + u[:, None]) * R + c[None, :], mask=umask[:, None], other=0.0)
    su = 1.0 / tl.maximum(_count_valid(u, L, offs_ptr, NOFF, PAST), 1.0) if MEAN else 1.0
    for k in range(NOFF):
        delta = tl.load(offs_ptr + k)
        # u as the partner of t = u ± Δ: the share c dW_t of the combination
        t = u + delta if PAST else u - delta
        ok = (t >= 0) & (t < L) & umask
        zt = tl.load(zb + t[:, None] * r + c[None, :], mask=ok[:, None] & cmask,
                     other=0.0).to(tl.float32)
        dWt = tl.load(dW_ptr + (b * L + t[:, None]) * R + c[None, :], mask=ok[:, None], other=0.0)
        st = 1.0 / tl.maximum(_count_valid(t, L, offs_ptr, NOFF, PAST), 1.0) if MEAN else 1.0
        if NORMALIZE:
            v, beta, zzt, dot, m, inv, big = _pair(zt, zu, eps)
            coef = tl.where(ok, st * inv, 0.0)
            e = tl.where(ok & big, -tl.sum(dWt * v, 1) * coef * inv * inv, 0.0)
            dz += coef[:, None] * dWt + (e * zzt)[:, None] * v
            # u as the token with partner p: the gradient of its own norms and of β z_u
            p = u - delta if PAST else u + delta
            ok = (p >= 0) & (p < L) & umask
            w = tl.load(zb + p[:, None] * r + c[None, :], mask=ok[:, None] & cmask,
                        other=0.0).to(tl.float32)
            v, beta, zz, dot, m, inv, big = _pair(zu, w, eps)
            coef = su * inv
            e = tl.where(ok & big, -tl.sum(dWu * v, 1) * coef * inv * inv, 0.0)
            dz += -(beta * coef)[:, None] * dWu + e[:, None] * (m[:, None] * zu - dot[:, None] * v)
        else:
            dz += tl.where(ok, st, 0.0)[:, None] * dWt
    tl.store(out_ptr + (b * L + u[:, None]) * r + c[None, :], dz.to(out_ptr.dtype.element_ty),
             mask=umask[:, None] & cmask)


# Decided by Triton when the kernels above were decorated (TRITON_INTERPRET=1 then).
INTERPRETED = isinstance(_fwd, InterpretedFunction)


def _meta(K: torch.Tensor):
    R, D = K.shape[0], K.shape[-1]
    # float32 stays float32 in tl.dot ("ieee"): the fused path must match the reference,
    # not TF32's 10-bit mantissa. Half inputs use the tensor cores as they are.
    precision = "ieee" if K.dtype == torch.float32 else "tf32"
    # 64-token tiles: big enough for the tensor cores, few programs for the interpreter
    return R, D, precision, 64, min(64, max(16, triton.next_power_of_2(D)))


class _GrassmannCore(torch.autograd.Function):
    """g = core(z, K) without bias; K: (R, R, D) zero-padded, R a power of two >= 16."""

    @staticmethod
    def forward(ctx, z, K, offs, past, normalize, eps, mean):
        B, L, r = z.shape
        R, D, precision, BT, BD = _meta(K)
        g = torch.empty(B, L, D, device=z.device, dtype=z.dtype)
        flags = dict(NOFF=offs.numel(), PAST=past, NORMALIZE=normalize, MEAN=mean)
        _fwd[(triton.cdiv(L, BT), B, triton.cdiv(D, BD))](
            z, K, g, offs, L, D, r, eps, **flags, PRECISION=precision, R=R, BT=BT, BD=BD)
        ctx.save_for_backward(z, K, offs)
        ctx.flags, ctx.eps = flags, eps
        return g

    @staticmethod
    def backward(ctx, dg):
        z, K, offs = ctx.saved_tensors
        B, L, r = z.shape
        R, D, precision, BT, BD = _meta(K)
        dg = dg.contiguous()
        W, dW, dz_direct = (torch.empty(B, L, R, device=z.device, dtype=torch.float32)
                            for _ in range(3))
        grid = (triton.cdiv(L, BT), B)
        _bwd_tokens[grid](z, K, dg, W, dW, dz_direct, offs, L, D, r, ctx.eps, **ctx.flags,
                          PRECISION=precision, R=R, BT=BT, BD=BD)
        n_tiles = B * triton.cdiv(L, BT)
        # Enough programs to fill the GPU; each split's partial dK is summed below.
        split = max(1, min(n_tiles, 512 // (r * triton.cdiv(D, BD))))
        dK = torch.zeros(split, R, R, D, device=z.device, dtype=torch.float32)
        _bwd_weight[(r, triton.cdiv(D, BD), split)](
            z, W, dg, dK, L, D, r, n_tiles, SPLIT=split, PRECISION=precision, R=R, BT=BT, BD=BD)
        dz = torch.empty_like(z)
        _bwd_partners[grid](z, dW, dz_direct, dz, offs, L, r, ctx.eps, **ctx.flags, R=R, BT=BT)
        return dz, dK.sum(0).to(K.dtype), None, None, None, None, None


def grassmann_core_triton(z, K, offsets, pairing, normalize, eps, aggregate):
    """The bias-free core g: (B, L, D) from z: (B, L, r) and K: (r, r, D) (bilinear_weight).
    Under Triton's CPU interpreter, whose half arithmetic is wrong, the kernels run
    in float32 and the result is cast back."""
    if z.dtype == torch.float64:
        raise ValueError("grassmann: impl='fused' has no float64 kernel; use impl='factored' "
                         "or 'eager' for float64 checks")
    dtype = z.dtype
    if INTERPRETED:
        z, K = z.float(), K.float()
    r = z.shape[-1]
    R = max(16, triton.next_power_of_2(r))  # tl.dot needs >= 16 along every dimension
    Kp = torch.nn.functional.pad(K, (0, 0, 0, R - r, 0, R - r)).to(z.dtype).contiguous()
    offs = torch.tensor(offsets, dtype=torch.int32, device=z.device)
    g = _GrassmannCore.apply(z.contiguous(), Kp, offs, pairing == "past", bool(normalize),
                             float(eps), aggregate == "mean")
    return g.to(dtype)
