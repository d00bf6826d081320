"""MAD's six synthetic tasks (Poli et al. 2024; github.com/athms/mad-lab, mad/data/instances.py):
our own vectorised generators with MAD's semantics. Each returns ``(inputs, targets)``, int64
(n, seq_len); target -100 is ignored by the loss. Every draw comes from a numpy Generator seeded
by ``seed`` and the split (train and test are independent streams); no global RNG is used.

Recall tasks are next-token tasks: targets[t] is the token that follows position t. For
split="train" that is every next token (MAD trains recall with a full LM loss); for "test"
only recall positions are scored. K key, v value, N noise, P pad, C copy, B blank, I insert.

in-context recall:  K v K v K v ... K v | K* v*    (multi_query=False: ... K v | C K* v*)
    keys [0, ns/2), values [ns/2, ns); a key keeps one value within a sequence. Scored (at the
    key): each key shown in an earlier pair, and the final query K*, a uniformly drawn shown
    key (without multi-query only K* is scored).
noisy in-context recall:  K v N N K v ... K v | K* v*    (ns = vocab_size - noise_vocab_size)
    each pair is, with probability frac_noise, two noise tokens [ns, ns + noise_vocab_size)
    instead: never a key or value, never scored.
fuzzy in-context recall:  P P K K v v v K v K K K v v ... | K* K* v*
    keys: 1..k_motif_size distinct key tokens (test split: always k_motif_size), values:
    1..v_motif_size distinct value tokens; padding in front. The query pair is planted in the
    body. Scored: each value token of a pair whose key was shown before, and of the query.
selective copying:  d B B d B d d ... d C B B B B   ->  targets -100 ... -100 d d d d
    the data tokens with blanks among them, C, one blank per data token; at those blanks the
    data tokens are output in order (not shifted).
compression:  t t t ... t Z  ->  targets t t t ... t Z: an encoder pools the last token Z and
    an MLP decoder rebuilds every position from it (MAD's AutoEncoder).
memorization:  K I K I K I  ->  targets -100 v -100 v -100 v, one key->value dictionary per
    seed for every sequence of both splits (facts to memorise, not recall).

Where we differ from MAD, on purpose:
  * Multi-query (noisy) recall has seq_len - 1 tokens in MAD; we keep its last token as an
    input with an ignored target, so every task has exactly seq_len tokens.
  * Selective copying draws blank positions from numpy's global RNG in MAD; ours are seeded
    (same law: each blank goes before a uniform data token, so none follows the last one).
  * Compression: MAD computes noise-masked targets, then returns the unmasked inputs; we return
    what it evidently intends: the clean tokens, -100 where noise replaced one.
  * Fuzzy recall: MAD's plant offset can fall past the body's end, leaving a query whose key
    was never shown (still scored); ours is drawn where planting always happens. No noise
    option for fuzzy recall and memorization (MAD's configs never use it).
  * Recall: MAD's forced real pair can land on the final slot (1 in 64: no guarantee); ours
    is always in the body.
  * Selective copying copies ``num_tokens_to_copy`` tokens; mad-lab passed that field to its
    generator only from December 2024 (commit 35772e8), so before it every setting copied 16,
    and the published scores (Poli et al.; the DeltaNet paper) most likely rest on that.
  * Same laws as MAD, drawn in another order: no sequence equals MAD's for a given seed.
"""
from __future__ import annotations

import numpy as np
import torch

GENERATOR_VERSION = 1  # part of the cache key: bump when the generated data changes
IGNORE = -100  # MAD's target_ignore_index (mad/configs.py), what CrossEntropyLoss skips
SPLITS = {"train": 0, "test": 1, "valid": 2}  # spawn keys: independent train, test and validation streams
_DICT_KEY = 2  # spawn key of the memorization dictionary, shared by both splits

