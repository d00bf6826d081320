"""Multi-query associative recall (MQAR), with the semantics of Zoology (Arora, Eyuboglu
et al., 2023, HazyResearch/zoology ``multiquery_ar``).

A sequence of length L holds ``kv`` key-value pairs first, then each key once more as a
query; the model must output the key's value right at the query:

    k1 v1 k2 v2 .. | x x k2 x x x k1 x ..     inputs (x: random tokens)
     -  -  -  -    | - - v2 - - - v1 - ..     labels (-100 = ignored)

Keys are drawn without replacement from [1, V/2), values from [V/2, V). The query of
each key sits on one of the even slots after the pairs; slots are drawn without
replacement with P(gap g) ~ (g + 1)^(a - 1), a = 0.01 (Zoology's power law: most
queries come soon after the pairs, a few far). The metric is accuracy over the query
positions only. A mixer with a receptive field shorter than the key-query distance
cannot solve it; a mixer with too small a state cannot hold kv pairs.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import zoo
from zoo.config import NOT_IN_ID, WHEN_SET, StrictConfig, check_bounds
from zoo.model import ModelConfig, positions_for

from ..engine.batches import epoch_indices
from ..engine.cache import cached_examples
from ..engine.losses import labelled_accuracy, labelled_lm_loss
from ..engine.runs import checkpoint_path, model_metadata, refuse_non_causal, run_fields, score_best
from ..engine.train import TrainConfig, train
from .data import GENERATOR_VERSION, check_mqar, mqar_examples


@dataclass
class MQARConfig(StrictConfig):
    seed: int = 0  # model init, data and batch order
    # The defaults are the local CPU recipe (LOCAL_GRID's first point): attention reaches
    # 0.99 in ~650 steps, under a minute of one CPU core. Zoology's scale: ZOOLOGY_FIG2_GRID.
    model: ModelConfig = field(default_factory=lambda: ModelConfig(
        vocab_size=128, d_model=64, n_layers=2, max_len=64, d_ff=0, mixer_options={"n_heads": 1}))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        steps=1500, batch_size=64, lr=3e-3, warmup_steps=30, eval_every=50, target=0.99))
    seq_len: int = 64
    num_kv_pairs: int = 4
    vocab_size: int = 128
    num_train_examples: int = 20_000
    num_test_examples: int = 1_000
    # 0: Zoology's protocol, every evaluation on test and the best one reported. > 0: that
    # many fresh examples from a third seed stream pick the checkpoint (and stop the run at
    # the target); test is read once, at that checkpoint.
    num_val_examples: int = field(default=0, metadata=WHEN_SET)
    power_a: float = 0.01
    random_non_queries: bool = True  # fill the unused slots with random tokens (else 0)
    # the cache root (tasks.engine.cache.cache_root); the data goes to its mqar/
    cache_dir: str | None = field(default=None, metadata=NOT_IN_ID)
    eval_batch_size: int = 256

    def __post_init__(self):
        check_mqar(self.seq_len, self.num_kv_pairs, self.vocab_size)
        if self.model.vocab_size != self.vocab_size:
            raise ValueError(f"MQARConfig: model.vocab_size={self.model.vocab_size} must equal "
                             f"vocab_size={self.vocab_size}")
        if self.model.positions == "learned" and self.model.max_len < self.seq_len:
            raise ValueError(f"MQARConfig: model.max_len={self.model.max_len} is shorter than "
                             f"seq_len={self.seq_len}")
        check_bounds(self, "seed", ge=0)  # numpy's SeedSequence takes no negative seed
        check_bounds(self, "num_train_examples", "num_test_examples", "eval_batch_size", "power_a", gt=0)
        check_bounds(self, "num_val_examples", ge=0)

    def data_key(self, split: str) -> dict:
        """Everything the generated data depends on (and nothing else)."""
        n = {"train": self.num_train_examples, "valid": self.num_val_examples}.get(split, self.num_test_examples)
        return {"version": GENERATOR_VERSION, "split": split, "num_examples": n, "seq_len": self.seq_len,
                "num_kv_pairs": self.num_kv_pairs, "vocab_size": self.vocab_size, "seed": self.seed,
                "power_a": self.power_a, "random_non_queries": self.random_non_queries}

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.seq_len

    def planned_tokens(self) -> int:
        """The tokens a run trains unless it stops early (``linbench status`` scales by it)."""
        return self.train.steps * self.tokens_per_step


def load_split(cfg: MQARConfig, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The split's (inputs, labels), generated once and cached under a hash of its key."""
    key = cfg.data_key(split)
    return cached_examples(cfg.cache_dir, "mqar", split, key,
                           lambda: mqar_examples(**{k: v for k, v in key.items() if k != "version"}))


