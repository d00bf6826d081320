"""``linbench``: run a sweep, see where it stands, draw its figures, write its report.

    linbench run smoke                                  # local, one run at a time
    linbench run sweeps/mqar.py --parallel 2
    linbench run wikitext2_paper --executor slurm --partition gpu --gpus 1 --time 240
    linbench status smoke
    linbench plot smoke && linbench report smoke
"""
from __future__ import annotations

import argparse
import collections
import shutil
import sys
from pathlib import Path

from results.records import load_records, read_record, record_path

from .core import SweepError, load_sweep
from .launch import launch, workdir_for

PUBLISHED = Path(__file__).resolve().parent.parent / "results" / "published.csv"


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _minutes(text: str) -> int:
    """Minutes, or Slurm's [D-]HH:MM[:SS]."""
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days or len(parts) == 3:  # D-H[:M[:S]] or H:M:S
        h, m, s = (parts + [0, 0])[:3]
    else:  # M[:S]
        h, (m, s) = 0, (parts + [0])[:2]
    return int(days or 0) * 1440 + h * 60 + m + (s > 0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="linbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", required=True)

    def verb(name, help):
        sp = verbs.add_parser(name, help=help)
        sp.add_argument("sweep", help="a shipped sweep's name (smoke) or a path (sweeps/smoke.py)")
        sp.add_argument("--results-dir", default="results", help="records go to RESULTS_DIR/SWEEP/ (default: results)")
        return sp

    run = verb("run", "run every config that has no 'ok' record yet")
    run.add_argument("--executor", choices=["local", "slurm", "debug"], default="local",
                     help="local: subprocesses on this machine; slurm: a job array; debug: in-process")
    run.add_argument("--parallel", type=int, default=1, help="local: runs at the same time (default 1)")
    run.add_argument("--dry-run", action="store_true", help="validate and list what would run, run nothing")
    s = run.add_argument_group("slurm")
    s.add_argument("--partition")
    s.add_argument("--gpus", type=int, help="GPUs per job")
    s.add_argument("--cpus-per-task", type=int)
    s.add_argument("--mem-gb", type=float)
    s.add_argument("--time", type=_minutes, help="limit per job: minutes or [D-]HH:MM[:SS] (default 120); "
                   "a job that reaches it checkpoints and is requeued")
    s.add_argument("--array-parallelism", type=int, help="array tasks running at once (default 256)")
    s.add_argument("--max-timeouts", type=int, default=3, help="requeues after time-outs before giving up")
    s.add_argument("--account")
    s.add_argument("--qos")
    s.add_argument("--constraint")
    s.add_argument("--setup", action="append", default=[], help="shell line run before the job (repeatable)")
    s.add_argument("--slurm-arg", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="any other sbatch option, e.g. --slurm-arg exclude=node3 (repeatable)")
    s.add_argument("--wait", action="store_true", help="block until every submitted run has a record")

    verb("status", "count records by status; list the runs that are not ok")
    plot = verb("plot", "draw the sweep's figures (PNG)")
    plot.add_argument("--out", help="folder for the PNGs (default RESULTS_DIR/SWEEP/plots)")
    report = verb("report", "write a Markdown report beside the published numbers")
    report.add_argument("--out", help="file (default RESULTS_DIR/SWEEP/report.md)")
    report.add_argument("--published", default=str(PUBLISHED), help="CSV of published numbers")
    return p


def cmd_run(args, sweep) -> int:
    if args.dry_run:
        for run in sweep.runs:
            rec = read_record(record_path(args.results_dir, sweep.name, run.run_id))
            print(f"{run.run_id}  {(rec or {}).get('status', '-'):<8} {run.task:<10} {run.name}")
        print(f"{len(sweep)} configs valid")
        return 0
    if args.executor == "slurm" and shutil.which("sbatch") is None:
        raise SweepError("--executor slurm submits with sbatch, which is not on PATH: run it on a Slurm login node")
    opts = {k: getattr(args, k) for k in ("partition", "gpus", "cpus_per_task", "mem_gb", "time",
                                          "array_parallelism", "max_timeouts", "account", "qos",
                                          "constraint", "setup")}
    opts["extra"] = dict(args.slurm_arg)
    summary = launch(sweep, args.results_dir, args.executor, args.parallel, opts, wait=args.wait)
    if summary["statuses"]:
        print("finished:", ", ".join(f"{n} {s}" for s, n in sorted(summary["statuses"].items())))
    bad = {s for s in summary["statuses"] if s != "ok"}
    return 1 if bad else 0


def cmd_status(args, sweep) -> int:
    counts = collections.Counter()
    for run in sweep.runs:
        rec = read_record(record_path(args.results_dir, sweep.name, run.run_id))
        status = rec["status"] if rec else "not run"
        if rec is None and (workdir_for(args.results_dir, sweep.name, run.run_id) / "checkpoint.pt").exists():
            status = "partial"  # interrupted or running: a checkpoint, no record yet
        counts[status] += 1
        if status != "ok":
            detail = ((rec or {}).get("error") or "").strip().splitlines()[-1:] or [""]
            print(f"  {run.run_id}  {status:<8} {run.task:<10} {run.name}  {detail[0][:100]}")
    ids = {run.run_id for run in sweep.runs}
    stale = len([r for r in load_records(Path(args.results_dir) / sweep.name) if r.get("run_id") not in ids])
    print(f"{sweep.name}: {len(sweep)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.most_common())
          + (f" ({stale} record(s) of configs no longer in the sweep)" if stale else ""))
    return 0 if counts["ok"] == len(sweep) else 1


def _frame(args, sweep):
    from results.records import records_frame
    records = load_records(Path(args.results_dir) / sweep.name, [run.run_id for run in sweep.runs])
    if not records:
        raise SweepError(f"{sweep.name}: no records under {Path(args.results_dir) / sweep.name}; run it first")
    return records_frame(records)


def cmd_plot(args, sweep) -> int:
    from results.plots import plot_all
    out = Path(args.out or Path(args.results_dir) / sweep.name / "plots")
    paths = plot_all(_frame(args, sweep), out)
    for path in paths:
        print(path)
    if not paths:
        print(f"{sweep.name}: no figure applies to these records")
    return 0


def cmd_report(args, sweep) -> int:
    from results.report import write_report
    out = Path(args.out or Path(args.results_dir) / sweep.name / "report.md")
    write_report(_frame(args, sweep), out, args.published, title=sweep.name)
    print(out)
    return 0


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        sweep = load_sweep(args.sweep)
        return {"run": cmd_run, "status": cmd_status, "plot": cmd_plot, "report": cmd_report}[args.verb](args, sweep)
    except SweepError as exc:
        print(f"linbench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
