"""Data for the tasks: an on-disk cache, the Wikitext-2 and SNLI loaders and tokenizers,
and the seeded epoch order every task draws its batches in.

Every loader reads either the Hugging Face hub (``data_dir=None``) or a local folder
(``data_dir``, laid out as ``../shared/data``), never one after failing the other:
a run asked for the hub that cannot reach it stops with a message naming
``--data-dir``. Each loader returns a ``source`` string for the record, so a result
always says where its data came from.
"""
from __future__ import annotations

import csv
import fcntl
import hashlib
import json
import os
import re
import functools
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from zoo.config import id_as

# Trained WordPiece vocabularies the reference runs read, committed (training is not
# reproducible across processes: ``trained_wordpiece``).
SHIPPED_VOCAB = Path(__file__).resolve().parent / "vocab"
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # BERT's, in BERT's id order
WIKITEXT_HUB = "Salesforce/wikitext"
WIKITEXT_CONFIGS = {"tokens": "wikitext-2-v1", "raw": "wikitext-2-raw-v1"}
SNLI_HUB = "stanfordnlp/snli"
SNLI_LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}
SPLITS = ("train", "valid", "test")
_HUB_SPLIT = {"train": "train", "valid": "validation", "test": "test"}


class DataUnavailable(RuntimeError):
    """The requested source (hub or folder) cannot give the data; nothing was substituted."""


def need(module: str, what: str):
    """Import an optional NLP package, or say which extra installs it."""
    try:
        return __import__(module)
    except ImportError as e:
        raise ImportError(f"{what} needs the `{module}` package: pip install -e '.[nlp]'") from e


# A data folder enters a run's identity only as "local copy" against "the hub": an offline
# run trains on other splits (SNLI) or another copy of the same text, wherever it lives.
LOCAL_OR_HUB = id_as(lambda v: {"data_dir": "local" if v is not None else None})


def cache_root(cache_dir: str | None = None) -> Path:
    root = Path(cache_dir or os.environ.get("LINBENCH_CACHE") or Path.home() / ".cache" / "linbench")
    root.mkdir(parents=True, exist_ok=True)
    return root


