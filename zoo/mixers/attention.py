"""Causal multi-head attention and its local (sliding-window) control."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.optional import optional
from .base import Mixer, check_choice, check_divisible, check_positive

flash_attn_func = optional("flash_attn", "flash_attn_func")

BACKENDS = ("auto", "flash_attn", "sdpa", "math")


def attention_ref(q, k, v, window: int | None = None):
    """Readable causal softmax attention. q, k, v: (B, H, L, Dh) -> (B, H, L, Dh).
    With ``window``, position t attends to t-window .. t (window + 1 keys)."""
    L = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, L, L)
    mask = _causal_mask(L, window, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v


def _causal_mask(L: int, window: int | None, device) -> torch.Tensor:
    i = torch.arange(L, device=device)
    keep = i[None, :] <= i[:, None]  # (L, L): key s <= query t
    if window is not None:
        keep &= i[None, :] >= i[:, None] - window
    return keep


class Attention(Mixer):
    """Causal multi-head self-attention: qkv projection, softmax attention, output
    projection. 4 (d^2 + d) parameters, as in the paper's TransformerLM."""

    name = "attention"
    fast_path = "flash_attn (CUDA, fp16/bf16); else torch SDPA"

    def __init__(self, d_model: int, n_heads: int = 4, backend: str = "auto", bias: bool = True):
        super().__init__()
        check_divisible(self.name, d_model, n_heads)
        check_choice(self.name, "backend", backend, BACKENDS)
        if backend == "flash_attn" and flash_attn_func is None:
            raise ValueError(f"{self.name}: backend='flash_attn' but flash_attn is not importable")
        self.d_model, self.n_heads, self.requested_backend = d_model, n_heads, backend
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    window: int | None = None  # None: full causal attention

    def _pick_backend(self, x: torch.Tensor) -> str:
        if self.requested_backend != "auto":
            return self.requested_backend
        if flash_attn_func is not None and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
            return "flash_attn"
        return "sdpa"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        H = self.n_heads
        q, k, v = self.qkv(x).view(B, L, 3, H, D // H).unbind(2)  # each (B, L, H, Dh)
        backend = self.backend = self._pick_backend(x)
        if backend == "flash_attn":
            win = (-1, -1) if self.window is None else (self.window, 0)
            y = flash_attn_func(q, k, v, causal=True, window_size=win)  # (B, L, H, Dh)
        else:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, Dh)
            if backend == "math":
                y = attention_ref(q, k, v, self.window)
            elif self.window is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                mask = _causal_mask(L, self.window, x.device)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            y = y.transpose(1, 2)  # (B, L, H, Dh)
        return self.out(y.reshape(B, L, D))

    def state_size(self, seq_len: int) -> int:
        return 2 * self.d_model * seq_len  # the KV cache grows with L


class SlidingWindowAttention(Attention):
    """Causal attention over the last ``window`` tokens plus the current one. With
    window=16 it sees exactly what the Grassmann mixer with offsets up to 16 sees,
    so it separates "local" from "geometric" in every comparison."""

    name = "sliding_window"
    fast_path = "flash_attn window_size (CUDA, fp16/bf16); else masked SDPA"

    def __init__(self, d_model: int, n_heads: int = 4, window: int = 16, backend: str = "auto",
                 bias: bool = True):
        super().__init__(d_model, n_heads=n_heads, backend=backend, bias=bias)
        check_positive(self.name, window, "window")
        self.window = window

    def state_size(self, seq_len: int) -> int:
        return 2 * self.d_model * min(seq_len, self.window + 1)
