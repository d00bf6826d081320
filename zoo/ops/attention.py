"""Causal softmax attention without a fused kernel: the readable reference (full, or
over a window of the last ``window`` tokens) and the sliding window in time and memory
linear in L, which the sliding-window mixer runs on CPU (``sdpa_local``)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# A query block of the local path is at least this long: shorter blocks make more,
# smaller SDPA calls, whose overhead outweighs the keys they save.
LOCAL_BLOCK = 32


def attention_ref(q, k, v, window: int | None = None):
    """Readable causal softmax attention. q, k, v: (B, H, L, Dh) -> (B, H, L, Dh).
    With ``window``, position t attends to t-window .. t (window + 1 keys)."""
    L = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, L, L)
    mask = _causal_mask(L, window, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    # softmax in at least fp32 (fp64 stays fp64, so checks against it can be tight)
    return torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(v.dtype) @ v


def _causal_mask(L: int, window: int | None, device) -> torch.Tensor:
    i = torch.arange(L, device=device)
    keep = i[None, :] <= i[:, None]  # (L, L): key s <= query t
    if window is not None:
        keep &= i[None, :] >= i[:, None] - window
    return keep


def local_attention(q, k, v, window: int):
    """Sliding-window causal attention in time and memory linear in L: the same
    function as ``attention_ref(q, k, v, window)``. q, k, v: (B, H, L, Dh).

    The sequence is cut into blocks of T >= window queries; every key a query of block
    n may see lies in block n or n - 1, so each block attends to those 2T keys under a
    fixed (T, 2T) band mask: L/T attention problems of size T x 2T, never L x L.
    """
    B, H, L, Dh = q.shape
    if window >= L - 1:  # the window reaches back to token 0 everywhere: plain causal
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = max(window, LOCAL_BLOCK)
    n = -(-L // T)
    pad = n * T - L  # padded queries and keys sit after every real token: never seen

    def blocks(t):  # (B, H, L, Dh) -> (B, H, n, T, Dh)
        return F.pad(t, (0, 0, 0, pad)).view(B, H, n, T, Dh)

    def with_previous(t):  # (B, H, n, T, Dh) -> (B, H * n, 2T, Dh): block n-1, then block n
        return torch.cat([F.pad(t, (0, 0, 0, 0, 1, 0))[:, :, :n], t], dim=3).flatten(1, 2)

    q, k, v = blocks(q), blocks(k), blocks(v)
    i = torch.arange(T, device=q.device)[:, None]  # query offset in its block
    j = torch.arange(2 * T, device=q.device)[None, :] - T  # key offset from the block start
    band = (j <= i) & (j >= i - window)  # (T, 2T)
    first = band & (j >= 0)  # block 0 has no previous block: its zero padding is masked
    mask = torch.stack([first, *[band] * (n - 1)]).repeat(H, 1, 1)  # (H * n, T, 2T)
    # 4-D (B, H * n, T, Dh), the layout SDPA's fused kernels take
    y = F.scaled_dot_product_attention(q.flatten(1, 2), with_previous(k), with_previous(v),
                                       attn_mask=mask)
    return y.view(B, H, n * T, Dh)[:, :, :L]
