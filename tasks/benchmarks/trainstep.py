"""The CPU training-step benchmark: every mixer's full training step beside attention's.

At each point (L, d_model, batch) every mixer runs the same step of a small LM (n_layers
blocks without MLP, no positions, so the mixers are nearly all the work): forward,
cross-entropy over the B*L tokens against random targets, backward, AdamW step,
zero_grad. Each (point, mixer) is timed in a fresh child process (tasks.benchmarks.timing), one
thread by default, and its median is divided by attention's at the same point in the same
precision: fp32, or bf16 autocast (``--precision fp32,bf16`` measures both, side by side at
each point, and the table adds each mixer's fp32/bf16 speed-up). The
points are the outer loop, so the two medians of a ratio are minutes apart, not hours;
``rounds`` repeats the whole grid and reports the median of the per-round medians,
which damps the machine's drift further. A failure (oom, timeout, error) is a row.

    python -m tasks.benchmarks.trainstep --out results/reference/trainstep_cpu.csv
    python -m tasks.benchmarks.trainstep --table-from results/reference/trainstep_cpu.csv  # docs/performance.md's table
    python -m tasks.benchmarks.trainstep --precision fp32,bf16 --out results/reference/trainstep_cpu_precision.csv
    python -m tasks.benchmarks.trainstep --mixers mamba --points 256x128x64 --profile 15  # where time goes
"""
from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import zoo
from zoo.config import StrictConfig, check_bounds
from zoo.flops import flops
from zoo.mixers import check_mixer

from ..engine.cli import mixer_label, parse_mixers, write_csv
from ..engine.allocator import tune_malloc
from ..engine.runs import environment
from .bench import module_backend, module_chunk_size
from .timing import measure, run_point

# (seq_len, d_model, batch); the last two keep the 16,384 tokens per batch of L 256 x 64
POINTS = ((64, 64, 64), (64, 128, 64), (256, 64, 64), (256, 128, 64), (1024, 128, 16), (4096, 128, 4))
REFERENCE = "attention"  # every ratio is against it
# The second reference, measured beside it by default: attention with one head, the cheapest
# form of the baseline at d 64 (its score matmuls are one d-wide product instead of four).
ONE_HEAD = ("attention", {"n_heads": 1})


