"""The SSD (state space duality) scan of Mamba-2, chunked.

Per head h, with a scalar decay per step and a (headdim, dstate) state,

    dt_t = softplus(dt_t + dt_bias)                   (both optional)
    H_t  = exp(dt_t * A) * H_{t-1} + (dt_t * x_t) B_t^T
    y_t  = H_t C_t + D * x_t,   then   y_t *= silu(z_t)   (D, z optional)

Argument layouts are those of mamba_ssm's ``mamba_chunk_scan_combined`` so the
Triton kernel is a drop-in fast path. The pure-PyTorch path splits the sequence
into chunks of ``chunk_size``: inside a chunk the output is a masked quadratic
form (the "attention" view of SSD), across chunks the states are passed along
with a tiny (nchunks x nchunks) decay matrix (the "recurrent" view). Both views
use the same segment sums, computed by cumulative sums of masked copies rather
than as differences of one long cumsum, which cancels badly in low precision.
``ssd_scan_ref`` is the recurrence one step at a time, to check either path against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .fastpath import Kernel

# Also the source of the fused Mamba-2 block (zoo/mixers/mamba2.py); no float64 kernels.
SSD_SCAN = Kernel("mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined", "mamba-ssm",
                  "2.0.0", "the Mamba-2 SSD kernels")


def ssd_backend(x: torch.Tensor) -> str:
    """Which implementation ``ssd_scan`` runs for an input like ``x``."""
    return "mamba_ssm_ssd" if SSD_SCAN.usable(x) else "torch_chunked"


def ssd_scan(x, dt, A, B, C, chunk_size=64, D=None, z=None, dt_bias=None, dt_softplus=False,
             initial_states=None, return_final_states=False):
    """x: (b, L, h, p); dt: (b, L, h); A: (h,) negative; B, C: (b, L, g, n) with g | h;
    D: (h,) or (h, p); z: (b, L, h, p); dt_bias: (h,); initial_states: (b, h, p, n).
    Returns y (b, L, h, p) in x's dtype, and with ``return_final_states`` also the
    state after the last step (b, h, p, n), float32 (float64 for float64 inputs)."""
    if ssd_backend(x) == "mamba_ssm_ssd":
        return SSD_SCAN(
            x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
            initial_states=initial_states, return_final_states=return_final_states)
    return ssd_scan_chunked(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus,
                            initial_states, return_final_states)


def ssd_scan_ref(x, dt, A, B, C, chunk_size=64, D=None, z=None, dt_bias=None, dt_softplus=False,
                 initial_states=None, return_final_states=False):
    """One step at a time, exactly as the Mamba-2 paper writes the SSM (the readable
    reference; cost L Python steps):
        H_t = exp(dt_t A) H_{t-1} + dt_t x_t B_t^T,  y_t = H_t C_t + D x_t,  y_t *= silu(z_t).
    Same arguments and returns as ``ssd_scan``: ``chunk_size`` is taken, positionally
    too, so that the two are interchangeable, and ignored (a loop has no chunks)."""
    b, L, h, p = x.shape
    g, n = B.shape[-2:]
    if h % g:
        raise ValueError(f"ssd_scan: nheads={h} is not divisible by ngroups={g}")
    cdt = torch.promote_types(x.dtype, torch.float32)
    group = torch.arange(h, device=x.device) // (h // g)  # the B/C group each head reads
    dt = dt.to(cdt)
    if dt_bias is not None:
        dt = dt + dt_bias.to(cdt)
    if dt_softplus:
        dt = F.softplus(dt)
    xc, A, B, C = x.to(cdt), A.to(cdt), B.to(cdt), C.to(cdt)
    H = xc.new_zeros(b, h, p, n) if initial_states is None else initial_states.to(cdt)
    ys = []
    for t in range(L):
        Bt, Ct = B[:, t, group], C[:, t, group]  # (b, h, n)
        decay = torch.exp(dt[:, t] * A)  # (b, h)
        H = decay[..., None, None] * H + (dt[:, t, :, None] * xc[:, t])[..., None] * Bt[:, :, None, :]
        ys.append((H * Ct[:, :, None, :]).sum(-1))  # (b, h, p)
    y = torch.stack(ys, dim=1) if ys else xc.new_zeros(b, 0, h, p)
    if D is not None:
        y = y + xc * (D.to(cdt)[:, None] if D.dim() == 1 else D.to(cdt))
    if z is not None:
        y = y * F.silu(z.to(cdt))
    y = y.to(x.dtype)
    return (y, H) if return_final_states else y


def segsum(a: torch.Tensor) -> torch.Tensor:
    """a: (..., T) -> (..., T, T) with out[..., i, j] = a[j+1] + ... + a[i] for j <= i
    (0 on the diagonal) and -inf above it, so exp(out) is the causal decay matrix."""
    T = a.shape[-1]
    ones = torch.ones(T, T, dtype=torch.bool, device=a.device)
    a = a[..., :, None].expand(*a.shape, T)  # (..., T, T): a[..., i, j] = a_i
    a = a.masked_fill(~torch.tril(ones, diagonal=-1), 0.0)  # keep a_i only where i > j
    out = a.cumsum(dim=-2)  # out[i, j] = sum_{j < k <= i} a_k
    return out.masked_fill(~torch.tril(ones), float("-inf"))


def ssd_scan_chunked(x, dt, A, B, C, chunk_size=64, D=None, z=None, dt_bias=None, dt_softplus=False,
                     initial_states=None, return_final_states=False):
    """Pure-PyTorch SSD, same signature and semantics as ``ssd_scan``."""
    b, L, h, p = x.shape
    g, n = B.shape[-2:]
    if h % g:
        raise ValueError(f"ssd_scan: nheads={h} is not divisible by ngroups={g}")
    if chunk_size <= 0:
        raise ValueError(f"ssd_scan: chunk_size must be positive, got {chunk_size}")
    r = h // g  # heads per group: head k reads B, C of group k // r, as in mamba_ssm
    # Accumulate in float32 even for bf16/fp16 inputs: the decays are products of
    # many numbers just below 1 and the states sum over the whole sequence.
    cdt = torch.promote_types(x.dtype, torch.float32)

    dt = dt.to(cdt)
    if dt_bias is not None:
        dt = dt + dt_bias.to(cdt)
    if dt_softplus:
        dt = F.softplus(dt)
    dA = dt * A.to(cdt)  # (b, L, h) log-decay per step, <= 0
    xdt = x.to(cdt) * dt[..., None]  # (b, L, h, p) the input enters scaled by dt
    B, C = B.to(cdt), C.to(cdt)

    # Pad to whole chunks AFTER dt_bias/softplus: padded steps have dA = 0 (decay 1)
    # and zero input, so they leave the final state untouched.
    Q = min(chunk_size, max(L, 1))  # a chunk longer than the sequence would only add padding
    pad = -L % Q
    if pad:
        xdt, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (xdt, B, C))
        dA = F.pad(dA, (0, 0, 0, pad))
    c = (L + pad) // Q
    xdt = xdt.view(b, c, Q, g, r, p)
    B, C = B.view(b, c, Q, g, n), C.view(b, c, Q, g, n)
    dA = dA.view(b, c, Q, g, r).permute(0, 3, 4, 1, 2)  # (b, g, r, c, Q)

    # 1. Inside each chunk: y_l = sum_{s <= l} (C_l . B_s) exp(dA_{s+1} + .. + dA_l) xdt_s.
    decay = torch.exp(segsum(dA))  # (b, g, r, c, Q, Q)
    CB = torch.einsum("bclgn,bcsgn->bcgls", C, B)  # (b, c, g, Q, Q)
    y = torch.einsum("bcgls,bgrcls,bcsgrp->bclgrp", CB, decay, xdt)

    # 2. The state each chunk adds on its own, decayed to the chunk's last step.
    # decay[..., -1, :] is exactly exp(sum of dA after s up to the end of the chunk).
    states = torch.einsum("bcsgn,bgrcs,bcsgrp->bcgrpn", B, decay[..., -1, :], xdt)

    # 3. Pass states across chunks: the state entering chunk k is
    # sum_{j <= k} exp(total dA of chunks j..k-1) * (chunk j-1's own state), with
    # "chunk -1" the initial state.
    if initial_states is None:
        init = states.new_zeros(b, 1, g, r, p, n)
    else:
        init = initial_states.to(cdt).reshape(b, 1, g, r, p, n)
    states = torch.cat([init, states], dim=1)  # (b, c+1, g, r, p, n)
    chunk_dA = F.pad(dA.sum(-1), (1, 0))  # (b, g, r, c+1): total log-decay per chunk
    chunk_decay = torch.exp(segsum(chunk_dA))  # (b, g, r, c+1, c+1)
    states = torch.einsum("bgrkj,bjgrpn->bkgrpn", chunk_decay, states)
    prev_states, final_states = states[:, :-1], states[:, -1]  # entering each chunk; after all

    # 4. What the incoming state contributes to each step, decayed from the chunk start.
    decay_in = torch.exp(dA.cumsum(-1))  # (b, g, r, c, Q)
    y = y + torch.einsum("bclgn,bcgrpn,bgrcl->bclgrp", C, prev_states, decay_in)

    y = y.reshape(b, c * Q, h, p)[:, :L]
    if D is not None:
        y = y + x.to(cdt) * (D.to(cdt)[:, None] if D.dim() == 1 else D.to(cdt))
    if z is not None:
        y = y * F.silu(z.to(cdt))
    y = y.to(x.dtype)
    return (y, final_states.reshape(b, h, p, n)) if return_final_states else y
