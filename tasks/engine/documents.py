"""Any text corpus as token ids: documents from a Hugging Face dataset by name (streamed,
so a corpus larger than the disk is read only as far as a run needs) or from local
.txt / .jsonl / .parquet files, tokenized once into a memory-mapped array per split and
cached under a key of everything that made it.

A source is ``hf:NAME[:CONFIG][@SPLIT]`` (split "train" unless given) or a local file,
folder or glob. A .txt file is a document per non-empty line; .jsonl and .parquet hold a
document per row, in the column ``text_field``. Validation and test documents come from
their own sources or, when none is given, are held out of the training source: of every
``m`` documents, the last goes to test and the one before it to validation (m =
round(1 / holdout)), a rule that needs no pass over the corpus first.
"""
from __future__ import annotations

import glob
import json
import os
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from .cache import build_once, cache_root, fingerprint
from .sources import DataUnavailable, need
from .tokenizers import Subword, trained_wordpiece

SUFFIXES = (".txt", ".jsonl", ".parquet")
BATCH_DOCS = 512  # documents tokenized per call


def local_files(spec: str) -> list[Path]:
    """The files of a local source: a file, every corpus file under a folder, or a glob."""
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES)
    elif path.is_file():
        files = [path]
    else:
        files = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True))
    files = [p for p in files if p.is_file()]
    if not files:
        raise DataUnavailable(f"corpus source {spec!r}: no {'/'.join(SUFFIXES)} file there")
    bad = [p.name for p in files if p.suffix not in SUFFIXES]
    if bad:
        raise ValueError(f"corpus source {spec!r}: {bad[:3]} are not one of {list(SUFFIXES)}")
    return files


def _hub(spec: str) -> tuple[str, str | None, str]:
    """"hf:NAME[:CONFIG][@SPLIT]" -> (name, config, split)."""
    body, _, split = spec[3:].partition("@")
    name, _, config = body.partition(":")
    return name, config or None, split or "train"


def documents(spec: str, text_field: str = "text") -> Iterator[str]:
    """Every document of a source, in order."""
    if spec.startswith("hf:"):
        name, config, split = _hub(spec)
        datasets = need("datasets", "a corpus from the Hugging Face hub")
        try:
            rows = datasets.load_dataset(name, config, split=split, streaming=True)
        except Exception as e:
            raise DataUnavailable(f"could not stream {spec!r} from the Hugging Face hub: {type(e).__name__}: {e}; "
                                  f"a local copy (.txt, .jsonl or .parquet) is read by its path") from e
        for row in rows:
            yield row[text_field]
        return
    for path in local_files(spec):
        if path.suffix == ".txt":
            with open(path, encoding="utf-8") as f:
                yield from (line.rstrip("\n") for line in f if line.strip())
        elif path.suffix == ".jsonl":
            with open(path, encoding="utf-8") as f:
                for i, line in enumerate(f):
                    if line.strip():
                        row = json.loads(line)
                        if text_field not in row:
                            raise ValueError(f"{path}:{i + 1}: no field {text_field!r} (text_field); it has {sorted(row)}")
                        yield row[text_field]
        else:
            need("pyarrow", "reading parquet files")
            import pyarrow.parquet as pq
            table = pq.ParquetFile(path)
            if text_field not in table.schema_arrow.names:
                raise ValueError(f"{path}: no column {text_field!r} (text_field); it has {table.schema_arrow.names}")
            for batch in table.iter_batches(columns=[text_field]):
                yield from batch.column(0).to_pylist()


def check_source(spec: str, text_field: str, name: str = "source") -> None:
    """Refuse a local source with no corpus file, or whose first .jsonl / .parquet file
    has no ``text_field``, while the run can still be left unsent: in a job it fails only
    once it starts. Reads one record of a .jsonl file and a .parquet file's schema (its
    footer), whatever their size; the first file of each format stands for the rest.
    A hub source is not looked up: that is a network call per config."""
    if spec.startswith("hf:"):
        return
    try:
        files = local_files(spec)
    except DataUnavailable:
        raise ValueError(f"{name}={spec!r}: no {'/'.join(SUFFIXES)} file there; give a local file, folder or "
                         f"glob, or hf:NAME[:CONFIG][@SPLIT]") from None
    except ValueError as e:  # files of another format
        raise ValueError(f"{name}={spec!r}: {str(e).removeprefix(f'corpus source {spec!r}: ')}") from None
    for suffix in (".jsonl", ".parquet"):
        path = next((p for p in files if p.suffix == suffix), None)
        if path is None:
            continue
        if suffix == ".jsonl":
            with open(path, encoding="utf-8") as f:
                number, line = next(((i + 1, line) for i, line in enumerate(f) if line.strip()), (0, ""))
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{name}={spec!r}: {path}:{number} is not a JSON line ({e})") from None
            columns = sorted(row) if isinstance(row, dict) else []
        else:
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise ValueError(f"{name}={spec!r}: reading {path.name} needs the `pyarrow` package: "
                                 "pip install -e '.[nlp]'") from None
            columns = pq.read_schema(path).names
        if text_field not in columns:
            raise ValueError(f"text_field={text_field!r} is not a column of {path} ({name}); it has {columns}")


def split_documents(source: str, split: str, text_field: str, holdout: float,
                    own: str | None = None) -> Iterator[str]:
    """The documents of ``split`` ("train", "valid" or "test"): its own source, or its
    share of the training source (module docstring)."""
    if own:
        yield from documents(own, text_field)
        return
    m = max(3, round(1 / holdout))
    keep = {"train": lambda i: i % m < m - 2, "valid": lambda i: i % m == m - 2, "test": lambda i: i % m == m - 1}[split]
    yield from (doc for i, doc in enumerate(documents(source, text_field)) if keep(i))


