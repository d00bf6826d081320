"""``linbench``: run a sweep, see where it stands, draw its figures, write its report.

    linbench run smoke                                  # local, one run at a time
    linbench run sweeps/shipped/mqar.py --parallel 2
    linbench run wikitext2_paper --executor slurm --partition gpu --gpus 1 --time 240
    linbench status smoke                               # queued / running / partial / ok / failed ..., time left
    linbench logs smoke RUN                             # a run's error and the tail of its log
    linbench cancel smoke                               # stop its jobs; a later `run` resumes them
    linbench plot smoke && linbench report smoke
    linbench export smoke                               # results/smoke/runs.csv: a row per run
    linbench sample smoke attention --prompt "The game"  # text from a finished LM run's weights
    linbench headline --write docs/results.md           # the reference sweeps' tables, rewritten in place

and the single-run tools (sweeps.tools): ``linbench task``, ``bench``, ``mixers``, ``gpu-check``.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple

from results.layout import record_path, workdir_for
from results.records import load_records, read_checked, read_record
from tasks.engine.progress import format_line, read_progress
from tasks.engine.runs import REPO
from tasks.published import PUBLISHED

from .hints import Hints
from .launch import FINAL, launch, plan
from .ledger import cancel, flights, in_flight, never_starts, read_ledger, sent_with
from .slurm import describe, gpu_problem
from .spec import SweepError, check_inputs, load_sweep
from .tools import TOOLS, add_tool_verbs, run_tool
from .views import ago, distinguishing, only, ordered, outcome, time_left



def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def _minutes(text: str) -> int:
    """A job's time limit read as sbatch reads ``--time`` (TIME_FORMS: ``2:30`` is two
    minutes thirty), in whole minutes, seconds rounded up. A malformed value, a field out of
    range and zero (sbatch: no limit) or less are refused here, not by sbatch later."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time limit: use {TIME_FORMS} (sbatch's --time)")
    days, first, second, third = (None if g is None else int(g) for g in match.groups())
    if days is None and third is None:  # MM or MM:SS
        hours, minutes, seconds = 0, first, second or 0
        bounded = {"seconds": seconds} if second is not None else {}
    else:  # HH:MM:SS, or D-HH[:MM[:SS]]
        hours, minutes, seconds = first, second or 0, third or 0
        bounded = {"minutes": minutes, "seconds": seconds, **({"hours": hours} if days is not None else {})}
    for name, value in bounded.items():
        if value >= (24 if name == "hours" else 60):
            raise argparse.ArgumentTypeError(f"{text!r}: {name} {value} out of range ({TIME_FORMS})")
    total = (days or 0) * 1440 + hours * 60 + minutes + (seconds > 0)
    if total <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a time limit must be above zero (sbatch reads 0 as none); "
                                         "leave --time out for the default 120 minutes")
    return total


