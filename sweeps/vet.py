"""``linbench vet MIXER``: a researcher's mixer through linbench in one command, ending in a
report card (``results.card``).

First the correctness checks (``zoo.checks``), in this process: a mixer that reads the
future, does not return its update, gives NaN gradients or whose step form disagrees with
its parallel form gets a card that says which check failed, and nothing is trained. Then
its stages run as an ordinary sweep (resumable, local or Slurm, records under
RESULTS_DIR/vet/<mixer>/<budget>/): recall (MQAR beside attention and the sliding window,
the controls), capabilities (MAD's six tasks beside attention), language modelling
(Wikitext-2, parameter-matched to attention) and cost (the training step against L beside
attention and ``--against``).
A budget sizes all of it; the card's first line names the budget, seeds, hardware and
commit.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path

import zoo
from tasks.benchmarks.scaling import ScalingConfig
from tasks.engine.runs import cpu_name, provenance
from tasks.engine.train import TrainConfig
from tasks.mad.data import BASELINES
from tasks.mad.task import sweep_configs
from tasks.mqar.task import MQARConfig
from tasks.wikitext2 import paper_model_config, preset_config

from .launch import launch
from .spec import RunConfig, Sweep, local_data_dir, matched_models, validate

CONTROLS = {"attention": {"n_heads": 1}, "sliding_window": {"n_heads": 1, "window": 16}}  # Zoology's MQAR setup


@dataclass(frozen=True)
class Budget:
    note: str  # what the budget can and cannot say, the card's first line
    seeds: tuple
    seq_len: int  # MQAR
    kv_pairs: int
    widths: tuple
    steps: int
    lrs: tuple
    train_examples: int
    scaling: dict  # ScalingConfig fields: d_model, min_len, max_len, tokens, repeats
    mad_steps: int  # each of MAD's six tasks at its baseline, examples capped at mad_examples
    mad_examples: tuple  # (train, test)
    lm_tokens: int  # Wikitext-2 training tokens, the tiny preset, parameter-matched to attention


BUDGETS = {
    "test": Budget("CI-sized, about a minute on 2 cores: it exercises every stage and says nothing of quality",
                   seeds=(0,), seq_len=32, kv_pairs=2, widths=(16,), steps=30, lrs=(3e-3,), train_examples=256,
                   scaling=dict(d_model=16, min_len=32, max_len=64, tokens=256, repeats=1),
                   mad_steps=6, mad_examples=(64, 32), lm_tokens=4096),
    "smoke": Budget("about 15 minutes on 2 CPU cores, one seed: a first look, not a verdict to publish",
                    seeds=(0,), seq_len=64, kv_pairs=4, widths=(32, 64), steps=1500, lrs=(3e-3,),
                    train_examples=20_000,
                    scaling=dict(d_model=64, min_len=256, max_len=1024, tokens=4096, repeats=2),
                    mad_steps=150, mad_examples=(2_000, 256), lm_tokens=100_000),
}


def slug(mixer: str) -> str:
    """A folder name for a registered name or an import path."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", mixer)