@dataclass
class TrainStepConfig(StrictConfig):
    seed: int = 0
    mixers: tuple = ()  # (name, options) pairs; (): every registered mixer. Attention is always added.
    against: tuple = ONE_HEAD  # a second (name, options) reference (added if missing; () for none):
    # each row's ratio_against is its median over this one's
    points: tuple = POINTS  # (seq_len, d_model, batch) triples
    vocab_size: int = 512
    n_layers: int = 2
    threads: int = 1
    warmup: int = 2
    repeats: int = 5
    rounds: int = 1  # the whole grid this many times; the median of the rounds' medians
    time_limit_s: float = 600.0  # per (point, mixer, round), start-up excluded
    isolate: bool = True  # each measurement in a fresh child process
    precisions: tuple = ("fp32",)  # "fp32" and/or "bf16" (autocast), each measured at every point
    profile: int = 0  # > 0: print the top ops of one profiled step per (point, mixer)

    def __post_init__(self):
        own = "TrainStepConfig"
        check_bounds(self, "vocab_size", "n_layers", "threads", "repeats", "rounds", gt=0)
        check_bounds(self, "seed", "warmup", "time_limit_s", "profile", ge=0)  # a 0 s limit: every point times out
        self.precisions = tuple(self.precisions)
        bad = [p for p in self.precisions if p not in ("fp32", "bf16")]
        if bad or not self.precisions or len(set(self.precisions)) < len(self.precisions):
            raise ValueError(f"{own}: precisions={self.precisions!r} must be distinct values of ('fp32', 'bf16')")
        # JSON gives lists: normalise, so points are hashable keys and options are dicts
        self.points = tuple(tuple(p) if isinstance(p, (list, tuple)) else p for p in self.points)
        if not self.points:
            raise ValueError(f"{own}: points is empty")
        for p in self.points:
            if not (isinstance(p, tuple) and len(p) == 3
                    and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in p)):
                raise ValueError(f"{own}: points: {p!r} must be (seq_len, d_model, batch), three positive ints")
        for m in self.mixers:
            if not (isinstance(m, (list, tuple)) and len(m) == 2 and isinstance(m[1], dict)):
                raise ValueError(f"{own}: mixers: {m!r} must be a (name, options) pair")
            check_mixer(own, "mixers", m[0])
        self.mixers = tuple((name, dict(opts)) for name, opts in self.mixers)
        if self.against:
            if not (isinstance(self.against, (list, tuple)) and len(self.against) == 2
                    and isinstance(self.against[1], dict)):
                raise ValueError(f"{own}: against: {self.against!r} must be a (name, options) pair or ()")
            check_mixer(own, "against", self.against[0])
            self.against = (self.against[0], dict(self.against[1]))
        labels = [mixer_label(*e) for e in self.entries()]
        if len(set(labels)) < len(labels):
            raise ValueError(f"{own}: mixers: duplicate labels in {labels}")
        for name, opts in self.entries():  # refuse bad options now, not in a child process later
            for d in sorted({p[1] for p in self.points}):
                try:
                    with torch.device("meta"):
                        zoo.build_mixer(name, d, **opts)
                except Exception as exc:
                    raise ValueError(f"{own}: mixers: {mixer_label(name, opts)} at d_model={d}: {exc}") from exc

    def entries(self) -> list[tuple[str, dict]]:
        """The mixers in the order measured: the first attention entry (added if
        missing) first, since every ratio needs it, then the second reference (``against``,
        added if missing), then the rest as given."""
        mixers = list(self.mixers) or [(n, {}) for n in sorted(zoo.MIXERS)]
        second = mixer_label(*self.against) if self.against else None
        ref = next((e for e in mixers if e[0] == REFERENCE and mixer_label(*e) != second), (REFERENCE, {}))
        rest = [e for e in mixers if e is not ref]
        if second is not None:
            entry = next((e for e in rest if mixer_label(*e) == second), self.against)
            rest = [entry, *(e for e in rest if e is not entry)]
        return [ref, *rest]

    def model(self, name: str, options: dict, seq_len: int, d_model: int) -> zoo.ModelConfig:
        return zoo.ModelConfig(vocab_size=self.vocab_size, d_model=d_model, n_layers=self.n_layers,
                               mixer=name, mixer_options=options, d_ff=0, positions="none", max_len=seq_len)


def measure_step(model: dict, batch: int, seed: int, warmup: int, repeats: int, meter, deadline,
                 profile: int = 0, precision: str = "fp32"):
    """Time one training step of ``model`` (a ModelConfig dict), run by tasks.benchmarks.timing,
    usually in a child process; forward and loss under bf16 autocast for ``precision``
    "bf16", as the training loop runs them. Yields one row, then with ``profile`` > 0 the
    table of the top ``profile`` ops (self CPU time) of one more step."""
    cfg = zoo.ModelConfig.from_dict(model)
    tuned = tune_malloc()  # as the training loop does
    torch.manual_seed(seed)
    lm = zoo.build_model(cfg)
    opt = torch.optim.AdamW(lm.parameters())
    # max_len is the point's L (no position table: it only names the length here)
    x, targets = torch.randint(cfg.vocab_size, (2, batch, cfg.max_len)).unbind(0)  # (B, L) each

    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
            logits = lm(x)  # (B, L, V)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # over B*L tokens
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)  # as training does: no zero-fill of the grads

    t = measure(step, warmup, repeats, "cpu", deadline, settle=True)  # a training run's heap, grown
    yield {**t, "faults_per_step": t["median_faults"], "mean_faults_per_step": t["minor_faults"] / t["repeats"],
           "malloc_tuned": tuned,
           "backend": module_backend(lm), "chunk_size": module_chunk_size(lm)}
    if profile:  # where the time goes: after the timed steps, so the profiler skews none
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        yield {"profile": prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=profile,
                                                    max_name_column_width=48)}


