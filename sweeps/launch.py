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
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import submitit
import torch
from tqdm.auto import tqdm

import tasks
from results.records import STATUSES, now, provenance, read_record, record_path, write_record
from tasks.progress import read_progress

from .core import RunConfig, Sweep, SweepError, mixer_revisions
from .ledger import cancel_requested, in_flight, record_submissions

PREEMPT_SIGNAL = "USR1"  # one the training loop checkpoints on (it does not listen to USR2)
REPO = Path(__file__).resolve().parent.parent


def workdir_for(results_dir: Path, sweep: str, run_id: str) -> Path:
    return Path(results_dir) / sweep / "runs" / run_id


@contextlib.contextmanager
def _exclusive(workdir: Path):
    """Yield True when this process holds the run's lock: a run submitted twice (two
    `linbench run` at once) must not train twice into one checkpoint. A few tries: a
    `linbench status` probing the lock holds it for an instant."""
    with open(workdir / ".lock", "w") as fd:
        for attempt in range(20):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.1)
        else:
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
            threads: int | None = None, progress: bool = False, submitted: float | None = None) -> str:
    """Run one config and write its record; returns the status. ``run_fn`` defaults to
    the task's registered ``run`` (jobs carry it, so a task registered at run time,
    e.g. by a test, also runs in a fresh process). Returns without a record when the
    run was interrupted (it is being requeued), cancelled (``linbench cancel`` after
    ``submitted``) or runs elsewhere ("busy")."""
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
            if submitted is not None and cancel_requested(results_dir, sweep, submitted):
                status = "cancelled"  # submitit declined the requeue because of it
        if status in ("interrupted", "cancelled"):
            return status  # the checkpoint is written; the requeued job (or a rerun) resumes
        if status not in STATUSES:
            status, error = "failed", f"task returned status {status!r}; expected one of {list(STATUSES)}"
        record = {
            "run_id": run.run_id, "sweep": sweep, "task": run.task, "label": run.label,
            "config": run.to_dict()["config"], "mixer_revisions": mixer_revisions(run.config),
            "status": status, "error": error, "metrics": metrics,
            "resumed": metrics.get("resumed_from") is not None, "attempts": attempts,
            "provenance": {**provenance(), "executor": executor, "threads": torch.get_num_threads(),
                           "started": started, "finished": now(),
                           "seconds_this_attempt": round(time.perf_counter() - t0, 3),
                           **{k: metrics[k] for k in ("device", "device_name", "dtype", "backends", "wall_time")
                              if k in metrics}},
        }
        write_record(path, record)
        if status in ("ok", "diverged"):  # finished for good: the checkpoint is dead weight
            (workdir / "checkpoint.pt").unlink(missing_ok=True)
        return status


JOB_LOG_HINTS = {
    "failed": "; `linbench logs {sweep} {run_id}` prints its error",
    "oom": "; `linbench logs {sweep} {run_id}` prints its error",
    "timeout": "; `linbench logs {sweep} {run_id}` prints its error",
    "cancelled": "; its checkpoint is kept and `linbench run {sweep}` resumes it",
    "busy": "; another job is training this run",
}


class RunJob(submitit.helpers.Checkpointable):
    """What a submitit job runs. ``checkpoint`` (inherited) resubmits the job as is: all
    its progress lives in the run's workdir, where the task resumes from."""

    def __init__(self, run: RunConfig, sweep: str, results_dir: str | Path, executor: str,
                 threads: int | None = None):
        self.run, self.sweep, self.results_dir = run, sweep, str(Path(results_dir).resolve())
        self.executor, self.threads = executor, threads
        self.run_fn = tasks.TASKS[run.task][1]
        self.submitted = time.time()  # a `linbench cancel` after this stops the job

    def __call__(self) -> str:
        # where the run trains, for `linbench cancel` (a local job's pid is submitit's shell)
        record_submissions(self.results_dir, self.sweep, {self.run.run_id: {
            "pid": os.getpid(), "host": socket.gethostname()}})
        threads = self.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or None
        status = execute(self.run, self.sweep, self.results_dir, self.run_fn, self.executor, threads,
                         submitted=self.submitted)
        # The job log's last word (submitit then says "completed successfully" whatever
        # the run's status, since the job itself did not crash).
        print(f"[linbench] run {self.run.run_id} ({self.run.name}): {status}"
              + JOB_LOG_HINTS.get(status, "").format(sweep=self.sweep, run_id=self.run.run_id),
              flush=True)
        return status

    def checkpoint(self, *args, **kwargs):
        """submitit's requeue hook: requeue, unless the sweep was cancelled since."""
        if cancel_requested(self.results_dir, self.sweep, self.submitted):
            return None  # submitit then ends the job instead of requeueing it
        return super().checkpoint(*args, **kwargs)


