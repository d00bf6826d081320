"""MAD's synthetic capability suite (Poli et al. 2024, athms/mad-lab) on any zoo mixer.

One run trains one model on one setting of one of the six tasks (``tasks.mad.data``:
in-context, fuzzy and noisy recall, selective copying, compression, memorization) and
reports MAD's metric (``mad_metrics``: torchmetrics' macro accuracy over the scored positions
per test batch, at the evaluation of lowest test perplexity, as mad-lab's ``train.py``). MAD's
model is its width 128, two mixer layers each followed by an MLP, pre-norm residual
blocks: here the zoo LM with d_model 128, n_layers 2 and an MLP of 4 x d_model. As MAD,
compression runs the backbone as an encoder whose last state an MLP decodes back into
every position (``Compressor``); the other tasks score the LM head where targets are set.
MAD sweeps learning rate x weight decay per setting and keeps the best; its score is the
mean over the six tasks of each task's mean over its settings (``results.stats.mad_scores``).

Where the run differs from mad-lab's, on purpose: it evaluates ``train.eval_every`` steps
apart (MAD: every epoch), so "lowest perplexity" is over those evaluations; it stops once the
accuracy reaches ``train.target`` where one is set (MAD: at 0.999); a run that diverges is
recorded so, and scored as MAD would score it, at its evaluation of lowest perplexity before
(0 where none ran: ``results.stats.mad_runs``); and it trains with this
harness's recipe for every task: AdamW betas (0.9, 0.95), gradients clipped at 1, no decay of
norms, biases and what mixers mark (MAD: torch's betas (0.9, 0.999), no clipping, every
parameter decayed), the same for every mixer. The block around the mixer is the zoo's, as
in every task here, not MAD's (mad-lab's ``language_model.py`` and ``benchmark.py``): LayerNorm
(MAD: RMSNorm); a GELU MLP of 4 x d_model with biases (MAD's default channel mixer: SwiGLU
with no biases, 352 wide); the LM head tied to the embeddings (MAD: its own norm and a biased
Linear); torch's default initialisation (MAD: N(0, 0.02), zero biases); compression's code
vector read after the final norm (MAD: the last residual). Attention is mad-lab's
``attention.yml`` (one head, rotary over all 128 channels); its benchmark's default is
``mh-attention.yml`` (16 heads, rotary over 8), and which the published Transformer used is not
stated.

    python -m tasks mad --set task=selective-copying --set train.steps=500
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import zoo
from zoo.config import NOT_IN_ID, WHEN_SET, StrictConfig, check_bounds, check_choice
from zoo.model import ModelConfig, positions_for

from ..engine.batches import epoch_indices
from ..engine.cache import cached_examples
from ..engine.losses import labelled_batches, labelled_lm_loss, lm_loss
from ..engine.runs import checkpoint_path, model_metadata, refuse_non_causal, run_fields, score_best
from ..engine.train import TrainConfig, train
from .data import BASELINES, GENERATOR_VERSION, check, generate


@dataclass
class MADConfig(StrictConfig):
    seed: int = 0  # model init, data and batch order
    task: str = "in-context-recall"
    setting: dict = field(default_factory=dict)  # changes to the task's MAD baseline (BASELINES)
    # vocab_size and max_len: the setting's, applied by model_config (as wikitext2 takes its tokenizer's)
    model: ModelConfig = field(default_factory=lambda: ModelConfig(
        vocab_size=16, d_model=128, n_layers=2, max_len=128, d_ff=512, block="prenorm"))
    # MAD: AdamW, lr 5e-4 (swept with weight decay), cosine; its 200 epochs are a GPU's budget
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        steps=1000, batch_size=128, lr=5e-4, weight_decay=0.0, warmup_steps=0, min_lr_ratio=0.0, eval_every=250))
    # the cache root (tasks.engine.cache.cache_root); the data goes to its mad/
    cache_dir: str | None = field(default=None, metadata=NOT_IN_ID)
    eval_batch_size: int = 128  # MAD's test batches (its training batch): its accuracy is per batch
    # 0: MAD's protocol, every evaluation on test and the one of lowest perplexity reported.
    # > 0: that many fresh examples from a third seed stream pick the checkpoint (lowest
    # validation perplexity, MAD's rule on validation); test is read once, at that checkpoint.
    num_val_examples: int = field(default=0, metadata=WHEN_SET)

    def __post_init__(self):
        check_choice("MADConfig", "task", self.task, sorted(BASELINES))
        allowed = {*BASELINES[self.task]["baseline"], *BASELINES[self.task]["changes"]}
        unknown = sorted(set(self.setting) - allowed)
        if unknown:
            raise ValueError(f"MADConfig: setting has unknown field(s) {unknown} for task {self.task!r}; "
                             f"valid fields: {sorted(allowed)}")
        full = self.full_setting
        check(self.task, **{k: v for k, v in full.items() if k not in ("num_train_examples", "num_test_examples")})
        check_bounds(self, "seed", ge=0)
        for split in ("train", "test"):
            if not (isinstance(full[f"num_{split}_examples"], int) and full[f"num_{split}_examples"] > 0):
                raise ValueError(f"MADConfig: setting num_{split}_examples={full[f'num_{split}_examples']!r} "
                                 f"must be a positive integer")
        check_bounds(self, "eval_batch_size", gt=0)
        check_bounds(self, "num_val_examples", ge=0)

    @property
    def full_setting(self) -> dict:
        return {**BASELINES[self.task]["baseline"], **self.setting}

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.full_setting["seq_len"]

    def planned_tokens(self) -> int:
        """The tokens a run trains unless it stops early (``linbench status`` scales by it)."""
        return self.train.steps * self.tokens_per_step


# MAD's protocol (mad-lab's README and mad/configs.py): every setting at learning rates
# {1e-4, 5e-4, 1e-3} x weight decays {0, 0.1}, 200 epochs of batch 128, AdamW with a cosine
# to 1e-6 of the peak; the best of the six per setting is the setting's score.
MAD_LRS = (1e-4, 5e-4, 1e-3)
MAD_WEIGHT_DECAYS = (0.0, 0.1)
MAD_EPOCHS = 200
# MAD's layers (configs/layers/*.yml) in the zoo's options: one head rotating all of it for
# both attentions (the window 32, as MAD's), Mamba with 4 states, GLA with one head and its
# low-rank gate, RWKV-6 with heads of 16; positions come from the rotary, none are learned.
MAD_MIXER_OPTIONS = {
    "attention": {"n_heads": 1, "rotary": 128},
    "sliding_window": {"n_heads": 1, "rotary": 128, "window": 32},
    "mamba": {"d_state": 4, "d_conv": 4, "expand": 2},
    "gla": {"n_heads": 1, "expand_k": 1, "expand_v": 1, "gate_low_rank_dim": 16, "gate_logit_normalizer": 16},
    "rwkv6": {"head_size": 16},
}


def sweep_configs(mixer: str, settings: list[tuple[str, dict]], options: dict | None = None,
                  lrs=MAD_LRS, weight_decays=MAD_WEIGHT_DECAYS, epochs: int = MAD_EPOCHS,
                  max_steps: int | None = None, batch_size: int = 128, evals: int = 10,
                  warmup_steps: int = 0, target: float | None = None, seed: int = 0,
                  **overrides) -> list[MADConfig]:
    """One MADConfig per (setting, lr, weight decay) for ``mixer`` at MAD's model shape.
    ``settings``: (task, changes to its baseline) pairs, e.g. from ``mad_data.mad_settings``.
    Each run trains ``epochs`` epochs of its setting's training set (MAD's step count,
    which shrinks with the data), cut at ``max_steps`` where a budget demands (MAD has
    no warm-up; ``warmup_steps`` adds one), and evaluates ``evals`` times (stopping
    once the test accuracy reaches ``target``, where one is given); ``options``
    override ``MAD_MIXER_OPTIONS``; ``overrides`` replace top-level MADConfig fields
    (e.g. ``cache_dir``)."""
    opts = {**MAD_MIXER_OPTIONS.get(mixer, {}), **(options or {})}
    out = []
    for task, changes in settings:
        n_train = {**BASELINES[task]["baseline"], **changes}["num_train_examples"]
        steps = epochs * math.ceil(n_train / batch_size)
        steps = min(steps, max_steps) if max_steps else steps
        base = MADConfig(task=task, setting=dict(changes), seed=seed, **overrides)
        model = base.model.replace(mixer=mixer, mixer_options=opts, positions=positions_for(mixer, opts))
        for lr in lrs:
            for wd in weight_decays:
                train = base.train.replace(steps=steps, batch_size=batch_size, lr=lr, weight_decay=wd,
                                           min_lr_ratio=1e-6 / lr, eval_every=max(1, steps // evals),
                                           warmup_steps=warmup_steps, target=target)
                out.append(base.replace(model=model, train=train))
    return out


def model_config(cfg: MADConfig) -> ModelConfig:
    """The model the run builds: ``cfg.model`` at the setting's vocabulary and length."""
    return cfg.model.replace(vocab_size=cfg.full_setting["vocab_size"], max_len=cfg.full_setting["seq_len"])


