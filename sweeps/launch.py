"""Running a sweep: one checkpointable job per run, executed in-process (``debug``), as
local subprocesses at most N at a time (``local``), or as a Slurm job array (``slurm``),
the last two through submitit.

What one job does (train a run, write its record, checkpoint and requeue on a signal)
is ``sweeps.jobs``; this module plans which runs to send and keeps at most N running.

The records, not submitit's job states, say what is done: without Slurm accounting
submitit cannot read job states, and a record outlives the cluster's memory of a job.
"""
from __future__ import annotations

import collections
import os
import sys
import time
from pathlib import Path

import submitit
from tqdm.auto import tqdm

from results.layout import record_path, workdir_for
from results.records import read_record
from tasks.engine.progress import read_progress

from .hints import Hints
from .jobs import PREEMPT_SIGNAL, RunJob, execute, ledger_entry, log_status
from .ledger import cancel_requested, in_flight, read_ledger, record_submissions
from .slurm import submit_slurm, wait_slurm
from .spec import RunConfig, Sweep

# Statuses that end a run for good: a diverged run diverges again with the same seed.
FINAL = ("ok", "diverged")


def plan(sweep: Sweep, results_dir: str | Path, final=FINAL) -> dict[str, list]:
    """The runs by what `run` does with them: "todo", "ok", "final" (another final
    status, not rerun), "in_flight" (a job of theirs is queued or running)."""
    flying = in_flight(results_dir, sweep.name, [run.run_id for run in sweep.runs])
    out = {"todo": [], "ok": [], "final": [], "in_flight": []}
    for run in sweep.runs:
        status = (read_record(record_path(results_dir, sweep.name, run.run_id)) or {}).get("status")
        key = ("ok" if status == "ok" else "final" if status in final else
               "in_flight" if run.run_id in flying else "todo")
        out[key].append(run)
    return out


def launch(sweep: Sweep, results_dir: str | Path = "results", executor: str = "local", parallel: int = 1,
           slurm: dict | None = None, wait: bool = False, log=print, final=FINAL,
           hints: Hints | None = None) -> dict:
    """Run (or submit) every run of ``sweep`` that has no final record and no job in
    flight. Returns a summary: ``submitted``, ``skipped``, ``statuses`` (of runs
    finished here) and ``job_ids`` (Slurm). ``hints``: how the user launched it, for the
    commands the jobs' logs and ``linbench cancel`` print."""
    results_dir = Path(results_dir).resolve()
    hints = hints or Hints(sweep.name)
    parts = plan(sweep, results_dir, final)
    todo = parts["todo"]
    log(f"{sweep.name}: {len(sweep)} runs, {len(parts['ok'])} already ok, "
        + (f"{len(parts['final'])} final (not rerun), " if parts["final"] else "")
        + (f"{len(parts['in_flight'])} in flight (queued or running), " if parts["in_flight"] else "")
        + f"{len(todo)} to run ({executor})")
    summary = {"submitted": len(todo), "skipped": len(sweep) - len(todo), "statuses": {}, "job_ids": []}
    # --wait waits for every selected run: those already in flight on Slurm too
    flying = _slurm_entries(results_dir, sweep.name, parts["in_flight"]) if executor == "slurm" and wait else []
    if not todo and not flying:
        return summary
    folder = results_dir / sweep.name / "submitit"
    if executor == "debug":
        statuses = [log_status(run, execute(run, sweep.name, results_dir, executor="debug", progress=True,
                                            log=(slurm or {}).get("log")), log)
                    for run in todo]
    elif executor == "local":
        statuses = _run_local(todo, sweep.name, results_dir, folder, parallel, slurm or {}, log, hints)
    elif executor == "slurm":
        submitted = time.time()
        jobs = submit_slurm(todo, sweep.name, results_dir, folder, slurm or {}, hints) if todo else []
        summary["job_ids"] = sorted({j.job_id.split("_")[0] for j in jobs})
        if jobs:
            log(f"submitted {len(jobs)} job(s) as {', '.join(summary['job_ids'])}; logs in {folder}")
        if not wait:
            return summary
        if flying:
            log(f"waiting for {len(flying)} run(s) already in flight too")
        new = [(run, job.job_id, str(job.paths.stdout), submitted) for run, job in zip(todo, jobs)]
        statuses = wait_slurm(new + flying, sweep.name, results_dir, log=log)
    else:
        raise ValueError(f"executor={executor!r} is not valid; choose one of ['local', 'slurm', 'debug']")
    summary["statuses"] = dict(collections.Counter(statuses))
    return summary