# MAD's settings: "baseline" and "changes" from configs/tasks/<task>.yml (the changes are
# applied one at a time, as make_benchmark_mad_configs in mad/configs.py does); fields the
# yml leaves out take MADConfig's defaults (mad/configs.py: num_test_examples=1280,
# multi_query=True, no noise). Our generators' defaults equal these baselines.
_NTR, _VOC, _LEN = (6400, 3200, 1600, 800), (32, 64, 128), (256, 512, 1024)  # tuples: shared, immutable
BASELINES = {
    "in-context-recall": {"source": "configs/tasks/in-context-recall.yml",
        "baseline": dict(vocab_size=16, seq_len=128, multi_query=True, num_train_examples=12800,
                         num_test_examples=1280),
        "changes": dict(vocab_size=_VOC, seq_len=_LEN, num_train_examples=_NTR)},
    "fuzzy-in-context-recall": {"source": "configs/tasks/fuzzy-in-context-recall.yml",
        "baseline": dict(vocab_size=16, seq_len=128, k_motif_size=3, v_motif_size=3, multi_query=True,
                         num_train_examples=12800, num_test_examples=1280),
        "changes": dict(vocab_size=_VOC, seq_len=_LEN, num_train_examples=_NTR)},
    "noisy-in-context-recall": {"source": "configs/tasks/noisy-in-context-recall.yml",
        "baseline": dict(vocab_size=32, noise_vocab_size=16, frac_noise=0.2, seq_len=128, multi_query=True,
                         num_train_examples=12800, num_test_examples=1280),
        # the vocab sizes include the 16 noise tokens (the yml says so): 32/64/128 real tokens
        "changes": dict(vocab_size=[48, 80, 144], seq_len=_LEN, num_train_examples=_NTR,
                        frac_noise=[0.4, 0.6, 0.8])},
    "selective-copying": {"source": "configs/tasks/selective-copying.yml",
        "baseline": dict(vocab_size=16, seq_len=256, num_tokens_to_copy=16, num_train_examples=12800,
                         num_test_examples=1280),
        "changes": dict(vocab_size=_VOC, seq_len=[512, 1024], num_train_examples=_NTR,
                        num_tokens_to_copy=[32, 64, 96])},
    "compression": {"source": "configs/tasks/compression.yml",
        "baseline": dict(vocab_size=16, seq_len=32, num_train_examples=12800, num_test_examples=1280),
        "changes": dict(vocab_size=_VOC, seq_len=[64, 128, 256], num_train_examples=_NTR)},
    "memorization": {"source": "configs/tasks/memorization.yml",
        "baseline": dict(vocab_size=256, seq_len=32, num_train_examples=256, num_test_examples=1280),
        "changes": dict(vocab_size=[512, 1024, 2048, 4096, 8192])},
}


def mad_settings(task: str) -> list[dict]:
    """The baseline, then each change applied alone to it (MAD's difficulty levels)."""
    b, changes = BASELINES[task]["baseline"], BASELINES[task]["changes"]
    return [dict(b)] + [{**b, k: v} for k, vs in changes.items() for v in vs]