def _summary(runs: list[dict]) -> dict:
    """One (point, mixer) over its rounds: the median of each statistic, or the first failure."""
    failed = next((r for r in runs if r["status"] != "ok"), None)
    if failed:
        return {"backend": "", "chunk_size": "", "median_ms": None, "p20_ms": None, "p80_ms": None,
                "faults_per_step": None, "mean_faults_per_step": None, "warmup_calls": None,
                "malloc_tuned": None, **failed}
    stats = {k: float(np.median([r[k] for r in runs])) for k in ("median_ms", "p20_ms", "p80_ms")}
    faults = {k: [r[k] for r in runs if r.get(k) is not None] for k in ("faults_per_step", "mean_faults_per_step")}
    return {"backend": runs[-1]["backend"], "chunk_size": runs[-1].get("chunk_size", ""), **stats,
            **{k: float(np.median(v)) if v else None for k, v in faults.items()},
            "warmup_calls": max(r.get("warmup_calls", 0) for r in runs),  # the most any round needed
            "malloc_tuned": runs[-1].get("malloc_tuned"), "status": "ok", "error": ""}


def run(cfg: TrainStepConfig, progress: bool = True) -> list[dict]:
    """One row per (point, precision, mixer), points outer, attention first at each
    point and precision."""
    entries = cfg.entries()
    cells = [(p, prec, mixer_label(*e)) for p in cfg.points for prec in cfg.precisions for e in entries]
    parent_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)  # run_point gives each child the parent's thread count
    try:
        runs = _measure(cfg, entries, cells, progress)
    finally:
        torch.set_num_threads(parent_threads)
    return _rows(cfg, entries, cells, runs)


def _measure(cfg: TrainStepConfig, entries: list, cells: list, progress: bool) -> dict[tuple, list[dict]]:
    """Every cell's measurement in each round, in child processes: {cell: [one per round]}."""
    runs: dict[tuple, list[dict]] = {cell: [] for cell in cells}
    for rnd in range(cfg.rounds):
        for point in cfg.points:
            L, d, B = point
            for prec in cfg.precisions:
                ref = None  # attention's median this round: entries[0]
                for i, (name, options) in enumerate(entries):
                    tag = mixer_label(name, options)
                    done = runs[point, prec, tag]
                    if done and done[-1]["status"] != "ok":
                        continue  # not retried: a timeout would cost its whole limit again
                    kwargs = {"model": cfg.model(name, options, L, d).to_dict(), "batch": B, "seed": cfg.seed,
                              "warmup": cfg.warmup, "repeats": cfg.repeats, "profile": cfg.profile,
                              "precision": prec}
                    rows, status, error = run_point(measure_step, kwargs, device=torch.device("cpu"),
                                                    isolate=cfg.isolate, time_limit_s=cfg.time_limit_s)
                    done.append({**rows[0], "status": "ok", "error": ""} if status == "ok"
                                else {"status": status, "error": error})
                    for row in rows[1:]:  # the profile, when asked for
                        print(f"--- L={L} d={d} B={B} {prec} {tag}\n{row['profile']}", flush=True)
                    ms = done[-1].get("median_ms")
                    ref = ms if i == 0 else ref
                    if progress:
                        cell = _cell(ms, ms / ref if ms and ref else None, status)
                        print(f"[round {rnd + 1}/{cfg.rounds}] L={L} d={d} B={B} {prec}  "
                              f"{tag:<24} {cell}  {error.splitlines()[0] if error else ''}".rstrip(), flush=True)
    return runs