def _positive(kind, hint: str = ""):
    """An argparse type: a number of ``kind`` above 0, refused here (not by sbatch later),
    with ``hint`` after the refusal of one that is not."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} must be > 0{hint}")
        return value
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="linbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", required=True)

    def verb(name, help):
        sp = verbs.add_parser(name, help=help)
        sp.add_argument("sweep", help="a shipped sweep's name (smoke) or a path to a sweep file (my_sweep.py)")
        sp.add_argument("--results-dir", default=None,
                        help="records go to RESULTS_DIR/SWEEP/ (default: the results/ folder that holds "
                             "SWEEP, looked for here, beside the sweep file and in this checkout; else ./results)")
        return sp

    run = _run_options(verb("run", "run every config that has no 'ok' record yet"))
    _reading_verbs(verb)
    _vet_verb(verbs)
    headline = verbs.add_parser("headline", help="the reference sweeps' tables (results/reference), or rewrite "
                                "their marked copies in a Markdown file")
    headline.add_argument("--write", type=Path, help="rewrite the tables marked <!-- headline:NAME --> in this file")
    add_tool_verbs(verbs)
    p.run_verb = run  # its options are what a printed `linbench run` must repeat
    return p


def _run_options(run: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``linbench run``'s options: what runs and how, and the Slurm job's resources."""
    run.add_argument("--executor", choices=["local", "slurm", "debug"], default="local",
                     help="local: subprocesses on this machine; slurm: a job array; debug: in-process")
    run.add_argument("--parallel", type=_positive(int), default=1, help="local: runs at the same time (default 1)")
    run.add_argument("--dry-run", action="store_true", help="check all that can be checked before a run is "
                     "sent (configs, their data files, the --log package, --gpus against sinfo) and list what would "
                     "run, with --executor slurm each job's resources; run nothing")
    run.add_argument("--threads", type=_positive(int), help="torch threads per run (default: the cores it is "
                     "given: --cpus-per-task on Slurm, cores / --parallel locally); recorded")
    run.add_argument("--only", action="append", metavar="LABEL", help="run only the runs of this label (or "
                     "run id, or its first characters, or FIELD=VALUE of their configs: seed=0, train.lr=1e-3); "
                     "repeatable, e.g. the baseline first")
    run.add_argument("--order", action="append", metavar="FIELD", help="run in the order of this config "
                     "field (seq_len, train.lr, label; repeatable: the next breaks ties), e.g. the cheapest "
                     "points first (default: the sweep file's order)")
    run.add_argument("--rerun-diverged", action="store_true",
                     help="run diverged runs again (by default a diverged run is final)")
    s = run.add_argument_group("slurm")
    s.add_argument("--partition")
    s.add_argument("--gpus", type=_positive(int, "; on a CPU partition leave --gpus out"),
                   help="GPUs per node of a job (leave it out on a CPU partition)")
    run.add_argument("--log", choices=["tensorboard", "wandb"],
                     help="live curves of every run (loss, lr, tokens/s, validation, backends) under "
                          "RESULTS_DIR/SWEEP/logs/; needs that package")
    run.add_argument("--tasks-per-node", type=_positive(int), metavar="N",
                     help="processes per run and node (one per GPU): one run trained by DDP or FSDP2 "
                          "(the config's train.strategy) on N x NODES processes; local and slurm")
    s.add_argument("--nodes", type=_positive(int), help="nodes per run (with --tasks-per-node)")
    s.add_argument("--cpus-per-task", type=_positive(int))
    s.add_argument("--mem-gb", type=_positive(float), help="memory per job in GB (whole megabytes are sent)")
    s.add_argument("--signal-lead", type=_positive(int), dest="signal_lead_s", metavar="SECONDS",
                   help="send USR1 (checkpoint and requeue) this long before the time limit "
                        "(default: a tenth of --time, 15 s to 5 min)")
    s.add_argument("--time", type=_minutes, help=f"limit per job, read as sbatch reads it: {TIME_FORMS} "
                   "(2:30 is 2 min 30 s; default 120 minutes); "
                   "a job that reaches it checkpoints and is requeued")
    s.add_argument("--array-parallelism", type=_positive(int), help="array tasks running at once (default 256)")
    s.add_argument("--max-timeouts", type=int, default=3, help="requeues after time-outs before giving up")
    s.add_argument("--account")
    s.add_argument("--qos")
    s.add_argument("--constraint")
    s.add_argument("--setup", action="append", default=[], help="shell line run before the job (repeatable)")
    s.add_argument("--slurm-arg", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="any other sbatch option, e.g. --slurm-arg exclude=node3 (repeatable)")
    s.add_argument("--wait", action="store_true", help="block until every submitted run has a record")

    return run


