"""Where each run of a sweep was sent, whether it is still in flight, and cancelling it.

The records say what is finished; the ledger (``RESULTS/SWEEP/submitit/ledger.json``,
beside the jobs' logs) says what
was submitted: per run id the executor, the job id, when, and where the job's log is.
``linbench run`` reads it so that a run whose job is still queued or running is not
submitted a second time; ``status``, ``logs`` and ``cancel`` read it to find the job and
its log. A run is *running* while some process holds its workdir's lock (whichever
executor started it); it is *queued* while its Slurm job is pending.

Cancelling writes ``RESULTS/SWEEP/submitit/cancel`` (a time stamp), then removes pending jobs and
signals running ones with USR1, the signal on which the training loop checkpoints. A job
submitted before that time stamp declines submitit's requeue and ends without a record,
so the run stays partial and a later ``run`` resumes it from its checkpoint; one that
starts after it ends at once, without training.
"""
from __future__ import annotations

import fcntl
import getpass
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from results.layout import jobs_dir, workdir_for

LEDGER, CANCEL = "ledger.json", "cancel"
# squeue states of a job that has not started running the task yet
PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED",
           "CONFIGURING"}
# squeue reasons of a pending job that Slurm will not start as submitted: it asks for more
# than the partition, account or QOS allows (more CPUs than a node has: PartitionConfig).
# Any other reason (Resources, Priority, BeginTime after a requeue ...) waits its turn.
# (PartitionNodeLimit is not one: it also means the nodes it needs are down for now; nor are
# the per-user and aggregate limits, which clear as other jobs end.)
NEVER = {"PartitionConfig", "BadConstraints", "PartitionTimeLimit", "AccountNotAllowed", "QOSNotAllowed",
         "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied"}


def never_starts(reason: str) -> bool:
    per_job = reason.startswith(("AssocMax", "QOSMax")) and "PerJob" in reason  # a per-job limit
    return reason in NEVER or per_job


def ledger_path(results_dir, sweep: str) -> Path:
    return jobs_dir(results_dir, sweep) / LEDGER


def read_ledger(results_dir, sweep: str) -> dict:
    """{run_id: {"executor", "job_id", "submitted", "log", and once the job has started
    "pid" and "host" of the process that trains}}; empty when there is none."""
    try:
        return json.loads(ledger_path(results_dir, sweep).read_text())
    except (OSError, ValueError):
        return {}


def record_submissions(results_dir, sweep: str, entries: dict) -> None:
    """Merge ``entries`` ({run_id: fields}) into the ledger, field by field (locked
    read-modify-write, atomic replace)."""
    path = ledger_path(results_dir, sweep)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ledger = read_ledger(results_dir, sweep)
        for rid, fields in entries.items():
            ledger[rid] = {**ledger.get(rid, {}), **fields}
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(ledger, indent=1, sort_keys=True))
        os.replace(tmp, path)


def sent_with(entry: dict) -> tuple[str, ...]:
    """The `linbench run` options that sent a ledger entry's job; for an entry written
    before they were kept, its executor alone (so a resumed Slurm run stays on Slurm)."""
    if "options" in entry:
        return tuple(entry["options"])
    return ("--executor", entry["executor"]) if entry.get("executor", "local") != "local" else ()


def is_running(workdir: Path) -> bool:
    """Whether a process holds the run's lock, i.e. is training it right now."""
    try:
        fd = open(Path(workdir) / ".lock", "r")
    except OSError:
        return False
    with fd:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False


