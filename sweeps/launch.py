"""Running a sweep: one checkpointable job per run, executed in-process (``debug``), as
local subprocesses at most N at a time (``local``), or as a Slurm job array (``slurm``),
the last two through submitit.

Preemption and time-outs: Slurm is asked to send SIGUSR1 before the time limit, and
submitit inside the job is told that USR1 is its preemption signal. The training loop
catches USR1 (and SIGTERM, which ``scontrol requeue`` and preemption send), writes
``workdir/checkpoint.pt`` at the next step boundary and hands the signal on to
submitit, which calls ``RunJob.checkpoint`` and requeues the job. The requeued job runs
the task again, and the task resumes from that checkpoint.

The records, not submitit's job states, say what is done: without Slurm accounting
submitit cannot read job states, and a record outlives the cluster's memory of a job.
"""
from __future__ import annotations

import collections
import contextlib
import fcntl
import getpass
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import submitit
import torch
from tqdm.auto import tqdm

import tasks
from results.records import STATUSES, now, provenance, read_record, record_path, write_record

from .core import RunConfig, Sweep

PREEMPT_SIGNAL = "USR1"  # one the training loop checkpoints on (it does not listen to USR2)
REPO = Path(__file__).resolve().parent.parent


def workdir_for(results_dir: Path, sweep: str, run_id: str) -> Path:
    return Path(results_dir) / sweep / "runs" / run_id


@contextlib.contextmanager
def _exclusive(workdir: Path):
    """Yield True when this process holds the run's lock: a run submitted twice (two
    `linbench run` at once) must not train twice into one checkpoint."""
    with open(workdir / ".lock", "w") as fd:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def _bump_attempts(workdir: Path) -> int:
    path = workdir / "attempts"
    n = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(n))
    return n


def _classify(exc: BaseException) -> str:
    if isinstance(exc, submitit.core.utils.UncompletedJobError):
        return "timeout"  # submitit gave up requeueing
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):  # the former is torch.OutOfMemoryError
        return "oom"
    return "failed"


def execute(run: RunConfig, sweep: str, results_dir: str | Path, run_fn=None, executor: str = "debug",
            threads: int | None = None, progress: bool = False) -> str:
    """Run one config and write its record; returns the status. ``run_fn`` defaults to
    the task's registered ``run`` (jobs carry it, so a task registered at run time,
    e.g. by a test, also runs in a fresh process). Returns without a record when the
    run was interrupted (it is being requeued) or runs elsewhere ("busy")."""
    path = record_path(results_dir, sweep, run.run_id)
    old = read_record(path)
    if old is not None and old.get("status") == "ok":
        return "ok"  # a duplicate submission finds it done
    run_fn = run_fn or tasks.TASKS[run.task][1]
    workdir = workdir_for(results_dir, sweep, run.run_id)
    workdir.mkdir(parents=True, exist_ok=True)
    with _exclusive(workdir) as mine:
        if not mine:
            return "busy"
        attempts = _bump_attempts(workdir)
        if threads:
            torch.set_num_threads(threads)
        started, t0 = now(), time.perf_counter()
        metrics, error = {}, None
        try:
            metrics = dict(run_fn(run.config, workdir=workdir, progress=progress))
            status = metrics.get("status", "ok")
        except Exception as exc:  # SystemExit (submitit's requeue) and Ctrl-C pass through
            status, error = _classify(exc), traceback.format_exc()
        if status == "interrupted":
            return status  # the checkpoint is written; the requeued job (or a rerun) resumes
        if status not in STATUSES:
            status, error = "failed", f"task returned status {status!r}; expected one of {list(STATUSES)}"
        record = {
            "run_id": run.run_id, "sweep": sweep, "task": run.task, "label": run.label,
            "config": run.to_dict()["config"], "status": status, "error": error, "metrics": metrics,
            "resumed": metrics.get("resumed_from") is not None, "attempts": attempts,
            "provenance": {**provenance(), "executor": executor, "started": started, "finished": now(),
                           "seconds_this_attempt": round(time.perf_counter() - t0, 3),
                           **{k: metrics[k] for k in ("device", "device_name", "dtype", "backends", "wall_time")
                              if k in metrics}},
        }
        write_record(path, record)
        if status in ("ok", "diverged"):  # finished for good: the checkpoint is dead weight
            (workdir / "checkpoint.pt").unlink(missing_ok=True)
        return status


