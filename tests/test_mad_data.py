"""MAD's six synthetic tasks (tasks/mad/data.py): each generator's invariants (property
tests against small reference parsers), seeding, independence from every global RNG,
the settings checks, and MAD's settings table."""
import inspect
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.mad import data as md

IGN = md.IGNORE
FAST = settings(max_examples=25, deadline=None)
seeds = st.integers(0, 2 ** 31 - 1)
splits = st.sampled_from(["train", "test"])


def _basic(x, y, n, L, V):
    assert x.shape == y.shape == (n, L) and x.dtype == y.dtype == torch.int64
    assert x.min() >= 0 and x.max() < V
    assert ((y == IGN) | ((y >= 0) & (y < V))).all()


# ---- in-context recall and noisy in-context recall -------------------------------------

def _check_recall_row(x, y, L, V, noise_vocab, mq, split):
    ns = V - noise_vocab - (0 if mq else 1)
    nk = ns // 2
    is_key = lambda t: 0 <= t < nk  # noqa: E731
    is_val = lambda t: nk <= t < ns  # noqa: E731
    P = L // 2 - 1
    answer, expected = {}, [IGN] * L
    for j in range(P):
        k, v = x[2 * j], x[2 * j + 1]
        if k >= ns:  # a noise slot: two noise tokens, never a key or a value
            assert ns <= k < ns + noise_vocab and ns <= v < ns + noise_vocab
            continue
        assert is_key(k) and is_val(v)
        if k in answer:
            assert answer[k] == v  # one value per key within a sequence
            if mq:
                expected[2 * j] = v  # scored at the key: predict the value that follows
        answer[k] = v
    assert answer, "at least one real key-value pair"
    if mq:
        qk, qv = x[L - 2], x[L - 1]
        expected[L - 2] = qv
    else:
        assert x[L - 2] == V - 1  # the copy token
        qk, qv = x[L - 1], y[L - 1]
        expected[L - 1] = qv
    assert qk in answer and answer[qk] == qv  # the final query asks a shown key
    if split == "test":
        assert y == expected
    else:  # MAD trains recall on every next token
        assert y[:-1] == x[1:]
        assert y[-1] == (IGN if mq else qv)


@FAST
@given(st.integers(1, 6), st.integers(2, 30), st.integers(2, 40), st.booleans(), splits, seeds)
def test_in_context_recall_invariants(n, half, V, mq, split, seed):
    L = 2 * half
    V = max(V, 2 if mq else 3)
    x, y = md.in_context_recall(n, seed, split, vocab_size=V, seq_len=L, multi_query=mq)
    _basic(x, y, n, L, V)
    for rx, ry in zip(x.tolist(), y.tolist()):
        _check_recall_row(rx, ry, L, V, 0, mq, split)


@FAST
@given(st.integers(1, 6), st.integers(2, 30), st.integers(2, 20), st.integers(1, 16),
       st.floats(0, 0.95), st.booleans(), splits, seeds)
def test_noisy_recall_noise_never_keys_values_or_scored(n, half, real, noise, frac, mq, split, seed):
    L, V = 2 * half, real + noise + (0 if mq else 1)
    x, y = md.noisy_in_context_recall(n, seed, split, vocab_size=V, seq_len=L, multi_query=mq,
                                      noise_vocab_size=noise, frac_noise=frac)
    _basic(x, y, n, L, V)
    for rx, ry in zip(x.tolist(), y.tolist()):
        _check_recall_row(rx, ry, L, V, noise, mq, split)
    if split == "test":  # no noise token is ever an input at, or the answer of, a scored position
        ns = V - noise - (0 if mq else 1)
        scored = y != IGN
        assert (x[scored] < ns).all() and (y[scored] < ns).all()


