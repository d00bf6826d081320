"""Running sweeps for days: what `run` submits again, final statuses and exit codes,
`status` / `logs` / `cancel`, Slurm options, and a local run killed with -9 resuming
to the same numbers. Uses the toy task of tests/test_sweeps.py; the same against a
real Slurm is in tests/test_slurm.py."""
from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps import cli as cli_module
from sweeps.cli import main as cli
from results.layout import workdir_for
from results.records import load_records
from sweeps import ledger as ledger_module
from sweeps.ledger import is_running, never_starts, read_ledger, record_submissions
from sweeps.views import time_left
from sweeps.slurm import signal_lead, slurm_parameters
from tasks.engine.progress import write_progress
from test_sweeps import TESTS, records, sweep_of, toy, toy_task  # noqa: F401  (the autouse fixture registers the toy task)

TRAIN = {"steps": 8, "batch_size": 4, "lr": 1e-2, "warmup_steps": 1, "eval_every": 4, "device": "cpu"}


def sweep_file(tmp_path: Path, *configs: str) -> Path:
    path = tmp_path / "ops.py"
    path.write_text("from sweeps import RunConfig\n"
                    f"train = {TRAIN!r}\n"
                    "configs = [\n" + "".join(f"    {c},\n" for c in configs) + "]\n")
    return path


def test_slurm_memory_is_whole_megabytes_and_the_signal_lead_scales_with_time():
    assert slurm_parameters("s", {"mem_gb": 2})["mem"] == "2048M"  # sbatch refuses 2.0GB
    assert slurm_parameters("s", {"mem_gb": 1.5})["mem"] == "1536M"
    assert [signal_lead(t) for t in (2, 30, 240)] == [15, 180, 300]
    assert slurm_parameters("s", {"time": 2})["additional_parameters"]["signal"] == "USR1@15"
    assert slurm_parameters("s", {"time": 2, "signal_lead_s": 45})["signal_delay_s"] == 45


