"""The SSD (state space duality) scan of Mamba-2, chunked.

Per head h, with a scalar decay per step and a (headdim, dstate) state,

    dt_t = softplus(dt_t + dt_bias)                   (both optional)
    H_t  = exp(dt_t * A) * H_{t-1} + (dt_t * x_t) B_t^T
    y_t  = H_t C_t + D * x_t,   then   y_t *= silu(z_t)   (D, z optional)

Argument layouts are those of mamba_ssm's ``mamba_chunk_scan_combined`` so the
Triton kernel is a drop-in fast path. The pure-PyTorch path splits the sequence
into chunks of ``chunk_size``: inside a chunk the output is a masked quadratic
form (the "attention" view of SSD), across chunks the states are passed along
by a loop over chunks (the "recurrent" view). Inside a chunk the decays are
differences of the chunk's own cumulative sum, as mamba_ssm's kernels form them, and
are split about the chunk's midpoint so that a group's heads share one matmul.
``ssd_scan_ref`` is the recurrence one step at a time, to check either path against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .fastpath import Kernel
from .chunks import matmul_range, own_precision

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


@own_precision
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


def _discretize(x, dt, A, dt_bias, dt_softplus: bool, cdt: torch.dtype):
    """The per-step log-decay dA = dt * A (b, L, h), <= 0, and the input scaled by dt,
    xdt (b, L, h, p), in the accumulation dtype ``cdt``."""
    dt = dt.to(cdt)
    if dt_bias is not None:
        dt = dt + dt_bias.to(cdt)
    if dt_softplus:
        dt = F.softplus(dt)
    return dt * A.to(cdt), x.to(cdt) * dt[..., None]


def _within_chunks(C, B, x_heads, cs, limit: float):
    """Step 1 of ``ssd_scan_chunked``: each chunk's output from its own steps,
    y_l = sum_{s <= l} (C_l . B_s) exp(cs_l - cs_s) xdt_s, computed as
    exp(cs_l - m) [tril(C B^T) (exp(m - cs) xdt)]_l with m halfway along the chunk's decay:
    one (Q x Q) product per group shared by its r heads, and no (Q x Q) decay per head.
    Where a head's total decay in a chunk would push a factor's exponent past ``limit`` / 2,
    that (chunk, head) is recomputed with its pairwise decays.
    C, B: (b, c, g, Q, n); x_heads: (b, c, g, Q, r, p); cs: (b, c, g, r, Q). Returns
    (b, c, g, Q, r, p)."""
    Q, (r, p) = C.shape[-2], x_heads.shape[-2:]
    causal = torch.ones(Q, Q, dtype=torch.bool, device=C.device).tril()
    scores = (C @ B.transpose(-1, -2)).masked_fill(~causal, 0.0)  # (b, c, g, Q, Q)
    mid = cs[..., -1:] / 2  # (b, c, g, r, 1)
    into = (mid - cs).clamp(max=limit / 2).exp().transpose(-1, -2)[..., None]  # (b, c, g, Q, r, 1)
    out_of = (cs - mid).clamp(max=limit / 2).exp().transpose(-1, -2)[..., None]
    y = (scores @ (x_heads * into).flatten(-2)).unflatten(-1, (r, p)) * out_of
    steep = -cs[..., -1] > limit  # (b, c, g, r)
    if steep.any():
        at = steep.nonzero(as_tuple=True)
        cs_at = cs[at]  # (M, Q)
        decay = (cs_at[:, :, None] - cs_at[:, None, :]).masked_fill(~causal, float("-inf")).exp()
        y_at = (scores[at[:3]] * decay) @ x_heads.transpose(3, 4)[at]  # (M, Q, p)
        y = y.transpose(3, 4).index_put(at, y_at.to(y.dtype)).transpose(3, 4)  # autocast: y_at may be bf16
    return y


def _across_chunks(states, cs, S, r: int, p: int):
    """Step 3 of ``ssd_scan_chunked``: a loop over chunks (not steps). The state entering
    chunk k+1 is exp(chunk k's total decay) times the state entering k, plus k's own
    (``states``, (b, c, g, n, r*p)); ``S`` (b, g, n, r*p) enters the first. Returns the
    state entering each chunk, (b, c, g, n, r*p), and the final one."""
    carry = cs[..., -1].exp()[:, :, :, None, :, None]  # (b, c, g, 1, r, 1)
    entering = []
    for carry_k, states_k in zip(carry.unbind(1), states.unbind(1)):  # unbind: one stack in the backward
        entering.append(S)
        S = (S.unflatten(-1, (r, p)) * carry_k).flatten(-2) + states_k
    return torch.stack(entering, dim=1), S


@own_precision
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

    dA, xdt = _discretize(x, dt, A, dt_bias, dt_softplus, cdt)  # (b, L, h), (b, L, h, p)
    B, C = B.to(cdt), C.to(cdt)

    # Pad to whole chunks AFTER dt_bias/softplus: padded steps have dA = 0 (decay 1)
    # and zero input, so they leave the final state untouched.
    Q = min(chunk_size, max(L, 1))  # a chunk longer than the sequence would only add padding
    pad = -L % Q
    if pad:
        xdt, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (xdt, B, C))
        dA = F.pad(dA, (0, 0, 0, pad))
    c = (L + pad) // Q
    # Layouts that make every contraction one batched matmul: a chunk's steps next to
    # the group's heads, (b, c, g, Q, r*p), so that all the r heads reading the same
    # B and C share one product with them.
    xdt = xdt.view(b, c, Q, g, r * p).transpose(2, 3)  # (b, c, g, Q, r*p)
    B = B.view(b, c, Q, g, n).transpose(2, 3)  # (b, c, g, Q, n)
    C = C.view(b, c, Q, g, n).transpose(2, 3)
    dA = dA.view(b, c, Q, g, r).permute(0, 1, 3, 4, 2)  # (b, c, g, r, Q)
    cs = dA.cumsum(-1)  # (b, c, g, r, Q) log-decay from the chunk's start, inclusive

    # 1. Inside each chunk: each step from the chunk's own earlier steps.
    x_heads = xdt.unflatten(-1, (r, p))  # (b, c, g, Q, r, p)
    y = _within_chunks(C, B, x_heads, cs, matmul_range(cdt))  # (b, c, g, Q, r, p)

    # 2. The state each chunk adds on its own, decayed to the chunk's last step.
    to_end = (cs[..., -1:] - cs).exp().transpose(-1, -2)[..., None]  # (b, c, g, Q, r, 1)
    states = B.transpose(-1, -2) @ (x_heads * to_end).flatten(-2)  # (b, c, g, n, r*p)

    # 3. Pass states across chunks.
    S = states.new_zeros(b, g, n, r * p) if initial_states is None else \
        initial_states.to(cdt).view(b, g, r, p, n).permute(0, 1, 4, 2, 3).reshape(b, g, n, r * p)
    prev_states, S = _across_chunks(states, cs, S, r, p)  # (b, c, g, n, r*p), (b, g, n, r*p)
    final_states = S.unflatten(-1, (r, p)).permute(0, 1, 3, 4, 2)  # (b, g, r, p, n)

    # 4. What the incoming state contributes to each step, decayed from the chunk start.
    decay_in = cs.exp().transpose(-1, -2)[..., None]  # (b, c, g, Q, r, 1)
    y = y + (C @ prev_states).unflatten(-1, (r, p)) * decay_in  # (b, c, g, Q, r, p)
    y = y.transpose(2, 3)  # (b, c, Q, g, r, p)

    y = y.reshape(b, c * Q, h, p)[:, :L]
    if D is not None:
        y = y + x.to(cdt) * (D.to(cdt)[:, None] if D.dim() == 1 else D.to(cdt))
    if z is not None:
        y = y * F.silu(z.to(cdt))
    y = y.to(x.dtype)
    return (y, final_states.reshape(b, h, p, n)) if return_final_states else y