def test_noisy_recall_noise_rate():
    x, _ = md.noisy_in_context_recall(2000, 3, frac_noise=0.6)  # baseline: 16 real + 16 noise
    noise_slots = (x[:, 0:-2:2] >= 16).float().mean().item()
    assert abs(noise_slots - 0.6 * (1 - 1 / 63)) < 0.01  # one slot per sequence is forced real
    x0, _ = md.noisy_in_context_recall(200, 3, frac_noise=0.0)
    assert (x0 < 16).all()


# ---- fuzzy in-context recall -----------------------------------------------------------

def _check_fuzzy_row(x, y, L, V, km, vm, mq, split):
    ns = V - 1 if mq else V - 2
    nk, pad = ns // 2, ns
    seq = x + [y[-1]]  # the last value token exists only as the last target
    i = 0
    while seq[i] == pad:
        i += 1
    assert i >= (2 if mq else 1)  # front padding only
    end = L + 1
    if not mq:
        end = L + 1 - seq[::-1].index(V - 1) - 1
    pairs, p = [], i
    while p < L + 1:
        if not mq and p == end:
            p += 1  # the copy token, right before the final pair
            continue
        k0 = p
        while p < L + 1 and seq[p] < nk:
            p += 1
        v0 = p
        while p < L + 1 and nk <= seq[p] < ns:
            p += 1
        assert k0 < v0 < p, f"a key then a value at {k0}: {seq}"
        pairs.append((tuple(seq[k0:v0]), tuple(seq[v0:p]), v0))
    if not mq:  # C sits right before the final pair, and only there
        assert pairs[-1][2] - len(pairs[-1][0]) == end + 1 and seq.count(V - 1) == 1
    answer, expected = {}, [IGN] * (L + 1)
    for n_pair, (k, v, v0) in enumerate(pairs):
        last = n_pair == len(pairs) - 1
        assert 1 <= len(k) <= km and 1 <= len(v) <= vm
        assert len(set(k)) == len(k) and len(set(v)) == len(v)  # motifs: distinct tokens
        if split == "test":
            assert len(k) == km  # MAD always probes at the maximum key size
        if k in answer:
            assert answer[k] == v  # one value per key within a sequence
        if last or (mq and k in answer):
            expected[v0:v0 + len(v)] = v
        if last:
            assert k in answer  # the final query's key was shown before
        answer[k] = v
    if split == "test":
        assert y == expected[1:]
    else:
        assert y == seq[1:]
    return pairs


@FAST
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.integers(0, 12), st.integers(0, 40),
       st.booleans(), splits, seeds)
def test_fuzzy_recall_invariants(n, km, vm, extra_v, extra_l, mq, split, seed):
    V = (1 if mq else 2) + max(2 * km, 2 * vm - 1) + extra_v
    L = 3 * (km + vm) + extra_l
    x, y = md.fuzzy_in_context_recall(n, seed, split, vocab_size=V, seq_len=L, k_motif_size=km,
                                      v_motif_size=vm, multi_query=mq)
    _basic(x, y, n, L, V)
    for rx, ry in zip(x.tolist(), y.tolist()):
        _check_fuzzy_row(rx, ry, L, V, km, vm, mq, split)


def test_fuzzy_recall_baseline_mixes_motif_sizes():
    x, y = md.fuzzy_in_context_recall(20, 0)  # baseline: keys and values of 1..3 tokens
    pairs = [p for rx, ry in zip(x.tolist(), y.tolist())
             for p in _check_fuzzy_row(rx, ry, 128, 16, 3, 3, True, "train")]
    assert {len(k) for k, _, _ in pairs} == {len(v) for _, v, _ in pairs} == {1, 2, 3}
    assert len(pairs) > 20 * 20  # about 128 / 4 pairs per sequence
    _, yt = md.fuzzy_in_context_recall(200, 0, "test")
    assert (yt != IGN).sum(1).float().mean() > 3  # repeated keys are scored, not only the query


# ---- selective copying, compression, memorization ---------------------------------------