# Statuses that end a run for good: a diverged run diverges again with the same seed.
FINAL = ("ok", "diverged")


def plan(sweep: Sweep, results_dir: str | Path, final=FINAL) -> dict[str, list]:
    """The runs by what `run` does with them: "todo", "ok", "final" (another final
    status, not rerun), "in_flight" (a job of theirs is queued or running)."""
    flying = in_flight(results_dir, sweep.name, workdir_for, [run.run_id for run in sweep.runs])
    out = {"todo": [], "ok": [], "final": [], "in_flight": []}
    for run in sweep.runs:
        status = (read_record(record_path(results_dir, sweep.name, run.run_id)) or {}).get("status")
        key = ("ok" if status == "ok" else "final" if status in final else
               "in_flight" if run.run_id in flying else "todo")
        out[key].append(run)
    return out


def launch(sweep: Sweep, results_dir: str | Path = "results", executor: str = "local", parallel: int = 1,
           slurm: dict | None = None, wait: bool = False, log=print, final=FINAL) -> dict:
    """Run (or submit) every run of ``sweep`` that has no final record and no job in
    flight. Returns a summary: ``submitted``, ``skipped``, ``statuses`` (of runs
    finished here) and ``job_ids`` (Slurm)."""
    results_dir = Path(results_dir).resolve()
    parts = plan(sweep, results_dir, final)
    todo = parts["todo"]
    log(f"{sweep.name}: {len(sweep)} runs, {len(parts['ok'])} already ok, "
        + (f"{len(parts['final'])} final (not rerun), " if parts["final"] else "")
        + (f"{len(parts['in_flight'])} in flight (queued or running), " if parts["in_flight"] else "")
        + f"{len(todo)} to run ({executor})")
    summary = {"submitted": len(todo), "skipped": len(sweep) - len(todo), "statuses": {}, "job_ids": []}
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
        from .slurm import submit_slurm, wait_slurm  # here: they need launch's RunJob
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


def _fraction(results_dir, sweep: str, run: RunConfig) -> float:
    """How much of the run is trained, from its heartbeat (0 before the first one)."""
    p = read_progress(workdir_for(results_dir, sweep, run.run_id)) or {}
    return min(1.0, p["step"] / p["steps"]) if p.get("step") and p.get("steps") else 0.0


def _run_local(todo, sweep, results_dir, folder, parallel, params, log) -> list[str]:
    """submitit's local executor starts every job at once: keep at most ``parallel``,
    and start nothing beside a run marked ``alone`` (a timing would measure the other)."""
    parallel = max(1, parallel)
    cores = os.cpu_count() or 1
    ex = submitit.LocalExecutor(folder)
    ex.update_parameters(timeout_min=params.get("time") or 7 * 24 * 60,
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
                threads = params.get("threads") or (cores if run.alone else max(1, cores // parallel))
                job = ex.submit(RunJob(run, sweep, results_dir, "local", threads))
                running[job] = run
                record_submissions(results_dir, sweep, {run.run_id: _entry("local", job)})
                started = True
            if started:
                bar.set_postfix_str(", ".join(r.name for r in running.values())[:60])
            time.sleep(0.5)
            finished = [j for j in running if j.done()]
            for job in finished:
                run = running.pop(job)
                rec = read_record(record_path(results_dir, sweep, run.run_id))
                status = rec["status"] if rec else f"no record (log: {job.paths.stderr})"
                statuses.append(_report(run, status, bar.write if log is print else log))
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


def _entry(executor: str, job) -> dict:
    return {"executor": executor, "job_id": str(job.job_id), "submitted": time.time(),
            "log": str(job.paths.stdout)}
