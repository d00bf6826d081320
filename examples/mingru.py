"""minGRU (Feng et al. 2024, "Were RNNs All We Needed?", arXiv 2410.01201) as a mixer
outside the zoo, named ``examples.mingru:MinGRU``.

A GRU with its gates read from the input alone, so that the recurrence is linear in h and
trains in parallel:

    z_t = sigmoid(W_z x_t),  h~_t = g(W_h x_t),  h_t = (1 - z_t) * h_{t-1} + z_t * h~_t,
    y_t = W_o h_t,

g(u) = u + 1/2 for u >= 0, sigmoid(u) below: positive, so the scan runs in log space
(the paper's choice) and neither vanishes nor overflows over long sequences. The state is
one vector of ``expand * d_model`` floats, whatever the context."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import zoo


def g(u: torch.Tensor) -> torch.Tensor:
    return torch.where(u >= 0, u + 0.5, torch.sigmoid(u))


def log_g(u: torch.Tensor) -> torch.Tensor:
    # log(u + 1/2) on the positive side, log sigmoid(u) = -softplus(-u) below; the relu keeps
    # the branch not taken finite, so its gradient is not NaN
    return torch.where(u >= 0, torch.log(F.relu(u) + 0.5), -F.softplus(-u))


def scan(k: torch.Tensor, u: torch.Tensor, h0: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """h_t = (1 - z_t) h_{t-1} + z_t g(u_t), z = sigmoid(k), for every t in parallel.

    k, u: (B, L, H) gate and candidate pre-activations; h0: (B, H). With a_t = log(1 - z_t)
    and A_t = a_1 + ... + a_t, h_t = exp(A_t) h0 + sum_{s<=t} exp(A_t - A_s) z_s g(u_s): the
    sum of positive terms is one logcumsumexp. Chunks of ``chunk`` tokens, each starting from
    the last one's h, keep |A| small enough for float32 to resolve A_t - A_s."""
    out = []
    for k_c, u_c in zip(k.split(chunk, dim=1), u.split(chunk, dim=1)):
        log_a = -F.softplus(k_c)  # (B, C, H): log(1 - z)
        log_b = -F.softplus(-k_c) + log_g(u_c)  # (B, C, H): log(z * g(u))
        A = torch.cumsum(log_a, dim=1)
        out.append(torch.exp(A) * h0.unsqueeze(1) + torch.exp(A + torch.logcumsumexp(log_b - A, dim=1)))
        h0 = out[-1][:, -1]
    return torch.cat(out, 1)


def scan_ref(k: torch.Tensor, u: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """``scan`` one token at a time, as the step form runs it."""
    z, cand, h, out = torch.sigmoid(k), g(u), h0, []
    for t in range(k.shape[1]):
        h = (1 - z[:, t]) * h + z[:, t] * cand[:, t]
        out.append(h)
    return torch.stack(out, 1) if out else k.new_zeros(k.shape)


class MinGRU(zoo.Mixer):
    """minGRU over ``expand * d_model`` channels, projected back to d_model."""

    name = "mingru"

    def __init__(self, d_model: int, expand: int = 1):
        super().__init__()
        self.hidden = expand * d_model
        self.gate_and_candidate = nn.Linear(d_model, 2 * self.hidden, bias=False)
        self.out = nn.Linear(self.hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, D) -> (B, L, D), the update only
        y, _ = self.prefill(x, self.init_state(x.shape[0], x.device, x.dtype))
        return y

    def state_size(self, seq_len: int) -> int:
        return self.hidden

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        return {"h": torch.zeros(batch, self.hidden, device=device, dtype=dtype)}

    def prefill(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        k, u = self.gate_and_candidate(x).chunk(2, dim=-1)  # (B, L, H) each
        self.backend = "torch"
        if x.shape[1] == 0:
            return self.out(u), state
        # the log-space scan in float32 at least: under bf16 autocast its cumulative sums
        # would lose the small gates' contributions
        dtype = torch.promote_types(k.dtype, torch.float32)
        h = scan(k.to(dtype), u.to(dtype), state["h"].to(dtype))  # (B, L, H)
        return self.out(h.to(x.dtype)), {"h": h[:, -1].to(state["h"].dtype)}

    def step(self, x_t: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        k, u = self.gate_and_candidate(x_t).chunk(2, dim=-1)  # (B, H) each
        z = torch.sigmoid(k)
        h = (1 - z) * state["h"] + z * g(u)
        self.backend = "torch"
        return self.out(h), {"h": h}

    def core_flops(self, B: int, L: int) -> float:
        # the recurrence's multiply-add and the gate's blend per channel and token; the
        # log-space terms are elementwise, free by zoo.flops' convention
        return 4.0 * B * L * self.hidden
