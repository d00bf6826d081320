"""Mixers that each break one invariant, for ``linbench vet``'s early stop: a card must
name the check that failed and train nothing."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import zoo


class Peek(zoo.Mixer):
    """Reads the next token: y_t = W x_{t+1} (the Grassmann paper's literal pairing)."""

    name = "peek"

    def __init__(self, d_model: int):
        super().__init__()
        self.lin = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(F.pad(x, (0, 0, 0, 1))[:, 1:])  # (B, L, D): x_{t+1}, zero past the end

    def state_size(self, seq_len: int) -> int:
        return 0


class NanGrad(zoo.Mixer):
    """Causal, but its update is NaN once trained on: sqrt of a negative number."""

    name = "nan_grad"

    def __init__(self, d_model: int):
        super().__init__()
        self.lin = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * torch.sqrt(torch.tensor(-1.0))

    def state_size(self, seq_len: int) -> int:
        return 0


class WrongStep(zoo.Mixer):
    """A running sum whose step form forgets the state: prefill is right, step is not."""

    name = "wrong_step"

    def __init__(self, d_model: int):
        super().__init__()
        self.lin = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.cumsum(1))

    def state_size(self, seq_len: int) -> int:
        return self.d_model

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        return {"s": torch.zeros(batch, self.d_model, device=device, dtype=dtype)}

    def prefill(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        s = state["s"][:, None] + x.cumsum(1)  # (B, L, D)
        return self.lin(s), {"s": s[:, -1] if x.shape[1] else state["s"]}

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        return self.lin(x), {"s": state["s"] + x}  # the defect: y ignores the state