def _reading_verbs(verb) -> None:
    """The verbs that read a sweep's records or jobs: status, logs, cancel, plot, report,
    export, sample (``verb(name, help)`` adds one with the sweep and --results-dir)."""
    status = verb("status", "each run: queued, running, partial (step, ETA), ok, failed, diverged ...; time left")
    status.add_argument("--brief", action="store_true", help="list only the runs not yet ok (then the counts)")
    status.add_argument("--all-ok", action="store_true",
                        help="exit 1 unless every run is ok (without it: 0 whenever the sweep could be read)")
    logs = verb("logs", "print a run's error and the tail of its job log")
    logs.add_argument("run", help="a run id (or its first characters) or a label")
    logs.add_argument("--lines", type=int, default=40, help="lines of the log's tail (default 40)")
    verb("cancel", "cancel the sweep's queued and running jobs (running ones checkpoint first)")
    plot = verb("plot", "draw the sweep's figures (PNG, each with a CSV of its points); several sweeps or "
                        "record folders on one figure")
    plot.add_argument("more", nargs="*", metavar="SWEEP", help="more sweeps (names, files) or record folders to "
                      "draw beside the first; a label two of them share is told apart by its sweep")
    plot.add_argument("--out", help="folder for the figures (default RESULTS_DIR/SWEEP/plots; for several: "
                      "results/compare/A+B/plots)")
    plot.add_argument("--format", action="append", choices=["svg", "pdf"], default=[], dest="formats",
                      help="also write each figure in this format (repeatable)")
    plot.add_argument("--published", default=str(PUBLISHED), help="CSV of published numbers")
    report = verb("report", "write a Markdown report beside the published numbers")
    report.add_argument("--out", help="file (default RESULTS_DIR/SWEEP/report.md)")
    report.add_argument("--published", default=str(PUBLISHED), help="CSV of published numbers")
    export = verb("export", "write the records as one CSV table (a row per run, or per point)")
    export.add_argument("--out", help="file (default RESULTS_DIR/SWEEP/runs.csv)")
    sample = verb("sample", "write text with a finished language-model run's weights, after a prompt")
    sample.add_argument("run", help="a run id (or its first characters) or a label")
    sample.add_argument("--prompt", required=True, help="the text to continue")
    sample.add_argument("--tokens", type=int, default=50, help="new tokens (default 50)")
    sample.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); above 0: sampled")
    sample.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens only")
    sample.add_argument("--seed", type=int, default=None,
                        help="the sampling seed: the same seed, the same text (default: fresh randomness)")


def _vet_verb(verbs) -> None:
    """``linbench vet``: a report card for one mixer."""
    vet = verbs.add_parser("vet", help="a report card for one mixer: correctness checks, then recall and cost "
                           "beside the zoo, in RESULTS_DIR/vet/MIXER/BUDGET/report.md")
    vet.add_argument("mixer", help="a registered name or an import path (my_pkg.mixers:Mine), options after "
                     "colons (my_pkg.mixers:Mine:width=3)")
    vet.add_argument("--against", default="", help="more mixers to time beside it and attention (comma-separated)")
    vet.add_argument("--budget", default="smoke", choices=["test", "smoke", "cpu", "gpu"],
                     help="test: CI-sized; smoke: about 15 min on 2 CPU cores (default); cpu: the reference "
                     "sweeps' recipes, 3 seeds at each model's best learning rate, under a day on 2 cores; gpu: the "
                     "GPU sweeps' recipes, for a GPU node (docs/extending.md)")
    vet.add_argument("--results-dir", default="results")
    vet.add_argument("--executor", default="local", choices=["local", "slurm"])
    vet.add_argument("--parallel", type=_positive(int), default=2, help="local runs at once (default 2)")
    vet.add_argument("--partition")
    vet.add_argument("--time", type=_minutes, help="Slurm limit per job, as for `linbench run`")
    vet.add_argument("--wait", action="store_true", help="on Slurm, wait for the runs and write the whole card "
                     "(else rerun `linbench vet` once they finish)")


# `linbench run` options a printed rerun leaves out: it names its own runs, and neither
# waiting nor a dry run is what resuming means
NOT_REPEATED = {"help", "sweep", "results_dir", "only", "wait", "dry_run"}


def run_options(run_verb: argparse.ArgumentParser, args) -> tuple[str, ...]:
    """The options ``args`` were given beyond their defaults, as command-line words."""
    words = []
    for action in run_verb._actions:
        value = getattr(args, action.dest, None)
        if action.dest in NOT_REPEATED or value == action.default or not action.option_strings:
            continue
        flag = action.option_strings[-1]  # the long form
        if isinstance(action, argparse._StoreTrueAction):
            words.append(flag)
            continue
        for item in value if isinstance(action, argparse._AppendAction) else [value]:
            text = "=".join(map(str, item)) if isinstance(item, tuple) else str(item)
            # "--setup --version" would read as two options: "--setup=--version" cannot
            words += [f"{flag}={text}"] if text.startswith("-") else [flag, text]
    return tuple(words)


