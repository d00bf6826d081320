"""The tokenizers a text task reads with: a word-level vocabulary of the training split,
BERT's WordPiece from the hub, or a WordPiece trained here (cached, or shipped in
``tasks/engine/vocab/`` for the reference runs), all behind the same three calls."""
from __future__ import annotations

import hashlib
import re
import shutil
from collections import Counter
from pathlib import Path

from .cache import build_once, cache_root, fingerprint
from .sources import DataUnavailable, need

# Trained WordPiece vocabularies the reference runs read, committed (training is not
# reproducible across processes: ``trained_wordpiece``).
SHIPPED_VOCAB = Path(__file__).resolve().parent / "vocab"
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # BERT's, in BERT's id order
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
