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
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

import zoo
from results.records import load_records, read_record
from tasks.benchmarks.decode import DecodeConfig
from tasks.benchmarks.scaling import ScalingConfig
from tasks.engine.runs import REPO, cpu_name, provenance
from tasks.engine.train import TrainConfig
from tasks.mad.data import BASELINES
from tasks.mad.task import sweep_configs
from tasks.mqar.task import MQARConfig
from tasks.wikitext2 import paper_model_config, preset_config

from .launch import FINAL, launch
from .spec import RunConfig, Sweep, identity, local_data_dir, matched_models, sweep_module, validate

CONTROLS = {"attention": {"n_heads": 1}, "sliding_window": {"n_heads": 1, "window": 16}}  # Zoology's MQAR setup
REFERENCE = REPO / "results" / "reference"
# The metric each bracket is read on, and whether higher is better: Wikitext-2 on validation
# (results.stats.SELECT_ON); MQAR on its accuracy, Zoology's rule and mqar_cpu's.
CHOOSE_ON = {"mqar": ("accuracy", True), "wikitext2": ("best_val_ppl", False)}


@dataclass(frozen=True)
class Small:
    """The settings of a budget whose stages are its own, smaller than any reference sweep."""
    seq_len: int  # MQAR
    kv_pairs: int
    widths: tuple
    steps: int
    lrs: tuple
    train_examples: int
    mad_steps: int  # each of MAD's six tasks at its baseline, examples capped at mad_examples
    mad_examples: tuple  # (train, test)
    lm_tokens: int  # Wikitext-2 training tokens, the tiny preset, parameter-matched to attention


@dataclass(frozen=True)
class Recipe:
    """Shipped sweep files whose own code builds a budget's runs: ``mqar`` exposes
    ``configs_for(mixer, options)`` and its ``configs`` (the controls, by label); ``mad``
    ``configs_for(mixer, settings, seed, options)`` (and, optionally, ``SEEDED_TASKS`` and
    ``EXTRA_SEEDS``); ``lm`` its ``ATTENTION`` model and ``config_for(label, model, seed)``.
    Where one of them has committed records (results/reference/), a control with the same
    run id is read from them."""
    mqar: str
    mad: str
    lm: str
    lm_lrs: tuple  # the Wikitext-2 bracket
    needs_local_data: bool  # the LM sweep reads a local copy of Wikitext-2 (else the hub)


@dataclass(frozen=True)
class Budget:
    note: str  # what the budget can and cannot say, the card's first line
    seeds: tuple  # the first runs every learning rate of a bracket, the others each model's best
    scaling: dict  # ScalingConfig fields: d_model, min_len, max_len, tokens, repeats
    decode: dict  # DecodeConfig fields: d_model, batch, contexts, new_tokens
    small: Small | None = None  # None: ``recipe``'s sweeps, their zoo rows read from committed records
    recipe: Recipe | None = None
    device: str = "cpu"  # where the timings run (the training runs take their sweep's device)
    reads: bool = True  # False: the card shows the numbers, and no verdict beyond correctness
    against: tuple = ()  # zoo mixers timed beside attention when --against names none


BUDGETS = {
    "test": Budget("CI-sized: it exercises every stage and says nothing of quality, its verdicts included",
                   seeds=(0,), scaling=dict(d_model=16, min_len=32, max_len=64, tokens=256, repeats=1),
                   decode=dict(d_model=16, contexts=(0, 32), new_tokens=4, warmup=2, bandwidth_mb=8),
                   small=Small(seq_len=32, kv_pairs=2, widths=(16,), steps=30, lrs=(3e-3,), train_examples=256,
                               mad_steps=6, mad_examples=(64, 32), lm_tokens=4096), reads=False),
    "smoke": Budget("about 15 minutes on 2 CPU cores, one seed: a first look, not a verdict to publish",
                    seeds=(0,), scaling=dict(d_model=64, min_len=256, max_len=1024, tokens=4096, repeats=2),
                    decode=dict(d_model=64, contexts=(0, 1024, 4096), new_tokens=16),
                    small=Small(seq_len=64, kv_pairs=4, widths=(32, 64), steps=1500, lrs=(3e-3,),
                                train_examples=20_000, mad_steps=150, mad_examples=(2_000, 256),
                                lm_tokens=100_000)),
    "cpu": Budget("the reference sweeps' recipes (mqar_cpu, mad_cpu, wikitext2_cpu), each model at its best "
                  "learning rate of a bracket, 3 seeds there; under a day on 2 CPU cores; the zoo's rows are "
                  "their committed records, run here only where none matches",
                  seeds=(0, 1, 2), scaling=dict(d_model=256, min_len=256, max_len=4096, tokens=8192, repeats=3),
                  decode=dict(d_model=256, contexts=(0, 1024, 4096, 16384), new_tokens=64), against=("mamba2",),
                  recipe=Recipe("mqar_cpu", "mad_cpu", "wikitext2_cpu", lm_lrs=(5e-4, 1e-3, 2e-3),
                                needs_local_data=True)),
    "gpu": Budget("the GPU sweeps' recipes (mqar: Zoology's figure-2 grid; mad: MAD's protocol on its six "
                  "baselines; wikitext2_paper: the paper's 6-layer model for 30 epochs), each model at its best "
                  "learning rate of a bracket, 3 seeds there; meant for a GPU node, not measured on GPU",
                  seeds=(0, 1, 2), scaling=dict(d_model=1024, min_len=1024, max_len=16384, tokens=16384, repeats=5),
                  decode=dict(d_model=1024, batch=16), against=("mamba2",),
                  recipe=Recipe("mqar", "mad", "wikitext2_paper", lm_lrs=(5e-4, 1e-3, 2e-3), needs_local_data=False),
                  device="cuda"),
}