def test_dry_run_lists_what_tells_runs_apart(tmp_path, capsys):
    path = sweep_file(tmp_path, 'RunConfig("toy", {"seed": 0, "train": train}, "same")',
                      'RunConfig("toy", {"seed": 1, "train": {**train, "lr": 0.02}}, "same")')
    assert cli(["run", str(path), "--dry-run", "--results-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "seed=0 train.lr=0.01" in lines[0] and "seed=1 train.lr=0.02" in lines[1]
    # one label over two tasks: each run shows what differs within its task, no field of
    # the other task's config and no unset (None) field
    path = sweep_file(tmp_path, 'RunConfig("toy", {"seed": 0, "train": train}, "both")',
                      'RunConfig("toy", {"seed": 1, "train": train}, "both")',
                      'RunConfig("scaling", {"mixer": "retnet", "d_model": 32, "device": "cpu"}, "both")',
                      'RunConfig("scaling", {"mixer": "retnet", "d_model": 64, "device": "cpu"}, "both")')
    assert cli(["run", str(path), "--dry-run", "--results-dir", str(tmp_path)]) == 0
    lines = [line.split("both", 1)[1].strip() for line in capsys.readouterr().out.splitlines()[:4]]
    assert lines == ["seed=0", "seed=1", "d_model=32", "d_model=64"]


def test_a_diverged_run_is_final_and_a_rerun_exits_0_submitting_nothing(tmp_path, capsys):
    path = sweep_file(tmp_path, 'RunConfig("toy", {"seed": 0, "train": train}, "fine")',
                      'RunConfig("toy", {"seed": 1, "fail": "diverge", "train": train}, "nan")')
    argv = ["run", str(path), "--executor", "debug", "--results-dir", str(tmp_path)]
    assert cli(argv) == 0
    assert "not ok: 1 diverged" in capsys.readouterr().out
    assert cli(argv) == 0
    assert "1 final (not rerun), 0 to run" in capsys.readouterr().out
    assert cli([*argv, "--rerun-diverged"]) == 0
    assert "1 to run" in capsys.readouterr().out


def test_a_failed_run_exits_1_and_logs_prints_its_traceback(tmp_path, capsys):
    path = sweep_file(tmp_path, 'RunConfig("toy", {"fail": "error", "train": train}, "broken")')
    base = ["--results-dir", str(tmp_path)]
    assert cli(["run", str(path), "--executor", "debug", *base]) == 1
    capsys.readouterr()
    assert cli(["status", str(path), *base, "--all-ok"]) == 1
    out = capsys.readouterr().out
    assert "failed" in out and "deliberate failure" in out and f"linbench logs {path} " in out
    # without --all-ok a sweep that could be read is 0: `status X && plot X && report X` draws it
    assert cli(["status", str(path), *base]) == 0
    assert cli(["logs", str(path), "broken", *base]) == 0
    out = capsys.readouterr().out
    assert "Traceback" in out and "RuntimeError: deliberate failure" in out
    assert cli(["logs", str(path), "nosuchrun", *base]) == 2


def test_a_run_in_flight_is_not_submitted_again_and_status_says_so(tmp_path, capsys):
    """A process holding the run's workdir lock is training it: `run` leaves it alone."""
    path = sweep_file(tmp_path, 'RunConfig("toy", {"train": train}, "busy")')
    run_id = cli_module.load_sweep(path).runs[0].run_id
    workdir = workdir_for(tmp_path, "ops", run_id)
    workdir.mkdir(parents=True)
    write_progress(workdir / "progress.json", {"status": "running", "step": 3, "steps": 8,
                                               "eta_s": 12.0, "updated": time.time()})
    with open(workdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert cli(["run", str(path), "--executor", "debug", "--results-dir", str(tmp_path)]) == 1
        assert "1 in flight (queued or running), 0 to run" in capsys.readouterr().out
        cli(["status", str(path), "--results-dir", str(tmp_path)])
        out = capsys.readouterr().out
        assert "running" in out and "step 3/8" in out
    assert not records(tmp_path, "ops")
    (workdir / "checkpoint.pt").touch()  # no lock, a heartbeat still running: lost
    cli(["status", str(path), "--results-dir", str(tmp_path)])
    assert "1 lost" in capsys.readouterr().out
    write_progress(workdir / "progress.json", {"status": "interrupted", "step": 3, "steps": 8})
    cli(["status", str(path), "--results-dir", str(tmp_path)])  # stopped in order, a checkpoint: partial
    assert "1 partial" in capsys.readouterr().out


def test_only_runs_the_named_labels_and_names_the_labels_when_none_matches(tmp_path, capsys):
    path = sweep_file(tmp_path, 'RunConfig("toy", {"seed": 0, "train": train}, "base")',
                      'RunConfig("toy", {"seed": 1, "train": train}, "other")',
                      'RunConfig("toy", {"seed": 2, "train": train}, "other")')
    argv = ["run", str(path), "--executor", "debug", "--results-dir", str(tmp_path)]
    assert cli([*argv, "--only", "nope"]) == 2
    assert "--only nope: no run of ops has that label, id or FIELD=VALUE; its labels: base, other" in capsys.readouterr().err
    assert cli([*argv, "--only", "base"]) == 0
    assert [r["label"] for r in records(tmp_path, "ops").values()] == ["base"]
    third = cli_module.load_sweep(path).runs[2].run_id
    assert cli([*argv, "--only", third[:6]]) == 0  # a run id's first characters
    assert sorted(r["config"]["seed"] for r in records(tmp_path, "ops").values()) == [0, 2]
    assert cli([*argv, "--only", "seed=1", "--dry-run"]) == 0  # a config field's value
    assert "1 configs valid" in capsys.readouterr().out
    assert cli([*argv, "--only", "seed=9"]) == 2
    capsys.readouterr()
    path = sweep_file(tmp_path, 'RunConfig("toy", {"seed": 0, "train": train}, "base")')  # the sweep shrinks
    assert cli(["status", str(path), "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 runs: 1 ok (1 record(s) of configs no longer in the sweep)" in out and "left: nothing" in out


def test_time_left_uses_a_heartbeat_else_the_nearest_finished_runs_and_says_which():
    a1, a2, a3 = toy("a", seed=0), toy("a", seed=1), toy("a", seed=1, step_delay=0.5)
    b1, c1 = toy("b", seed=2), toy("c", seed=3)
    sweep = sweep_of(a1, a2, a3, b1, c1)
    ok = {a1.run_id: 3600.0, a2.run_id: 3 * 3600.0}
    states = {r.run_id: "ok" if r.run_id in ok else "not run" for r in sweep.runs}
    # a3 differs from a2 in one field, from a1 in two: a2's 3 h; b1's heartbeat: 0.5 h;
    # c1 has no finished run of its label: its nearest of any label (a1 and a2, both 2
    # fields away) give their median, 2 h
    line = time_left(sweep, states, {b1.run_id: {"eta_s": 1800.0}}, ok)
    assert line == ("left: 3 run(s), about 5.5 h of training summed over runs (1 by finished runs of the same "
                    "label, 1 by heartbeat ETA, 1 by finished runs of other labels (rough))")
    states[c1.run_id] = "diverged"  # final: not run again, not counted
    line = time_left(sweep, states, {}, {})
    assert line == "left: 2 run(s), time unknown: no run has finished or reported an ETA yet"
    # minutes read as minutes (ETAs 1:40 and 0:39), not as "0.0 h"
    line = time_left(sweep, states, {a3.run_id: {"eta_s": 100.0}, b1.run_id: {"eta_s": 39.0}}, {})
    assert line == "left: 2 run(s), about 2 min of training summed over runs (2 by heartbeat ETA)"
    assert time_left(sweep, dict.fromkeys(states, "ok"), {}, ok) == "left: nothing"
    # a run stopped part-way (cancelled: its ETA reads 0) counts its steps from its last
    # checkpoint at the rate it ran: (100 - 40) steps at 0.1 a second, 10 min
    stopped = {"status": "stopped", "step": 45, "steps": 100, "checkpoint_step": 40, "steps_per_s": 0.1,
               "eta_s": 0.0}
    line = time_left(sweep, states, {a3.run_id: stopped, b1.run_id: {"eta_s": 0.0, "status": "running"}}, {})
    assert line == "left: 2 run(s), about 10 min of training summed over runs (2 by heartbeat ETA)"
    # a run of a label whose finished runs all differ from it in two fields (seed and
    # step_delay): their median, 2 h, said to be rough (another length or task costs more)
    a4 = toy("a", seed=5, step_delay=0.7)
    far = sweep_of(a1, a2, a4)
    line = time_left(far, {r.run_id: "ok" if r.run_id in ok else "not run" for r in far.runs}, {}, ok)
    assert line == ("left: 1 run(s), about 2.0 h of training summed over runs (1 by finished runs of the same "
                    "label in another setting (rough))")


def test_time_left_scales_by_the_tokens_a_run_plans_where_its_task_says():
    from sweeps import RunConfig
    from tasks.mad.task import MADConfig
    from tasks.mqar.task import MQARConfig
    from tasks.wikitext2 import WikiText2Config

    def mqar(steps, batch=64, lr=1e-3):
        cfg = MQARConfig()
        return RunConfig("mqar", cfg.replace(train=cfg.train.replace(steps=steps, batch_size=batch, lr=lr)), "m")

    cfg = MQARConfig()
    assert cfg.planned_tokens() == cfg.train.steps * cfg.train.batch_size * cfg.seq_len
    mad = MADConfig(task="in-context-recall", setting={"seq_len": 256})
    assert mad.planned_tokens() == mad.train.steps * mad.train.batch_size * 256  # the setting's length
    assert WikiText2Config(budget_tokens=5000).planned_tokens() == 5000
    assert WikiText2Config().planned_tokens() is None  # epochs: only the corpus knows the tokens

    # finished: 1,000 steps of batch 64 at two lrs, in 1,000 s and 2,000 s. To do: 3,000
    # steps at a third lr (two fields from both: their median per token, 4,500 s, rough) and
    # 1,000 steps of batch 32 at the first lr (one field: 500 s); a task that plans nothing
    # keeps its peers' median wall time (the toy's 1 h)
    done_a, done_b = mqar(1000), mqar(1000, lr=3e-3)
    long_run, half = mqar(3000, lr=1e-2), mqar(1000, batch=32)
    t1, t2 = toy("t", seed=0), toy("t", seed=1)
    sweep = sweep_of(done_a, done_b, long_run, half, t1, t2)
    ok = {done_a.run_id: 1000.0, done_b.run_id: 2000.0, t1.run_id: 3600.0}
    states = {r.run_id: "ok" if r.run_id in ok else "not run" for r in sweep.runs}
    assert time_left(sweep, states, {}, ok) == (  # 8,600 s; unscaled it would be 6,100 s, 1.7 h
        "left: 3 run(s), about 2.4 h of training summed over runs (1 by finished runs of the same "
        "label in another setting (rough), 2 by finished runs of the same label)")


def _command(text: str, verb: str) -> list[str]:
    """The one `linbench VERB ...` command quoted in backticks in ``text``, as argv words."""
    found = [shlex.split(c) for c in re.findall(r"`(linbench [^`]*)`", text)]
    found = [c for c in found if c[1] == verb]
    assert len(found) == 1, text
    return found[0]


def test_every_printed_command_pastes_as_is(tmp_path, capsys, monkeypatch):
    """Each command linbench prints keeps the sweep path, the results folder, and for a
    rerun the executor, its options and the --only set: pasted, it does what it says."""
    path = sweep_file(tmp_path, 'RunConfig("toy", {"fail": "error", "train": train}, "broken")',
                      'RunConfig("toy", {"seed": 1, "train": train}, "fine")')
    res = str(tmp_path / "elsewhere")
    argv = ["run", str(path), "--executor", "debug", "--results-dir", res, "--threads", "1"]
    assert cli([*argv, "--only", "broken"]) == 1
    status = _command(capsys.readouterr().out, "status")
    assert status == ["linbench", "status", str(path), "--results-dir", res]
    assert cli(status[1:]) == 0 and "failed" in capsys.readouterr().out  # finds the failed run where it is
    assert cli([*status[1:], "--all-ok"]) == 1
    logs = _command(capsys.readouterr().out, "logs")
    assert cli(logs[1:]) == 0 and "RuntimeError: deliberate failure" in capsys.readouterr().out
    assert cli(["logs", str(path), "nope", "--results-dir", res]) == 2
    assert _command(capsys.readouterr().err, "status") == status

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    launch, in_flight = cli_module.launch, cli_module.in_flight
    monkeypatch.setattr(cli_module, "launch", interrupted)
    monkeypatch.setattr(cli_module, "in_flight", lambda *a: {"abc": "running"})
    assert cli([*argv, "--only", "fine", "--rerun-diverged"]) == 130
    err = capsys.readouterr().err
    assert "1 run(s) still queued or running" in err
    assert _command(err, "cancel") == ["linbench", "cancel", str(path), "--results-dir", res]
    rerun = _command(err, "run")
    assert rerun == ["linbench", "run", str(path), "--executor", "debug", "--threads", "1", "--rerun-diverged",
                     "--only", "fine", "--results-dir", res]
    monkeypatch.setattr(cli_module, "launch", launch)
    monkeypatch.setattr(cli_module, "in_flight", in_flight)
    assert cli(rerun[1:]) == 0  # the runs that were asked for, as they were asked for
    assert [r["label"] for r in records(Path(res), "ops").values() if r["status"] == "ok"] == ["fine"]


def test_status_names_lost_runs_waiting_reasons_reading_ages_and_ok_runs(tmp_path, capsys, monkeypatch):
    path = sweep_file(tmp_path, 'RunConfig("toy", {"seed": 0, "train": train}, "done")',
                      'RunConfig("toy", {"seed": 1, "train": train}, "killed")',
                      'RunConfig("toy", {"seed": 2, "train": train}, "killed early")',
                      'RunConfig("toy", {"seed": 3, "train": train}, "too big")')
    done, killed, early, big = (r.run_id for r in cli_module.load_sweep(path).runs)
    base = ["--results-dir", str(tmp_path)]
    assert cli(["run", str(path), "--executor", "debug", "--only", "done", *base]) == 0
    # two runs whose process died (kill -9) mid-training: the heartbeat still says running
    for rid, ckpt in ((killed, True), (early, False)):
        workdir = workdir_for(tmp_path, "ops", rid)
        workdir.mkdir(parents=True)
        write_progress(workdir / "progress.json", {"status": "running", "step": 5, "steps": 8, "eta_s": 15.0,
                                                   "checkpoint_step": 4 if ckpt else None,
                                                   "updated": time.time() - 125})
        if ckpt:
            (workdir / "checkpoint.pt").touch()
    # and a job Slurm will never start as submitted
    monkeypatch.setattr(cli_module, "flights", lambda *a: {big: ("queued", "PartitionConfig")})
    capsys.readouterr()
    assert cli(["status", str(path), *base, "--all-ok"]) == 1
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")}
    assert " ok " in lines[done] and "loss" in lines[done] and " in 0:00:0" in lines[done]  # listed, with its result
    assert " lost " in lines[killed] and "step 5/8" in lines[killed] and "(2 min ago)" in lines[killed]
    assert "the checkpoint of step 4 is kept" in lines[killed]
    assert f"`linbench run {path} --only {killed} --results-dir {tmp_path}` resumes from it" in lines[killed]
    assert " lost " in lines[early] and "no checkpoint" in lines[early] and "starts it again" in lines[early]
    assert " queued " in lines[big] and "(Slurm: PartitionConfig; Slurm will not start it as submitted" in lines[big]
    # --brief: the same lines for the runs not yet ok, and the same counts
    full = lines
    assert cli(["status", str(path), *base, "--brief", "--all-ok"]) == 1
    out = capsys.readouterr().out
    brief = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert brief == {rid: line for rid, line in full.items() if rid != done} and "1 ok" in out
    assert cli(["logs", str(path), "killed", *base]) == 0
    assert "status: lost" in capsys.readouterr().out


SLOW = '{"seed": 5, "step_delay": 0.25, "train": {**train, "steps": 40, "checkpoint_every": 2, "log_every_s": 0.2}}'


def _start(path: Path, results: Path) -> subprocess.Popen:
    """`linbench run` with the local executor, in its own process group, as a user would."""
    code = ("import sys, tasks; from test_sweeps import ToyConfig, toy_run; "
            "tasks.TASKS['toy'] = (ToyConfig, toy_run); from sweeps.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    return subprocess.Popen([sys.executable, "-c", code, "run", str(path), "--executor", "local",
                             "--results-dir", str(results)], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(cond, timeout=90.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError("timed out")


@pytest.mark.slow
def test_kill_9_after_a_checkpoint_then_run_resumes_to_identical_numbers(tmp_path, capsys):
    path = sweep_file(tmp_path, f'RunConfig("toy", {SLOW}, "killed")')
    run = cli_module.load_sweep(path).runs[0]
    ckpt = workdir_for(tmp_path / "a", "ops", run.run_id) / "checkpoint.pt"
    proc = _start(path, tmp_path / "a")
    _wait_for(ckpt.exists)
    pid = read_ledger(tmp_path / "a", "ops")[run.run_id]["pid"]
    os.kill(pid, signal.SIGKILL)  # the training process, then `linbench run` itself
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_for(lambda: not is_running(ckpt.parent), timeout=10)  # the kernel drops its lock
    assert not records(tmp_path / "a", "ops")
    assert cli(["status", str(path), "--results-dir", str(tmp_path / "a"), "--all-ok"]) == 1
    out = capsys.readouterr().out
    assert "1 lost" in out and "its process died without a record" in out and "resumes from it" in out
    assert cli(["run", str(path), "--executor", "local", "--results-dir", str(tmp_path / "a")]) == 0
    assert cli(["run", str(path), "--executor", "local", "--results-dir", str(tmp_path / "b")]) == 0
    resumed, clean = (records(tmp_path / d, "ops")[run.run_id] for d in ("a", "b"))
    assert resumed["resumed"] is True and 0 < resumed["metrics"]["resumed_from"] < 40
    assert resumed["provenance"]["threads"] == clean["provenance"]["threads"]
    assert resumed["metrics"]["loss"] == clean["metrics"]["loss"]  # same thread count: bit-identical


@pytest.mark.slow
def test_cancel_stops_a_local_sweep_at_a_checkpoint_and_run_resumes_it(tmp_path, capsys):
    path = sweep_file(tmp_path, f'RunConfig("toy", {SLOW}, "first")',
                      f'RunConfig("toy", {{**{SLOW}, "seed": 6}}, "second")')
    first = cli_module.load_sweep(path).runs[0]
    ckpt = workdir_for(tmp_path, "ops", first.run_id) / "checkpoint.pt"
    proc = _start(path, tmp_path)
    _wait_for(ckpt.exists)
    assert cli(["cancel", str(path), "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "told to checkpoint and stop" in out
    resume = _command(out, "run")  # the cancelled run alone, from the same results folder
    assert resume == ["linbench", "run", str(path), "--only", first.run_id, "--results-dir", str(tmp_path)]
    out, _ = proc.communicate(timeout=60)
    assert "cancelled; 1 run(s) not started" in out, out
    assert not records(tmp_path, "ops")
    cli(["status", str(path), "--results-dir", str(tmp_path)])
    assert "1 partial, 1 not run" in capsys.readouterr().out
    log = Path(read_ledger(tmp_path, "ops")[first.run_id]["log"]).read_text()
    assert "[train] step" in log and f"cancelled; its checkpoint is kept and `{shlex.join(resume)}` resumes it" in log
    assert cli(resume[1:]) == 0
    rec = records(tmp_path, "ops")[first.run_id]
    assert rec["status"] == "ok" and rec["resumed"] is True and rec["metrics"]["steps"] == 40
    assert len(records(tmp_path, "ops")) == 1  # the run never started is left for a plain `run`


def test_threads_per_run_default_to_the_cores_given_and_are_recorded(tmp_path):
    path = sweep_file(tmp_path, 'RunConfig("toy", {"train": train}, "one")')
    argv = ["run", str(path), "--executor", "local"]
    assert cli([*argv, "--results-dir", str(tmp_path / "a"), "--threads", "1"]) == 0
    assert cli([*argv, "--results-dir", str(tmp_path / "b"), "--parallel", "1"]) == 0
    (one,), (default,) = (records(tmp_path / d, "ops").values() for d in ("a", "b"))
    assert one["provenance"]["threads"] == one["metrics"]["threads"] == 1
    assert default["provenance"]["threads"] == max(1, os.cpu_count() or 1)


def test_only_a_pending_reason_that_cannot_clear_is_called_never():
    assert never_starts("PartitionConfig") and never_starts("QOSMaxWallDurationPerJobLimit")
    assert never_starts("AssocMaxCpuPerJobLimit")
    # per-user and aggregate limits clear as other jobs end; down nodes come back
    for reason in ("Resources", "Priority", "BeginTime", "QOSMaxJobsPerUserLimit", "AssocMaxJobsLimit",
                   "QOSGrpCpuLimit", "PartitionNodeLimit"):
        assert not never_starts(reason), reason


def test_flights_ask_squeue_once_and_keep_a_pending_jobs_reason(tmp_path, monkeypatch):
    record_submissions(tmp_path, "ops", {rid: {"executor": "slurm", "job_id": job}
                                         for rid, job in (("a", "7"), ("b", "8"), ("c", "9"), ("d", "10"))})
    asked = []
    squeue = {"7": ("PENDING", "Resources"), "8": ("PENDING", "None"), "9": ("RUNNING", "None")}  # 10: gone
    monkeypatch.setattr(ledger_module, "slurm_jobs", lambda ids: asked.append(sorted(ids)) or squeue)
    assert ledger_module.flights(tmp_path, "ops") == {"a": ("queued", "Resources"), "b": ("queued", ""),
                                                      "c": ("running", "")}
    assert asked == [["10", "7", "8", "9"]]
    assert ledger_module.in_flight(tmp_path, "ops") == {"a": "queued", "b": "queued", "c": "running"}


def test_a_lost_run_resumes_where_it_was_sent_and_an_unanswered_squeue_is_not_lost(tmp_path, capsys, monkeypatch):
    path = sweep_file(tmp_path, 'RunConfig("toy", {"seed": 0, "train": train}, "new")',
                      'RunConfig("toy", {"seed": 1, "train": train}, "old")')
    new, old = (r.run_id for r in cli_module.load_sweep(path).runs)
    for rid in (new, old):
        workdir = workdir_for(tmp_path, "ops", rid)
        workdir.mkdir(parents=True)
        write_progress(workdir / "progress.json", {"status": "running", "step": 2, "steps": 8, "updated": time.time()})
    # sent to Slurm with options; and an entry from before the options were kept
    record_submissions(tmp_path, "ops", {
        new: {"executor": "slurm", "job_id": "7", "options": ["--executor", "slurm", "--cpus-per-task", "2"]},
        old: {"executor": "slurm", "job_id": "8"}})
    monkeypatch.setattr(ledger_module, "slurm_jobs", lambda ids: {})  # squeue knows neither job: lost
    base = ["--results-dir", str(tmp_path)]
    cli(["status", str(path), *base])
    out = capsys.readouterr().out
    assert f"`linbench run {path} --executor slurm --cpus-per-task 2 --only {new} --results-dir {tmp_path}`" in out
    assert f"`linbench run {path} --executor slurm --only {old} --results-dir {tmp_path}`" in out
    # squeue there but silent: the jobs may be training on another node
    monkeypatch.setattr(ledger_module, "slurm_jobs", lambda ids: None)
    monkeypatch.setattr(ledger_module.shutil, "which", lambda name: f"/usr/bin/{name}")
    cli(["status", str(path), *base])
    out = capsys.readouterr().out
    assert "2 unknown" in out and " lost " not in out and "squeue did not answer" in out
    assert cli(["run", str(path), "--executor", "debug", *base]) == 1  # and nothing is run twice
    assert "2 in flight" in capsys.readouterr().out and not records(tmp_path, "ops")


def test_only_takes_labels_with_an_equals_sign_and_field_values_as_written(tmp_path, capsys):
    path = sweep_file(tmp_path, 'RunConfig("toy", {"seed": 0, "train": train}, "grassmann eps=1e-8")',
                      'RunConfig("toy", {"seed": 1, "train": {**train, "lr": 0.02}}, "other")')
    argv = ["run", str(path), "--dry-run", "--results-dir", str(tmp_path)]
    for key in ("grassmann eps=1e-8", "train.lr=1e-2", "seed=0"):
        assert cli([*argv, "--only", key]) == 0
        assert "1 configs valid" in capsys.readouterr().out, key


def test_order_runs_the_runs_by_config_fields_and_names_a_field_no_run_has(tmp_path, capsys):
    path = sweep_file(tmp_path, 'RunConfig("toy", {"seed": 2, "train": train}, "c")',
                      'RunConfig("toy", {"seed": 0, "train": {**train, "lr": 0.02}}, "b")',
                      'RunConfig("toy", {"seed": 1, "train": train}, "a")',
                      'RunConfig("toy", {"seed": 0, "train": train}, "d")')
    argv = ["run", str(path), "--dry-run", "--results-dir", str(tmp_path)]

    def listed(*order):
        assert cli([*argv, *order]) == 0
        return [line.split()[3] for line in capsys.readouterr().out.splitlines() if line.split()[1:2] == ["-"]]
    assert listed() == ["c", "b", "a", "d"]  # the file's order
    assert listed("--order", "seed") == ["b", "d", "a", "c"]  # ties stay in the file's order
    assert listed("--order", "seed", "--order", "train.lr") == ["d", "b", "a", "c"]
    assert listed("--order", "label") == ["a", "b", "c", "d"]
    assert listed("--order", "seed", "--only", "seed=2", "--only", "a") == ["a", "c"]
    assert cli([*argv, "--order", "seq_len"]) != 0
    err = capsys.readouterr().err
    assert "--order seq_len: no run of ops has that field; its fields: " in err and " seed, " in err and " train.lr," in err


def test_printed_options_that_start_with_a_dash_keep_their_value(tmp_path):
    p = cli_module.parser()
    args = p.parse_args(["run", "s", "--setup=--version", "--setup", "module load x", "--slurm-arg", "exclude=n3"])
    words = cli_module.run_options(p.run_verb, args)
    assert words == ("--setup=--version", "--setup", "module load x", "--slurm-arg", "exclude=n3")
    again = p.parse_args(["run", "s", *words])
    assert again.setup == args.setup and again.slurm_arg == args.slurm_arg


def test_a_job_pickled_before_jobs_carried_hints_still_says_its_last_word(tmp_path, capsys):
    from sweeps.jobs import RunJob
    job = RunJob(toy("x"), "ops", tmp_path, "slurm")
    del job.__dict__["hints"]  # as unpickled from an older version
    job._last_word("cancelled")
    assert "`linbench run ops --only" in capsys.readouterr().out


def test_the_rendezvous_port_is_one_per_job_and_below_the_ephemeral_range(tmp_path):
    from sweeps.jobs import rendezvous_port
    ports = tmp_path / "ip_local_port_range"
    ports.write_text("32768\t60999\n")
    picked = {rendezvous_port(f"{job}", str(ports)) for job in range(200)}
    assert all(20000 <= p < 32768 for p in picked) and len(picked) > 150  # spread over the range
    assert rendezvous_port("28", str(ports)) == rendezvous_port("28", str(ports))  # every task agrees
    assert 20000 <= rendezvous_port("28", str(tmp_path / "missing")) < 32768  # Linux's default


@pytest.mark.parametrize("text, minutes", [
    ("90", 90), ("2:30", 3), ("2:00", 2), ("1:00:00", 60), ("01:30:01", 91), ("2-0", 2880),
    ("1-12", 2160), ("1-12:30", 2190), ("0-0:0:1", 1), (" 45 ", 45)])
def test_time_limits_are_read_as_sbatch_reads_them(text, minutes):
    assert cli_module._minutes(text) == minutes


@pytest.mark.parametrize("text, why", [
    ("0", "above zero"), ("0:00", "above zero"), ("-5", "not a time limit"), ("1:99", "seconds 99 out of range"),
    ("1:60:00", "minutes 60 out of range"), ("1-24", "hours 24 out of range"), ("2h", "not a time limit"),
    ("1:2:3:4", "not a time limit")])
def test_a_bad_time_limit_is_refused_with_one_line(text, why, capsys):
    with pytest.raises(SystemExit):
        cli(["run", "smoke", "--executor", "slurm", "--time", text, "--dry-run"])
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err and ("MM, MM:SS, HH:MM:SS" in err or why == "above zero")


def test_a_results_dir_that_is_a_file_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    path = sweep_file(tmp_path, 'RunConfig("toy", {"train": train}, "one")')
    (tmp_path / "results.txt").write_text("not a folder")
    for verb in ("run", "status", "report", "export"):
        argv = [verb, str(path), "--results-dir", str(tmp_path / "results.txt" / "deeper")]
        assert cli([*argv, *(["--executor", "debug"] if verb == "run" else [])]) == 2
        err = capsys.readouterr().err
        assert "results.txt is a file, not a folder" in err and "Traceback" not in err
    monkeypatch.setattr(cli_module.os, "access", lambda p, mode: False)  # a read-only filesystem
    assert cli(["run", str(path), "--executor", "debug", "--results-dir", str(tmp_path / "r")]) == 2
    assert "is not writable here" in capsys.readouterr().err
    assert cli(["status", str(path), "--results-dir", str(tmp_path / "r")]) == 0  # reading needs no write


def test_damaged_records_are_named_shown_as_damaged_and_trained_again(tmp_path, capsys):
    path = sweep_file(tmp_path, *(f'RunConfig("toy", {{"seed": {s}, "train": train}}, "t{s}")' for s in range(6)))
    base = ["--results-dir", str(tmp_path)]
    assert cli(["run", str(path), "--executor", "debug", *base]) == 0
    runs = cli_module.load_sweep(path).runs
    folder = tmp_path / "ops"
    damage = {runs[0].run_id: '{"run_id": "x", "sta', runs[1].run_id: "[]", runs[2].run_id: "",
              runs[3].run_id: ("metrics", "loss", "high"), runs[4].run_id: ("status", None, "okay")}
    for rid, text in damage.items():
        if isinstance(text, tuple):  # a score that is not a number, a status no one writes
            rec = json.loads((folder / f"{rid}.json").read_text())
            part, key, value = text
            if key:
                rec[part][key] = value
            else:
                rec[part] = value
            text = json.dumps(rec)
        (folder / f"{rid}.json").write_text(text)
    capsys.readouterr()
    assert cli(["status", str(path), *base]) == 0
    out = capsys.readouterr().out
    assert out.count("damaged") >= 5 and "not valid JSON" in out and "a JSON list, not an object" in out
    assert "empty" in out and "metrics ['loss'] are not numbers" in out and "status 'okay' is not one of" in out
    assert "6 runs: 5 damaged, 1 ok" in out
    with pytest.warns(UserWarning, match=f"{runs[1].run_id}.json: damaged record"):
        assert len(load_records(folder)) == 1
    for verb in ("report", "plot", "export"):  # no crash; the damaged ones are left out, each named
        with pytest.warns(UserWarning, match=f"{runs[3].run_id}.json: damaged record"):
            assert cli([verb, str(path), *base]) == 0
    assert cli(["run", str(path), "--executor", "debug", *base]) == 0  # trained again
    assert len(load_records(folder)) == 6


def test_gpus_0_says_to_leave_the_flag_out_on_a_cpu_partition(capsys):
    with pytest.raises(SystemExit):
        cli(["run", "smoke", "--executor", "slurm", "--gpus", "0", "--dry-run"])
    assert "0 must be > 0; on a CPU partition leave --gpus out" in capsys.readouterr().err
