"""Where the answer to each scored MAD target lies, as offsets back from the position
that must produce it: what a mixer has to see to score at all. A model whose receptive
field (``zoo.causality.receptive_offsets``) holds none of a target's offsets cannot
answer it except by guessing, so the share of targets with one inside, plus a guess's
share of the rest (``guess_accuracy``), is a ceiling on a local mixer's accuracy
(``results.paper.findings.mad_reach``). Layouts: tasks/mad/data.py.

``answer_offsets(task, inputs, targets)`` -> bool (n_scored, L): entry [i, s] is True
when the token s positions before target i's reader carries its answer. The reader is
the scored position itself, except in compression, where the model decodes every
position from the last one. Fuzzy recall (multi-token keys, any of whose tokens may
be seen) has no single answer position: None.
"""
from __future__ import annotations

import numpy as np
import torch

from .data import IGNORE


def _recall(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """At a scored key K (target: its value v), every earlier pair K v: the value token
    at p + 1 is the answer, s = t - (p + 1) back."""
    rows, t = np.nonzero(y != IGNORE)
    L = x.shape[1]
    p = np.arange(L - 1)
    pair = (x[rows, :-1] == x[rows, t][:, None]) & (x[rows, 1:] == y[rows, t][:, None]) & (p + 1 < t[:, None])
    out = np.zeros((len(rows), L), bool)
    r, q = np.nonzero(pair)  # q: the key's position p
    out[r, t[r] - (q + 1)] = True
    return out


def _selective_copying(x: np.ndarray, y: np.ndarray, vocab_size: int) -> np.ndarray:
    """The j-th output blank after the copy token shows the j-th data token (the tokens
    below the blank, vocab_size - 2, before the copy token)."""
    rows, t = np.nonzero(y != IGNORE)
    n, L = x.shape
    k = int((y[0] != IGNORE).sum())
    data = np.nonzero(x < vocab_size - 2)[1].reshape(n, k)  # (n, k): data positions, in order
    src = data[rows, t - (L - k)]
    out = np.zeros((len(rows), L), bool)
    out[np.arange(len(rows)), t - src] = True
    return out


def _compression(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Every position is decoded from the last one's state: position i is L - 1 - i back."""
    rows, t = np.nonzero(y != IGNORE)
    L = x.shape[1]
    out = np.zeros((len(rows), L), bool)
    out[np.arange(len(rows)), L - 1 - t] = True
    return out


def _memorization(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The value at an insert token is the stored fact of the key just before it."""
    rows, _ = np.nonzero(y != IGNORE)
    out = np.zeros((len(rows), x.shape[1]), bool)
    out[:, 1] = True
    return out


def answer_offsets(task: str, inputs: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> np.ndarray | None:
    x, y = inputs.numpy(), targets.numpy()
    if task in ("in-context-recall", "noisy-in-context-recall"):
        return _recall(x, y)
    if task == "selective-copying":
        return _selective_copying(x, y, vocab_size)
    if task == "compression":
        return _compression(x, y)
    if task == "memorization":
        return _memorization(x, y)
    if task == "fuzzy-in-context-recall":
        return None
    raise ValueError(f"answer_offsets: unknown task {task!r}")


def guess_accuracy(task: str, setting: dict) -> float | None:
    """The accuracy of the best guess at a target whose answer lies outside the receptive
    field: every answer is drawn uniformly from its alphabet, independently of the tokens a
    model sees without it (a recall key's value is its own draw; copied, compressed and
    memorised tokens are independent draws), so no guess beats 1 / alphabet size. None for
    fuzzy recall (no single answer position, hence no ceiling)."""
    V, noise = setting["vocab_size"], setting.get("noise_vocab_size", 0)
    if task in ("in-context-recall", "noisy-in-context-recall"):
        ns = V - noise - (0 if setting.get("multi_query", True) else 1)  # keys [0, ns // 2), values the rest
        return 1 / (ns - ns // 2)
    if task == "selective-copying":
        return 1 / (V - 2)  # data tokens: all but blank and copy
    if task == "compression":
        return 1 / (V - 1 - noise)  # (the last target, the compression token, is always seen)
    if task == "memorization":
        return 1 / ((V - 1) // 2)  # the dictionary's values, one per key
    if task == "fuzzy-in-context-recall":
        return None
    raise ValueError(f"guess_accuracy: unknown task {task!r}")
