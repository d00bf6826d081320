"""One run as a job: ``execute`` trains it under its workdir's lock and writes its record
(whatever the outcome: a failure is a record too), and ``RunJob`` is what a submitit job
calls, locally or on Slurm. ``launch`` decides which runs to send where; this module is
what every executor sends.

Preemption and time-outs: Slurm is asked to send SIGUSR1 before the time limit, and
submitit inside the job is told that USR1 is its preemption signal. The training loop
catches USR1 (and SIGTERM, which ``scontrol requeue`` and preemption send), writes
``workdir/checkpoint.pt`` at the next step boundary and hands the signal on to
submitit, which calls ``RunJob.checkpoint`` and requeues the job. The requeued job runs
the task again, and the task resumes from that checkpoint.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
import traceback
import zlib
from pathlib import Path

import submitit
import torch

import tasks
from results.layout import record_path, workdir_for
from results.records import STATUSES, read_record, write_record
from tasks.engine import parallel, tracking
from tasks.engine.runs import now, provenance

from .hints import Hints
from .ledger import cancel_requested, record_submissions
from .spec import RunConfig, mixer_revisions

PREEMPT_SIGNAL = "USR1"  # one the training loop checkpoints on (it does not listen to USR2)


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
            threads: int | None = None, progress: bool = False, submitted: float | None = None,
            log: str | None = None) -> str:
    """Run one config and write its record; returns the status. ``run_fn`` defaults to
    the task's registered ``run`` (jobs carry it, so a task registered at run time,
    e.g. by a test, also runs in a fresh process). Returns without a record when the
    run was interrupted (it is being requeued), cancelled (``linbench cancel`` after
    ``submitted``) or runs elsewhere ("busy"). ``log`` ("tensorboard", "wandb") sends its
    curves there while it trains, under RESULTS_DIR/SWEEP/logs/ (tasks.engine.tracking).

    A run over several processes (a job of several tasks: WORLD_SIZE in the environment)
    calls this on every rank: they join one process group, rank 0 takes the decisions
    (done already, busy) and writes the record; the others train beside it."""
    w = parallel.init_from_env("cuda" if torch.cuda.is_available() else "cpu")
    path = record_path(results_dir, sweep, run.run_id)
    old = read_record(path) if w.main else None
    if parallel.from_main(old is not None and old.get("status") == "ok"):
        return "ok"  # a duplicate submission finds it done
    run_fn = run_fn or tasks.TASKS[run.task][1]
    workdir = workdir_for(results_dir, sweep, run.run_id)
    workdir.mkdir(parents=True, exist_ok=True)
    with (_exclusive(workdir) if w.main else contextlib.nullcontext(True)) as mine:
        if not parallel.from_main(mine):
            return "busy"
        attempts = _bump_attempts(workdir) if w.main else 0
        if threads:
            torch.set_num_threads(threads)
        started, t0 = now(), time.perf_counter()
        metrics, error = {}, None
        try:
            with tracking.session(log if w.main else None, run.run_id, Path(results_dir) / sweep / "logs",
                                  {"task": run.task, "label": run.label, "sweep": sweep, **run.to_dict()["config"]},
                                  project=f"linbench-{sweep}"):
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
        if not w.main:
            return status  # rank 0 writes the record
        write_record(path, _record(run, sweep, status, error, metrics, attempts, executor, started, t0))
        if status in ("ok", "diverged"):  # finished for good: the checkpoint is dead weight
            (workdir / "checkpoint.pt").unlink(missing_ok=True)
        return status


def _record(run: RunConfig, sweep: str, status: str, error: str | None, metrics: dict, attempts: int,
            executor: str, started: str, t0: float) -> dict:
    """A finished run's record: what ran, how it ended, its metrics, and where and when."""
    return {
        "run_id": run.run_id, "sweep": sweep, "task": run.task, "label": run.label,
        "config": run.to_dict()["config"], "mixer_revisions": mixer_revisions(run.config),
        "status": status, "error": error, "metrics": metrics,
        "resumed": metrics.get("resumed_from") is not None, "attempts": attempts,
        "provenance": {**provenance(), "executor": executor, "threads": torch.get_num_threads(),
                       "started": started, "finished": now(),
                       "seconds_this_attempt": round(time.perf_counter() - t0, 3),
                       **{k: metrics[k] for k in ("device", "device_name", "dtype", "backends", "chunk_sizes",
                                                  "wall_time")
                          if k in metrics}},
    }