def check(task: str, num_examples: int = 1, split: str = "train", **kw) -> None:
    """Raise ValueError, naming the field and its valid range, for impossible settings."""
    if task not in BASELINES:
        raise ValueError(f"mad_data: task={task!r} is invalid; valid: {sorted(BASELINES)}")
    V, L, mq = kw["vocab_size"], kw["seq_len"], kw.get("multi_query", True)
    noise, frac = kw.get("noise_vocab_size", 0), kw.get("frac_noise", 0.0)
    km, vm, ntc = kw.get("k_motif_size", 1), kw.get("v_motif_size", 1), kw.get("num_tokens_to_copy", 1)
    top = 1.0 if task == "compression" else np.nextafter(1.0, 0)  # recall needs one real pair
    rules = [  # (broken, field, value, valid range)
        (split not in SPLITS, "split", split, sorted(SPLITS)),
        (num_examples < 1, "num_examples", num_examples, ">= 1"),
        (noise < 0, "noise_vocab_size", noise, ">= 0"),
        (not 0 <= frac <= top, "frac_noise", frac, "[0, 1]" if task == "compression" else "[0, 1)"),
        (frac > 0 and noise < 1, "noise_vocab_size", noise, ">= 1 when frac_noise > 0")]
    if task in ("in-context-recall", "noisy-in-context-recall"):
        sp = 0 if mq else 1  # the copy token
        rules += [(L < 4 or L % 2, "seq_len", L, "even and >= 4 (pairs, then the final query pair)"),
                  (V - noise - sp < 2, "vocab_size", V, f">= {noise + sp + 2} (noise, special, 1 key, 1 value)")]
    elif task == "fuzzy-in-context-recall":
        sp = 1 if mq else 2  # pad (+ copy token); ns // 2 keys >= km and ns - ns // 2 values >= vm
        need = sp + max(2 * km, 2 * vm - 1)
        rules += [(km < 1, "k_motif_size", km, ">= 1"), (vm < 1, "v_motif_size", vm, ">= 1"),
                  (V < need, "vocab_size", V, f">= {need} (distinct key/value tokens for a motif)"),
                  (((V - sp) // 2 + 1) ** km >= 2 ** 62, "k_motif_size", km, "small enough for int64 key codes"),
                  (L < 3 * (km + vm), "seq_len", L, f">= 3 * (k_motif_size + v_motif_size) = {3 * (km + vm)}")]
    elif task == "selective-copying":
        rules += [(ntc < 1, "num_tokens_to_copy", ntc, ">= 1"),
                  (V < 3, "vocab_size", V, ">= 3 (blank, copy, 1 data token)"),
                  (L < 2 * ntc + 2, "seq_len", L, f">= 2 * num_tokens_to_copy + 2 = {2 * ntc + 2} (one blank)")]
    elif task == "compression":
        rules += [(L < 2, "seq_len", L, ">= 2"),
                  (V - 1 - noise < 1, "vocab_size", V, f">= {noise + 2} (compression token, noise, 1 token)")]
    else:  # memorization
        rules += [(L < 2 or L % 2, "seq_len", L, "even and >= 2 (key, insert-token pairs)"),
                  (V < 3, "vocab_size", V, ">= 3 (insert token, 1 key, 1 value)")]
    for broken, field, value, valid in rules:
        if broken:
            raise ValueError(f"{task}: {field}={value!r} is invalid; valid: {valid}")


def _rng(seed: int, key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))


def _finish(seq, tgt, L, split):
    """seq/tgt: (n, L) or (n, L + 1), tgt[t] scored at the token before t. Returns
    (inputs, targets) (n, L): targets = next tokens (train) or tgt shifted (test)."""
    if seq.shape[1] == L:  # the final token gets an ignored target
        pad = np.full((len(seq), 1), IGNORE)
        seq, tgt = np.concatenate([seq, pad], 1), np.concatenate([tgt, pad], 1)
    y = seq if split == "train" else tgt
    return torch.from_numpy(np.ascontiguousarray(seq[:, :L])), torch.from_numpy(np.ascontiguousarray(y[:, 1:]))


def _first_seen(codes):
    """codes (n, P) -> (n, P) column of each code's first occurrence in its row."""
    n, P = codes.shape
    order = np.argsort(codes, axis=1, kind="stable")  # equal codes: earliest column first
    s = np.take_along_axis(codes, order, 1)
    new = np.ones((n, P), bool)
    new[:, 1:] = s[:, 1:] != s[:, :-1]
    head = np.maximum.accumulate(np.where(new, np.arange(P), 0), axis=1)  # group start in sorted order
    first = np.empty_like(order)
    np.put_along_axis(first, order, np.take_along_axis(order, head, 1), 1)
    return first


def _recall(num_examples, seed, split, vocab_size, seq_len, multi_query, noise_vocab_size, frac_noise, task):
    check(task, num_examples, split, vocab_size=vocab_size, seq_len=seq_len, multi_query=multi_query,
          noise_vocab_size=noise_vocab_size, frac_noise=frac_noise)
    rng, n, L = _rng(seed, SPLITS[split]), num_examples, seq_len
    ns = vocab_size - noise_vocab_size - (0 if multi_query else 1)  # key + value tokens
    nk, P, rows = ns // 2, L // 2 - 1, np.arange(num_examples)  # P pairs before the final query
    keys = rng.integers(0, nk, (n, P))
    # A value per possible key, drawn up front: the same law as MAD's draw at a key's first sight.
    table = rng.integers(nk, ns, (n, nk))
    vals = np.take_along_axis(table, keys, 1)
    noise = rng.random((n, P)) < frac_noise
    noise[rows, rng.integers(0, P, n)] = False  # at least one real pair, so a key can be queried
    noise_tok = rng.integers(ns, ns + max(noise_vocab_size, 1), (n, P, 2))
    codes = np.where(noise, nk + np.arange(P), keys)  # noise slots never match anything
    repeat = (_first_seen(codes) != np.arange(P)) & ~noise  # key shown in an earlier pair
    shown = np.zeros((n, nk), bool)
    r, c = np.nonzero(~noise)
    shown[r, keys[r, c]] = True
    qk = np.where(shown, rng.random((n, nk)), -1.0).argmax(1)  # uniform over the distinct shown keys
    qv = table[rows, qk]
    body = np.stack([np.where(noise, noise_tok[..., 0], keys), np.where(noise, noise_tok[..., 1], vals)], -1)
    tail = [qk, qv] if multi_query else [np.full(n, vocab_size - 1), qk, qv]
    seq = np.concatenate([body.reshape(n, 2 * P), np.stack(tail, 1)], 1)  # (n, L) or (n, L + 1)
    tgt = np.full(seq.shape, IGNORE)
    if multi_query:
        tgt[:, 1:2 * P:2] = np.where(repeat, vals, IGNORE)
    tgt[:, -1] = qv
    return _finish(seq, tgt, L, split)


def in_context_recall(num_examples: int, seed: int, split: str = "train", vocab_size: int = 16,
                      seq_len: int = 128, multi_query: bool = True, noise_vocab_size: int = 0,
                      frac_noise: float = 0.0):
    return _recall(num_examples, seed, split, vocab_size, seq_len, multi_query, noise_vocab_size,
                   frac_noise, "in-context-recall")


def noisy_in_context_recall(num_examples: int, seed: int, split: str = "train", vocab_size: int = 32,
                            seq_len: int = 128, multi_query: bool = True, noise_vocab_size: int = 16,
                            frac_noise: float = 0.2):
    return _recall(num_examples, seed, split, vocab_size, seq_len, multi_query, noise_vocab_size,
                   frac_noise, "noisy-in-context-recall")


def _perms(rng, shape, K, k):
    """shape + (k,) distinct tokens of [0, K) in uniform random order (its first j entries are
    a uniform ordered j-subset): the i-th draw picks among the K - i tokens left."""
    out = np.empty(shape + (k,), np.int64)
    for i in range(k):
        x = rng.integers(0, K - i, shape)
        for p in np.moveaxis(np.sort(out[..., :i], -1), -1, 0):  # skip earlier picks, ascending
            x += x >= p
        out[..., i] = x
    return out


def _code(tok, size, base):
    """A distinct int64 per key tuple tok[..., :size] (base-`base` digits tok + 1)."""
    w = base ** np.arange(tok.shape[-1], dtype=np.int64)
    return ((tok + 1) * w * (np.arange(tok.shape[-1]) < size[..., None])).sum(-1)


def _place(out, pos0, tok, size, ok):
    """Write tok[..., :size] at out[row, pos0 + c] wherever ok; tok, (n, S, M); pos0, size, ok (n, S)."""
    c = np.arange(tok.shape[-1])
    m = ok[..., None] & (c < size[..., None])
    flat = (np.arange(len(out)) * out.shape[1])[:, None, None] + pos0[..., None] + c
    out.reshape(-1)[flat[m]] = tok[m]  # out is C-contiguous: reshape is a view


def _fuzzy_chunk(rng, n, L, V, km, vm, mq, train):
    """``n`` fuzzy-recall examples of length ``L`` over vocabulary ``V``, vectorised over rows:
    (sequences, targets), each (n, L + 1). A key is a motif of 1..``km`` key tokens, a value
    one of 1..``vm`` value tokens; ``mq`` scores every repeated key's value (multi-query),
    else only the final query's; ``train`` draws key lengths at random (test: always ``km``).

    Names, per row: ``ns`` key + value tokens (``nk`` keys), ``M`` the longest pair, ``P``
    the most pairs that fit; the final query is key ``pk`` (``a`` tokens, code ``pc``) and value
    ``pv`` (``b`` tokens); the body's pairs are keys ``K`` (``ks`` tokens, codes ``kc``) and
    values ``Vt`` (``vs`` tokens); ``T`` is the body's length budget and ``plant`` the offset at
    or after which the query pair is planted in the body. ``layout`` gives each body pair its
    first occurrence (``first``), whether it is the query key (``is_q``), its value length
    (``vlen``) and start (``start``). MAD builds one row at a time in a loop; this draws the
    same law for all rows at once (tests/test_mad_data.py checks its invariants)."""
    ns = V - 1 if mq else V - 2  # key + value tokens; pad = ns, copy = V - 1 (non-multi-query)
    nk, M, P = ns // 2, km + vm, L // 2  # a pair has >= 2 tokens: at most L / 2 fit
    rows, base = np.arange(n), nk + 1
    a = rng.integers(1, km + 1, n) if train else np.full(n, km)  # final query's key / value size
    b = rng.integers(1, vm + 1, n)
    pk, pv = _perms(rng, (n,), nk, km), nk + _perms(rng, (n,), ns - nk, vm)
    ks = rng.integers(1, km + 1, (n, P)) if train else np.full((n, P), km)  # body pairs
    vs = rng.integers(1, vm + 1, (n, P))
    K, Vt = _perms(rng, (n, P), nk, km), nk + _perms(rng, (n, P), ns - nk, vm)
    T = L - a - b - M  # as MAD: add pairs while the body is shorter than T (the rest fits)
    plant = rng.integers(0, T - M + 1)  # plant offset; <= T - M always lands in the body (MAD: < L - 2(a+b))
    pc = _code(pk, a, base)

    def layout(kc):  # the value of a key = the query's if it is the query key, else its first pair's
        first, is_q = _first_seen(kc), kc == pc[:, None]
        vlen = np.where(is_q, b[:, None], np.take_along_axis(vs, first, 1))
        start = np.cumsum(ks + vlen, 1) - ks - vlen
        return first, is_q, vlen, start

    kc = _code(K, ks, base)
    _, is_q, _, start = layout(kc)
    j = (start < plant[:, None]).sum(1)  # the first pair starting at or after the offset
    # MAD skips planting when the query key already came up by chance before that pair
    r = np.flatnonzero(~(is_q & (np.arange(P) < j[:, None])).any(1))
    ks[r, j[r]], K[r, j[r]], kc[r, j[r]] = a[r], pk[r], pc[r]
    first, is_q, vlen, start = layout(kc)
    vt = np.where(is_q[..., None], pv[:, None], np.take_along_axis(Vt, first[..., None], 1))
    inc = start < T[:, None]  # pairs in the body: a prefix of each row; drop unused columns
    S = inc.sum(1).max()
    ks, vlen, start, inc, first, K, vt = (u[:, :S] for u in (ks, vlen, start, inc, first, K, vt))
    pre = L + 1 - (np.where(inc, ks + vlen, 0).sum(1) + a + b + (0 if mq else 1))  # front padding
    seq, tgt = np.full((n, L + 1), ns), np.full((n, L + 1), IGNORE)
    body0, q0 = pre[:, None] + start, np.full((n, 1), L + 1) - (a + b)[:, None]
    _place(seq, body0, K, ks, inc)
    _place(seq, body0 + ks, vt, vlen, inc)
    _place(seq, q0, pk[:, None], a[:, None], np.ones((n, 1), bool))
    _place(seq, q0 + a[:, None], pv[:, None], b[:, None], np.ones((n, 1), bool))
    if mq:  # a value is scored when its key was shown in an earlier pair
        _place(tgt, body0 + ks, vt, vlen, inc & (first != np.arange(S)))
    else:
        seq[rows, L - a - b] = V - 1
    _place(tgt, q0 + a[:, None], pv[:, None], b[:, None], np.ones((n, 1), bool))
    return seq, tgt


def fuzzy_in_context_recall(num_examples: int, seed: int, split: str = "train", vocab_size: int = 16,
                            seq_len: int = 128, k_motif_size: int = 3, v_motif_size: int = 3,
                            multi_query: bool = True):
    check("fuzzy-in-context-recall", num_examples, split, vocab_size=vocab_size, seq_len=seq_len,
          k_motif_size=k_motif_size, v_motif_size=v_motif_size, multi_query=multi_query)
    rng, n = _rng(seed, SPLITS[split]), num_examples
    rows = max(1, 2 ** 17 // seq_len)  # chunks bound the (rows, L/2, motif) scratch arrays
    parts = [_fuzzy_chunk(rng, min(rows, n - s), seq_len, vocab_size, k_motif_size, v_motif_size,
                          multi_query, split == "train") for s in range(0, n, rows)]
    return _finish(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), seq_len, split)


def selective_copying(num_examples: int, seed: int, split: str = "train", vocab_size: int = 16,
                      seq_len: int = 256, num_tokens_to_copy: int = 16):
    check("selective-copying", num_examples, split, vocab_size=vocab_size, seq_len=seq_len,
          num_tokens_to_copy=num_tokens_to_copy)
    rng, n, L, k = _rng(seed, SPLITS[split]), num_examples, seq_len, num_tokens_to_copy
    blank, copy = vocab_size - 2, vocab_size - 1
    data = rng.integers(0, vocab_size - 2, (n, k))
    # MAD inserts each blank before a uniform data token: blanks before each token ~ multinomial
    gaps = rng.multinomial(L - 2 * k - 1, np.full(k, 1.0 / k), size=n)  # (n, k)
    x = np.full((n, L), blank)
    np.put_along_axis(x, np.arange(k) + np.cumsum(gaps, 1), data, 1)
    x[:, L - k - 1] = copy
    y = np.full((n, L), IGNORE)
    y[:, L - k:] = data  # output at the blanks after the copy token, not shifted
    return torch.from_numpy(x), torch.from_numpy(y)


def compression(num_examples: int, seed: int, split: str = "train", vocab_size: int = 16,
                seq_len: int = 32, noise_vocab_size: int = 0, frac_noise: float = 0.0):
    check("compression", num_examples, split, vocab_size=vocab_size, seq_len=seq_len,
          noise_vocab_size=noise_vocab_size, frac_noise=frac_noise)
    rng, n, L = _rng(seed, SPLITS[split]), num_examples, seq_len
    ns = vocab_size - 1 - noise_vocab_size
    x = rng.integers(0, ns, (n, L))
    x[:, -1] = vocab_size - 1  # the compression token, itself a target as in MAD
    noisy = rng.random((n, L)) < frac_noise
    noisy[:, -1] = False
    # Our choice (MAD's evident intent, see the module docstring): noise positions are not scored.
    y = np.where(noisy, IGNORE, x)
    x = np.where(noisy, rng.integers(ns, ns + max(noise_vocab_size, 1), (n, L)), x)
    return torch.from_numpy(x), torch.from_numpy(y)


def memorization_dictionary(vocab_size: int, seed: int) -> np.ndarray:
    """(nk,) the value of each key 0..nk-1: a uniform injection into the value tokens (MAD zips
    shuffled keys with shuffled values). Fixed per seed, shared by both splits."""
    ns = vocab_size - 1  # the insert token is vocab_size - 1
    return _rng(seed, _DICT_KEY).permutation(np.arange(ns // 2, ns))[:ns // 2]


def memorization(num_examples: int, seed: int, split: str = "train", vocab_size: int = 256, seq_len: int = 32):
    check("memorization", num_examples, split, vocab_size=vocab_size, seq_len=seq_len)
    rng, n, L = _rng(seed, SPLITS[split]), num_examples, seq_len
    d = memorization_dictionary(vocab_size, seed)
    keys = rng.integers(0, len(d), (n, L // 2))
    x = np.stack([keys, np.full_like(keys, vocab_size - 1)], -1).reshape(n, L)
    y = np.stack([np.full_like(keys, IGNORE), d[keys]], -1).reshape(n, L)  # value at the insert token
    return torch.from_numpy(x), torch.from_numpy(y)


GENERATORS = {"in-context-recall": in_context_recall, "fuzzy-in-context-recall": fuzzy_in_context_recall,
              "noisy-in-context-recall": noisy_in_context_recall, "selective-copying": selective_copying,
              "compression": compression, "memorization": memorization}


def generate(task: str, setting: dict, split: str, seed: int):
    """A whole split of one MAD setting (a dict from ``mad_settings``); its size
    ``setting["num_<split>_examples"]`` (``num_valid_examples`` for the validation split,
    which MAD's own settings do not have)."""
    kw = {k: v for k, v in setting.items() if not (k.startswith("num_") and k.endswith("_examples"))}
    return GENERATORS[task](setting[f"num_{split}_examples"], seed, split, **kw)
