"""Every chunked mixer's chunk sizes timed at the training-step benchmark's points: one layer's
chunked op, forward and backward, at each size ``chunk_size="auto"`` would try
(zoo.ops.chunk_tuning), in a fresh child process per (point, mixer), one thread. The
fixed defaults of the zoo's chunked mixers were set from this table.

    python -m tasks.benchmarks.chunk_sizes --points 64x64x64,256x128x64 \
        --out results/reference/chunk_sizes_cpu.csv
"""
from __future__ import annotations

import argparse
import inspect
import shlex
import sys
from pathlib import Path

import torch

import zoo
from zoo.ops import chunk_tuning

from ..engine.allocator import tune_malloc
from ..engine.cli import parse_mixers, write_csv
from ..engine.runs import environment
from .timing import run_point
from .trainstep import POINTS, TrainStepConfig, parse_points


def chunked_mixers() -> list[str]:
    """The registered mixers with a ``chunk_size`` option."""
    return sorted(n for n, cls in zoo.MIXERS.items() if "chunk_size" in cls.option_names)


def measure_chunks(model: dict, batch: int, seed: int, meter, deadline):
    """One forward and backward of ``model`` (a ModelConfig dict whose mixer runs
    chunk_size="auto"): yields a row per (op, size) that the measurement timed."""
    cfg = zoo.ModelConfig.from_dict(model)
    tune_malloc()
    torch.manual_seed(seed)
    lm = zoo.build_model(cfg)
    x = torch.randint(cfg.vocab_size, (batch, cfg.max_len))
    chunk_tuning.choices.clear()
    lm(x).sum().backward()
    for key, (chosen, times) in chunk_tuning.choices.items():
        for size, seconds in times.items():
            yield {"op": key[1], "chunk_size": int(size), "ms": seconds * 1e3, "fastest": int(size) == chosen}


def run(points, mixers, threads: int = 1, seed: int = 0) -> list[dict]:
    base = TrainStepConfig(against=())
    device = torch.device("cpu")
    parent = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows = []
    try:
        for L, d, B in points:
            for name, options in mixers:
                default = inspect.signature(zoo.MIXERS[name].__init__).parameters["chunk_size"].default
                model = base.model(name, {**options, "chunk_size": "auto"}, L, d).to_dict()
                got, status, error = run_point(measure_chunks, {"model": model, "batch": B, "seed": seed},
                                               device=device)
                for r in got or [{}]:
                    rows.append({"seq_len": L, "d_model": d, "batch": B, "mixer": name,
                                 "default_chunk_size": default, **{k: r.get(k) for k in
                                 ("op", "chunk_size", "ms", "fastest")}, "status": status, "error": error})
                best = next((r for r in got if r["fastest"]), None)
                print(f"L={L} d={d} B={B}  {name:<16} " + (
                    "  ".join(f"{r['chunk_size']}: {r['ms']:.1f} ms" for r in got)
                    + f"  -> {best['chunk_size']} (default {default})" if best else status), flush=True)
    finally:
        torch.set_num_threads(parent)
    env = {**environment(device), "threads": threads}
    return [{**r, **env} for r in rows]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description="Each chunked mixer's chunk sizes timed, forward and backward.")
    p.add_argument("--mixers", default=",".join(chunked_mixers()), help="name[:option=value...],...")
    p.add_argument("--points", type=parse_points, default=POINTS, help="LxDxB,... e.g. 64x64x64,256x128x64")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="CSV file, one row per (point, mixer, size)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    mixers = parse_mixers(args.mixers)
    plain = [name for name, _ in mixers if name not in chunked_mixers()]
    if plain:
        p.error(f"--mixers: {plain} take no chunk_size; chunked mixers: {chunked_mixers()}")
    command = shlex.join(["python", "-m", "tasks.benchmarks.chunk_sizes", *argv])
    rows = [{**r, "command": command} for r in run(args.points, mixers, args.threads)]
    if args.out:
        write_csv(rows, args.out)
    return rows


if __name__ == "__main__":
    # as tasks.benchmarks.trainstep: children unpickle measure_chunks by its module name
    from tasks.benchmarks.chunk_sizes import main as _main

    sys.argv[0] = "python -m tasks.benchmarks.chunk_sizes"  # the usage line names the command, not the file
    _main()
