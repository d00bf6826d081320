"""Causal multi-head attention and its local (sliding-window) control."""
from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import fastpath
from ..ops.attention import attention_ref, local_attention
from ..ops.fastpath import HALF, Kernel
from .base import Mixer, check_choice, check_divisible, check_positive

# flash_attn_func(q, k, v, causal=True, window_size=(left, right)) on (B, L, H, Dh) fp16/bf16;
# window_size arrived in 2.3.0.
FLASH_ATTN = Kernel("flash_attn", "flash_attn_func", "flash-attn", "2.3.0",
                    "the window_size argument", dtypes=HALF)

# flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=, causal=): writes k, v
# into the caches (B, capacity, H, Dh) at cache_seqlens, in place, then attends q to the
# filled part; the decode path of full attention. cache_seqlens as a tensor since 2.2.
FLASH_KVCACHE = Kernel("flash_attn", "flash_attn_with_kvcache", "flash-attn", "2.3.0",
                       "the floor of the package in pyproject's cuda extra", dtypes=HALF)

BACKENDS = ("auto", "flash_attn", "sdpa", "math")


def rotary(x: torch.Tensor, dims: int, base: float = 10_000.0, start: int = 0) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) on the first ``dims`` channels of each
    head, rotated as two halves (GPT-NeoX's layout): channel i pairs with i + dims/2 and
    turns by angle t * base^(-2i/dims) at position t. q.k of rotated vectors depends on
    the positions only through their offset, which is what lets one head find "the token
    after the last occurrence of mine" at any distance. x: (B, L, H, Dh) -> same."""
    if dims == 0:
        return x
    L, half = x.shape[1], dims // 2
    freq = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)  # (dims/2,)
    angle = torch.arange(start, start + L, device=x.device, dtype=torch.float32)[:, None] * freq  # (L, dims/2)
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]  # (L, 1, dims/2): broadcast over heads
    a, b, rest = x[..., :half].float(), x[..., half:dims].float(), x[..., dims:]
    turned = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)
    return torch.cat([turned, rest], dim=-1)