def load_split(cfg: MADConfig, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The split's (inputs, targets), generated once and cached under a hash of its key."""
    setting = {**cfg.full_setting, "num_valid_examples": cfg.num_val_examples} if split == "valid" else cfg.full_setting
    key = {"version": GENERATOR_VERSION, "task": cfg.task, "setting": setting, "split": split, "seed": cfg.seed}
    return cached_examples(cfg.cache_dir, "mad", split, key, lambda: generate(cfg.task, setting, split, cfg.seed))


class Compressor(nn.Module):
    """MAD's compression model: the LM's blocks encode the sequence, the last position's
    state (which has seen every token) is the code, and a 2-layer MLP decodes the code
    plus a fixed sinusoidal position into each position's token."""

    def __init__(self, lm: zoo.LM, seq_len: int):
        super().__init__()
        d = lm.cfg.d_model
        self.lm = lm
        self.decoder = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(),
                                     nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))
        self.unembed = nn.Linear(d, lm.cfg.vocab_size)
        pos = torch.arange(seq_len)[:, None] / 10_000 ** (torch.arange(0, d, 2) / d)  # (L, D/2)
        self.register_buffer("positions", torch.cat([pos.sin(), pos.cos()], -1), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, L) -> (B, L, V)
        code = self.lm.features_embedded(self.lm.embed(tokens))[:, -1]  # (B, D)
        L = tokens.shape[1]
        return self.unembed(self.decoder(code[:, None] + self.positions[:L]))