def source_key(spec: str | None) -> object:
    """What identifies a source's content for the cache: a hub name as given, local files
    by name, size and modification time (an edited file is tokenized again)."""
    if not spec or spec.startswith("hf:"):
        return spec
    return [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in local_files(spec)]


def tokenizer_for(kind: str, train_docs: Iterator[str], vocab_size: int, sample_docs: int,
                  cache_dir: str | None, about: str) -> Subword:
    """"wordpiece": an uncased WordPiece of ``vocab_size`` trained here on the first
    ``sample_docs`` training documents (cached by content); a path to a ``tokenizer.json``
    (the ``tokenizers`` format: GPT-2's BPE, say, saved where the cluster can read it);
    ``hub:NAME``: ``tokenizers.Tokenizer.from_pretrained(NAME)``."""
    tk = need("tokenizers", "a corpus tokenizer")
    if kind == "wordpiece":
        texts = [doc for _, doc in zip(range(sample_docs), train_docs)]
        return trained_wordpiece(texts, vocab_size, cache_dir, about)
    if kind.startswith("hub:"):
        try:
            return Subword(tk.Tokenizer.from_pretrained(kind[4:]), kind)
        except Exception as e:
            raise DataUnavailable(f"could not load tokenizer {kind[4:]!r} from the hub: {type(e).__name__}: {e}; "
                                  f"save its tokenizer.json and give the path instead") from e
    path = Path(kind).expanduser()
    if not path.is_file():
        raise ValueError(f"tokenizer={kind!r} is not valid: 'wordpiece', 'hub:NAME' or the path of a "
                         f"tokenizer.json, and there is no file {path}")
    return Subword(tk.Tokenizer.from_file(str(path)), f"{path.name} ({path.stat().st_size} bytes)")


def separator(tok: Subword) -> list[int]:
    """The id that ends a document in the stream, when the tokenizer has one."""
    for name in ("<|endoftext|>", "</s>", "[SEP]", "<eos>"):
        i = tok.token_to_id(name)
        if i is not None:
            return [i]
    return []


def tokenize_to_file(docs: Iterator[str], tok: Subword, path: Path, max_tokens: int | None) -> Path:
    """Token ids of ``docs`` (a separator after each) written once to ``path`` as raw
    uint16 (uint32 past 65,535 types), at most ``max_tokens``; the cache's lock makes
    concurrent ranks wait for the one that writes."""
    dtype = np.uint16 if tok.vocab_size <= 65535 else np.uint32
    sep = separator(tok)

    def write(tmp: Path) -> None:
        written = 0
        with open(tmp, "wb") as f:
            batch = []
            for doc in docs:
                batch.append(doc)
                if len(batch) == BATCH_DOCS:
                    written += _flush(f, tok, batch, sep, dtype, max_tokens, written)
                    batch = []
                    if max_tokens is not None and written >= max_tokens:
                        return
            _flush(f, tok, batch, sep, dtype, max_tokens, written)
    return build_once(path, write)


def _flush(f, tok: Subword, batch: list[str], sep: list[int], dtype, max_tokens, written: int) -> int:
    ids = [i for row in tok.encode_batch(batch) for i in (*row, *sep)] if batch else []
    if max_tokens is not None:
        ids = ids[:max(0, max_tokens - written)]
    f.write(np.asarray(ids, dtype=dtype).tobytes())
    return len(ids)


def load_ids(path: Path, vocab_size: int) -> torch.Tensor:
    """The token ids of a split, memory-mapped read-only: a batch reads only its own
    chunks (``Chunks.get`` indexes the map and widens those to int64)."""
    dtype = np.uint16 if vocab_size <= 65535 else np.uint32
    ids = np.memmap(path, dtype=dtype, mode="r")
    if len(ids) < 2:
        raise DataUnavailable(f"{path}: {len(ids)} tokens; a split needs at least 2")
    with warnings.catch_warnings():  # read-only map: nothing here writes to it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(ids)


def load_corpus(source: str, valid_source: str | None, test_source: str | None, text_field: str,
                holdout: float, tokenizer: str, vocab_size: int, tokenizer_docs: int,
                max_train_tokens: int | None, max_eval_tokens: int | None, cache_dir: str | None) -> dict:
    """``{"train", "valid", "test"}`` token id streams (memory-mapped), the vocabulary size,
    the tokenizer's name and where the data came from."""
    root = cache_root(cache_dir) / "corpus"
    root.mkdir(parents=True, exist_ok=True)
    own = {"train": None, "valid": valid_source, "test": test_source}
    tok = tokenizer_for(tokenizer, split_documents(source, "train", text_field, holdout), vocab_size,
                        tokenizer_docs, cache_dir, f"the first {tokenizer_docs:,} training documents of {source}")
    streams = {}
    for split in ("train", "valid", "test"):
        limit = max_train_tokens if split == "train" else max_eval_tokens
        key = fingerprint("corpus", source_key(source), source_key(own[split]), split, text_field, holdout,
                          tok.name, tok.vocab_size, limit)
        path = tokenize_to_file(split_documents(source, split, text_field, holdout, own[split]), tok,
                                root / f"{split}-{key}.bin", limit)
        streams[split] = load_ids(path, tok.vocab_size)
    held = f", valid/test held out 1 in {max(3, round(1 / holdout))} documents each" \
        if not (valid_source and test_source) else ""
    return {**streams, "vocab_size": tok.vocab_size, "tokenizer": tok.name,
            "data_source": f"{source}{held}" + (f", valid {valid_source}" if valid_source else "")
                           + (f", test {test_source}" if test_source else "")}