JOB_LOG_HINTS = {
    "failed": "; `{logs}` prints its error",
    "oom": "; `{logs}` prints its error",
    "timeout": "; `{logs}` prints its error",
    "cancelled": "; its checkpoint is kept and `{rerun}` resumes it",
    "interrupted": "; its checkpoint is kept: the requeued job (or `{rerun}`) resumes it",
    "busy": "; another job is training this run",
}


class RunJob(submitit.helpers.Checkpointable):
    """What a submitit job runs. ``checkpoint`` (inherited) resubmits the job as is: all
    its progress lives in the run's workdir, where the task resumes from."""

    hints: Hints | None = None  # a job pickled before jobs carried hints has none

    def __init__(self, run: RunConfig, sweep: str, results_dir: str | Path, executor: str,
                 threads: int | None = None, log: str | None = None, hints: Hints | None = None):
        self.run, self.sweep, self.results_dir = run, sweep, str(Path(results_dir).resolve())
        self.executor, self.threads, self.log = executor, threads, log
        self.hints = hints  # the commands its log's last line names
        self.run_fn = tasks.TASKS[run.task][1]
        self.submitted = time.time()  # a `linbench cancel` after this stops the job

    def __call__(self) -> str:
        if cancel_requested(self.results_dir, self.sweep, self.submitted):
            # queued when the sweep was cancelled and started before Slurm removed it
            self._last_word("cancelled", "; it had not started training: `{rerun}` runs it")
            return "cancelled"
        job = submitit.JobEnvironment()
        if job.num_tasks > 1:  # one run over several tasks: torch.distributed's rendezvous
            os.environ.setdefault("MASTER_PORT", str(rendezvous_port(job.job_id)))
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        if job.global_rank == 0:
            # where the run trains, for `linbench cancel` (a local job's pid is submitit's shell)
            record_submissions(self.results_dir, self.sweep, {self.run.run_id: {
                "pid": os.getpid(), "host": socket.gethostname()}})
        threads = self.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or None
        status = execute(self.run, self.sweep, self.results_dir, self.run_fn, self.executor, threads,
                         submitted=self.submitted, log=self.log)
        # The job log's last word (submitit then says "completed successfully" whatever
        # the run's status, since the job itself did not crash).
        self._last_word(status)
        return status

    def checkpoint(self, *args, **kwargs):
        """submitit's requeue hook: requeue, unless the sweep was cancelled since. Either
        way this attempt's log ends with its status line, as a finished job's does."""
        if cancel_requested(self.results_dir, self.sweep, self.submitted):
            self._last_word("cancelled")
            return None  # submitit then ends the job instead of requeueing it
        self._last_word("requeued", "; it resumes from its checkpoint")
        return super().checkpoint(*args, **kwargs)

    def _last_word(self, status: str, hint: str | None = None) -> None:
        hint = JOB_LOG_HINTS.get(status, "") if hint is None else hint
        hints = self.hints or Hints(self.sweep)
        print(f"[linbench] run {self.run.run_id} ({self.run.name}): {status}"
              + hint.format(logs=hints.command("logs", self.run.run_id), rerun=hints.rerun([self.run.run_id])),
              flush=True)


def rendezvous_port(job_id: str, ports: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The port rank 0 listens on for a multi-task job, the same in every task (a hash of
    the job id), and below the kernel's ephemeral range: submitit's own pick (20000-60000)
    overlaps it, so srun's and slurmstepd's own sockets could hold it first (EADDRINUSE,
    seen on a one-node Slurm, the job then lost to its time limit)."""
    try:
        ephemeral = int(Path(ports).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768  # Linux's default
    low = 20000 if ephemeral > 21000 else 1024
    return low + zlib.crc32(str(job_id).encode()) % max(1, ephemeral - low)


def log_status(run: RunConfig, status: str, log) -> str:
    """Log one line for a run that ended; return its status."""
    log(f"  {run.run_id}  {status:<11} {run.name}")
    return status


def ledger_entry(executor: str, job, options: tuple[str, ...] = ()) -> dict:
    """What the ledger keeps of a submitted job: where it went, when, its log, and the
    `linbench run` options that sent it (what `linbench cancel` says resumes it)."""
    return {"executor": executor, "job_id": str(job.job_id), "submitted": time.time(),
            "log": str(job.paths.stdout), "options": list(options)}
