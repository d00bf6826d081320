"""The MQAR generator: Zoology's multi-query associative recall sequences (layout and
sampling law in tasks/mqar/task.py's docstring), drawn with vectorised numpy. Pure data: no
model, config or cache (tasks.mqar caches each split under a hash of its key, which
includes GENERATOR_VERSION)."""
from __future__ import annotations

import numpy as np
import torch

GENERATOR_VERSION = 1  # part of the cache key: bump when the generated data changes
SPLITS = {"train": 0, "test": 1, "valid": 2}  # spawn keys: the three streams never overlap


def check_mqar(seq_len: int, num_kv_pairs: int, vocab_size: int) -> None:
    if seq_len <= 0 or seq_len % 2:
        raise ValueError(f"mqar: seq_len={seq_len} must be positive and even (key/query slots are even)")
    if vocab_size <= seq_len:
        raise ValueError(f"mqar: vocab_size={vocab_size} must be larger than seq_len={seq_len}")
    if num_kv_pairs <= 0:
        raise ValueError(f"mqar: num_kv_pairs={num_kv_pairs} must be > 0")
    if 4 * num_kv_pairs > seq_len:
        raise ValueError(f"mqar: num_kv_pairs={num_kv_pairs} needs 4 * num_kv_pairs <= seq_len={seq_len} "
                         f"(2 * kv slots for the pairs, kv even slots for the queries)")


def _distinct(rng: np.random.Generator, n: int, low: int, high: int, k: int) -> np.ndarray:
    """(n, k) integers from [low, high), distinct within each row, uniform over ordered
    k-tuples (what ``choice(replace=False)`` gives row by row)."""
    m = high - low
    if 4 * k <= m:  # sparse: i.i.d. draws, redrawing rows with a repeat, is uniform and fast
        out = rng.integers(low, high, size=(n, k))
        while True:
            s = np.sort(out, axis=1)
            bad = np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1))
            if not len(bad):
                return out
            out[bad] = rng.integers(low, high, size=(len(bad), k))
    out = np.empty((n, k), dtype=np.int64)  # dense: a random ranking of all m candidates
    rows = max(1, 2 ** 22 // m)  # bounds the (rows, m) scratch array
    for s in range(0, n, rows):
        u = rng.random((min(rows, n - s), m))
        pick = np.argpartition(u, k - 1, axis=1)[:, :k]  # the k smallest: a uniform k-subset
        order = np.argsort(np.take_along_axis(u, pick, 1), axis=1)  # ... in a uniform order
        out[s:s + len(u)] = low + np.take_along_axis(pick, order, 1)
    return out


def _power_law_slots(rng: np.random.Generator, n: int, space: int, k: int, power_a: float) -> np.ndarray:
    """(n, k) distinct slot indices in [0, space), drawn one after another with
    P(slot g) ~ (g + 1)^(power_a - 1) among the slots not yet drawn (numpy's
    ``choice(replace=False, p=...)``, as Zoology uses). The Gumbel top-k trick gives
    exactly that sequential law in one vectorised sort."""
    logp = (power_a - 1) * np.log(np.arange(1, space + 1))
    out = np.empty((n, k), dtype=np.int64)
    rows = max(1, 2 ** 22 // space)
    for s in range(0, n, rows):
        g = logp + rng.gumbel(size=(min(rows, n - s), space))
        out[s:s + len(g)] = np.argsort(-g, axis=1)[:, :k]
    return out


def mqar_examples(num_examples: int, seq_len: int, num_kv_pairs: int, vocab_size: int, seed: int,
                  split: str = "train", power_a: float = 0.01, random_non_queries: bool = True):
    """``(inputs, labels)``, each (num_examples, seq_len) int64. ``labels[i, t]`` is
    the value that must be predicted at query position t, -100 elsewhere."""
    check_mqar(seq_len, num_kv_pairs, vocab_size)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(SPLITS[split],)))
    n, L, kv, V = num_examples, seq_len, num_kv_pairs, vocab_size
    keys = _distinct(rng, n, 1, V // 2, kv)  # (n, kv)
    values = _distinct(rng, n, V // 2, V, kv)  # (n, kv)
    if random_non_queries:
        inputs = rng.integers(0, V, size=(n, L), dtype=np.int64)
    else:
        inputs = np.zeros((n, L), dtype=np.int64)
    inputs[:, 0:2 * kv:2], inputs[:, 1:2 * kv:2] = keys, values
    # key j is queried at slot gap_j of the even positions after the pairs
    query_pos = 2 * kv + 2 * _power_law_slots(rng, n, (L - 2 * kv) // 2, kv, power_a)  # (n, kv)
    np.put_along_axis(inputs, query_pos, keys, axis=1)
    labels = np.full((n, L), -100, dtype=np.int64)
    np.put_along_axis(labels, query_pos, values, axis=1)
    return torch.from_numpy(inputs), torch.from_numpy(labels)


def key_distances(inputs: torch.Tensor, labels: torch.Tensor, num_kv_pairs: int) -> np.ndarray:
    """(n, kv): for every query, how many tokens back its key sits (q - k, k the key's
    slot among the first 2 * kv tokens). A stack that sees at most R tokens back per
    layer can bring a key and its value (at k + 1) to the query only if q - k <= layers * R:
    the share of queries within that distance caps a local mixer's accuracy."""
    x, y = inputs.numpy(), labels.numpy()
    n, kv = len(x), num_kv_pairs
    q = np.nonzero(y != -100)[1].reshape(n, kv)  # (n, kv) query positions, row by row
    asked = np.take_along_axis(x, q, 1)  # (n, kv) the key each query repeats
    slot = (asked[:, :, None] == x[:, None, 0:2 * kv:2]).argmax(-1)  # (n, kv) which pair
    return q - 2 * slot
