"""A sweep through a real Slurm (submitit's Slurm executor), end to end.

Needs a running controller: `.ci/slurm-setup.sh` (root) starts a one-node Slurm with
no munge and no accounting, as CI does. Without accounting submitit cannot read job
states (sacct), so the test, like `linbench`, goes by the records.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sweeps.cli import main as cli
from sweeps.spec import load_sweep
from results.layout import workdir_for
from test_sweeps import records, toy_task  # noqa: F401  (the autouse fixture registers the toy task)


def _no_slurm() -> str | None:
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        return "no Slurm client on PATH (start one with `sudo .ci/slurm-setup.sh`)"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return f"no Slurm controller answers `scontrol ping`: {(ping.stdout + ping.stderr).strip()[:200]}"
    nodes = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True).stdout.split()
    if not any(s.rstrip("*") in ("idle", "mix", "alloc") for s in nodes):
        return f"the Slurm controller has no usable node (states: {nodes})"
    return None


NO_SLURM = _no_slurm()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(NO_SLURM is not None, reason=str(NO_SLURM))]

SWEEP = """
from sweeps import RunConfig
train = {"steps": 8, "batch_size": 4, "lr": 1e-2, "warmup_steps": 1, "eval_every": 4,
         "checkpoint_every": 2, "device": "cpu"}
configs = [
    RunConfig("toy", {"seed": 0, "step_delay": 0.3, "train": {**train, "steps": 50}}, "signalled"),
    RunConfig("toy", {"seed": 3, "step_delay": 0.3, "train": {**train, "steps": 50}}, "requeued"),
    RunConfig("toy", {"seed": 1, "train": train}, "short"),
    RunConfig("toy", {"seed": 2, "crash_at": 0, "train": train}, "flaky"),  # fails on its first attempt
]
"""


def _wait(cond, timeout: float, what: str, logs: Path):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(logs.glob("**/*.out")))
    queue = subprocess.run(["squeue"], capture_output=True, text=True).stdout
    pytest.fail(f"timed out waiting for {what}\nsqueue:\n{queue}\nlogs:\n{tails}")


def _command(text: str, verb: str) -> list[str]:
    found = [shlex.split(c) for c in re.findall(r"`(linbench [^`]*)`", text) if c.split()[1] == verb]
    assert len(found) == 1, text
    return found[0]


def _queue() -> list[str]:
    return subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True).stdout.split()


def _requeued(job_id: str, logs: Path) -> None:
    state = ["squeue", "-h", "-j", job_id, "-o", "%T"]
    _wait(lambda: subprocess.run(state, capture_output=True, text=True).stdout.strip() == "PENDING",
          60, f"job {job_id} back in the queue", logs)


def _start_now(job_id: str) -> None:
    """Slurm holds a requeued job back for about two minutes: start it at once."""
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)


def test_sweep_on_slurm_failed_ok_requeue_resume_and_nothing_to_resubmit(tmp_path, capsys):
    path = tmp_path / "slurm_toy.py"
    path.write_text(SWEEP)
    res = tmp_path / "results"  # a fresh submitit folder too: a restarted controller reuses job ids
    argv = ["run", str(path), "--executor", "slurm", "--results-dir", str(res), "--cpus-per-task", "1",
            "--time", "10", "--array-parallelism", "4"]
    assert cli(argv) == 0
    out = capsys.readouterr().out
    assert "4 to run (slurm)" in out and "submitted 4 job(s)" in out
    job = out.split("submitted 4 job(s) as ")[1].split(";")[0].strip()
    logs = res / "slurm_toy" / "submitit"
    sbatch = "".join(p.read_text() for p in logs.glob("**/*submission.sh"))
    assert "--array=0-3%4" in sbatch and "--signal=USR1@" in sbatch and "SUBMITIT_PREEMPT_SIGNAL=USR1" in sbatch

    # Once the two long runs have trained a few steps, interrupt them as a cluster does:
    # the time-limit warning (USR1, on which submitit requeues the job itself), then
    # `scontrol requeue` (SIGTERM, as preemption). Both must continue from their
    # checkpoint. One at a time: Slurm refuses to alter an array job while one of its
    # tasks is being requeued.
    for run in load_sweep(path).runs[:2]:
        ckpt = workdir_for(res, "slurm_toy", run.run_id) / "checkpoint.pt"
        _wait(ckpt.exists, 90, f"a first checkpoint of {run.label}", logs)
    # scancel delivers the signal at once but, once the job has requeued itself, keeps
    # retrying for minutes ("Job can not be altered now"); it is stopped before the
    # job can start again, so no retry reaches the second attempt.
    scancel = subprocess.Popen(["scancel", "--signal=USR1", f"{job}_0"], stderr=subprocess.DEVNULL)
    try:
        _requeued(f"{job}_0", logs)
    finally:
        scancel.kill()
        scancel.wait()
    _start_now(f"{job}_0")
    subprocess.run(["scontrol", "requeue", f"{job}_1"], check=True, timeout=30)
    _requeued(f"{job}_1", logs)
    _start_now(f"{job}_1")
    _wait(lambda: len(records(res, "slurm_toy")) == 4 and not any(j.startswith(job) for j in _queue()),
          150, "four records", logs)

    recs = {r["label"]: r for r in records(res, "slurm_toy").values()}
    assert recs["short"]["status"] == "ok" and recs["short"]["provenance"]["executor"] == "slurm"
    assert recs["short"]["provenance"]["slurm_job_id"].startswith(f"{job}_")
    assert recs["flaky"]["status"] == "failed" and "crash at step 0" in recs["flaky"]["error"]
    for label in ("requeued", "signalled"):
        rec = recs[label]
        assert rec["status"] == "ok" and rec["metrics"]["steps"] == 50, json.dumps(rec, indent=1)[:2000]
        assert rec["resumed"] is True and rec["attempts"] == 2 and 0 < rec["metrics"]["resumed_from"] < 50
    assert "Requeued job" in next(logs.glob(f"{job}_0_*log.out")).read_text()  # submitit's own requeue
    for task, said in ((0, "requeued; it resumes from its checkpoint"), (1, "interrupted")):
        # the interrupted attempt's log ends with its status line too, then the next attempt's
        text = next(logs.glob(f"{job}_{task}_*log.out")).read_text()
        assert f": {said}" in text and text.count("[linbench] run") == 2, text[-3000:]

    # again: only the failed run goes back to Slurm (and now succeeds) ...
    assert cli([*argv, "--wait"]) == 0
    out = capsys.readouterr().out
    assert "3 already ok, 1 to run" in out and "finished: 1 ok" in out
    # ... and once all are ok, a third run submits nothing
    _wait(lambda: not _queue(), 60, "an empty queue", logs)
    n_scripts = len(list(logs.glob("**/*submission.sh")))
    assert cli(argv) == 0
    assert "4 already ok, 0 to run" in capsys.readouterr().out
    assert len(list(logs.glob("**/*submission.sh"))) == n_scripts and not _queue()


DAYS = """
from sweeps import RunConfig
train = {"steps": 8, "batch_size": 4, "lr": 1e-2, "warmup_steps": 1, "eval_every": 4,
         "device": "cpu", "log_every_s": 0.2}