@FAST
@given(st.integers(1, 6), st.integers(3, 40), st.integers(1, 10), st.integers(0, 60), splits, seeds)
def test_selective_copying_targets_are_the_data_tokens_in_order(n, V, k, extra, split, seed):
    L = 2 * k + 2 + extra
    x, y = md.selective_copying(n, seed, split, vocab_size=V, seq_len=L, num_tokens_to_copy=k)
    _basic(x, y, n, L, V)
    blank, copy = V - 2, V - 1
    for rx, ry in zip(x.tolist(), y.tolist()):
        assert rx[L - k - 1] == copy and rx[L - k:] == [blank] * k
        data = [t for t in rx[:L - k - 1] if t != blank]
        assert len(data) == k and all(t < blank for t in data)
        assert ry == [IGN] * (L - k) + data
        assert rx[L - k - 2] != blank  # MAD's law: no blank after the last data token


@FAST
@given(st.integers(1, 6), st.integers(2, 40), st.integers(0, 8), st.floats(0, 1), st.integers(2, 50), splits, seeds)
def test_compression_structure(n, real, noise, frac, L, split, seed):
    V = real + noise + 1
    frac = frac if noise else 0.0
    x, y = md.compression(n, seed, split, vocab_size=V, seq_len=L, noise_vocab_size=noise, frac_noise=frac)
    _basic(x, y, n, L, V)
    assert (x[:, -1] == V - 1).all() and (y[:, -1] == V - 1).all()  # the compression token
    assert (x[:, :-1] < V - 1).all()
    noisy = x >= real
    noisy[:, -1] = False  # the compression token is scored
    assert (y[noisy] == IGN).all()  # noise is never scored (what MAD intends) ...
    assert torch.equal(y[~noisy], x[~noisy])  # ... every other token is rebuilt
    if frac == 0:
        assert not noisy.any()


@FAST
@given(st.integers(1, 8), st.integers(3, 300), st.integers(1, 20), seeds)
def test_memorization_fixed_dictionary(n, V, half, seed):
    L = 2 * half
    d = md.memorization_dictionary(V, seed)
    nk = (V - 1) // 2
    assert len(d) == nk and len(set(d.tolist())) == nk and d.min() >= nk and d.max() < V - 1
    answer = {}
    for split in ("train", "test"):  # both splits share the seed's dictionary
        x, y = md.memorization(n, seed, split, vocab_size=V, seq_len=L)
        _basic(x, y, n, L, V)
        assert (x[:, 1::2] == V - 1).all() and (y[:, 0::2] == IGN).all()
        assert (x[:, 0::2] < nk).all()
        for k, v in zip(x[:, 0::2].flatten().tolist(), y[:, 1::2].flatten().tolist()):
            assert answer.setdefault(k, v) == v == d[k]  # the same key, the same value, everywhere


# ---- seeding -----------------------------------------------------------------------------

SMALL = {  # every draw exercised (noise on), small enough to be quick
    "in-context-recall": dict(seq_len=32),
    "fuzzy-in-context-recall": dict(seq_len=64),
    "noisy-in-context-recall": dict(seq_len=32, frac_noise=0.5),
    "selective-copying": dict(seq_len=64, num_tokens_to_copy=8),
    "compression": dict(vocab_size=24, noise_vocab_size=8, frac_noise=0.3),
    "memorization": dict(vocab_size=64),
}


def _gen(task, seed, split="train"):
    return md.GENERATORS[task](16, seed, split, **SMALL[task])


def _same(a, b):
    return all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("task", list(md.GENERATORS))
def test_same_seed_same_data_other_seed_or_split_differs(task):
    a = _gen(task, 7)
    assert _same(a, _gen(task, 7))
    assert not torch.equal(a[0], _gen(task, 8)[0])
    assert not torch.equal(a[0], _gen(task, 7, "test")[0])


def _ignores_global_rngs(generate):
    outs = []
    for k in (1, 2):  # re-seed and advance every global RNG differently before each call
        np.random.seed(k)
        np.random.random(k)
        random.seed(k)
        torch.manual_seed(k)
        torch.rand(k)
        outs.append(generate())
    return _same(*outs)