def slurm_jobs(job_ids) -> dict[str, tuple[str, str]] | None:
    """{job id ("123" or array task "123_4"): (squeue state, reason)} for those still
    known to squeue; None where squeue cannot be asked."""
    ids = sorted({str(j).split("_")[0] for j in job_ids})
    if not ids:
        return {}
    query = ["squeue", "-h", "-r", "-o", "%i %T %r", "-u", getpass.getuser()]
    try:
        out = subprocess.run([*query, "-j", ",".join(ids)], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:  # an id the controller has forgotten: ask for all of ours
            out = subprocess.run(query, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    jobs = (line.split(maxsplit=2) for line in out.stdout.splitlines())
    return {job[0]: (job[1], job[2] if len(job) > 2 else "") for job in jobs if len(job) >= 2}


def flights(results_dir, sweep: str, run_ids=(), ledger: dict | None = None) -> dict[str, tuple[str, str]]:
    """{run_id: (state, reason)} for every run of the ledger, or of ``run_ids``, that is
    (or may be) in flight, the state "running" | "queued" | "unknown": a run started by
    any executor holds its workdir's lock; a Slurm job squeue knows is queued (with
    Slurm's reason for the wait, "" where it has none yet) or running; and where squeue is
    there but does not answer, a Slurm run without a lock is "unknown" (a job on another
    node may be training it), so that nothing resubmits it or calls it lost meanwhile.
    squeue is asked once; ``ledger``: the sweep's, where the caller has read it already."""
    ledger = read_ledger(results_dir, sweep) if ledger is None else ledger
    out = {rid: ("running", "") for rid in {*ledger, *run_ids}
           if is_running(workdir_for(results_dir, sweep, rid))}
    slurm = {rid: e["job_id"] for rid, e in ledger.items()
             if e.get("executor") == "slurm" and rid not in out}
    jobs = slurm_jobs(slurm.values()) if slurm else {}
    for rid, job in slurm.items():
        if jobs is None:
            if shutil.which("squeue"):  # no squeue at all: off the cluster, no job to ask about
                out[rid] = ("unknown", "")
        elif job in jobs:
            state, reason = jobs[job]
            # "None": not looked at by the scheduler yet
            out[rid] = ("queued", "" if reason == "None" else reason) if state in PENDING else ("running", "")
    return out


def in_flight(results_dir, sweep: str, run_ids=()) -> dict[str, str]:
    """{run_id: "running" | "queued" | "unknown"}: ``flights`` without the reasons."""
    return {rid: state for rid, (state, _) in flights(results_dir, sweep, run_ids).items()}


def cancel_requested(results_dir, sweep: str, since: float) -> bool:
    """Whether ``linbench cancel`` was called after ``since`` (a job's submission)."""
    try:
        return float((jobs_dir(results_dir, sweep) / CANCEL).read_text()) >= since
    except (OSError, ValueError):
        return False


def _scancel(*args: str) -> tuple[bool, bool]:
    """(done, refused for now) of one ``scancel`` call: Slurm refuses to signal a job that
    is changing state ("Job can not be altered now, try again later")."""
    out = subprocess.run(["scancel", *args], capture_output=True, text=True)
    return out.returncode == 0, "try again later" in out.stderr.lower()


def cancel(results_dir, sweep: str, log=print, patience_s: float = 60.0, poll_s: float = 1.0) -> dict[str, str]:
    """Stop every queued or running run of the sweep; {run_id: what was done}.

    Nothing it does may kill a training process without a checkpoint: a queued job is
    removed with ``scancel --state=PENDING``, which leaves it alone if it has started
    meanwhile (it then sees the cancel mark as it starts and ends without training, or is
    signalled on the next look); a running one gets USR1, asked again while Slurm says
    "try again later", for up to ``patience_s``."""
    mark = jobs_dir(results_dir, sweep) / CANCEL
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(repr(time.time()))
    ledger, done = read_ledger(results_dir, sweep), {}
    removing: set[str] = set()  # queued jobs asked to leave the queue, not yet seen gone
    deadline = time.time() + patience_s
    while True:
        flying = {rid: st for rid, st in in_flight(results_dir, sweep).items() if rid not in done}
        for rid in removing - set(flying):  # gone from the queue without starting
            done[rid] = "removed from the queue"
            log(f"  {rid}  queued   {done[rid]} (job {ledger[rid]['job_id']})")
        removing &= set(flying)
        last_look = time.time() > deadline
        for rid, state in sorted(flying.items()):
            entry, what = ledger[rid], None
            if state == "unknown":
                what = f"not cancelled: squeue did not answer (job {entry['job_id']})"
            elif entry.get("executor") != "slurm":  # local: the training process (it noted its pid)
                try:
                    os.kill(int(entry["pid"]), signal.SIGUSR1)
                    what = "told to checkpoint and stop"
                except (KeyError, ProcessLookupError, ValueError):
                    what = f"could not be signalled ({state})"
            elif state == "queued":
                if last_look:
                    what = "could not be removed from the queue"
                else:  # an array's tasks may leave with the first one's scancel (then this one errs)
                    _scancel("--state=PENDING", entry["job_id"])
                    removing.add(rid)
            else:
                ok, later = _scancel("--signal=USR1", entry["job_id"])
                if ok:
                    what = "told to checkpoint and stop"
                elif not later or last_look:
                    what = f"could not be signalled ({state}" + (", Slurm said try again later)" if later else ")")
            if what is not None:
                done[rid] = what
                log(f"  {rid}  {state:<8} {what} (job {entry['job_id']})")
        if last_look or not (set(flying) - set(done)):
            return done
        time.sleep(poll_s)