# --log's choices and the package each needs in the job
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_before_sending(args, sweep, opts: dict) -> None:
    """Everything that would fail each run once its job starts, and that can be seen from
    here, refused in one line before anything is queued or any folder made: data files the
    configs name, the --log package, and --gpus on a partition without GPUs."""
    check_inputs(sweep.runs, sweep.name)
    package = TRACKER_PACKAGES.get(args.log)
    if package and importlib.util.find_spec(package) is None:
        others = [f"use --log {kind}" for kind, other in TRACKER_PACKAGES.items()
                  if kind != args.log and importlib.util.find_spec(other) is not None]
        raise SweepError(f"--log {args.log} needs the `{package}` package, which does not import here: "
                         f"pip install {package}, or {', or '.join([*others, 'leave --log out'])}")
    if args.executor == "slurm":
        problem = gpu_problem(opts)
        if problem:
            raise SweepError(problem)


def cmd_run(args, sweep) -> int:
    sweep = ordered(only(sweep, args.only), args.order)
    final = tuple(s for s in FINAL if not (args.rerun_diverged and s == "diverged"))
    opts = {k: getattr(args, k) for k in ("partition", "gpus", "nodes", "tasks_per_node", "cpus_per_task",
                                          "mem_gb", "time",
                                          "array_parallelism", "max_timeouts", "signal_lead_s", "threads",
                                          "account", "qos", "constraint", "setup", "log")}
    opts["extra"] = dict(args.slurm_arg)
    if args.executor == "slurm" and not args.dry_run and shutil.which("sbatch") is None:
        raise SweepError("--executor slurm submits with sbatch, which is not on PATH: run it on a Slurm login node")
    check_before_sending(args, sweep, opts)
    if args.dry_run:
        diff = distinguishing(sweep.runs)
        for run in sweep.runs:
            rec = read_record(record_path(args.results_dir, sweep.name, run.run_id))
            print(f"{run.run_id}  {(rec or {}).get('status', '-'):<8} {run.task:<10} {run.name:<24} "
                  f"{diff[run.run_id][:120]}")
        print(f"{len(sweep)} configs valid")
        if args.executor == "slurm":
            print("\n".join(describe(sweep.name, opts, plan(sweep, args.results_dir, final)["todo"])))
        return 0
    try:
        summary = launch(sweep, args.results_dir, args.executor, args.parallel, opts, wait=args.wait,
                         final=final, hints=args.hints)
    except KeyboardInterrupt:
        flying = in_flight(args.results_dir, sweep.name, [r.run_id for r in sweep.runs])
        print(f"\ninterrupted: {len(flying)} run(s) still queued or running"
              + (f"; stop them with `{args.hints.command('cancel')}`; then `{args.hints.rerun()}` resumes "
                 "them from their checkpoints" if flying else f"; `{args.hints.rerun()}` resumes "
                 "the stopped runs from their checkpoints"), file=sys.stderr)
        return 130
    if summary["statuses"]:
        print("finished:", ", ".join(f"{n} {s}" for s, n in sorted(summary["statuses"].items())))
    if summary["job_ids"] and not args.wait:
        print(f"follow them with `{args.hints.command('status')}`, stop them with "
              f"`{args.hints.command('cancel')}`")
        return 0
    states = {rid: seen.status for rid, seen in _survey(args, sweep).items()}
    not_ok = collections.Counter(st for st in states.values() if st != "ok")
    if not_ok:
        print("not ok: " + ", ".join(f"{n} {s}" for s, n in not_ok.most_common())
              + f" (`{args.hints.command('status')}`)")
    # 0 when every run is final, or in flight on Slurm when not waiting for it
    fine = (*FINAL, *(() if args.wait or args.executor != "slurm" else ("queued", "running")))
    return 0 if all(st in fine for st in states.values()) else 1


