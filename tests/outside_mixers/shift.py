"""A mixer defined outside zoo/ and never registered there: sweeps name it by its import
path, ``"outside_mixers.shift:ShiftMix"``."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import zoo


class ShiftMix(zoo.Mixer):
    """y_t = W_o (a * h_t + b * h_{t-shift}), h = W_i x: each channel mixes the current
    token with the one ``shift`` places back. Causal by construction (left padding)."""

    name = "shift_mix"

    def __init__(self, d_model: int, shift: int = 1):
        super().__init__()
        self.shift = shift
        self.inp = nn.Linear(d_model, d_model)
        self.a = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.full((d_model,), 0.5))
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        L = x.shape[1]
        h = self.inp(x)  # (B, L, D)
        past = F.pad(h, (0, 0, self.shift, 0))[:, :L]  # (B, L, D): h_{t-shift}, zeros before the start
        self.backend = "torch"
        return self.out(self.a * h + self.b * past)

    def state_size(self, seq_len: int) -> int:
        return self.shift * self.d_model  # the last `shift` projected tokens