@torch.no_grad()
def mad_metrics(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int,
                num_classes: int) -> dict:
    """MAD's test metrics (mad-lab: mad/metrics.py, mad/model/pl_model_wrapper.py). Per test
    batch: torchmetrics' MulticlassAccuracy at its default average="macro" (each class's share
    of its scored positions predicted right, averaged over the classes that occur as a target or
    as a prediction, so a class predicted but never a target counts 0) and its Perplexity (exp
    of the batch's mean loss); each averaged over the batches weighted by their sequences, as
    Lightning logs an epoch. Beside them the pooled accuracy over every scored position
    (``tasks.engine.losses.labelled_accuracy``'s). The two part where a class is rare in a batch
    (memorization's large vocabularies) and, far more, while a model still predicts tokens
    that are never answers (keys, noise): each such class adds a 0 to the macro mean."""
    acc = ppl = weight = correct = total = 0.0
    for n, picked, labels in labelled_batches(model, inputs, targets, batch_size):
        if not len(labels):
            continue  # MAD's test sequences all have answers (torchmetrics would score such a batch 0)
        pred = picked.argmax(-1)
        support = torch.bincount(labels, minlength=num_classes)  # tp + fn per class
        hits = torch.bincount(labels[pred == labels], minlength=num_classes)  # tp
        present = (support + torch.bincount(pred, minlength=num_classes)) > 0  # tp + fp + fn > 0
        acc += n * (hits / support.clamp(min=1))[present].mean().item()
        ppl += n * F.cross_entropy(picked, labels).exp().item()
        weight += n
        correct, total = correct + hits.sum().item(), total + len(labels)
    if not weight:
        raise ValueError("mad_metrics: the test split has no scored position (every target is -100)")
    return {"accuracy": acc / weight, "perplexity": ppl / weight, "pooled_accuracy": correct / total}