class Seen(NamedTuple):
    """What `status` and `logs` know of one run, each source read once."""
    status: str
    record: dict  # {} without one
    progress: dict | None  # its heartbeat, where it has no record
    reason: str  # Slurm's reason for a queued job's wait, or ""


def _survey(args, sweep, ledger: dict | None = None) -> dict[str, Seen]:
    """{run_id: Seen}. The status is the record's, else queued / running (a job in flight),
    lost (its heartbeat says running, but no process or job is: killed without a word),
    partial (a checkpoint, no job) or not run."""
    flying = flights(args.results_dir, sweep.name, [run.run_id for run in sweep.runs], ledger)
    out = {}
    for run in sweep.runs:
        path = record_path(args.results_dir, sweep.name, run.run_id)
        rec, damage = read_checked(path)
        rec = rec or {}
        workdir = workdir_for(args.results_dir, sweep.name, run.run_id)
        progress = None if rec else read_progress(workdir)
        state, reason = flying.get(run.run_id, (None, ""))
        status = (rec.get("status") or state or ("damaged" if damage else
                                                   "lost" if (progress or {}).get("status") == "running" else
                                                   "partial" if (workdir / "checkpoint.pt").exists() else "not run"))
        out[run.run_id] = Seen(status, rec, progress, f"{path}: {damage}" if damage else reason)
    return out


# a config cell of the report's list of runs not ok: longer ones are cut
CONFIG_CHARS = 100


def not_ok_runs(args, sweep) -> list[dict]:
    """The runs of ``sweep`` without an ok record, in its order, as ``results.report``
    lists them: run_id, label, state (``_survey``'s: the one `status` shows), config (the
    fields that tell it from the other runs of its label, ``views.distinguishing``) and
    note (its error's last line, or why its record is damaged)."""
    seen = _survey(args, sweep)
    by_label = collections.defaultdict(list)
    for run in sweep.runs:
        by_label[run.name].append(run)
    config = {rid: text for runs in by_label.values() for rid, text in distinguishing(runs).items()}
    out = []
    for run in sweep.runs:
        one = seen[run.run_id]
        if one.status == "ok":
            continue
        text = config[run.run_id]
        note = ((one.record.get("error") or "").strip().splitlines() or [""])[-1][:120]
        if one.status == "damaged":  # the reason names the file, which the row's run id already does
            note = one.reason.removeprefix(f"{record_path(args.results_dir, sweep.name, run.run_id)}: ")
        out.append({"run_id": run.run_id, "label": run.name, "state": one.status, "note": note,
                    "config": text if len(text) <= CONFIG_CHARS else text[:CONFIG_CHARS - 1] + "…"})
    return out


def _detail(args, sweep, run, seen: Seen, ledger: dict) -> list[str]:
    """What `status` says of one run beside its status (``ledger``: the sweep's, read once)."""
    status, rec, progress = seen.status, seen.record, seen.progress
    if status == "ok":
        return [outcome(rec)]
    detail = (rec.get("error") or "").strip().splitlines()[-1:]
    if rec.get("error"):
        detail.append(f"(`{args.hints.command('logs', run.run_id)}`)")
    if progress and not rec:
        detail = [format_line(progress) + (f" ({ago(time.time() - progress['updated'])} ago)"
                                           if progress.get("updated") else "")]
    if status == "lost":
        at = progress.get("checkpoint_step")
        ckpt = workdir_for(args.results_dir, sweep.name, run.run_id) / "checkpoint.pt"
        # the rerun goes where the run was sent (executor and options of its ledger entry)
        rerun = args.hints.rerun([run.run_id], sent_with(ledger.get(run.run_id, {})))
        detail.append("- its process died without a record; "
                      + (f"{'its checkpoint' if at is None else f'the checkpoint of step {at}'} is kept and "
                         f"`{rerun}` resumes from it" if ckpt.exists() else f"no checkpoint: `{rerun}` starts it again"))
    if status == "damaged":
        detail.append(f"- {seen.reason}; `linbench run` trains it again (delete or fix the file first)")
    if status == "unknown":
        detail.append("(squeue did not answer: its Slurm job may still be queued or running)")
    if status == "queued" and seen.reason:
        detail.append(f"(Slurm: {seen.reason}"
                      + (f"; Slurm will not start it as submitted: `{args.hints.command('cancel')}`, "
                         "then submit with options it can meet)" if never_starts(seen.reason) else ")"))
    return detail