class Attention(Mixer):
    """Causal multi-head self-attention: qkv projection, softmax attention, output
    projection. 4 (d^2 + d) parameters, as in the paper's TransformerLM. ``rotary``:
    how many channels of each head take rotary positions (0: none, the paper's model,
    which adds learned positions instead; MAD's attention rotates its whole head)."""

    name = "attention"
    fast_path = "flash_attn (CUDA, fp16/bf16); else torch SDPA"
    needs_positions = True  # order-blind without positions, apart from the causal mask
    bwd_ratio = 2.5  # FlashAttention's convention: its backward recomputes the scores

    def __init__(self, d_model: int, n_heads: int = 4, backend: str = "auto", bias: bool = True,
                 rotary: int = 0):
        super().__init__()
        check_divisible(self.name, d_model, n_heads)
        check_choice(self.name, "backend", backend, BACKENDS)
        head_dim = d_model // n_heads
        if not (isinstance(rotary, int) and 0 <= rotary <= head_dim and rotary % 2 == 0):
            raise ValueError(f"{self.name}: rotary={rotary!r} must be an even number of channels "
                             f"from 0 to the head dim {head_dim}")
        self.rotary = rotary
        if backend == "flash_attn" and FLASH_ATTN.fn is None:
            raise ValueError(f"{self.name}: backend='flash_attn' cannot run: {FLASH_ATTN.why_not}")
        self.d_model, self.n_heads, self.requested_backend = d_model, n_heads, backend
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    window: int | None = None  # None: full causal attention

    def choose_backend(self, device_type: str, dtype: torch.dtype, device=None) -> str:
        """The path a forward takes for q/k/v of this device type and dtype: the dtype
        the kernel sees, i.e. after the projection (bf16 under autocast even though the
        block hands the mixer fp32). ``device``: the tensor's device; on CUDA
        flash-attn 2 needs compute capability >= 8.0 (Ampere)."""
        head_dim = self.d_model // self.n_heads
        flash = (FLASH_ATTN.allows(device_type, dtype) and head_dim <= 256
                 and (device is None or device.type != "cuda"
                      or torch.cuda.get_device_capability(device) >= (8, 0)))
        if self.requested_backend == "flash_attn" and fastpath.enabled():
            if not flash:
                raise ValueError(f"{self.name}: backend='flash_attn' needs CUDA (sm80+) fp16/bf16 "
                                 f"inputs and a head dim <= 256, got {device_type} {dtype}, "
                                 f"head dim {head_dim}")
            return "flash_attn"
        if self.requested_backend == "auto" and flash:
            return "flash_attn"
        if self.requested_backend == "math":
            return "math"
        return "sdpa" if self.window is None else "sdpa_local"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        H = self.n_heads
        q, k, v = self.qkv(x).view(B, L, 3, H, D // H).unbind(2)  # each (B, L, H, Dh)
        q, k = rotary(q, self.rotary), rotary(k, self.rotary)  # every backend sees the rotated q, k
        backend = self.backend = self.choose_backend(q.device.type, q.dtype, q.device)
        if backend == "flash_attn":
            # documented: (B, L, H, Dh), causal, window_size=(left, right) keys around t
            win = (-1, -1) if self.window is None else (self.window, 0)
            y = FLASH_ATTN(q, k, v, causal=True, window_size=win)  # (B, L, H, Dh)
        else:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, Dh)
            if backend == "math":
                y = attention_ref(q, k, v, self.window)
            elif backend == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                y = local_attention(q, k, v, self.window)
            y = y.transpose(1, 2)  # (B, L, H, Dh)
        return self.out(y.reshape(B, L, D))

    # The KV cache grows by whole blocks of CACHE_BLOCK positions and a step writes its key
    # and value into the room left, in place: appending by torch.cat would copy the whole
    # cache at every token, tripling a step's memory traffic at long contexts. States that
    # share a buffer share its "filled" count ([positions written]), so a second step from
    # one state (beam search, speculative decoding) sees the first one's writes past its
    # own ``seen`` and copies the buffer before writing: branches never corrupt each other.
    CACHE_BLOCK = 64

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        """The KV cache, (B, H, capacity, Dh) each, its first ``seen`` positions filled
        (capacity 0 here); the window keeps its last ``window`` keys and values instead."""
        H = self.n_heads
        empty = torch.zeros(batch, H, 0, self.d_model // H, device=device, dtype=dtype)
        state = {"k": empty, "v": empty.clone(), "seen": 0}
        return state if self.window is not None else {**state, "filled": [0]}

    def prefill(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """x's queries attend to the cache and to x itself, causally (and within the
        window). The cache is written in place unless another state has written past this
        one's end of it (then it is copied first)."""
        B, L, D = x.shape
        H, T0 = self.n_heads, state["seen"]
        q, k, v = self.qkv(x).view(B, L, 3, H, D // H).unbind(2)  # each (B, L, H, Dh)
        q, k = rotary(q, self.rotary, start=T0), rotary(k, self.rotary, start=T0)
        if self.window is None:
            k_cache, v_cache, filled = self._writable(state, T0 + L)
            filled[0] = T0 + L
        if self.window is None and self._kvcache_ok(q):
            # the kernel writes k and v into the room the cache has and attends to it; it
            # reads the cache through its strides, so our (B, H, capacity, Dh) cache is its
            # (B, capacity, H, Dh) as a transposed view
            seqlens = torch.full((B,), T0, dtype=torch.int32, device=x.device)
            y = FLASH_KVCACHE(q, k_cache.transpose(1, 2), v_cache.transpose(1, 2), k=k, v=v,
                              cache_seqlens=seqlens, causal=True)  # (B, L, H, Dh)
            self.backend = "flash_attn_kvcache"
            return self.out(y.reshape(B, L, D)), {"k": k_cache, "v": v_cache, "seen": T0 + L, "filled": filled}
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, Dh)
        if self.window is None:
            k_cache[:, :, T0:T0 + L], v_cache[:, :, T0:T0 + L] = k, v
            keys, values = k_cache[:, :, :T0 + L], v_cache[:, :, :T0 + L]  # (B, H, T0 + L, Dh)
        else:
            keys, values = torch.cat([state["k"], k], 2), torch.cat([state["v"], v], 2)  # (B, H, T + L, Dh)
            k_cache, v_cache = keys[:, :, -self.window:], values[:, :, -self.window:]
        if self.window is None and (L == 1 or T0 == 0):
            # one query sees every cached key; a prompt from an empty cache is the plain
            # causal case (SDPA's fused kernel, no L x L mask in memory)
            y = F.scaled_dot_product_attention(q, keys, values, is_causal=L > 1)  # (B, H, L, Dh)
        else:
            first = T0 + L - keys.shape[2]  # absolute position of the first key
            t = torch.arange(T0, T0 + L, device=x.device)[:, None]  # (L, 1) query positions
            s = torch.arange(first, T0 + L, device=x.device)[None, :]  # (1, keys) key positions
            mask = (s <= t) if self.window is None else (s <= t) & (s >= t - self.window)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (B, H, L, Dh)
        self.backend = "sdpa"
        state = {"k": k_cache, "v": v_cache, "seen": T0 + L}
        return self.out(y.transpose(1, 2).reshape(B, L, D)), state if self.window is not None else {**state, "filled": filled}

    def _writable(self, state: dict, need: int):
        """The cache buffers to write positions seen .. need - 1 into, and their filled count:
        the state's own, unless a branch already wrote past ``seen`` (then copies)."""
        k, v, filled = state["k"], state["v"], state["filled"]
        if filled[0] > state["seen"]:
            k, v, filled = k.clone(), v.clone(), [state["seen"]]
        grown_k, grown_v = _reserve(k, need, self.CACHE_BLOCK), _reserve(v, need, self.CACHE_BLOCK)
        if grown_k is not k:
            filled = [state["seen"]]  # a new buffer: no other state shares it
        return grown_k, grown_v, filled

    def _kvcache_ok(self, q: torch.Tensor) -> bool:
        """Whether the decode takes flash_attn_with_kvcache for q (B, L, H, Dh): as the
        training path takes flash_attn (CUDA sm80+, fp16/bf16, head dim <= 256)."""
        return self.choose_backend(q.device.type, q.dtype, q.device) == "flash_attn" and FLASH_KVCACHE.usable(q)

    def core_flops(self, B: int, L: int) -> float:
        # FlashAttention's benchmark formula: q.k and p.v, causal attention doing half the
        # L^2 work. A formula, not FlopCounterMode: that counts SDPA unmasked on meta
        # tensors, not at all on CPU (no formula for its CPU kernel), and the local path's
        # (T, 2T) blocks rather than the window + 1 keys each query needs.
        pairs = L * L / 2 if self.window is None else L * min(L / 2, self.window + 1)  # (query, key) pairs
        return 4 * B * pairs * self.d_model  # q.k and p.v: 2 FLOPs per pair per channel each

    def state_size(self, seq_len: int) -> int:
        # the KV cache grows with L, by whole blocks (none of the zoo's lengths is off a block)
        return 2 * self.d_model * -(-seq_len // self.CACHE_BLOCK) * self.CACHE_BLOCK


class SlidingWindowAttention(Attention):
    """Causal attention over the last ``window`` tokens plus the current one. With
    window=16 it sees exactly what the Grassmann mixer with offsets up to 16 sees,
    so it separates "local" from "geometric" in every comparison."""

    name = "sliding_window"
    fast_path = "flash_attn window_size (CUDA, fp16/bf16); else SDPA over blocks (linear in L)"

    def __init__(self, d_model: int, n_heads: int = 4, window: int = 16, backend: str = "auto",
                 bias: bool = True, rotary: int = 0):
        super().__init__(d_model, n_heads=n_heads, backend=backend, bias=bias, rotary=rotary)
        check_positive(self.name, window, "window")
        self.window = window

    def state_size(self, seq_len: int) -> int:
        # the last `window` keys and values: with the current token's, what a query sees
        return 2 * self.d_model * min(seq_len, self.window)


def _reserve(cache: torch.Tensor, need: int, block: int) -> torch.Tensor:
    """cache (B, H, capacity, Dh) with room for ``need`` positions: itself when it has it,
    else a zeroed cache of the next whole number of blocks holding its filled positions."""
    if cache.shape[2] >= need:
        return cache
    grown = cache.new_zeros(*cache.shape[:2], -(-need // block) * block, cache.shape[3])
    grown[:, :, :cache.shape[2]] = cache
    return grown