def mad_reported(history: list) -> dict:
    """The evaluation MAD reports: mad-lab's ``train.py`` keeps the checkpoint of lowest test
    perplexity and validates that one at the end. Empty when nothing was evaluated."""
    finite = [h for h in history if math.isfinite(h.get("perplexity", math.nan))]
    return min(finite, key=lambda h: h["perplexity"]) if finite else {}


def run(cfg: MADConfig, workdir: Path | None = None, progress: bool = True) -> dict:
    train_x, train_y = load_split(cfg, "train")
    test_x, test_y = load_split(cfg, "test")
    lm = zoo.build_model(model_config(cfg), seed=cfg.seed)
    refuse_non_causal(lm, "mad")
    compress = cfg.task == "compression"
    torch.manual_seed(cfg.seed)  # the compression decoder's init
    model = Compressor(lm, train_x.shape[1]) if compress else lm
    pick = epoch_indices(len(train_x), cfg.train.batch_size, cfg.seed)
    setting = cfg.full_setting
    def batch_fn(step: int):
        idx = pick(step)
        return train_x[idx], train_y[idx]

    validate = bool(cfg.num_val_examples)
    # with a validation split the loop keeps the checkpoint of lowest validation perplexity
    select_x, select_y = load_split(cfg, "valid") if validate else (test_x, test_y)
    res = train(model, cfg.train, batch_fn,
                lm_loss if compress else labelled_lm_loss,  # the compressor: (B, L, V), IGNORE is -100
                eval_fn=lambda m: mad_metrics(m, select_x, select_y, cfg.eval_batch_size, lm.cfg.vocab_size),
                metric="perplexity" if validate else "accuracy",
                higher_is_better=not validate, checkpoint=checkpoint_path(workdir), progress=progress,
                tokens_per_step=cfg.tokens_per_step, desc=f"mad {cfg.task} {lm.cfg.name}")
    steps_per_epoch = math.ceil(len(train_x) / cfg.train.batch_size)
    reported = mad_reported(res.history)
    if validate:  # test once, at the checkpoint validation chose
        tested = score_best(model, res, cfg.train,
                            lambda m: mad_metrics(m, test_x, test_y, cfg.eval_batch_size, lm.cfg.vocab_size)) or {}
        selection = {"selected_on": "validation", "best_val_accuracy": reported.get("accuracy"),
                     "val_perplexity": reported.get("perplexity"), "accuracy": tested.get("accuracy"),
                     "perplexity": tested.get("perplexity"), "pooled_accuracy": tested.get("pooled_accuracy")}
    else:  # MAD's protocol: the evaluation on test of lowest perplexity
        selection = {"selected_on": "test", "accuracy": reported.get("accuracy"),
                     "perplexity": reported.get("perplexity"), "pooled_accuracy": reported.get("pooled_accuracy"),
                     "best_accuracy": res.best,
                     "final_accuracy": (res.history[-1] if res.history else {}).get("accuracy")}
    return {
        "task": "mad", "mad_task": cfg.task, **run_fields(res, cfg.train, cfg.seed),
        "setting": json.dumps(setting, sort_keys=True), **{f"mad_{k}": v for k, v in setting.items()},
        "mixer": lm.cfg.name, "layout": lm.cfg.layout,
        "mixer_options": json.dumps(lm.cfg.mixer_options, sort_keys=True),
        "d_model": lm.cfg.d_model, "n_layers": lm.cfg.n_layers, "vocab_size": lm.cfg.vocab_size,
        "lr": cfg.train.lr, "weight_decay": cfg.train.weight_decay,
        # MAD's number: the accuracy at the lowest perplexity (not the best accuracy seen)
        **selection, "reported_step": reported.get("step"), "num_val_examples": cfg.num_val_examples,
        "train_loss": res.final_loss, "epochs_seen": res.steps / steps_per_epoch,
        **model_metadata(lm, setting["seq_len"]),
    }