def stage_runs(mixer: str, options: dict, against: list[tuple[str, dict]], budget: Budget) -> list[RunConfig]:
    """The recall and cost runs of ``mixer`` and its controls at ``budget``."""
    b = budget
    models = {mixer: options, **CONTROLS}
    runs = []
    for seed in b.seeds:
        for name, opts in models.items():
            positions = "learned" if zoo.mixer_class(name).needs_positions else "none"
            for d in b.widths:
                for lr in b.lrs:
                    model = zoo.ModelConfig(vocab_size=128, d_model=d, n_layers=2, max_len=b.seq_len, d_ff=0,
                                            mixer=name, mixer_options=opts, positions=positions)
                    train = TrainConfig(steps=b.steps, batch_size=64, lr=lr, warmup_steps=min(30, b.steps // 4),
                                        eval_every=max(10, b.steps // 10), target=0.99, device="cpu")
                    cfg = MQARConfig(seed=seed, model=model, train=train, seq_len=b.seq_len,
                                     num_kv_pairs=b.kv_pairs, num_train_examples=b.train_examples,
                                     num_test_examples=256)
                    runs.append(RunConfig("mqar", cfg, label=name))
        runs += mad_runs(mixer, options, budget, seed) + lm_runs(mixer, options, budget, seed)
        timed = {mixer: options, "attention": {}, **dict(against)}
        for name, opts in timed.items():
            cfg = ScalingConfig(mixer=name, mixer_options=opts, seed=seed, warmup=1, device="cpu", **b.scaling)
            runs.append(RunConfig("scaling", cfg, label=name, alone=True))
    return runs


def mad_runs(mixer: str, options: dict, budget: Budget, seed: int) -> list[RunConfig]:
    """MAD's six tasks at their baselines (examples capped by the budget), the mixer and
    the zoo's attention (mad_cpu's control), at MAD's one learning rate of mad_cpu."""
    train, test = budget.mad_examples
    settings = [(task, {"num_train_examples": min(train, base["baseline"]["num_train_examples"]),
                        "num_test_examples": min(test, base["baseline"]["num_test_examples"])})
                for task, base in BASELINES.items()]
    return [RunConfig("mad", cfg, label=name)
            for name, opts in ((mixer, options), ("attention", {"n_heads": 4, "rotary": 0}))
            for cfg in sweep_configs(name, settings, options=opts, lrs=(1e-3,), weight_decays=(0.0,),
                                     batch_size=32, max_steps=budget.mad_steps, evals=3, seed=seed)]


def lm_runs(mixer: str, options: dict, budget: Budget, seed: int) -> list[RunConfig]:
    """Wikitext-2 at the tiny preset, the mixer resized to attention's parameter count
    without embeddings; none where no local copy of the data is found (the card says so)."""
    data = local_data_dir()
    if data is None:
        return []
    base = paper_model_config("attention", "tiny")
    models = {"attention": base, **matched_models(base, {mixer: (mixer, options)}, knob="auto")}
    out = []
    for label, model in models.items():
        cfg = preset_config("tiny", model.mixer, model=model, seed=seed, data_dir=data, tokenizer="wordpiece",
                            wordpiece_vocab=8192, budget_tokens=budget.lm_tokens,
                            eval_every_tokens=budget.lm_tokens // 2, eval_tokens=min(16_384, budget.lm_tokens))
        out.append(RunConfig("wikitext2", cfg.replace(train=cfg.train.replace(device="cpu")), label=label))
    return out


def meta(budget: str) -> dict:
    """What the card's first line states: the budget and its reach, seeds, machine, commit."""
    info = provenance()
    return {"budget": budget, "note": BUDGETS[budget].note, "seeds": list(BUDGETS[budget].seeds),
            "hardware": f"CPU {cpu_name()} (every stage ran on the CPU)",
            "commit": (info.get("git_commit") or "unknown")[:12] + (" with local changes" if info.get("git_dirty") else "")}


def vet(mixer: str, options: dict, against: list[tuple[str, dict]], budget: str, results_dir: str | Path,
        executor: str = "local", parallel: int = 1, slurm: dict | None = None, wait: bool = True,
        log=print) -> Path:
    """Run the card's checks and stages for ``mixer`` and write the card; returns its path.
    On Slurm without ``wait``, the card covers what has finished: run it again to complete it."""
    from results.card import card_markdown
    from results.records import load_records, records_frame
    from zoo.checks import mixer_checks

    folder = Path(results_dir) / "vet" / slug(mixer)
    out = folder / budget
    out.mkdir(parents=True, exist_ok=True)
    log(f"vet {mixer}: correctness checks")
    checks = [dataclasses.asdict(c) for c in mixer_checks(mixer, options)]
    (out / "checks.jsonl").write_text("".join(json.dumps(c) + "\n" for c in checks))
    frame = None
    if all(c["passed"] is not False for c in checks):
        runs = validate(stage_runs(mixer, options, against, BUDGETS[budget]), f"vet {mixer}")
        sweep = Sweep(budget, Path(__file__), runs, f"linbench vet {mixer} --budget {budget}")
        launch(sweep, folder, executor, parallel, slurm, wait=wait, log=log)
        records = load_records(out, [run.run_id for run in runs])
        frame = records_frame(records) if records else None
    card = out / "report.md"
    card.write_text(card_markdown(mixer, meta(budget), checks, frame, out / "plots"))
    return card
