"""FLOP estimates for tasks.scaling's FLOP/s column. Conventions of FlashAttention's
benchmarks: a multiply-add is 2 FLOPs; elementwise work (norms, activations, gates) is
not counted; causal attention does half the L^2 work; backward = 2x forward for
matmuls, 2.5x for the attention core (FlashAttention recomputes the scores). Each mixer
family has a function for its sequence-mixing core; its projections are counted from
its nn.Linear / Conv1d weights. A family without a function gets no estimate (None),
not a wrong one.
"""
from __future__ import annotations

import torch.nn as nn

import zoo


def _core_attention(m, B: int, L: int) -> float:
    pairs = L * L / 2 if m.window is None else L * min(L / 2, m.window + 1)  # (query, key) pairs
    return 4 * B * pairs * m.d_model  # q.k and p.v: 2 FLOPs per pair per channel each


def _core_mamba(m, B: int, L: int) -> float:
    # per (token, channel, state): exp(dt*A) 1, dt*B*x 2, h = dA*h + dBx 2, y += C*h 2
    return 7 * B * L * m.d_inner * m.d_state


def _chunked_linear_attention(B, L, heads, K, V, chunk, score_groups=None) -> float:
    """Chunked linear attention (SSD, RWKV-6, retention): per token, scores against
    chunk/2 earlier tokens of its chunk (K each, shared by ``score_groups`` if fewer
    than the heads) and their values (V), plus reading and updating the K x V state."""
    groups = heads if score_groups is None else score_groups
    return B * L * (groups * chunk * K + heads * (chunk * V + 4 * K * V))


def _core_mamba2(m, B, L):
    return _chunked_linear_attention(B, L, m.nheads, m.d_state, m.headdim, m.chunk_size, m.ngroups)


def _core_rwkv6(m, B, L):
    lora = sum(getattr(m, n).numel() for n in ("time_maa_w1", "time_maa_w2", "time_decay_w1",
                                               "time_decay_w2"))
    K = m.head_size
    return 2 * B * L * lora + _chunked_linear_attention(B, L, m.n_heads, K, K, m.chunk_size)


def _core_retnet(m, B, L):
    K = m.d_model // m.n_heads
    return _chunked_linear_attention(B, L, m.n_heads, K, m.expand_v * K, m.chunk_size)


def _core_gla(m, B, L):
    # The RWKV-6 chunk core (its low-rank gate is nn.Linear, counted with the dense
    # weights), plus the current token's score q.k and value term that zoo.ops.gla adds
    # beside the core (2K + 2V per token and head).
    K, V = m.head_k_dim, m.head_v_dim
    return (_chunked_linear_attention(B, L, m.n_heads, K, V, m.chunk_size)
            + 2 * B * L * m.n_heads * (K + V))


def _core_gated_deltanet(m, B, L):
    # The chunked linear-attention work (scores, values, reading and updating the K x V
    # state), plus what the delta rule adds per token: the keys' gram matrix in its chunk
    # (chunk K), the triangular solve applied to [values | keys] (chunk (V + K)), and the
    # state's prediction W S0 that corrects the values (2 K V).
    K, V, C = m.head_dim, m.head_v_dim, m.chunk_size
    return (_chunked_linear_attention(B, L, m.n_heads, K, V, C)
            + B * L * m.n_heads * (C * K + C * (V + K) + 2 * K * V))


def _core_grassmann(m, B, L):
    # The formula as the paper states it (the eager path), whatever ``impl`` ran: the
    # factored / compiled / fused paths do less work for the same function, so their
    # FLOP/s column is eager-equivalent throughput, not the arithmetic they performed.
    P = m.r * (m.r - 1) // 2  # Plücker coordinates per pair
    # per offset: wedge 3P (2 mul + 1 sub), normalise 3P (square-sum + divide), sum P
    return B * L * len(m.offsets) * P * (7 if m.normalize else 4)


CORE_FLOPS = {  # mixer name -> (forward FLOPs of the core, backward / forward ratio)
    "attention": (_core_attention, 2.5), "sliding_window": (_core_attention, 2.5),
    "mamba": (_core_mamba, 2.0), "mamba2": (_core_mamba2, 2.0), "rwkv6": (_core_rwkv6, 2.0),
    "retnet": (_core_retnet, 2.0), "grassmann": (_core_grassmann, 2.0),
    "gla": (_core_gla, 2.0),
    "gated_deltanet": (_core_gated_deltanet, 2.0),
}


def flops(module: nn.Module, B: int, L: int) -> dict[str, float] | None:
    """{"fwd": ..., "fwd_bwd": ...} for a mixer or an LM on a (B, L) batch."""
    dense = 2 * B * L * sum(m.weight.numel() for m in module.modules()
                            if isinstance(m, (nn.Linear, nn.Conv1d)))
    fwd, fwd_bwd = dense, 3 * dense
    for m in module.modules():
        if isinstance(m, zoo.Mixer):
            if m.name not in CORE_FLOPS:
                return None
            core_fn, bwd_ratio = CORE_FLOPS[m.name]
            core = core_fn(m, B, L)
            fwd, fwd_bwd = fwd + core, fwd_bwd + core * (1 + bwd_ratio)
    return {"fwd": float(fwd), "fwd_bwd": float(fwd_bwd)}