def _slurm_entries(results_dir, sweep: str, runs) -> list[tuple]:
    """(run, job id, job log, submitted) of the runs whose ledger entry is a Slurm job."""
    ledger = read_ledger(results_dir, sweep)
    return [(run, e["job_id"], e.get("log", ""), e.get("submitted", 0.0)) for run in runs
            if (e := ledger.get(run.run_id, {})).get("executor") == "slurm" and e.get("job_id")]


def may_start(run: RunConfig, running: list, parallel: int) -> bool:
    """Whether the local executor may start ``run`` beside the ``running`` ones."""
    if not running:
        return True
    return len(running) < parallel and not run.exclusive and not any(r.exclusive for r in running)


def _fraction(results_dir, sweep: str, run: RunConfig) -> float:
    """How much of the run is trained, from its heartbeat (0 before the first one)."""
    p = read_progress(workdir_for(results_dir, sweep, run.run_id)) or {}
    return min(1.0, p["step"] / p["steps"]) if p.get("step") and p.get("steps") else 0.0


def _run_local(todo, sweep, results_dir, folder, parallel, params, log, hints) -> list[str]:
    """submitit's local executor starts every job at once: keep at most ``parallel``,
    and start nothing beside a run marked ``exclusive`` (a timing would measure the other)."""
    parallel = max(1, parallel)
    cores = os.cpu_count() or 1
    ex = submitit.LocalExecutor(folder)
    ex.update_parameters(timeout_min=params.get("time") or 7 * 24 * 60,
                         tasks_per_node=params.get("tasks_per_node") or 1,  # processes per run
                         setup=[f"export SUBMITIT_PREEMPT_SIGNAL={PREEMPT_SIGNAL}"])
    queue, running, statuses, since = list(todo), {}, [], time.time()
    bar = tqdm(total=len(todo), desc=sweep, unit="run", disable=log is not print)
    ticking = sys.stderr.isatty()  # a log file gets a line per finished run, not a ticking clock
    try:
        while queue or running:
            started = False
            if queue and cancel_requested(results_dir, sweep, since):
                log(f"{sweep}: cancelled; {len(queue)} run(s) not started")
                queue = []
            while queue and may_start(queue[0], list(running.values()), parallel):
                run = queue.pop(0)
                threads = params.get("threads") or (cores if run.exclusive else max(1, cores // parallel))
                job = ex.submit(RunJob(run, sweep, results_dir, "local", threads, params.get("log"), hints))
                running[job] = run
                record_submissions(results_dir, sweep, {run.run_id: ledger_entry("local", job, hints.run_options)})
                started = True
            if started:
                bar.set_postfix_str(", ".join(r.name for r in running.values())[:60])
            time.sleep(0.5)
            finished = [j for j in running if j.done()]
            for job in finished:
                run = running.pop(job)
                rec = read_record(record_path(results_dir, sweep, run.run_id))
                status = rec["status"] if rec else f"no record (log: {job.paths.stderr})"
                statuses.append(log_status(run, status, bar.write if log is print else log))
            # finished runs plus the trained fraction of the running ones (their heartbeats)
            bar.n = round(len(statuses) + sum(_fraction(results_dir, sweep, r) for r in running.values()), 2)
            if ticking or finished:
                bar.refresh()
    except KeyboardInterrupt:
        for job in running:
            job.cancel(check=False)
        raise
    finally:
        bar.close()
    return statuses
