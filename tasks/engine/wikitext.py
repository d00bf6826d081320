"""The Wikitext-2 corpus: each split's lines from the hub or a local copy, tokenized once
and cached, and the unigram bar a language model must clear."""
from __future__ import annotations

from pathlib import Path

import torch

from .cache import cache_root, cached, fingerprint
from .sources import HUB_SPLIT, SPLITS, hub_split, read_lines
from .tokenizers import make_tokenizer

WIKITEXT_HUB = "Salesforce/wikitext"
WIKITEXT_CONFIGS = {"tokens": "wikitext-2-v1", "raw": "wikitext-2-raw-v1"}


def wikitext_lines(variant: str, data_dir: str | None) -> tuple[dict[str, list[str]], str]:
    """The lines of each split and where they came from. One line = one row of the
    hub's dataset = one line of the official files (blank lines included)."""
    if data_dir is None:
        config = WIKITEXT_CONFIGS[variant]
        lines = {s: list(hub_split(WIKITEXT_HUB, config, HUB_SPLIT[s])["text"]) for s in SPLITS}
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