def run(cfg: MQARConfig, workdir: Path | None = None, progress: bool = True) -> dict:
    t0 = time.perf_counter()
    train_x, train_y = load_split(cfg, "train")
    test_x, test_y = load_split(cfg, "test")
    model = zoo.build_model(cfg.model, seed=cfg.seed)
    refuse_non_causal(model, "mqar")
    pick = epoch_indices(len(train_x), cfg.train.batch_size, cfg.seed)

    def batch_fn(step: int):
        idx = pick(step)
        return train_x[idx], train_y[idx]

    # the split that picks the checkpoint: a validation split when the config asks for one
    select_x, select_y = load_split(cfg, "valid") if cfg.num_val_examples else (test_x, test_y)
    res = train(model, cfg.train, batch_fn, labelled_lm_loss,
                eval_fn=lambda m: labelled_accuracy(m, select_x, select_y, cfg.eval_batch_size),
                metric="accuracy", higher_is_better=True, checkpoint=checkpoint_path(workdir), progress=progress,
                tokens_per_step=cfg.tokens_per_step,
                desc=f"mqar {cfg.model.mixer} L={cfg.seq_len} kv={cfg.num_kv_pairs}")
    last = res.history[-1] if res.history else {}
    if cfg.num_val_examples:
        tested = score_best(model, res, cfg.train, lambda m: labelled_accuracy(m, test_x, test_y, cfg.eval_batch_size))
        selection = {"selected_on": "validation", "best_val_accuracy": res.best,
                     "accuracy": None if tested is None else tested["accuracy"],  # test, read once
                     "test_loss": None if tested is None else tested.get("test_loss"),
                     "final_val_accuracy": last.get("accuracy")}
    else:  # Zoology's protocol: the best of the evaluations on test
        selection = {"selected_on": "test", "accuracy": res.best, "final_accuracy": last.get("accuracy"),
                     "test_loss": last.get("test_loss")}
    return {
        "task": "mqar", **run_fields(res, cfg.train, cfg.seed),
        "mixer": cfg.model.name, "layout": cfg.model.layout,
        "mixer_options": json.dumps(cfg.model.mixer_options, sort_keys=True),
        "d_model": cfg.model.d_model, "n_layers": cfg.model.n_layers, "lr": cfg.train.lr,
        "seq_len": cfg.seq_len, "num_kv_pairs": cfg.num_kv_pairs, "vocab_size": cfg.vocab_size,
        **selection, "num_val_examples": cfg.num_val_examples,
        "train_loss": res.final_loss, "stopped_early": res.stopped_early,
        "tokens_seen": res.steps * cfg.tokens_per_step,
        **model_metadata(model, cfg.seq_len),
        "mixer_state_size": model.blocks[0].mixer.state_size(cfg.seq_len),
        "total_time": time.perf_counter() - t0,
    }