def cmd_status(args, sweep) -> int:
    ledger = read_ledger(args.results_dir, sweep.name)
    seen = _survey(args, sweep, ledger)
    counts = collections.Counter(s.status for s in seen.values())
    heartbeats, walls = {}, {}
    for run in sweep.runs:
        one = seen[run.run_id]
        if one.status == "ok":
            walls[run.run_id] = (one.record.get("metrics") or {}).get("wall_time") or 0.0
        elif one.progress:
            heartbeats[run.run_id] = one.progress
        if args.brief and one.status == "ok":
            continue
        detail = _detail(args, sweep, run, one, ledger)
        print(f"  {run.run_id}  {one.status:<8} {run.task:<10} {run.name}  {' '.join(d for d in detail if d)}")
    ids = {p.stem for p in (Path(args.results_dir) / sweep.name).glob("*.json")}
    stale = len(ids - {run.run_id for run in sweep.runs})
    print(f"{sweep.name}: {len(sweep)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.most_common())
          + (f" ({stale} record(s) of configs no longer in the sweep)" if stale else "")
          + f"; records in {Path(args.results_dir).resolve() / sweep.name}")
    print(time_left(sweep, {rid: s.status for rid, s in seen.items()}, heartbeats, walls))
    return 1 if args.all_ok and counts["ok"] < len(sweep) else 0


def _find(args, sweep, key: str, keep=None, what: str = "run"):
    """The one run of ``sweep`` whose id starts with ``key`` or whose label is ``key``,
    among those ``keep`` accepts (default: all)."""
    hits = [run for run in sweep.runs if (run.run_id.startswith(key) or run.label == key)
            and (keep is None or keep(run))]
    if len(hits) != 1:
        which = f"no {what}" if not hits else f"{len(hits)} {what}s ({', '.join(r.run_id for r in hits)})"
        raise SweepError(f"{sweep.name}: {which} with id or label {key!r}; "
                         f"`{args.hints.command('status')}` lists them")
    return hits[0]


def cmd_logs(args, sweep) -> int:
    run = _find(args, sweep, args.run)
    ledger = read_ledger(args.results_dir, sweep.name)
    seen = _survey(args, dataclasses.replace(sweep, runs=[run]), ledger)[run.run_id]
    entry, rec = ledger.get(run.run_id), seen.record
    print(f"{run.run_id}  {run.name}  status: {seen.status}  "
          + " ".join(d for d in _detail(args, sweep, run, seen, ledger) if d))
    if rec.get("error"):
        print("--- error\n" + rec["error"].rstrip())
    if entry is None:
        print("--- no job of this run in the ledger (run with --executor debug, or never submitted)")
        return 0
    log = Path(entry["log"])
    print(f"--- {entry['executor']} job {entry['job_id']}, log {log}")
    if log.exists():
        print("\n".join(log.read_text(errors="replace").splitlines()[-args.lines:]))
    else:
        print("(the log does not exist yet: the job has not started)")
    return 0


def cmd_sample(args, sweep) -> int:
    from tasks import TASKS
    from tasks.engine.runs import weights_path

    def writer(run):  # the task's sample(), None where the task writes no text
        return getattr(sys.modules[TASKS[run.task][1].__module__], "sample", None)

    run = _find(args, sweep, args.run, keep=writer, what="language-model run")
    weights = weights_path(workdir_for(args.results_dir, sweep.name, run.run_id))
    if not weights.exists():
        raise SweepError(f"{sweep.name}: no weights at {weights}: the run has not finished on this machine, "
                         f"or finished before runs kept their weights (move its record away, then "
                         f"`{args.hints.rerun([run.run_id])}` trains it again)")
    try:
        text = writer(run)(run.config, weights, args.prompt, args.tokens, args.temperature, args.top_k, args.seed)
    except ValueError as exc:  # a bad prompt, length or sampling argument: said in one line
        raise SweepError(f"sample: {exc}") from None
    print(args.prompt + " " + text)
    return 0