def fingerprint(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_once(path: Path, write) -> Path:
    """Make sure ``path`` exists: if not, ``write(tmp)`` and rename ``tmp`` to ``path``.
    Runs of a sweep that miss the same cache entry at once build it one at a time (a
    file lock): the first builds, the others wait and read its file, so every run gets
    the same bytes. Without it each kept its own build, and two WordPiece trainings of
    the same text in two processes gave different ids (2,473,123 vs 2,473,105 tokens)."""
    if path.exists():
        return path
    with open(path.with_name(path.name + ".lock"), "w") as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if not path.exists():  # nobody built it while we waited
                tmp = path.with_name(path.name + f".tmp{os.getpid()}")
                write(tmp)
                os.replace(tmp, path)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    return path


def cached(path: Path, build):
    """``build()``, saved to ``path`` by the first run that needs it; every run, that
    one included, loads the saved file."""
    build_once(path, lambda tmp: torch.save(build(), tmp))
    return torch.load(path, weights_only=False)


def cached_examples(cache_dir: str | None, task: str, split: str, key: dict, make) -> tuple:
    """A generated split's (inputs, targets), made by ``make()`` once and cached under
    ``cache_root/task/`` by a hash of ``key`` (everything the data depends on); int32 on
    disk halves the file, and the key rides along so a cached file explains itself."""
    path = cache_root(cache_dir) / task / f"{task}-{split}-{fingerprint(key)}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)

    def build() -> dict:
        inputs, targets = make()
        return {"inputs": inputs.int(), "targets": targets.int(), "key": key}
    data = cached(path, build)
    if data.keys() != {"inputs", "targets", "key"} or data["key"] != key:
        # A file of another layout or another key under the same hash: the data are a
        # function of the key, so build it again.
        path.unlink(missing_ok=True)
        data = cached(path, build)
    return data["inputs"].long(), data["targets"].long()


def hub_split(name: str, config: str | None, split: str):
    datasets = need("datasets", "loading from the Hugging Face hub")
    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as e:  # offline, rate-limited, renamed: all end the run the same way
        raise DataUnavailable(
            f"could not load {name} ({config or 'default'}, split {split!r}) from the Hugging Face hub: "
            f"{type(e).__name__}: {e}. Offline, point the task at a local copy instead: "
            f"--data-dir ../shared/data (config field data_dir)") from e


def local_file(path: Path) -> Path:
    if not path.is_file():
        raise DataUnavailable(f"{path} does not exist; data_dir must be laid out as ../shared/data "
                              f"(see its README.md)")
    return path


# ---------------------------------------------------------------- Wikitext-2

def wikitext_lines(variant: str, data_dir: str | None) -> tuple[dict[str, list[str]], str]:
    """The lines of each split and where they came from. One line = one row of the
    hub's dataset = one line of the official files (blank lines included)."""
    if data_dir is None:
        config = WIKITEXT_CONFIGS[variant]
        lines = {s: list(hub_split(WIKITEXT_HUB, config, _HUB_SPLIT[s])["text"]) for s in SPLITS}
        return lines, f"hub:{WIKITEXT_HUB}/{config}"
    root = Path(data_dir)
    words = {s: root / "wikitext-2" / f"{s}.txt" for s in SPLITS}
    if variant == "tokens":
        return {s: read_lines(p) for s, p in words.items()}, f"local:{root / 'wikitext-2'}"
    # The raw train split is not shipped offline: the word-level train split (whose only
    # difference is that rare words read <unk>) stands in for it, and the source says so.
    raw = {s: root / "wikitext-2-raw" / f"wiki.{s}.raw" for s in ("valid", "test")}
    lines = {"train": read_lines(words["train"]), **{s: read_lines(p) for s, p in raw.items()}}
    return lines, (f"local:{root / 'wikitext-2-raw'} (valid/test raw; train = the word-level "
                   f"{words['train']}: the raw train split is not available offline)")


def read_lines(path: Path) -> list[str]:
    with open(local_file(path), encoding="utf-8") as f:
        return f.read().splitlines()


# ---------------------------------------------------------------- tokenizers

WORD_RE = re.compile(r"\w+|[^\w\s]")


class Words:
    """A word-level vocabulary of the training split, most frequent first.

    ``lowercase=False``: whitespace-split, pre-tokenized text (Wikitext-2's tokens
    variant), ``eos`` appended per line, as the standard recipe does. ``lowercase=True``:
    raw sentences split into words and punctuation (SNLI)."""

    def __init__(self, vocab: list[str], unk: str, lowercase: bool, eos: str | None, name: str):
        self.vocab, self.unk, self.lowercase, self.eos, self.name = vocab, unk, lowercase, eos, name
        self.ids = {w: i for i, w in enumerate(vocab)}

    @classmethod
    def build(cls, texts, specials=(), unk="<unk>", lowercase=False, eos=None, name="word"):
        probe = cls([], unk, lowercase, eos, name)
        counts = Counter(w for t in texts for w in probe.pieces(t))
        vocab = list(specials) + [w for w, _ in counts.most_common() if w not in specials]
        if unk not in vocab:
            vocab.append(unk)  # a split without OOV words still needs an id for them
        return cls(vocab, unk, lowercase, eos, name)

    def pieces(self, text: str) -> list[str]:
        words = WORD_RE.findall(text.lower()) if self.lowercase else text.split()
        return words + [self.eos] if self.eos else words

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def token_to_id(self, token: str) -> int:
        return self.ids[token]

    def encode_batch(self, texts) -> list[list[int]]:
        unk = self.ids[self.unk]
        return [[self.ids.get(w, unk) for w in self.pieces(t)] for t in texts]

    def decode(self, ids) -> str:
        """Ids back to text: the words joined by spaces, each end-of-line mark a newline."""
        words = [self.vocab[i] for i in ids]
        return " ".join(words).replace(f" {self.eos} ", "\n") if self.eos else " ".join(words)


class Subword:
    """A ``tokenizers.Tokenizer`` (BERT's WordPiece, or one trained here) behind the
    same three calls as ``Words``; no [CLS]/[SEP] are added implicitly."""

    def __init__(self, tok, name: str):
        self.tok, self.name = tok, name

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def token_to_id(self, token: str) -> int:
        return self.tok.token_to_id(token)

    def encode_batch(self, texts) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)