configs = [
    RunConfig("toy", {"seed": 7, "step_delay": 0.3,
                      "train": {**train, "steps": 200, "checkpoint_every": 2}}, "long"),
    RunConfig("toy", {"seed": 8, "crash_at": 0, "train": train}, "flaky"),
]
"""


def _slurm_sweep(tmp_path: Path, name: str, text: str):
    """A sweep file ``name``.py of ``text`` in tmp_path: (its path, the results dir, its
    submitit folder, the --results-dir arguments, a Slurm `run` of 1 CPU and 10 min)."""
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    res = tmp_path / "results"
    base = ["--results-dir", str(res)]
    argv = ["run", str(path), "--executor", "slurm", *base, "--cpus-per-task", "1", "--time", "10"]
    return path, res, res / name / "submitit", base, argv


def test_days_on_slurm_refusal_pending_no_resubmit_cancel_resume_and_logs(tmp_path, capfd):
    capsys = capfd  # sbatch writes to the process's stderr itself: read the file descriptors
    path, res, logs, base, argv = _slurm_sweep(tmp_path, "days", DAYS)

    # sbatch's refusal is one `linbench:` line, and leaves no files of the submission
    assert cli([*argv, "--partition", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert "linbench: sbatch refused the submission" in err and "Traceback" not in err
    # one line, ours (quoting sbatch), and no folder left behind
    assert [line for line in err.splitlines() if line.strip()] == [err.strip()] and "error" in err
    assert not res.exists()

    # --mem-gb 2 is accepted; a second run while the jobs wait submits nothing
    assert cli([*argv, "--mem-gb", "2", "--slurm-arg", "begin=now+3600"]) == 0
    capsys.readouterr()
    assert "--mem=2048M" in "".join(p.read_text() for p in logs.glob("*submission.sh"))
    n_scripts = len(list(logs.glob("*submission.sh")))
    assert cli([*argv, "--mem-gb", "2"]) == 0
    assert "2 in flight (queued or running), 0 to run" in capsys.readouterr().out
    assert len(list(logs.glob("*submission.sh"))) == n_scripts
    def looked() -> bool:  # every pending job has a reason ("None" until the scheduler's first look)
        return "None" not in subprocess.run(["squeue", "-h", "-r", "-o", "%r"], capture_output=True,
                                            text=True).stdout.split()

    _wait(looked, 30, "the scheduler's look at the jobs", logs)
    cli(["status", str(path), *base])
    out = capsys.readouterr().out
    assert "2 queued" in out and out.count("(Slurm: BeginTime)") == 2  # Slurm's reason, a wait
    assert cli(["cancel", str(path), *base]) == 0
    out = capsys.readouterr().out
    assert out.count("removed from the queue") == 2
    # they resume as they were sent: executor, Slurm options, these runs
    resume = shlex.split(re.search(r"`(linbench run [^`]*)`", out).group(1))
    assert resume[:9] == ["linbench", "run", str(path), "--executor", "slurm", "--cpus-per-task", "1", "--mem-gb",
                          "2.0"] and "--only" in resume and resume[-2:] == base
    _wait(lambda: not _queue(), 30, "the queue to empty", logs)

    # a job Slurm will never start as submitted (more CPUs than the node has) says so
    assert cli([*argv[:-4], "--cpus-per-task", str(2 * (os.cpu_count() or 1) + 2), "--time", "10",
                "--only", "flaky"]) == 0
    out = capsys.readouterr().out
    assert _command(out, "status") == ["linbench", "status", str(path), *base]
    _wait(looked, 30, "the scheduler's look at the job", logs)
    cli(["status", str(path), *base])
    out = capsys.readouterr().out
    assert "1 queued" in out and "(Slurm: PartitionConfig; Slurm will not start it as submitted" in out
    assert cli(["cancel", str(path), *base]) == 0
    capsys.readouterr()
    _wait(lambda: not _queue(), 30, "the queue to empty", logs)

    # running: progress in the job log, then cancel: it checkpoints and stops, partial
    assert cli(argv) == 0
    capsys.readouterr()
    long_run = load_sweep(path).runs[0]
    ckpt = workdir_for(res, "days", long_run.run_id) / "checkpoint.pt"
    _wait(ckpt.exists, 90, "a first checkpoint", logs)
    _wait(lambda: "[train] step" in "".join(p.read_text() for p in logs.glob("*_log.out")), 30,
          "progress lines in the job log", logs)
    assert cli(["cancel", str(path), *base]) == 0
    assert "told to checkpoint and stop" in capsys.readouterr().out
    _wait(lambda: not _queue(), 60, "the cancelled job to end", logs)
    cli(["status", str(path), *base])
    out = capsys.readouterr().out
    assert "partial" in out and "interrupted step" in out and "1 failed" in out
    assert long_run.run_id not in records(res, "days")

    # logs prints the failed run's traceback; a rerun resumes the cancelled one
    assert cli(["logs", str(path), "flaky", *base]) == 0
    out = capsys.readouterr().out
    assert "Traceback" in out and "crash at step 0" in out and "[linbench] run" in out
    assert cli([*argv, "--wait"]) == 0
    rec = records(res, "days")[long_run.run_id]
    assert rec["status"] == "ok" and rec["resumed"] is True and 0 < rec["metrics"]["resumed_from"] < 200


TWO_TASKS = """
from sweeps import RunConfig
configs = [RunConfig("toy", {"seed": 9, "train": {"steps": 8, "batch_size": 4, "lr": 1e-2, "warmup_steps": 1,
                                                  "eval_every": 4, "device": "cpu"}}, "two")]