def cmd_cancel(args, sweep) -> int:
    done = cancel(args.results_dir, sweep.name)
    if not done:
        print(f"{sweep.name}: nothing in flight")
        return 0
    print(f"{sweep.name}: {len(done)} job(s) cancelled; each checkpoints first")
    # the runs resume as they were sent: same executor and options, these runs only
    ledger = read_ledger(args.results_dir, sweep.name)
    sent = collections.defaultdict(list)
    for rid in done:
        sent[sent_with(ledger.get(rid, {}))].append(rid)
    for options, rids in sent.items():
        print(f"`{args.hints.rerun(sorted(rids), options)}` resumes {'it' if len(rids) == 1 else 'them'}")
    return 0


def _frame(args, sweep):
    from results.records import records_frame
    records = load_records(Path(args.results_dir) / sweep.name, [run.run_id for run in sweep.runs])
    if not records:
        raise SweepError(f"{sweep.name}: no records under {Path(args.results_dir) / sweep.name}; run it first")
    return records_frame(records)


def _source(name: str, results_dir: str | None):
    """A sweep named on the command line, or a folder of records: (its name, its records'
    table, its folder)."""
    from results.records import records_frame
    folder = Path(name)
    if folder.is_dir() and any(folder.glob("*.json")):
        return folder.name, records_frame(load_records(folder)), folder
    sweep = load_sweep(name)
    folder = Path(results_dir_for(sweep, results_dir)) / sweep.name
    records = load_records(folder, [run.run_id for run in sweep.runs])
    if not records:
        raise SweepError(f"{sweep.name}: no records under {folder}; run it first")
    return sweep.name, records_frame(records), folder


def cmd_plot(args) -> int:
    from results.plots import plot_all
    from results.records import combine
    sources = [_source(name, args.results_dir) for name in [args.sweep, *args.more]]
    frame = combine({name: table for name, table, _ in sources})
    names = [name for name, _, _ in sources]
    default = sources[0][2] / "plots" if len(sources) == 1 else Path("results") / "compare" / "+".join(names) / "plots"
    paths = plot_all(frame, Path(args.out or default), args.published, tuple(args.formats))
    for path in paths:
        print(path)
    if not paths:
        print(f"{' + '.join(names)}: no figure applies to these records")
    return 0


# runs not ok that `report` prints; the report itself lists every one
PRINTED = 20


def cmd_report(args, sweep) -> int:
    from results.report import sweep_counts, write_report
    out = Path(args.out or Path(args.results_dir) / sweep.name / "report.md")
    frame, not_ok = _frame(args, sweep), not_ok_runs(args, sweep)
    write_report(frame, out, args.published, title=sweep.name, not_ok=not_ok)
    print(out)
    if not_ok:
        print(f"{sweep.name}: {sweep_counts(len(sweep) - len(not_ok), not_ok)}")
        for run in not_ok[:PRINTED]:
            print("  " + "  ".join(filter(None, [run["run_id"], f"{run['state']:<8} {run['label']}",
                                                 run["config"], run["note"]])))
        if len(not_ok) > PRINTED:
            print(f"  ... {len(not_ok) - PRINTED} more: in {out}, and `{args.hints.command('status', '--brief')}`")
    return 0


def cmd_export(args, sweep) -> int:
    """The table the plots and the report read (``results.records.records_frame``: config
    fields as ``config.<path>``, metrics by their names), for pandas or a spreadsheet
    elsewhere; curves (lists) stay JSON in their cells."""
    from results.records import export_csv
    out = Path(args.out or Path(args.results_dir) / sweep.name / "runs.csv")
    frame = _frame(args, sweep)
    export_csv(frame, out)
    print(f"{out}: {len(frame)} rows, {len(frame.columns)} columns")
    return 0