def hub_wordpiece(name: str = "bert-base-uncased") -> Subword:
    """BERT's uncased WordPiece (vocab 30,522, the paper's), through transformers."""
    transformers = need("transformers", f"the {name} tokenizer")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(name)
    except Exception as e:
        raise DataUnavailable(f"could not load the {name} tokenizer from the Hugging Face hub: "
                              f"{type(e).__name__}: {e}. Offline, use tokenizer='wordpiece' "
                              f"(trained on the training split) instead") from e
    return Subword(tok.backend_tokenizer, f"{name} (hub)")


def trained_wordpiece(texts: list[str], vocab_size: int, cache_dir: str | None, about: str) -> Subword:
    """A BERT-style uncased WordPiece trained on ``texts`` (the training split), cached
    by content so every run on the same text gets the same ids. The training itself is
    not reproducible across processes (huggingface/tokenizers#1794: ``##`` pieces get
    ids in hash-map order, which breaks merge ties), so the name carries the file's
    digest: two records with the same digest used the same vocabulary, and copying the
    cached file is how another machine gets it. A vocabulary shipped in tasks/engine/vocab/
    under the cache entry's name (the one the Wikitext-2 records of results/reference/
    read) is copied instead of trained, so every machine reads the same ids."""
    tk = need("tokenizers", "training a WordPiece tokenizer")
    path = cache_root(cache_dir) / f"wordpiece-{vocab_size}-{fingerprint(texts)}.json"

    def train(tmp: Path) -> None:
        if (SHIPPED_VOCAB / path.name).is_file():
            shutil.copyfile(SHIPPED_VOCAB / path.name, tmp)
            return
        tok = tk.Tokenizer(tk.models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = tk.normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
        tok.decoder = tk.decoders.WordPiece()
        tok.train_from_iterator(texts, tk.trainers.WordPieceTrainer(vocab_size=vocab_size,
                                                                   special_tokens=list(SPECIALS)))
        tok.save(str(tmp))
    build_once(path, train)
    # every run, the one that trained it included, uses the file: one tokenizer per cache entry
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return Subword(tk.Tokenizer.from_file(str(path)),
                   f"wordpiece trained on {about} (target vocab {vocab_size}, file sha256 {digest})")


def make_tokenizer(kind: str, train_texts: list[str], cache_dir: str | None, vocab_size: int,
                   about: str, **word_options):
    if kind == "word":
        return Words.build(train_texts, **word_options)
    if kind == "wordpiece":
        return trained_wordpiece(train_texts, vocab_size, cache_dir, about)
    if kind == "bert-base-uncased":
        return hub_wordpiece(kind)
    raise ValueError(f"unknown tokenizer {kind!r}; choose one of ['word', 'wordpiece', 'bert-base-uncased']")


def wikitext2_text(variant: str = "tokens", tokenizer: str = "word", data_dir: str | None = None,
                   cache_dir: str | None = None, wordpiece_vocab: int = 30522) -> tuple[dict, str, object]:
    """The lines of each split, where they came from, and the tokenizer a Wikitext-2 run
    reads them with (trained on, or built from, the training split): what
    ``load_wikitext2`` tokenizes, and what turns a prompt into ids and ids into text."""
    if tokenizer == "word" and variant != "tokens":
        raise ValueError("tokenizer='word' needs variant='tokens' (word-level Wikitext-2)")
    lines, source = wikitext_lines(variant, data_dir)
    if tokenizer != "word":  # word-level text marks rare words <unk>: make it the subword [UNK]
        lines = {s: [line.replace("<unk>", "[UNK]") for line in ls] for s, ls in lines.items()}
    word_level_train = variant == "tokens" or data_dir is not None
    tok = make_tokenizer(tokenizer, lines["train"], cache_dir, wordpiece_vocab,
                         f"the {'word-level ' if word_level_train else 'raw '}train split",
                         unk="<unk>", eos="<eos>", name="word (train split, <eos> per line)")
    return lines, source, tok


def load_wikitext2(variant: str = "tokens", tokenizer: str = "word", data_dir: str | None = None,
                   cache_dir: str | None = None, wordpiece_vocab: int = 30522) -> dict:
    """Token ids of the three splits (int32 tensors, one stream each) and what made
    them: ``{"train", "valid", "test", "vocab_size", "data_source", "tokenizer"}``.

    Word level: whitespace tokens + ``<eos>`` per line, vocabulary of the train split
    (33,278 types). Subword: each line's WordPiece ids, lines concatenated (the
    reproductions join lines and tokenize; WordPiece drops the newlines either way).
    """
    lines, source, tok = wikitext2_text(variant, tokenizer, data_dir, cache_dir, wordpiece_vocab)
    key = fingerprint("wikitext2", tok.name, tok.vocab_size, lines)  # by content: edited files re-tokenize
    ids = cached(cache_root(cache_dir) / f"wikitext2-{key}.pt", lambda: {
        s: torch.tensor([i for row in tok.encode_batch(lines[s]) for i in row], dtype=torch.int32)
        for s in SPLITS})
    return {**ids, "vocab_size": tok.vocab_size, "data_source": source, "tokenizer": tok.name}


def unigram_perplexity(train_ids: torch.Tensor, eval_ids: torch.Tensor, vocab_size: int) -> float:
    """Perplexity of ``eval_ids`` under the train split's add-one-smoothed unigram
    distribution: the bar any model that learned something from context must clear."""
    counts = torch.bincount(train_ids.long(), minlength=vocab_size).double() + 1
    logp = (counts / counts.sum()).log()
    return float(torch.exp(-logp[eval_ids.long()].mean()))


# ---------------------------------------------------------------- SNLI

def snli_splits(data_dir: str | None) -> tuple[dict[str, dict], dict]:
    """``{split: {"premise": [...], "hypothesis": [...], "label": [...]}}`` with labels
    0/1/2 (entailment/neutral/contradiction) and unlabelled pairs dropped, plus a dict
    saying which data each split is (an offline run trains on dev, and says so)."""
    if data_dir is None:
        splits = {}
        for s in SPLITS:
            ds = hub_split(SNLI_HUB, None, _HUB_SPLIT[s])
            cols = {k: list(ds[k]) for k in ("premise", "hypothesis", "label")}  # one read per column
            keep = [i for i, y in enumerate(cols["label"]) if y != -1]  # -1: no annotator majority
            splits[s] = {k: [v[i] for i in keep] for k, v in cols.items()}
        about = {s: f"hub:{SNLI_HUB}/{_HUB_SPLIT[s]}" for s in SPLITS}
        return splits, about
    root = Path(data_dir) / "snli"
    splits = {"train": read_tsv(root / "dev.tsv"), "valid": read_jsonl(root / "train_sample_1000.jsonl"),
              "test": read_tsv(root / "test.tsv")}
    about = {"train": f"local:{root / 'dev.tsv'} (offline substitute for the 550k train split)",
             "valid": f"local:{root / 'train_sample_1000.jsonl'} (the gold-labelled of the first 1,000 "
                      f"train pairs, held out from training)",
             "test": f"local:{root / 'test.tsv'}"}
    return splits, about


def read_tsv(path: Path) -> dict:
    with open(local_file(path), encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))  # fields are CSV-quoted
    return {"premise": [r["premise"] for r in rows], "hypothesis": [r["hypothesis"] for r in rows],
            "label": [int(r["label"]) for r in rows]}


def read_jsonl(path: Path) -> dict:
    with open(local_file(path), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r["gold_label"] in SNLI_LABELS]  # "-": no annotator majority
    return {"premise": [r["sentence1"] for r in rows], "hypothesis": [r["sentence2"] for r in rows],
            "label": [SNLI_LABELS[r["gold_label"]] for r in rows]}


# ---------------------------------------------------------------- batch order

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
