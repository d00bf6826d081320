"""The seeded epoch order every task draws its batches in."""
from __future__ import annotations

import functools

import numpy as np
import torch


def epoch_indices(n: int, batch_size: int, seed: int):
    """``indices(step)``: the example indices of batch ``step`` in an endless run of
    epochs over ``n`` examples, each epoch a fresh permutation seeded by (seed, epoch).
    A pure function of the step: the training loop resumes exactly on it."""

    @functools.lru_cache(maxsize=2)
    def order(epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0]))
        return torch.randperm(n, generator=g)

    def indices(step: int) -> torch.Tensor:
        flat = torch.arange(step * batch_size, (step + 1) * batch_size)
        epochs, out = flat // n, torch.empty(batch_size, dtype=torch.long)
        for e in epochs.unique().tolist():  # a batch may straddle two epochs
            sel = epochs == e
            out[sel] = order(e)[flat[sel] % n]
        return out
    return indices