"""


def test_a_two_task_job_trains_one_run_to_one_record(tmp_path, capsys):
    # `--tasks-per-node 2`: one job of two tasks (submitit's TorchDistributedEnvironment,
    # DDP over gloo), one record written by rank 0, and both tasks' logs end in a status line
    path = tmp_path / "two.py"
    path.write_text(TWO_TASKS)
    res = tmp_path / "results"
    argv = ["run", str(path), "--executor", "slurm", "--results-dir", str(res), "--cpus-per-task", "1",
            "--tasks-per-node", "2", "--time", "10", "--wait"]
    assert cli(argv) == 0, capsys.readouterr().out
    logs = res / "two" / "submitit"
    sbatch = "".join(p.read_text() for p in logs.glob("**/*submission.sh"))
    assert "--ntasks-per-node=2" in sbatch
    (rec,) = records(res, "two").values()
    assert rec["status"] == "ok" and rec["metrics"]["world_size"] == 2 and rec["metrics"]["strategy"] == "ddp"
    assert rec["attempts"] == 1 and rec["provenance"]["executor"] == "slurm"
    task_logs = sorted(logs.glob("**/*_log.out"))
    assert len(task_logs) == 2 and all("[linbench] run" in p.read_text() for p in task_logs)


BESIDE = """
from sweeps import RunConfig
train = {"steps": 20, "batch_size": 4, "lr": 1e-2, "warmup_steps": 1, "eval_every": 10, "device": "cpu"}
configs = [RunConfig("toy", {"seed": 20, "step_delay": 0.3, "train": train}, "other"),
           RunConfig("toy", {"seed": 21, "step_delay": 0.3, "train": train}, "timing", exclusive=True)]
