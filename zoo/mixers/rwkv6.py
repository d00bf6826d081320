"""RWKV-6 ("Finch") time mixing (Peng et al., 2024, "Eagle and Finch").

Per token: a data-dependent token shift (ddlerp) builds five interpolations between
x_t and x_{t-1}, one each for the decay w, key, value, receptance and gate; the
decay is data-dependent too (base + low-rank tanh LoRA, w = -exp(...) in log space);
a per-head matrix state is read by the receptance with a bonus u for the current
token (zoo.ops.rwkv6_scan); GroupNorm per head, SiLU gate, output projection.

It is fla's RWKV6Attention with expand_k = expand_v = 1, heads of ``head_size``
(default 32 here, 64 in RWKV-LM), proj_low_rank_dim = ``mix_rank``, gate_low_rank_dim =
``decay_rank`` and norm_eps 64e-5 (tests/test_peer_layers.py), initialised as RWKV-LM's
x060 code initialises a middle layer where fla's layer starts from zeros.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.activations import tanh
from ..ops.rwkv6 import ddlerp, recurrent_backend, rwkv6_backend, rwkv6_recurrent, rwkv6_scan
from .base import Mixer, check_chunk_size, check_positive, chunked_linear_attention_flops


class RWKV6(Mixer):
    name = "rwkv6"
    fast_path = "fla chunk_rwkv6 (CUDA); a fused C++ recurrence (CPU); else chunked torch scan (matmul scores)"

    def __init__(self, d_model: int, head_size: int = 32, mix_rank: int = 32,
                 decay_rank: int = 64, chunk_size: int | str = 32):
        super().__init__()
        for option, value in [("head_size", head_size), ("mix_rank", mix_rank),
                              ("decay_rank", decay_rank)]:
            check_positive(self.name, value, option)
        check_chunk_size(self.name, chunk_size)
        if d_model % head_size:
            raise ValueError(f"{self.name}: d_model={d_model} is not divisible by "
                             f"head_size={head_size}")
        D = d_model
        self.d_model, self.head_size, self.chunk_size = D, head_size, chunk_size
        self.n_heads = D // head_size

        # RWKV-6's inits depend on the layer's depth; we take those of a middle layer
        # (depth ratio 1/2) so that a mixer does not need to know its position.
        with torch.no_grad():
            frac = torch.arange(D) / D  # channel position in [0, 1)
            chan = torch.arange(D) / max(D - 1, 1)  # in [0, 1]
            # ddlerp: mix = maa + tanh(x' W1) W2, per target; rows are w, k, v, r, g.
            # Low-channel mixes lean on the previous token, high ones on the current.
            maa = 1 - torch.stack([frac ** 0.5, frac ** 0.5, frac ** 0.5 + 0.15,
                                   frac ** 0.25, frac ** 0.25])
            self.time_maa_x = nn.Parameter(1 - frac ** 0.5)  # (D,)
            self.time_maa = nn.Parameter(maa)  # (5, D)
            self.time_maa_w1 = nn.Parameter(torch.zeros(D, 5 * mix_rank))
            self.time_maa_w2 = nn.Parameter(torch.empty(5, mix_rank, D).uniform_(-0.01, 0.01))
            # log-log decay from -6 (slow, exp(-exp(-6)) ~ 0.998) to -1 (fast, ~0.69)
            self.time_decay = nn.Parameter(-6 + 5 * chan ** 1.35)  # (D,)
            self.time_decay_w1 = nn.Parameter(torch.zeros(D, decay_rank))
            self.time_decay_w2 = nn.Parameter(torch.empty(decay_rank, D).uniform_(-0.01, 0.01))
            zigzag = ((torch.arange(D) + 1) % 3 - 1) * 0.1
            bonus = 0.5 * (1 - chan) + zigzag
            self.time_faaaa = nn.Parameter(bonus.view(self.n_heads, head_size))  # u: (H, K)

        for name, p in self.named_parameters():  # RWKV decays only its Linear weights
            if name.startswith("time_"):
                p._no_weight_decay = True

        self.receptance = nn.Linear(D, D, bias=False)
        self.key = nn.Linear(D, D, bias=False)
        self.value = nn.Linear(D, D, bias=False)
        self.gate = nn.Linear(D, D, bias=False)
        # RWKV zero-initialises the output projection; we keep the default init so the
        # mixer is not the identity-zero map at step 0 (the residual backbone scales it).
        self.output = nn.Linear(D, D, bias=False)
        # eps of RWKV-6 (1e-5 * head_size_divisor^2 with divisor 8): the unscaled
        # receptance-key products make the per-head outputs large.
        self.ln_x = nn.GroupNorm(self.n_heads, D, eps=64e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._mix(x, None, None)[0]

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        """The per-head K x K matrix state and the previous token (for the shift)."""
        K = self.head_size
        return {"S": torch.zeros(batch, self.n_heads, K, K, device=device, dtype=dtype),
                "prev": torch.zeros(batch, 1, self.d_model, device=device, dtype=dtype)}

    def prefill(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        y, S = self._mix(x, state["S"], state["prev"])
        return y, {"S": S.to(state["S"].dtype), "prev": x[:, -1:]}

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token x (B, D) through the recurrence itself (fla's fused_recurrent_rwkv6 on
        CUDA), not the chunked form over a chunk of one."""
        y, S = self._mix(x[:, None], state["S"], state["prev"], recurrent=True)
        return y[:, 0], {"S": S.to(state["S"].dtype), "prev": x[:, None]}

    def _mix(self, x: torch.Tensor, S0, prev, recurrent: bool = False):
        """The update for x (B, L, D) after a context with matrix state S0 and last token
        prev (B, 1, D) (None, None: no context), and the matrix state after x;
        ``recurrent``: token by token (a decode step)."""
        B, L, D = x.shape
        H, K = self.n_heads, self.head_size
        before = F.pad(x, (0, 0, 1, -1)) if prev is None else torch.cat([prev, x[:, :-1]], 1)
        xw, xk, xv, xr, xg = self._shift(x, before - x)  # before - x: x_{t-1} - x_t

        r, k, v = self.receptance(xr), self.key(xk), self.value(xv)
        g = F.silu(self.gate(xg))
        w = self.time_decay + tanh(xw @ self.time_decay_w1) @ self.time_decay_w2
        w = -torch.exp(w.to(torch.promote_types(w.dtype, torch.float32)))  # log decay <= 0, at least fp32: it is summed over time

        def heads(t):  # (B, L, D) -> (B, L, H, K)
            return t.view(B, L, H, K)

        self.backend = (recurrent_backend if recurrent else rwkv6_backend)(x)
        # RWKV does not scale the receptance (scale=1): GroupNorm takes care of the size.
        args = (heads(r), heads(k), heads(v), heads(w), self.time_faaaa)
        if recurrent:
            y, S = rwkv6_recurrent(*args, scale=1.0, initial_state=S0, output_final_state=True)
        else:
            y, S = self.chunked(rwkv6_scan, *args, scale=1.0, initial_state=S0,
                                output_final_state=S0 is not None, length=L)  # (B, L, H, K)
        y = self.ln_x(y.reshape(B * L, D)).view(B, L, D)
        return self.output(y * g), S

    def _shift(self, x: torch.Tensor, dx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The five ddlerp interpolations x + dx * (maa_f + tanh(xx W1)_f W2_f) of x and
        dx (B, L, D), one (B, L, D) tensor per target f: fused multiply-adds per target
        rather than one (5, B, L, D) stack, whose 40 MB temporaries cost a pass each way
        and a fresh page-in of the heap as it grows."""
        B, L, D = x.shape
        xx = torch.addcmul(x, dx, self.time_maa_x)
        lora = tanh(xx.view(B * L, D) @ self.time_maa_w1).view(B * L, 5, -1)  # (B*L, 5, R)
        if L == 1:  # a decode step: the five (B, D) mixes in one batched product, one call for five
            mixes = torch.baddbmm(self.time_maa[:, None], lora.transpose(0, 1), self.time_maa_w2).view(5, B, L, D)
            return ddlerp(x, dx, mixes.unbind(0))
        mixes = [torch.addmm(maa, h, w2).view(B, L, D)  # maa + h W2 in one matmul
                 for maa, h, w2 in zip(self.time_maa.unbind(0), lora.unbind(1), self.time_maa_w2.unbind(0))]
        return ddlerp(x, dx, mixes)

    def core_flops(self, B: int, L: int) -> float:
        # The low-rank ddlerp and decay matrices (plain Parameters, not nn.Linear: counted
        # here, 2 per weight per token), plus the chunked recurrence with K = V = head_size.
        lora = sum(getattr(self, n).numel() for n in ("time_maa_w1", "time_maa_w2",
                                                      "time_decay_w1", "time_decay_w2"))
        K = self.head_size
        return 2 * B * L * lora + chunked_linear_attention_flops(B, L, self.n_heads, K, K,
                                                                 self.flops_chunk_size())

    def state_size(self, seq_len: int) -> int:
        # per-head K x V matrix state + the previous token for the shift
        return self.n_heads * self.head_size ** 2 + self.d_model