@pytest.mark.parametrize("task", list(md.GENERATORS))
def test_no_draw_bypasses_the_seeded_generator(task):
    assert _ignores_global_rngs(lambda: _gen(task, 11))
    assert _ignores_global_rngs(lambda: _gen(task, 11, "test"))


def test_global_rng_canary():
    # The check above can fail: a generator drawing from numpy's, Python's or torch's global
    # RNG (MAD's selective copying draws blank positions from numpy's) is caught.
    assert not _ignores_global_rngs(lambda: (torch.from_numpy(np.random.randint(0, 9, (4, 8))),))
    assert not _ignores_global_rngs(lambda: (torch.tensor([random.random()]),))
    assert not _ignores_global_rngs(lambda: (torch.randint(0, 9, (4, 8)),))
    assert not _ignores_global_rngs(lambda: (torch.from_numpy(np.random.default_rng().integers(0, 9, 8)),))


# ---- settings ----------------------------------------------------------------------------

@pytest.mark.parametrize("task", list(md.GENERATORS))
def test_every_mad_setting_is_valid_and_defaults_are_the_baseline(task):
    params = inspect.signature(md.GENERATORS[task]).parameters
    base = md.BASELINES[task]["baseline"]
    for k, v in base.items():
        if k not in ("num_train_examples", "num_test_examples"):
            assert params[k].default == v, k
    assert md.BASELINES[task]["source"].startswith("configs/tasks/")
    settings_ = md.mad_settings(task)
    assert settings_[0] == base and len(settings_) == 1 + sum(map(len, md.BASELINES[task]["changes"].values()))
    for s in settings_:
        kw = {k: v for k, v in s.items() if k not in ("num_train_examples", "num_test_examples")}
        md.check(task, s["num_train_examples"], "train", **kw)
        x, y = md.GENERATORS[task](2, 0, "test", **kw)
        _basic(x, y, 2, s["seq_len"], s["vocab_size"])


@pytest.mark.parametrize("gen, kw, field", [
    (md.in_context_recall, dict(seq_len=127), "seq_len"),
    (md.in_context_recall, dict(vocab_size=1), "vocab_size"),
    (md.in_context_recall, dict(vocab_size=2, multi_query=False), "vocab_size"),
    (md.noisy_in_context_recall, dict(vocab_size=17), "vocab_size"),  # 16 noise + 1: no key and value
    (md.noisy_in_context_recall, dict(frac_noise=1.0), "frac_noise"),
    (md.noisy_in_context_recall, dict(noise_vocab_size=0), "noise_vocab_size"),
    (md.fuzzy_in_context_recall, dict(vocab_size=6), "vocab_size"),  # 5 key/value tokens: 2 keys < 3
    (md.fuzzy_in_context_recall, dict(k_motif_size=0), "k_motif_size"),
    (md.fuzzy_in_context_recall, dict(seq_len=17), "seq_len"),
    (md.selective_copying, dict(seq_len=33), "seq_len"),  # 16 tokens need 2 * 16 + 2
    (md.selective_copying, dict(num_tokens_to_copy=0), "num_tokens_to_copy"),
    (md.selective_copying, dict(vocab_size=2), "vocab_size"),
    (md.compression, dict(vocab_size=5, noise_vocab_size=4), "vocab_size"),
    (md.compression, dict(frac_noise=0.1), "noise_vocab_size"),
    (md.memorization, dict(seq_len=31), "seq_len"),
    (md.memorization, dict(vocab_size=2), "vocab_size"),
])
def test_check_names_the_bad_field(gen, kw, field):
    with pytest.raises(ValueError, match=f"{field}=.*valid"):
        gen(2, 0, **kw)


def test_check_rejects_bad_split_and_count():
    with pytest.raises(ValueError, match="split="):
        md.compression(2, 0, "val")
    with pytest.raises(ValueError, match="num_examples="):
        md.memorization(0, 0)