def _rows(cfg: TrainStepConfig, entries: list, cells: list, runs: dict) -> list[dict]:
    """The CSV rows: each cell over its rounds (``_summary``), beside attention's and the
    second reference's, with its size and useful work (``zoo.flops``)."""
    env = {**environment(torch.device("cpu")), "threads": cfg.threads}
    out, ref_work = [], None
    for point, prec, name_label in cells:
        L, d, B = point
        ref = _summary(runs[point, prec, mixer_label(*entries[0])])["median_ms"]
        ref2 = _summary(runs[point, prec, mixer_label(*cfg.against)])["median_ms"] if cfg.against else None
        name, options = next(e for e in entries if mixer_label(*e) == name_label)
        s = _summary(runs[point, prec, name_label])
        with torch.device("meta"):  # also known for a mixer that failed
            lm = zoo.build_model(cfg.model(name, options, L, d))
            params = zoo.count_params(lm)
            work = (flops(lm, B, L) or {}).get("fwd_bwd")  # the useful work, zoo.flops' conventions
        if name_label == mixer_label(*entries[0]):
            ref_work = work
        ms = s["median_ms"]
        out.append({
            "seq_len": L, "d_model": d, "batch": B, "tokens": B * L, "label": name_label,
            "mixer": name, "mixer_options": json.dumps(options, sort_keys=True), "backend": s["backend"],
            "chunk_size": s["chunk_size"], "params": params, "median_ms": ms, "p20_ms": s["p20_ms"],
            "p80_ms": s["p80_ms"], "ratio": ms / ref if ms is not None and ref is not None else None,
            "against": mixer_label(*cfg.against) if cfg.against else "",
            "ratio_against": ms / ref2 if ms is not None and ref2 else None,
            # the ratio the work alone would give: the step's FLOPs over attention's
            "gflop_per_step": work / 1e9 if work else None,
            "flop_ratio": work / ref_work if work and ref_work else None,
            "gflop_s": work / 1e9 / (ms / 1e3) if work and ms else None,
            "faults_per_step": s["faults_per_step"], "mean_faults_per_step": s["mean_faults_per_step"],
            "malloc_tuned": s["malloc_tuned"],
            "status": s["status"], "error": s["error"], "seed": cfg.seed, "warmup": cfg.warmup,
            "warmup_calls": s["warmup_calls"], "repeats": cfg.repeats, "rounds": cfg.rounds, **env,
            "dtype": "bfloat16" if prec == "bf16" else "float32", "precision": prec,
        })
    return out


# --------------------------------------------------------------------------- tables and CLI


def _number(v) -> float | None:
    return None if v in (None, "") else float(v)  # rows from run() or, as strings, from the CSV


def _cell(ms: float | None, ratio: float | None, status: str) -> str:
    if ms is None:
        return status
    text = f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"
    if ratio is None:
        return text
    return f"{text} ({ratio:.2f}x)" if ratio < 1 else f"{text} ({ratio:.1f}x)"  # 0.45x, not 0.5x


def _point(r: dict) -> tuple:
    return int(r["seq_len"]), int(r["d_model"]), int(r["batch"])


def _grid(cells: dict, names, points) -> str:
    lines = ["| mixer | " + " | ".join(f"L={L} d={d} B={B}" for L, d, B in points) + " |",
             "|---|" + "---:|" * len(points)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(cells.get((name, p), "-") for p in points) + " |")
    return "\n".join(lines)