# Grids as data; ``grid_configs`` (or a sweep file) turns them into MQARConfigs.
# As in Zoology, blocks have no MLP (d_ff=0), attention has one head and learned
# positions, and the recurrent mixers get no position embeddings; the sliding window,
# absent from Zoology's figure, gets them too, as softmax attention needs them to see
# order (``positions_for``). ``mixer_options`` are the recipe's settings for named
# mixers, ``mixer_n_layers`` their depths where they differ from ``n_layers``; any
# other mixer keeps its own defaults.
ZOOLOGY_RECIPE = {
    "d_ff": 0, "n_layers": 2,
    "mixer_options": {"attention": {"n_heads": 1}, "sliding_window": {"n_heads": 1}},
}


# Runs on CPU in minutes: ~1 min per (mixer, point, lr) on one core.
LOCAL_GRID = {
    **ZOOLOGY_RECIPE,
    "points": [{"seq_len": 64, "num_kv_pairs": 4, "vocab_size": 128, "batch_size": 64},
               {"seq_len": 128, "num_kv_pairs": 8, "vocab_size": 256, "batch_size": 64}],
    "d_model": [64],
    "lr": [1e-3, 3e-3],
    "train": {"steps": 1500, "warmup_steps": 30, "eval_every": 50, "target": 0.99},
    "num_train_examples": 20_000, "num_test_examples": 1_000,
}

# Zoology (Arora et al., 2023) Figure 2, as its config file (experiments/
# iclr24_zoology_figure2/configs.py) builds it: 100k train / 3k test examples, batch size
# by L, 64 epochs with a cosine decay to 0, early stop at 0.99 accuracy, evaluated every
# epoch; 2 layers for attention and 4 for every other mixer; the free slots filled with
# zeros (random_non_queries=False). The one definition: sweeps/shipped/mqar.py runs it.
ZOOLOGY_FIG2_GRID = {
    **ZOOLOGY_RECIPE,
    "n_layers": 4, "mixer_n_layers": {"attention": 2},
    "points": [{"seq_len": 64, "num_kv_pairs": 4, "vocab_size": 8192, "batch_size": 512},
               {"seq_len": 128, "num_kv_pairs": 8, "vocab_size": 8192, "batch_size": 512},
               {"seq_len": 256, "num_kv_pairs": 16, "vocab_size": 8192, "batch_size": 256},
               {"seq_len": 512, "num_kv_pairs": 64, "vocab_size": 8192, "batch_size": 128}],
    "d_model": [64, 128, 256, 512],
    "lr": [float(x) for x in np.logspace(-4, -2, 4)],
    "epochs": 64,
    "train": {"warmup_steps": 0, "min_lr_ratio": 0.0, "target": 0.99},
    "num_train_examples": 100_000, "num_test_examples": 3_000,
    # Zoology's generator fills the free slots with random tokens by default; its
    # figure-2 config file passes random_non_queries=False.
    "random_non_queries": False,
}