def cmd_headline(args) -> int:
    from results.paper import figure, headline
    planned = {sweep: len(load_sweep(sweep).runs) for sweep in headline.reference_sweeps()}
    made = headline.tables(planned)
    # the README's figure, redrawn from the same records and published.csv as the tables
    print(f"drew {figure.gap_figure()} (+ .csv)")
    if args.write:
        args.write.write_text(headline.update(args.write.read_text(), made))
        print(f"rewrote {', '.join(made)} in {args.write}")
    else:
        print("\n\n".join(f"{name}:\n\n{table}" for name, table in made.items()))
    return 0


def cmd_vet(args) -> int:
    from tasks.engine.cli import parse_mixers
    from .vet import vet
    (mixer, options), *extra = parse_mixers(args.mixer)
    if extra:
        raise SweepError(f"vet takes one mixer, got {args.mixer!r}: put the others in --against")
    import zoo
    for name, _ in [(mixer, options), *(parse_mixers(args.against) if args.against else [])]:
        try:
            zoo.mixer_class(name)
        except ValueError as exc:  # an unknown name or an import path that does not import: one line
            raise SweepError(f"vet: {exc}") from None
    slurm = {"partition": args.partition, "time": args.time}
    card = vet(mixer, options, parse_mixers(args.against) if args.against else [], args.budget, args.results_dir,
               args.executor, args.parallel, slurm, wait=args.executor == "local" or args.wait)
    print(card)
    return 0


def results_dir_for(sweep, given: str | None) -> str:
    """RESULTS_DIR as given, else the first results/ folder holding this sweep's records:
    the working directory's, the sweep file's folder's, this checkout's (a shipped sweep
    run from anywhere); else ./results, where a first run writes. So `linbench status`
    from another directory finds the records instead of reporting every run "not run"."""
    if given is not None:
        return given
    candidates = [Path("results"), Path(sweep.path).resolve().parent / "results", REPO / "results"]
    found = next((c for c in candidates if (c / sweep.name).is_dir()), Path("results"))
    return str(found.resolve()) if found != Path("results") else "results"


def check_results_dir(path: str, write: bool) -> None:
    """Refuse, in one line, a RESULTS_DIR that cannot hold records: a file on its path, or
    (for a verb that writes) a folder this user cannot write to."""
    here = Path(path).resolve()
    for part in [here, *here.parents]:
        if part.exists() and not part.is_dir():
            raise SweepError(f"results dir {path}: {part} is a file, not a folder; pass --results-dir DIR")
    existing = next(p for p in [here, *here.parents] if p.exists())
    if write and not os.access(existing, os.W_OK):
        raise SweepError(f"results dir {path}: {existing} is not writable here; pass --results-dir DIR "
                         "on a writable filesystem")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    tool = argv[0] if argv and argv[0] in TOOLS else None  # its own command line reads the rest
    p = parser()
    args = None if tool else p.parse_args(argv)
    try:
        if tool:
            return run_tool(tool, argv[1:])
        if args.verb == "headline":
            return cmd_headline(args)
        if args.verb == "vet":
            return cmd_vet(args)
        if args.verb == "plot":  # its sources may be record folders, not sweeps
            return cmd_plot(args)
        sweep = load_sweep(args.sweep)
        args.hints = Hints(args.sweep, args.results_dir, run_options(p.run_verb, args) if args.verb == "run" else (),
                           tuple(getattr(args, "only", None) or ()))
        args.results_dir = results_dir_for(sweep, args.results_dir)
        check_results_dir(args.results_dir, write=args.verb in ("run", "cancel", "export", "report"))
        verbs = {"run": cmd_run, "status": cmd_status, "logs": cmd_logs, "cancel": cmd_cancel, "export": cmd_export,
                 "report": cmd_report, "sample": cmd_sample}
        return verbs[args.verb](args, sweep)
    except SweepError as exc:
        print(f"linbench: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `linbench status smoke | head`: the reader has all it wanted. Point stdout at
        # /dev/null so that the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a command killed by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