class RunJob(submitit.helpers.Checkpointable):
    """What a submitit job runs. ``checkpoint`` (inherited) resubmits the job as is: all
    its progress lives in the run's workdir, where the task resumes from."""

    def __init__(self, run: RunConfig, sweep: str, results_dir: str | Path, executor: str,
                 threads: int | None = None):
        self.run, self.sweep, self.results_dir = run, sweep, str(Path(results_dir).resolve())
        self.executor, self.threads = executor, threads
        self.run_fn = tasks.TASKS[run.task][1]

    def __call__(self) -> str:
        threads = self.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or None
        return execute(self.run, self.sweep, self.results_dir, self.run_fn, self.executor, threads)


def plan(sweep: Sweep, results_dir: str | Path) -> tuple[list, list]:
    """(runs to do, runs already ok)."""
    todo, done = [], []
    for run in sweep.runs:
        rec = read_record(record_path(results_dir, sweep.name, run.run_id))
        (done if rec is not None and rec.get("status") == "ok" else todo).append(run)
    return todo, done


def launch(sweep: Sweep, results_dir: str | Path = "results", executor: str = "local", parallel: int = 1,
           slurm: dict | None = None, wait: bool = False, log=print) -> dict:
    """Run (or submit) every run of ``sweep`` that has no ``ok`` record. Returns a
    summary: ``submitted``, ``skipped``, ``statuses`` (of runs finished here) and
    ``job_ids`` (Slurm)."""
    results_dir = Path(results_dir).resolve()
    todo, done = plan(sweep, results_dir)
    log(f"{sweep.name}: {len(sweep)} runs, {len(done)} already ok, {len(todo)} to run ({executor})")
    summary = {"submitted": len(todo), "skipped": len(done), "statuses": {}, "job_ids": []}
    if not todo:
        return summary
    folder = results_dir / sweep.name / "submitit"
    if executor == "debug":
        statuses = [_report(run, execute(run, sweep.name, results_dir, executor="debug", progress=True), log)
                    for run in todo]
    elif executor == "local":
        statuses = _run_local(todo, sweep.name, results_dir, folder, parallel, slurm or {}, log)
    elif executor == "slurm":
        submitted = time.time()
        jobs = submit_slurm(todo, sweep.name, results_dir, folder, slurm or {})
        summary["job_ids"] = sorted({j.job_id.split("_")[0] for j in jobs})
        log(f"submitted {len(jobs)} job(s) as {', '.join(summary['job_ids'])}; logs in {folder}")
        if not wait:
            return summary
        statuses = wait_slurm(todo, sweep.name, results_dir, jobs, since=submitted, log=log)
    else:
        raise ValueError(f"executor={executor!r} is not valid; choose one of ['local', 'slurm', 'debug']")
    summary["statuses"] = dict(collections.Counter(statuses))
    return summary


def _report(run: RunConfig, status: str, log) -> str:
    log(f"  {run.run_id}  {status:<11} {run.name}")
    return status


def may_start(run: RunConfig, running: list, parallel: int) -> bool:
    """Whether the local executor may start ``run`` beside the ``running`` ones."""
    if not running:
        return True
    return len(running) < parallel and not run.alone and not any(r.alone for r in running)