"""


def test_a_timing_run_never_shares_the_node(tmp_path, capsys):
    # `alone` (a timing run) goes to Slurm with --exclusive: on this one node it starts
    # only once the other run's job has left it, and nothing starts beside it
    path = tmp_path / "beside.py"
    path.write_text(BESIDE)
    res = tmp_path / "results"
    argv = ["run", str(path), "--executor", "slurm", "--results-dir", str(res), "--cpus-per-task", "1",
            "--time", "10", "--wait"]
    assert cli(argv) == 0, capsys.readouterr().out
    scripts = {p.read_text() for p in (res / "beside" / "submitit").glob("**/*submission.sh")}
    assert sum("--exclusive" in text for text in scripts) == 1 and len(scripts) == 2
    recs = {r["label"]: r["metrics"] for r in records(res, "beside").values()}
    spans = sorted((m["t_start"], m["t_end"]) for m in recs.values())
    assert spans[0][1] <= spans[1][0], spans  # one after the other, never side by side


HELD = """
from sweeps import RunConfig
configs = [RunConfig("toy", {"seed": s}, f"h{s}") for s in range(3)]
"""


def _scontrol_job(job_id: str) -> dict[str, str]:
    text = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return dict(field.split("=", 1) for field in text.split() if "=" in field)


def _megabytes(text: str) -> float:
    return float(text[:-1]) * {"M": 1, "G": 1024, "T": 1024 ** 2}[text[-1]]


def test_a_dry_run_shows_what_slurm_gives_the_jobs_and_gpus_need_a_gpu_partition(tmp_path, capfd):
    path = tmp_path / "held.py"
    path.write_text(HELD)
    res = tmp_path / "results"
    argv = ["run", str(path), "--executor", "slurm", "--results-dir", str(res), "--partition", "debug",
            "--cpus-per-task", "1", "--time", "1-0:30", "--mem-gb", "1.5", "--array-parallelism", "2",
            "--slurm-arg", "begin=now+3600"]  # held an hour: submitted, never started

    # this cluster's node has no GPU: sinfo says so before sbatch is asked
    assert cli([*argv, "--gpus", "1"]) == 2
    err = capfd.readouterr().err
    assert err.strip() == ("linbench: partition debug has no GPUs (sinfo Gres: (null)); "
                           "leave --gpus out on a CPU partition")
    assert cli([*argv[:6], "--gpus", "1", "--dry-run"]) == 2  # the default partition, in a dry run too
    assert "partition debug (the default) has no GPUs" in capfd.readouterr().err
    assert not res.exists()

    assert cli([*argv, "--dry-run"]) == 0
    shown = dict(re.findall(r"^  (\S.*?)  +(.*)$", capfd.readouterr().out, re.M))
    assert not res.exists()
    assert cli(argv) == 0
    out = capfd.readouterr().out
    job_id = re.search(r"submitted 3 job\(s\) as (\d+)", out).group(1)
    try:
        job = _scontrol_job(job_id)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    # as Slurm read the script submitit wrote
    assert shown["time limit"] == job["TimeLimit"] == "1-00:30:00"
    assert shown["partition"] == job["Partition"] == "debug"
    assert set(job["NumNodes"].split("-")) == {shown["nodes"]}  # "1-1" (min-max) while pending
    assert shown["cpus per task"] == job["CPUs/Task"]
    assert _megabytes(shown["memory per node"]) == _megabytes(job["MinMemoryNode"]) == 1536
    assert shown["submitted as"] == "an array of 3 jobs, at most 2 at once"
    assert job["ArrayTaskId"] == "0-2%2" and shown["--begin"] == "now+3600"


WAITED = """
from sweeps import RunConfig
train = {"steps": 30, "batch_size": 4, "lr": 1e-2, "warmup_steps": 1, "eval_every": 10, "device": "cpu"}
configs = [RunConfig("toy", {"seed": 30, "step_delay": 0.4, "train": train}, "first")]
"""


def test_wait_waits_for_runs_already_in_flight(tmp_path, capsys):
    path = tmp_path / "waited.py"
    path.write_text(WAITED)
    res = tmp_path / "results"
    argv = ["run", str(path), "--executor", "slurm", "--results-dir", str(res), "--cpus-per-task", "1", "--time", "10"]
    assert cli(argv) == 0  # submitted, not waited for
    capsys.readouterr()
    second = 'RunConfig("toy", {"seed": 31, "train": {**train, "steps": 4}}, "second")'
    path.write_text(WAITED.replace('"first")]', f'"first"), {second}]'))
    assert cli([*argv, "--wait"]) == 0  # the new one is short: it ends long before the first
    out = capsys.readouterr().out
    assert "1 in flight" in out and "waiting for 1 run(s) already in flight too" in out and "finished: 2 ok" in out
    assert {r["label"]: r["status"] for r in records(res, "waited").values()} == {"first": "ok", "second": "ok"}


CHURN = """
from sweeps import RunConfig
train = {"steps": 10, "batch_size": 4, "lr": 1e-2, "warmup_steps": 1, "eval_every": 5, "checkpoint_every": 1,
         "device": "cpu"}