# Zoology's figure scaled to a 2-core CPU (sweeps/shipped/mqar_cpu.py), sized from measured runs
# (README): its first three (L, kv) points; widths 32 and 64 (one-head attention needed
# several times the steps at 128); three learning rates, logspace(-3, -2, 3) (Zoology's
# steps of 4.6x straddled the one that works for attention at d 64 within budget); 2
# layers for every mixer; vocab 512; batch 64 and a step budget per L. Two changes to its
# schedule: 30 warm-up steps (without them attention at lr 1e-2 never left the uniform
# guess) and random tokens in the free slots (its generator's default; the figure-2 file
# passes zeros).
CPU_GRID = {
    **{k: v for k, v in ZOOLOGY_FIG2_GRID.items() if k not in ("epochs", "mixer_n_layers")},
    "n_layers": 2,
    "points": [{"seq_len": L, "num_kv_pairs": L // 16, "vocab_size": 512, "batch_size": 64, "train": {"steps": steps}}
               for L, steps in ((64, 2000), (128, 2000), (256, 2500))],
    "d_model": [32, 64],
    "lr": [float(x) for x in np.logspace(-3, -2, 3)],
    "train": {**ZOOLOGY_FIG2_GRID["train"], "warmup_steps": 30, "eval_every": 100},
    "num_test_examples": 1_000,
    "random_non_queries": True,
}


def grid_configs(grid: dict, mixer: str, mixer_options: dict | None = None, seed: int = 0,
                 model_overrides: dict | None = None, **overrides) -> list[MQARConfig]:
    """One MQARConfig per (point, d_model, lr) of ``grid`` for ``mixer``. A point's own
    ``train`` entries (e.g. its step budget) override the grid's; ``model_overrides``
    replace ModelConfig fields (e.g. ``hybrid``, ``n_layers``); ``overrides`` replace top-level
    MQARConfig fields (e.g. ``cache_dir``)."""
    options = {**grid["mixer_options"].get(mixer, {}), **(mixer_options or {})}
    positions = positions_for(mixer, options)
    n_layers = grid.get("mixer_n_layers", {}).get(mixer, grid["n_layers"])
    out = []
    for point in grid["points"]:
        L, V, bs = point["seq_len"], point["vocab_size"], point["batch_size"]
        n_train = grid["num_train_examples"]
        train_kw = dict(grid["train"], batch_size=bs)
        if "epochs" in grid:  # Zoology counts epochs and evaluates after each one
            per_epoch = n_train // bs
            train_kw.update(steps=grid["epochs"] * per_epoch, eval_every=per_epoch)
        train_kw.update(point.get("train", {}))
        for d_model in grid["d_model"]:
            for lr in grid["lr"]:
                model = ModelConfig(**{"vocab_size": V, "d_model": d_model, "n_layers": n_layers, "max_len": L,
                                       "d_ff": grid["d_ff"], "mixer": mixer, "mixer_options": options,
                                       "positions": positions, **(model_overrides or {})})
                out.append(MQARConfig(seed=seed, model=model, train=TrainConfig(**train_kw, lr=lr),
                                      seq_len=L, num_kv_pairs=point["num_kv_pairs"], vocab_size=V,
                                      num_train_examples=n_train,
                                      num_test_examples=grid["num_test_examples"],
                                      random_non_queries=grid.get("random_non_queries", True), **overrides))
    return out


COLUMNS = ["mixer", "mixer_options", "seq_len", "num_kv_pairs", "d_model", "lr", "accuracy",
           "steps", "state_size", "params", "wall_time", "status"]


def main(argv=None) -> None:
    from ..engine.cli import format_table, parse_mixers

    p = argparse.ArgumentParser(description="MQAR on the local CPU recipe (see MQARConfig).")
    p.add_argument("--mixers", default="attention,sliding_window:window=4",
                   help="comma-separated name[:option=value...], e.g. sliding_window:window=4")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--kv", type=int, default=4, help="key-value pairs per sequence")
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--workdir", type=Path, default=None, help="checkpoints go to WORKDIR/<mixer>/")
    args = p.parse_args(argv)
    rows = []
    base = MQARConfig()
    for name, options in parse_mixers(args.mixers):
        positions = positions_for(name)
        options = {**ZOOLOGY_RECIPE["mixer_options"].get(name, {}), **options}
        model = base.model.replace(vocab_size=args.vocab, d_model=args.d_model, max_len=args.seq_len,
                                   mixer=name, mixer_options=options, positions=positions)
        cfg = base.replace(seed=args.seed, model=model, seq_len=args.seq_len, num_kv_pairs=args.kv,
                           vocab_size=args.vocab, cache_dir=args.cache_dir,
                           train=base.train.replace(steps=args.steps, lr=args.lr, device=args.device,
                                                    batch_size=args.batch_size))
        workdir = args.workdir / f"{name}-{len(rows)}" if args.workdir else None
        rows.append(run(cfg, workdir=workdir))
    print(format_table(rows, COLUMNS))