def _run_local(todo, sweep, results_dir, folder, parallel, params, log) -> list[str]:
    """submitit's local executor starts every job at once: keep at most ``parallel``,
    and start nothing beside a run marked ``alone`` (a timing would measure the other)."""
    parallel = max(1, parallel)
    cores = os.cpu_count() or 1
    ex = submitit.LocalExecutor(folder)
    ex.update_parameters(timeout_min=params.get("time") or 7 * 24 * 60,
                         setup=[f"export SUBMITIT_PREEMPT_SIGNAL={PREEMPT_SIGNAL}"])
    queue, running, statuses = list(todo), {}, []
    bar = tqdm(total=len(todo), desc=sweep, unit="run", disable=log is not print)
    ticking = sys.stderr.isatty()  # a log file gets a line per finished run, not a ticking clock
    try:
        while queue or running:
            started = False
            while queue and may_start(queue[0], list(running.values()), parallel):
                run = queue.pop(0)
                threads = cores if run.alone else max(1, cores // parallel)
                running[ex.submit(RunJob(run, sweep, results_dir, "local", threads))] = run
                started = True
            if started:
                bar.set_postfix_str(", ".join(r.name for r in running.values())[:60])
            time.sleep(0.5)
            if ticking:
                bar.refresh()
            for job in [j for j in running if j.done()]:
                run = running.pop(job)
                rec = read_record(record_path(results_dir, sweep, run.run_id))
                status = rec["status"] if rec else f"no record (log: {job.paths.stderr})"
                statuses.append(_report(run, status, bar.write if log is print else log))
                bar.update(1)
    except KeyboardInterrupt:
        for job in running:
            job.cancel(check=False)
        raise
    finally:
        bar.close()
    return statuses


def slurm_parameters(sweep: str, opts: dict) -> dict:
    """submitit SlurmExecutor parameters from the CLI's options (partition, gpus, time,
    array_parallelism, cpus_per_task, mem_gb, account, qos, constraint, setup, extra)."""
    delay = opts.get("signal_delay_s", 120)
    params = {"job_name": f"linbench-{sweep}", "time": opts.get("time") or 120, "signal_delay_s": delay,
              "array_parallelism": opts.get("array_parallelism") or 256,
              "cpus_per_task": opts.get("cpus_per_task") or 1, "stderr_to_stdout": True,
              # The job imports this checkout even when linbench is not installed there.
              "setup": [f"export SUBMITIT_PREEMPT_SIGNAL={PREEMPT_SIGNAL}",
                        f"export PYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}}", *opts.get("setup", [])],
              "additional_parameters": {"signal": f"{PREEMPT_SIGNAL}@{delay}", **opts.get("extra", {})}}
    for key in ("partition", "account", "qos", "constraint"):
        if opts.get(key):
            params[key] = opts[key]
    if opts.get("gpus"):
        params["gpus_per_node"] = opts["gpus"]
    if opts.get("mem_gb"):
        params["mem"] = f"{opts['mem_gb']}GB"
    return params


def submit_slurm(todo, sweep, results_dir, folder, opts: dict) -> list:
    """Submit the runs as one job array (a single run as one job)."""
    ex = submitit.SlurmExecutor(folder, max_num_timeout=opts.get("max_timeouts", 3))
    ex.update_parameters(**slurm_parameters(sweep, opts))
    with ex.batch():
        jobs = [ex.submit(RunJob(run, sweep, results_dir, "slurm")) for run in todo]
    return jobs


def _queued(job_ids) -> set | None:
    """Job ids (array tasks expanded, "123_4") still known to squeue; None if it fails."""
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-u", getpass.getuser()],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None
    mine = {str(j).split("_")[0] for j in job_ids}
    return {line.strip() for line in out.stdout.split() if line.strip().split("_")[0] in mine}


def wait_slurm(todo, sweep, results_dir, jobs, since: float, poll_s: float = 2.0,
               timeout_s: float | None = None, log=print) -> list[str]:
    """Wait until every submitted run has a record written after ``since`` (its
    submission) or its job left the queue without writing one."""
    start = time.time()
    waiting = dict(zip([run.run_id for run in todo], zip(todo, jobs)))
    statuses = []
    while waiting:
        queued = _queued([job.job_id for _, job in waiting.values()])
        for run_id, (run, job) in list(waiting.items()):
            path = record_path(results_dir, sweep, run_id)
            fresh = path.exists() and path.stat().st_mtime >= since
            gone = queued is not None and job.job_id not in queued
            if fresh or gone:
                rec = read_record(path) if fresh else None
                status = rec["status"] if rec else f"no record (job {job.job_id}, log: {job.paths.stdout})"
                statuses.append(_report(run, status, log))
                del waiting[run_id]
        if waiting:
            if timeout_s is not None and time.time() - start > timeout_s:
                raise TimeoutError(f"{len(waiting)} run(s) still running after {timeout_s:.0f}s")
            time.sleep(poll_s)
    return statuses
