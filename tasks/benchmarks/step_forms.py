"""Step forms side by side: one fixed-state mixer's decode step in each form it can take
(``zoo.stepping.step_forms``: eager, compiled, blas, ...), timed in one process.

"auto" picks a form by a short timing when a model is built; this benchmark says by how
much each form wins or loses, under the same conditions. On a shared machine a step's
time moves by tens of percent between processes minutes apart, more than the forms
differ, so every form runs in the same process from the same state after ``context``
tokens, over the same inputs (made before any timing), in ``rounds`` rounds of ``steps``
steps, the order reversed every other round, after one untimed round each (compiling).
A form's reading is the median over rounds of its round median against the first form's
in the same round (``ratio``, the lowest and highest round beside it); ``best_ms`` is
its fastest round.

It runs on the CPU only: the forms that differ there (blas, frozen, compiled_blas) are CPU
forms, and a GPU's step is timed by tasks.benchmarks.decode (``make gpu-check``), whose
``auto`` picks among the CUDA forms the same way.

    python -m tasks.benchmarks.step_forms --mixers mamba,gla --forms eager,blas,compiled \\
        --d-model 1024 --batch 16 --threads 1 --out forms.csv
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

import zoo
from zoo.stepping import fixed_state, step_forms

from ..engine.cli import emit_points, mixer_label, parse_mixers
from ..engine.runs import environment
from .decode import ratio_summary, round_medians, to_batch

TABLE = ["label", "form", "d_model", "batch", "context", "best_ms", "median_ms", "ratio", "ratio_low", "ratio_high"]
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def compare(name: str, options: dict, forms: list[str], d_model: int, batch: int, context: int, steps: int,
            rounds: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> dict:
    """One mixer's forms against the first of ``forms``: a record whose points are the forms."""
    torch.manual_seed(seed)
    m = zoo.build_mixer(name, d_model, **options).to(dtype=dtype).eval()
    if not (m.has_step_form() and fixed_state(m)):
        raise ValueError(f"mixer {name!r} has no fixed-state step (its state grows with the context): "
                         "its step takes one form; time it with tasks.benchmarks.decode")
    available = step_forms(m)
    missing = [f for f in forms if f not in available]
    if missing:
        raise ValueError(f"forms {missing} cannot run for {name!r} here; choose from {sorted(available)}")
    with torch.inference_mode():
        _, state = m.prefill(torch.randn(1, context, d_model, dtype=dtype), m.init_state(1))
        state = to_batch(state, batch)
        inputs = torch.randn(steps, batch, d_model, dtype=dtype).unbind(0)  # (B, D) each
        contenders = {f: (available[f], state) for f in forms}
        round_medians(contenders, inputs, 1, torch.device("cpu"))  # untimed: compiles, fills caches
        ms = round_medians(contenders, inputs, rounds, torch.device("cpu"))
    points = [{"form": f, "best_ms": min(ms[f]), "median_ms": float(np.median(ms[f])),
               **ratio_summary(ms[f], ms[forms[0]])} for f in forms]
    return {"task": "step_forms", "label": mixer_label(name, options), "mixer": name, "mixer_options": options,
            "d_model": d_model, "batch": batch, "context": context, "steps": steps, "rounds": rounds,
            "dtype": str(dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
            **environment(torch.device("cpu")), "points": points}


def forms_table(rows: list[dict]) -> str:
    """Markdown: per mixer, the first form's fastest round and every other form's ratio to
    it (rows as the CSV holds them: one per mixer and form)."""
    forms = list(dict.fromkeys(r["form"] for r in rows))
    first = forms[0]
    lines = [f"| mixer | {first} ms (best round) | " + " | ".join(f"{f} / {first}" for f in forms[1:]) + " |",
             "|---|" + "---:|" * len(forms)]
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = {r["form"]: r for r in rows if r["label"] == label}
        cells = [f"{float(mine[first]['best_ms']):.2f}", *(f"{float(mine[f]['ratio']):.2f}" for f in forms[1:])]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description="A fixed-state mixer's decode step forms, timed side by side "
                                            "in one process.")
    p.add_argument("--mixers", default="mamba,gla", help="comma-separated name[:option=value...]")
    p.add_argument("--forms", default="eager,blas,compiled",
                   help=f"comma-separated, the first the reference; of {[f for f in zoo.STEP_IMPLS if f != 'auto']}")
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=1024, help="tokens prefilled before the steps")
    p.add_argument("--steps", type=int, default=30, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--out", type=Path, default=None, help="CSV file, one row per mixer and form")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    bad = [f for f in forms if f not in zoo.STEP_IMPLS or f == "auto"]
    if bad or len(set(forms)) != len(forms) or not forms:
        p.error(f"--forms {args.forms!r}: name each form once, of {[f for f in zoo.STEP_IMPLS if f != 'auto']}")
    for flag in ("d_model", "batch", "steps", "rounds"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.context < 0:
        p.error("--context must be at least 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    command = shlex.join(["python", "-m", "tasks.benchmarks.step_forms", *argv])
    try:
        records = [compare(name, options, forms, args.d_model, args.batch, args.context, args.steps, args.rounds,
                           DTYPES[args.dtype])
                   for name, options in parse_mixers(args.mixers)]
    except ValueError as e:  # a mixer or form that cannot run: one line, not a traceback
        p.error(str(e))
    emit_points(records, TABLE, args.out, command)
    return records


if __name__ == "__main__":
    sys.argv[0] = "python -m tasks.benchmarks.step_forms"  # the usage line names the command, not the file
    main()