def slug(mixer: str) -> str:
    """A folder name for a registered name or an import path."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", mixer)


def first_runs(mixer: str, options: dict, budget: Budget, module=sweep_module) -> list[RunConfig]:
    """The runs of the first seed: every learning rate of each bracket, the mixer's and its
    controls', then MAD; the seeds after it follow from their records (``seeded_runs``)."""
    if budget.small is None:
        return reference_runs(mixer, options, budget.recipe, module)
    b, seed = budget.small, budget.seeds[0]
    runs = []
    for name, opts in {mixer: options, **CONTROLS}.items():
        positions = "learned" if zoo.mixer_class(name).needs_positions else "none"
        for d in b.widths:
            for lr in b.lrs:
                model = zoo.ModelConfig(vocab_size=128, d_model=d, n_layers=2, max_len=b.seq_len, d_ff=0,
                                        mixer=name, mixer_options=opts, positions=positions)
                train = TrainConfig(steps=b.steps, batch_size=64, lr=lr, warmup_steps=min(30, b.steps // 4),
                                    eval_every=max(10, b.steps // 10), target=0.99, device="cpu")
                cfg = MQARConfig(seed=seed, model=model, train=train, seq_len=b.seq_len, num_kv_pairs=b.kv_pairs,
                                 num_train_examples=b.train_examples, num_test_examples=256)
                runs.append(RunConfig("mqar", cfg, label=name))
    return runs + small_mad_runs(mixer, options, b, seed) + small_lm_runs(mixer, options, b, seed)


def small_mad_runs(mixer: str, options: dict, b: Small, seed: int) -> list[RunConfig]:
    """MAD's six tasks at their baselines (examples capped), the mixer and the zoo's
    attention (mad_cpu's control), at mad_cpu's one learning rate."""
    train, test = b.mad_examples
    settings = [(task, {"num_train_examples": min(train, base["baseline"]["num_train_examples"]),
                        "num_test_examples": min(test, base["baseline"]["num_test_examples"])})
                for task, base in BASELINES.items()]
    return [RunConfig("mad", cfg, label=name)
            for name, opts in ((mixer, options), ("attention", {"n_heads": 4, "rotary": 0}))
            for cfg in sweep_configs(name, settings, options=opts, lrs=(1e-3,), weight_decays=(0.0,),
                                     batch_size=32, max_steps=b.mad_steps, evals=3, seed=seed)]


def small_lm_runs(mixer: str, options: dict, b: Small, seed: int) -> list[RunConfig]:
    """Wikitext-2 at the tiny preset, the mixer resized to attention's parameter count
    without embeddings; none where no local copy of the data is found (the card says so)."""
    data = local_data_dir()
    if data is None:
        return []
    base = paper_model_config("attention", "tiny")
    models = {"attention": base, **matched_models(base, {mixer: (mixer, options)}, knob="auto")}
    out = []
    for label, model in models.items():
        for lr in b.lrs:
            cfg = preset_config("tiny", model.mixer, model=model, seed=seed, data_dir=data, tokenizer="wordpiece",
                                wordpiece_vocab=8192, budget_tokens=b.lm_tokens,
                                eval_every_tokens=b.lm_tokens // 2, eval_tokens=min(16_384, b.lm_tokens))
            out.append(RunConfig("wikitext2", cfg.replace(train=cfg.train.replace(device="cpu", lr=lr)), label=label))
    return out


def reference_runs(mixer: str, options: dict, recipe: Recipe, module=sweep_module) -> list[RunConfig]:
    """The first seed of the mixer and its controls under ``recipe``'s sweeps, built by
    those sweep files' own code, so that a control's run id is that of its record where
    one is committed: MQAR's grid beside attention and the window, MAD's six baselines
    (and the sweep's seeded tasks' seeds) beside attention, Wikitext-2 matched to the
    sweep's attention over ``recipe.lm_lrs``."""
    mqar = module(recipe.mqar)
    runs = [RunConfig("mqar", cfg, label=mixer) for cfg in mqar.configs_for(mixer, options)]
    runs += [run for run in mqar.configs if run.label in ("attention", "sliding_window") and run.config.seed == 0]
    mad = module(recipe.mad)
    for name, opts in ((mixer, options), ("attention", None)):
        runs += [RunConfig("mad", cfg, label=name) for cfg in mad.configs_for(name, [(t, {}) for t in BASELINES],
                                                                              options=opts)]
        runs += [RunConfig("mad", cfg, label=name) for seed in getattr(mad, "EXTRA_SEEDS", ())
                 for cfg in mad.configs_for(name, [(t, {}) for t in mad.SEEDED_TASKS], seed=seed, options=opts)]
    if recipe.needs_local_data and local_data_dir() is None:
        return runs
    lm = module(recipe.lm)
    models = {"attention": lm.ATTENTION, **matched_models(lm.ATTENTION, {mixer: (mixer, options)}, knob="auto")}
    for label, model in models.items():
        run = lm.config_for(label, model, seed=0)
        runs += [dataclasses.replace(run, config=run.config.replace(train=run.config.train.replace(lr=lr)))
                 for lr in recipe.lm_lrs]
    return runs


def cost_runs(mixer: str, options: dict, against: list[tuple[str, dict]], budget: Budget) -> list[RunConfig]:
    """The training step against L and the decode step against context, the mixer beside
    attention and ``against``: timings, so always run here, one at a time, never read from
    records of another machine."""
    timed = {mixer: options, "attention": {}, **dict(against)}
    device = budget.device
    runs = [RunConfig("scaling", ScalingConfig(mixer=name, mixer_options=opts, seed=0, warmup=1, device=device,
                                               **budget.scaling), label=name, exclusive=True)
            for name, opts in timed.items()]
    return runs + [RunConfig("decode", DecodeConfig(mixer=name, mixer_options=opts, device=device, **budget.decode),
                             label=name, exclusive=True)
                   for name, opts in timed.items() if zoo.mixer_class(name).has_step_form()]


def _bracket_key(run: RunConfig) -> str:
    """A run's config with its seed and learning rate left out: the runs of one bracket share it."""
    cfg = identity(run.config)
    cfg.pop("seed", None)
    cfg.get("train", {}).pop("lr", None)
    return json.dumps([run.task, run.label, cfg], sort_keys=True)


def seeded_runs(first: list[RunConfig], records: dict, seeds: tuple) -> list[RunConfig]:
    """``seeds`` at each bracket's best learning rate, for every bracket (``CHOOSE_ON``'s
    tasks) whose runs all have final records; a bracket still running gets them on a later
    call. ``records``: run id -> record."""
    brackets: dict[str, list[RunConfig]] = {}
    for run in first:
        if run.task in CHOOSE_ON:
            brackets.setdefault(_bracket_key(run), []).append(run)
    out = []
    for runs in brackets.values():
        if any(run.run_id not in records for run in runs):
            continue
        metric, higher = CHOOSE_ON[runs[0].task]
        scored = [(records[run.run_id].get("metrics", {}).get(metric), run) for run in runs
                  if records[run.run_id].get("status") == "ok"]
        scored = [(value, run) for value, run in scored if value is not None]
        if not scored:
            continue
        best = (max if higher else min)(scored, key=lambda vr: vr[0])[1]
        out += [dataclasses.replace(best, config=best.config.replace(seed=seed)) for seed in seeds]
    return out


def reference_records(run_ids, reference_dir: Path) -> dict:
    """run id -> the committed record of that id with a final status, from any sweep folder
    of ``reference_dir``."""
    wanted, out = set(run_ids), {}
    for path in sorted(Path(reference_dir).glob("*/*.json")):
        if path.stem in wanted:
            rec = read_record(path)
            if rec and rec.get("status") in FINAL:
                out[path.stem] = rec
    return out


def zoo_run_ids(recipe: Recipe, module=sweep_module) -> list[str]:
    """The runs shown beside the mixer (not in its verdicts) where their records are
    committed: every zoo mixer of the MQAR sweep's figure (not the controls of its local
    mixers, ``LENGTHS``), of the MAD sweep's baselines (and seeded tasks) and of the LM
    sweep."""
    mqar, mad = module(recipe.mqar), module(recipe.mad)
    runs = [run for run in mqar.configs if run.label not in getattr(mqar, "LENGTHS", {})]
    for name in sorted({run.label for run in mad.configs}):
        runs += [RunConfig("mad", cfg) for cfg in mad.configs_for(name, [(t, {}) for t in BASELINES])]
        runs += [RunConfig("mad", cfg) for seed in getattr(mad, "EXTRA_SEEDS", ())
                 for cfg in mad.configs_for(name, [(t, {}) for t in mad.SEEDED_TASKS], seed=seed)]
    if local_data_dir() is not None or not recipe.needs_local_data:
        runs += list(module(recipe.lm).configs)
    return [run.run_id for run in runs]


def meta(budget: str, own: list[dict], reference: dict) -> dict:
    """What the card's first lines state: the budget and its reach, seeds, this machine,
    the commits its own runs ran on (``own``: their records), and where the zoo rows read
    from committed records come from (``reference``: run id -> record)."""
    info = provenance()
    # what the mixer's own runs name (a card written again elsewhere still says where they
    # ran); this machine and checkout where none has run yet
    commits = sorted({(rec.get("provenance", {}).get("git_commit") or "unknown")[:12] for rec in own})
    devices = sorted({("GPU " if rec["provenance"].get("device") == "cuda" else "CPU ") + rec["provenance"]["device_name"]
                      for rec in own if rec.get("provenance", {}).get("device_name")})
    here_commit = (info.get("git_commit") or "unknown")[:12] + (" with local changes" if info.get("git_dirty") else "")
    here_device = f"CPU {cpu_name()}" + (f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available()
                                         and BUDGETS[budget].device == "cuda" else "")
    ref = reference.values()
    return {"budget": budget, "note": BUDGETS[budget].note, "seeds": list(BUDGETS[budget].seeds),
            "reads": BUDGETS[budget].reads,
            "hardware": "; ".join(devices) if devices else here_device,
            "commit": ", ".join(commits) if commits else here_commit,
            "reference": {"runs": len(reference), "sweeps": sorted({r.get("sweep") for r in ref}),
                          "hardware": sorted({r.get("provenance", {}).get("device_name") or "?" for r in ref})}}


def vet(mixer: str, options: dict, against: list[tuple[str, dict]], budget: str, results_dir: str | Path,
        executor: str = "local", parallel: int = 1, slurm: dict | None = None, wait: bool = True,
        log=print, reference_dir: str | Path = REFERENCE) -> Path:
    """Run the card's checks and stages for ``mixer`` and write the card; returns its path.
    The cost runs go first, the first seed's brackets next, then the other seeds at each
    bracket's best learning rate. A run whose id has a record in ``reference_dir`` (the
    zoo's committed runs) is read, not run. On Slurm without ``wait``, the card covers what
    has finished: run it again to add the seeds and complete it."""
    from results.card import card_markdown
    from results.records import records_frame
    from zoo.checks import mixer_checks

    b = BUDGETS[budget]
    folder = Path(results_dir) / "vet" / slug(mixer)
    out = folder / budget
    out.mkdir(parents=True, exist_ok=True)
    log(f"vet {mixer}: correctness checks")
    checks = [dataclasses.asdict(c) for c in mixer_checks(mixer, options)]
    (out / "checks.jsonl").write_text("".join(json.dumps(c) + "\n" for c in checks))
    frame, reference, own, zoo_rows = None, {}, [], None
    cached = functools.cache(sweep_module)
    if all(c["passed"] is not False for c in checks):
        against = against or [(name, {}) for name in b.against]
        first = validate(cost_runs(mixer, options, against, b) + first_runs(mixer, options, b, cached), f"vet {mixer}")
        runs, records = first, {}
        for _ in range(2):  # the first seed, then the seeds its brackets choose
            reference = reference_records([run.run_id for run in runs], reference_dir) if b.small is None else {}
            todo = [run for run in runs if run.run_id not in reference]
            sweep = Sweep(budget, Path(__file__), todo, f"linbench vet {mixer} --budget {budget}")
            if todo:
                launch(sweep, folder, executor, parallel, slurm, wait=wait, log=log)
            own = load_records(out, [run.run_id for run in todo])
            records = {**{rec["run_id"]: rec for rec in own}, **reference}
            more = [run for run in seeded_runs(first, records, b.seeds[1:]) if run.run_id not in
                    {r.run_id for r in runs}]
            if not more:
                break
            runs = validate(runs + more, f"vet {mixer}")
        frame = records_frame(list(records.values())) if records else None
        if b.small is None:
            shown = reference_records(set(zoo_run_ids(b.recipe, cached)) - set(records), reference_dir)
            zoo_rows = records_frame(list(shown.values())) if shown else None
            reference = {**reference, **shown}
    card = out / "report.md"
    card.write_text(card_markdown(mixer, meta(budget, own, reference), checks, frame, out / "plots", zoo_rows))
    return card
