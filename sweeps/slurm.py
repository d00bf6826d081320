"""Submitting a sweep's runs to Slurm as one job array, and waiting for them.

Preemption and time-outs: Slurm is asked to send USR1 ``signal_lead`` seconds before
the time limit, and submitit inside the job is told that USR1 is its preemption signal
(jobs.PREEMPT_SIGNAL); the training loop checkpoints on it and submitit requeues the
job. After a requeue Slurm holds the job back (its BeginTime) for about two minutes
before it may start again.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import submitit

from results.layout import record_path
from results.records import read_record
from tasks.engine.runs import REPO

from .hints import Hints
from .jobs import PREEMPT_SIGNAL, RunJob, ledger_entry, log_status
from .ledger import record_submissions, slurm_jobs
from .spec import SweepError


def signal_lead(time_min: float) -> int:
    """Seconds before the time limit at which Slurm sends USR1 (checkpoint and requeue):
    a tenth of the limit, at least 15 s and at most 5 min. Slurm may send it up to 60 s
    earlier than asked."""
    return int(min(300, max(15, 6 * time_min)))


def slurm_parameters(sweep: str, opts: dict) -> dict:
    """submitit SlurmExecutor parameters from the CLI's options (partition, gpus, nodes,
    tasks_per_node, time, array_parallelism, cpus_per_task, mem_gb, signal_lead_s, account,
    qos, constraint, setup, extra)."""
    delay = opts.get("signal_lead_s") or signal_lead(opts.get("time") or 120)
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
    if opts.get("nodes"):
        params["nodes"] = opts["nodes"]
    if opts.get("tasks_per_node"):  # one run over nodes x tasks processes (one per GPU)
        params["ntasks_per_node"] = opts["tasks_per_node"]
    if opts.get("mem_gb"):  # whole megabytes: sbatch refuses "--mem=2.0GB"
        params["mem"] = f"{math.ceil(opts['mem_gb'] * 1024)}M"
    return params


def gpu_problem(opts: dict) -> str | None:
    """Why ``--gpus`` cannot be met, read from ``sinfo`` before anything is submitted: the
    partition (the cluster's default when none is named) has no node with a GPU in its
    Gres. None where it may be met, and where sinfo is missing, fails, or does not know
    the partition (sbatch then refuses it in its own words)."""
    partition = opts.get("extra", {}).get("partition") or opts.get("partition")
    if not opts.get("gpus") or shutil.which("sinfo") is None:
        return None
    try:
        done = subprocess.run(["sinfo", "-h", *(["-p", partition] if partition else []), "-o", "%P|%G"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    rows = [line.strip().partition("|")[::2] for line in done.stdout.splitlines() if "|" in line]
    if not partition:  # sinfo marks the default partition with a *
        rows = [(name, gres) for name, gres in rows if name.endswith("*")]
    if not rows or any(item.strip().startswith("gpu") for _, gres in rows for item in gres.split(",")):
        return None
    name = partition or rows[0][0].rstrip("*") + " (the default)"
    gres = ", ".join(dict.fromkeys(gres.strip() for _, gres in rows))
    return f"partition {name} has no GPUs (sinfo Gres: {gres}); leave --gpus out on a CPU partition"


def _duration(minutes: int) -> str:
    """Minutes as sbatch prints a time limit: D-HH:MM:SS."""
    days, rest = divmod(int(minutes), 1440)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


# what --dry-run calls each sbatch option, and what sbatch does where it is left out
RESOURCES = {"time": ("time limit", None), "signal": ("signal", None), "partition": ("partition", "the cluster's default"),
             "gpus_per_node": ("GPUs per node", "none"), "nodes": ("nodes", 1), "ntasks_per_node": ("tasks per node", 1),
             "cpus_per_task": ("cpus per task", 1), "mem": ("memory per node", "the partition's default"),
             "account": ("account", None), "qos": ("qos", None), "constraint": ("constraint", None)}


def describe(sweep: str, opts: dict, todo: list) -> list[str]:
    """What each job of ``todo`` (the runs a submission would send) would get, in the
    lines ``--dry-run`` prints: the parameters ``submit_slurm`` gives submitit, with
    ``--slurm-arg`` options over them as in the script, and sbatch's defaults where both
    leave one out."""
    params = slurm_parameters(sweep, opts)
    delay = params["signal_delay_s"]
    given = {**{key: params.get(key) for key in RESOURCES}, "time": _duration(params["time"])}
    for key, value in params["additional_parameters"].items():
        given[key.replace("-", "_")] = value
    if given["signal"] == f"{PREEMPT_SIGNAL}@{delay}":
        given["signal"] = f"{PREEMPT_SIGNAL} {delay} s before the time limit (checkpoint and requeue)"
    rows = []
    for key, value in given.items():
        name, default = RESOURCES.get(key, (f"--{key.replace('_', '-')}", None))
        if value is not None or default is not None:
            rows.append((name, value if value is not None else default))
    shared = [run for run in todo if not run.exclusive]
    timing = [run for run in todo if run.exclusive]
    parallel = params["array_parallelism"]

    def array(n: int) -> str:
        return "1 job" if n == 1 else f"an array of {n} jobs, at most {min(n, parallel)} at once"
    if shared or not timing:
        rows.append(("submitted as", array(len(shared)) if shared else "nothing: every run is ok, final or in flight"))
    if timing:
        rows.append(("timing runs", f"{array(len(timing))}, each with a node to itself (--exclusive)"))
    width = max(len(name) for name, _ in rows)
    return [f"Slurm: {len(todo)} run(s) to submit; each job as sbatch reads it:"] + \
        [f"  {name:<{width}}  {value}" for name, value in rows]


def submit_slurm(todo, sweep, results_dir, folder, opts: dict, hints: Hints) -> list:
    """Submit the runs as one job array (a single run as one job), and the timing runs
    (``exclusive``) as another with --exclusive: a latency measured beside another job is no
    benchmark, and an array shares its options. A refusal by sbatch becomes one SweepError
    quoting it and leaves no files of the refused array behind (an array queued before it
    stays queued, in the ledger)."""
    # every folder this call makes (RESULTS_DIR/SWEEP/ too, on a first submission), so that
    # a refusal can take away those it leaves empty
    made = [path for path in (folder, *folder.parents) if not path.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    jobs_of = {}
    for exclusive in (False, True):
        runs = [run for run in todo if run.exclusive == exclusive]
        if not runs:
            continue
        before = set(folder.rglob("*"))
        ex = submitit.SlurmExecutor(folder, max_num_timeout=opts.get("max_timeouts", 3))
        ex.update_parameters(**slurm_parameters(sweep, opts), **({"exclusive": True} if exclusive else {}))
        try:
            with _sbatch_stderr() as said, ex.batch():
                jobs = [ex.submit(RunJob(run, sweep, results_dir, "slurm", opts.get("threads"), opts.get("log"), hints))
                        for run in runs]
        except (subprocess.CalledProcessError, submitit.core.utils.FailedJobError) as err:
            for path in sorted(set(folder.rglob("*")) - before, reverse=True):  # files before folders
                path.rmdir() if path.is_dir() else path.unlink(missing_ok=True)
            for path in made:  # deepest first: nothing of a refused first submission is left
                if path.is_dir() and not any(path.iterdir()):
                    path.rmdir()
            raise SweepError(f"sbatch refused the submission: {_sbatch_message(err, said())}") from None
        record_submissions(results_dir, sweep, {run.run_id: ledger_entry("slurm", job, hints.run_options)
                                                for run, job in zip(runs, jobs)})
        jobs_of.update({run.run_id: job for run, job in zip(runs, jobs)})
    return [jobs_of[run.run_id] for run in todo]


@contextlib.contextmanager
def _sbatch_stderr():
    """What sbatch writes to stderr during the submission, kept (submitit lets it through
    to the terminal, where it would stand beside our own one-line message): yields a
    function returning it. What it wrote on a submission that went through is passed on."""
    outer = sys.stderr
    outer.flush()
    said = {"text": ""}
    logged = io.StringIO()  # submitit's own log lines, written through sys.stderr
    with tempfile.TemporaryFile() as tmp, contextlib.redirect_stderr(logged):
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        failed = False
        try:
            yield lambda: said["text"]
        except BaseException:
            failed = True
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            said["text"] = tmp.read().decode(errors="replace") or logged.getvalue()
            if not failed:
                outer.write(said["text"] + logged.getvalue())


def _sbatch_message(err: Exception, stderr: str = "") -> str:
    """sbatch's own words, e.g. "error: Invalid generic resource (gres) specification"."""
    text = stderr.strip() or getattr(err, "output", None) or getattr(err, "stderr", None) or str(err)
    text = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return "; ".join(errors or lines[-1:]) or type(err).__name__


def wait_slurm(waiting: list[tuple], sweep, results_dir, poll_s: float = 2.0,
               timeout_s: float | None = None, log=print) -> list[str]:
    """Wait for every entry (run, job id, job log, since): until the run has a record
    written after ``since`` (its submission) or its job left the queue without writing
    one. The runs submitted now and those already in flight are waited for alike."""
    start = time.time()
    waiting = {run.run_id: entry for entry in waiting for run in entry[:1]}
    statuses = []
    while waiting:
        jobs = slurm_jobs([job_id for _, job_id, _, _ in waiting.values()])
        queued = None if jobs is None else set(jobs)
        for run_id, (run, job_id, job_log, since) in list(waiting.items()):
            path = record_path(results_dir, sweep, run_id)
            fresh = path.exists() and path.stat().st_mtime >= since
            gone = queued is not None and job_id not in queued
            if fresh or gone:
                rec = read_record(path) if fresh else None
                status = rec["status"] if rec else f"no record (job {job_id}, log: {job_log})"
                statuses.append(log_status(run, status, log))
                del waiting[run_id]
        if waiting:
            if timeout_s is not None and time.time() - start > timeout_s:
                raise TimeoutError(f"{len(waiting)} run(s) still running after {timeout_s:.0f}s")
            time.sleep(poll_s)
    return statuses