def markdown_table(rows: list[dict]) -> str:
    """One row per mixer, one column per point, cells "123 ms (1.8x)" (the ratio to
    attention at that point) or the failure's status. Measured in both precisions: one
    row per mixer and precision, then a table of each mixer's speed-up from fp32 to bf16
    autocast (fp32 ms / bf16 ms). Works on run()'s rows and on the rows of its CSV (one
    written before the precision column: fp32)."""
    points = list(dict.fromkeys(_point(r) for r in rows))
    precision = {id(r): r.get("precision") or "fp32" for r in rows}
    both = len(set(precision.values())) > 1
    name = (lambda r: f"{r['label']} ({precision[id(r)]})") if both else (lambda r: r["label"])
    cells = {(name(r), _point(r)): _cell(_number(r["median_ms"]), _number(r["ratio"]), r["status"]) for r in rows}
    table = _grid(cells, dict.fromkeys(name(r) for r in rows), points)
    against = next((r.get("against") for r in rows if r.get("against")), "")
    if against:
        second = {(name(r), _point(r)): f"{_number(r['ratio_against']):.2f}x" for r in rows
                  if _number(r.get("ratio_against")) is not None}
        table += f"\n\nEach step's median over {against}'s at the same point:\n\n"
        table += _grid(second, dict.fromkeys(name(r) for r in rows), points)
    if not both:
        return table
    ms = {(r["label"], precision[id(r)], _point(r)): _number(r["median_ms"]) for r in rows}
    speedup = {(label_, p): f"{ms[label_, 'fp32', p] / ms[label_, 'bf16', p]:.2f}x"
               for (label_, prec, p) in ms if prec == "bf16"
               and ms.get((label_, "fp32", p)) and ms[label_, "bf16", p]}
    return (f"{table}\n\nSpeed-up of bf16 autocast (fp32 ms / bf16 ms):\n\n"
            + _grid(speedup, dict.fromkeys(r["label"] for r in rows), points))


def parse_points(spec: str) -> tuple:
    """"64x64x64,256x128x64" -> ((64, 64, 64), (256, 128, 64)): L x d_model x batch."""
    return tuple(tuple(int(v) for v in item.split("x")) for item in spec.split(",") if item.strip())


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description="Every mixer's LM training step on CPU, beside attention's.")
    p.add_argument("--mixers", default="", help="name[:option=value...],...; default every registered mixer")
    p.add_argument("--points", type=parse_points, default=POINTS, help="LxDxB,... e.g. 64x64x64,256x128x64")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed steps first; up to 8 more while a step still grows the heap (warmup_calls)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1, help="repeat the grid; report the median of the rounds")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds per measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--against", default=mixer_label(*ONE_HEAD),
                   help="a second reference, name[:option=value...] ('' for none); rows add their ratio to it")
    p.add_argument("--precision", default="fp32", help="fp32, bf16 (autocast) or fp32,bf16: both side by side")
    p.add_argument("--no-isolate", action="store_true", help="measure in this process")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also print the top N ops (torch profiler, self CPU) of one step per mixer and point")
    p.add_argument("--out", type=Path, default=None, help="CSV file, one row per (point, mixer)")
    p.add_argument("--table-from", type=Path, default=None, help="print the table of this CSV; measure nothing")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    if args.table_from:
        with open(args.table_from, newline="") as f:
            rows = list(csv.DictReader(f))
        print(markdown_table(rows))
        return rows
    against = parse_mixers(args.against)
    cfg = TrainStepConfig(mixers=tuple(parse_mixers(args.mixers)), against=against[0] if against else (),
                          points=args.points, threads=args.threads,
                          warmup=args.warmup, repeats=args.repeats, rounds=args.rounds,
                          time_limit_s=args.time_limit, seed=args.seed, isolate=not args.no_isolate,
                          profile=args.profile,
                          precisions=tuple(p.strip() for p in args.precision.split(",") if p.strip()))
    command = shlex.join(["python", "-m", "tasks.benchmarks.trainstep", *argv])  # how the CSV was made
    rows = [{**r, "command": command} for r in run(cfg)]
    print()
    print(markdown_table(rows))
    if args.out:
        write_csv(rows, args.out)
    return rows


if __name__ == "__main__":
    # Run as tasks.benchmarks.trainstep, not __main__: the child processes unpickle measure_step by
    # its module name, which a forkserver child cannot resolve for __main__.
    from tasks.benchmarks.trainstep import main as _main

    sys.argv[0] = "python -m tasks.benchmarks.trainstep"  # the usage line names the command, not the file
    _main()