configs = [RunConfig("toy", {"seed": s, "step_delay": 0.3, "train": train}, f"r{s}") for s in range(8)]
"""


def test_a_cancel_while_array_tasks_start_loses_no_run(tmp_path, capsys):
    """Cancelled as the first tasks finish, while queued ones take their place: every run
    ends ok, partial with its checkpoint, or not started; none lost; a rerun finishes all."""
    path, res, logs, base, argv = _slurm_sweep(tmp_path, "churn", CHURN)
    runs = load_sweep(path).runs
    assert cli(argv) == 0
    _wait(lambda: records(res, "churn"), 180, "a first finished run", logs)
    assert cli(["cancel", str(path), *base]) == 0
    out = capsys.readouterr().out
    assert "could not" not in out, out
    _wait(lambda: not _queue(), 120, "the queue to empty", logs)
    cli(["status", str(path), *base])
    out = capsys.readouterr().out
    states = {r.run_id: re.search(rf"{r.run_id}\s+(\S+( run)?)", out).group(1) for r in runs}
    assert set(states.values()) <= {"ok", "partial", "not run"} and "lost" not in out, out
    for rid, state in states.items():
        if state == "partial":  # stopped by the cancel: it kept a checkpoint to resume from
            assert (workdir_for(res, "churn", rid) / "checkpoint.pt").exists(), out
    assert "not run" in states.values() or "partial" in states.values(), out  # the cancel stopped something

    assert cli([*argv, "--wait"]) == 0
    capsys.readouterr()
    recs = records(res, "churn")
    assert {rid: recs[rid]["status"] for rid in states} == {rid: "ok" for rid in states}
    assert all(recs[rid]["resumed"] for rid, state in states.items() if state == "partial")
