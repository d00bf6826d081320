"""Sweeps: run ids, validation, the debug and local executors, records, skip and resume.

A tiny task defined here (``toy``: a one-layer zoo LM on random tokens, trained by the
shared loop with checkpoints) stands in for the real tasks; tests/test_slurm.py
imports it too. Jobs in other processes import this module by name, so the tests put
tests/ on PYTHONPATH.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import sweeps
import tasks
import zoo
from sweeps import RunConfig, SweepError, launch, load_sweep, make_run_id, matched_models, validate
from sweeps.cli import main as cli
from sweeps.spec import Sweep, canonical
from results.layout import workdir_for
from sweeps.jobs import _exclusive, execute
from sweeps.launch import may_start
from tasks.engine.losses import lm_loss
from tasks.engine.runs import model_metadata, run_fields
from tasks.engine.train import TrainConfig, train
from submitit.core.utils import UncompletedJobError
from zoo.config import StrictConfig

TESTS = Path(__file__).resolve().parent
FAILURES = {"error": RuntimeError("deliberate failure"), "oom": torch.cuda.OutOfMemoryError("out of memory"),
            "timeout": UncompletedJobError("timed-out too many times")}


@dataclass
class ToyConfig(StrictConfig):
    seed: int = 0
    model: zoo.ModelConfig = field(default_factory=lambda: zoo.ModelConfig(
        vocab_size=32, d_model=16, n_layers=1, max_len=16, mixer_options={"n_heads": 2}))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        steps=8, batch_size=4, lr=1e-2, warmup_steps=1, eval_every=4, checkpoint_every=2, device="cpu"))
    fail: str = ""  # "error", "oom" or "timeout": raise that before training; "diverge": NaN losses
    crash_at: int = -1  # raise at this step on the first attempt (a checkpoint exists by then)
    step_delay: float = 0.0  # seconds per step, so that a job can be requeued mid-run


def toy_run(cfg: ToyConfig, workdir: Path | None = None, progress: bool = True) -> dict:
    if cfg.fail in FAILURES:
        raise FAILURES[cfg.fail]
    model = zoo.build_model(cfg.model, seed=cfg.seed)
    data = torch.randint(0, cfg.model.vocab_size, (64, 9), generator=torch.Generator().manual_seed(cfg.seed))
    marker = Path(workdir) / "crashed" if workdir else None
    t_start = time.time()

    def batch_fn(step):
        if step == cfg.crash_at and marker is not None and not marker.exists():
            marker.touch()
            raise RuntimeError(f"crash at step {step}")
        time.sleep(cfg.step_delay)
        rows = data[(step * cfg.train.batch_size + torch.arange(cfg.train.batch_size)) % len(data)]
        return rows[:, :-1], rows[:, 1:]

    ckpt = Path(workdir) / "checkpoint.pt" if workdir else None
    loss_fn = (lambda m, b: lm_loss(m, b) * float("nan")) if cfg.fail == "diverge" else lm_loss
    res = train(model, cfg.train, batch_fn, loss_fn, checkpoint=ckpt, progress=progress, desc="toy")
    return {**run_fields(res, cfg.train, cfg.seed), "loss": res.final_loss, "pid": os.getpid(),
            "t_start": t_start, "t_end": time.time(), "threads": torch.get_num_threads(), **model_metadata(model, 8)}


@pytest.fixture(autouse=True)
def toy_task(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "toy", (ToyConfig, toy_run))
    # submitit jobs unpickle toy_run by reference: they must find this module
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))


def toy(label="", **fields) -> RunConfig:
    return RunConfig("toy", ToyConfig(**fields), label)


def sweep_of(*runs, name="t") -> Sweep:
    return Sweep(name, Path(f"{name}.py"), validate(list(runs)))


def records(results: Path, name="t") -> dict:
    return {p.stem: json.loads(p.read_text()) for p in (results / name).glob("*.json")}


# --- ids and validation ------------------------------------------------------------

def test_run_id_is_a_stable_hash_of_the_config():
    a = toy(seed=1)
    assert a.run_id == toy("another label", seed=1).run_id  # the label is not identity
    assert a.run_id == RunConfig("toy", a.config.to_dict()).typed().run_id  # dict == typed
    assert a.run_id != toy(seed=2).run_id
    assert len(a.run_id) == 12 and int(a.run_id, 16) >= 0
    assert make_run_id("x", {"b": (1, 2), "a": {"c": 1.5}}) == make_run_id("x", {"a": {"c": 1.5}, "b": [1, 2]})
    # where the files live on this machine is not part of a run's identity; hub vs local is
    from tasks.wikitext2 import WikiText2Config
    local = make_run_id("wikitext2", WikiText2Config(data_dir="/a/data", cache_dir="/a/cache"))
    assert local == make_run_id("wikitext2", WikiText2Config(data_dir="/elsewhere"))
    assert local != make_run_id("wikitext2", WikiText2Config(data_dir=None))
    # pinned: an accidental change of the hashing would orphan every existing record
    assert make_run_id("x", {"n": 1}) == "52e153cf111e"


def test_precision_auto_keeps_the_ids_of_runs_made_with_the_flag_it_replaced():
    from tasks.wikitext2 import WikiText2Config
    cfg = WikiText2Config()
    made_before = canonical(cfg)  # a record made before the field: the flag amp in its place
    train = made_before["train"]
    del train["precision"], train["strategy"], train["micro_batch_size"], train["checkpoint_minutes"]
    del train["log_every_s"], made_before["cache_dir"], made_before["extrapolate"]
    del made_before["model"]["hybrid"], made_before["model"]["init_std"]
    train["amp"] = True
    assert make_run_id("wikitext2", cfg) == make_run_id("wikitext2", made_before)
    bf16 = make_run_id("wikitext2", cfg.replace(train=cfg.train.replace(precision="bf16")))
    assert bf16 != make_run_id("wikitext2", cfg)
    # how the processes share a global batch, and how often a run checkpoints, are not its identity
    assert make_run_id("wikitext2", cfg.replace(train=cfg.train.replace(
        strategy="fsdp", micro_batch_size=2, checkpoint_every=50, checkpoint_minutes=1.0))) == make_run_id("wikitext2", cfg)
    assert make_run_id("wikitext2", cfg.replace(train=cfg.train.replace(precision="fp32"))) not in (
        bf16, make_run_id("wikitext2", cfg))


def _committed_runs():
    """(task, config, id) of every run of a shipped sweep that has a committed record."""
    reference = Path(__file__).resolve().parent.parent / "results" / "reference"
    for path in sorted((Path(__file__).resolve().parent.parent / "sweeps" / "shipped").glob("*.py")):
        folder = reference / path.stem
        if not folder.is_dir():
            continue
        for run in load_sweep(path.stem).runs:
            record = folder / f"{run.run_id}.json"
            if record.is_file():
                yield run.task, json.loads(record.read_text())["config"], run.run_id


def test_a_committed_record_hashes_to_its_run_id_and_a_new_field_moves_none(monkeypatch, tmp_path):
    """Identity rules live on the fields (zoo.config's NOT_IN_ID, WHEN_SET, id_as): every
    committed record's config hashes to its file's id, and a field added with WHEN_SET
    moves none of them; added without it, it moves every one of its task."""
    import dataclasses as dc

    from zoo.config import WHEN_SET
    monkeypatch.setenv("LINBENCH_DATA", str(tmp_path))  # any folder: an id records local data, not where
    runs = list(_committed_runs())
    assert len(runs) > 400 and {t for t, _, _ in runs} >= {"wikitext2", "mqar", "mad", "decode"}
    for task, config, run_id in runs:
        assert make_run_id(task, config) == run_id, (task, run_id)
    for task in ("wikitext2", "mqar"):
        cls, fn = tasks.TASKS[task]
        later = dc.make_dataclass(cls.__name__, [("added_later", int, dc.field(default=3, metadata=WHEN_SET))],
                                  bases=(cls,))
        plain = dc.make_dataclass(cls.__name__, [("added_later", int, dc.field(default=3))], bases=(cls,))
        mine = [(config, run_id) for t, config, run_id in runs if t == task]
        monkeypatch.setitem(tasks.TASKS, task, (later, fn))
        assert all(make_run_id(task, config) == run_id for config, run_id in mine)
        assert make_run_id(task, {**mine[0][0], "added_later": 4}) != mine[0][1]  # set, it counts
        monkeypatch.setitem(tasks.TASKS, task, (plain, fn))
        assert not any(make_run_id(task, config) == run_id for config, run_id in mine)


def test_a_mixers_revision_is_part_of_the_run_id(monkeypatch):
    """A revised mixer computes something else for the same config, so its runs get new
    ids and no record of the earlier revision is taken for them; configs of unrevised
    mixers keep their ids (records committed before revisions existed)."""
    from sweeps.spec import mixer_revisions
    from zoo.mixers.grassmann import Grassmann

    reference = Path(__file__).resolve().parent.parent / "results" / "reference"
    kept = json.loads((reference / "superseded" / "wikitext2_cpu" / "2a292bd5ff58.json").read_text())
    assert kept["config"]["model"]["mixer"] == "attention" and "hybrid" not in kept["config"]["model"]
    assert make_run_id("wikitext2", kept["config"]) == "2a292bd5ff58"
    assert mixer_revisions(kept["config"]) == {}
    old = json.loads((reference / "superseded" / "wikitext2_6L_cpu" / "1e7a5726f394.json").read_text())
    assert old["config"]["model"]["mixer"] == "grassmann" and Grassmann.revision == 2
    assert mixer_revisions(old["config"]) == {"grassmann": 2}
    assert make_run_id("wikitext2", old["config"]) != "1e7a5726f394"
    hybrid = {"model": {"mixer": "attention", "hybrid": {"mixer": "grassmann", "every": 2}}}
    assert mixer_revisions(hybrid) == {"grassmann": 2}
    monkeypatch.setattr(Grassmann, "revision", 1)
    assert make_run_id("wikitext2", old["config"]) == "1e7a5726f394"


def test_validation_names_every_bad_config_with_its_field_and_choices():
    bad = [toy(seed=0),
           RunConfig("nope", {}),
           RunConfig("toy", {"seed": 1, "model": {"mixer": "transformerr"}}, "typo"),
           RunConfig("toy", {"sed": 3}),
           RunConfig("toy", {"model": {"d_model": 18, "mixer_options": {"n_heads": 4}}}, "heads"),
           toy(seed=0)]
    with pytest.raises(SweepError) as err:
        validate(bad)
    msg = str(err.value)
    assert "5 invalid" in msg
    assert "config #1" in msg and "task='nope'" in msg and "toy" in msg
    assert "config #2 (typo)" in msg and "mixer='transformerr'" in msg and "'attention'" in msg
    assert "config #3" in msg and "'sed'" in msg and "valid fields" in msg
    assert "config #4 (heads)" in msg  # built on the meta device: 18 is not divisible by 4 heads
    assert "config #5" in msg and "same config as config #0" in msg


def test_load_sweep_by_path_and_by_name(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from sweeps import RunConfig\nconfigs = [RunConfig('toy', {'seed': s}) for s in range(3)]\n")
    sweep = load_sweep(str(path))
    assert sweep.name == "mine" and len(sweep) == 3
    assert all(type(r.config).__name__ == "ToyConfig" for r in sweep.runs)
    path.write_text("from sweeps import RunConfig\nconfigs = [RunConfig('toy', {'seed': 'x', 'lr': 1})]\n")
    with pytest.raises(SweepError, match="'lr'"):
        load_sweep(path)
    with pytest.raises(SweepError, match="shipped sweeps") as err:
        load_sweep("no_such_sweep")
    files = sorted(f.stem for f in (Path(sweeps.__file__).parent / "shipped").iterdir())
    assert f"shipped sweeps: {files}" in str(err.value)  # exactly the sweep files, no machinery
    assert "cli" not in files and "mqar_cpu" in files
    assert cli(["run", str(path), "--dry-run"]) == 2  # the CLI names the problem and exits 2


def test_matched_models_are_within_tolerance():
    base = zoo.ModelConfig(vocab_size=64, d_model=64, n_layers=2, mixer_options={"n_heads": 2})
    models = matched_models(base, {"attn": ("attention", {"n_heads": 2}), "swa": ("sliding_window", {"window": 8})},
                            tol=0.05)
    assert models["attn"] is base
    n0 = zoo.config_params(base, include_embeddings=False)
    assert abs(zoo.config_params(models["swa"], include_embeddings=False) - n0) <= 0.05 * n0


# --- executors, records, skip and resume ------------------------------------------------

def test_debug_run_records_then_a_second_run_skips_ok_and_redoes_the_rest(tmp_path):
    sweep = sweep_of(toy("a", seed=0), toy("b", seed=1), toy("bad", fail="error"),
                     *(toy(kind, fail=kind) for kind in ("oom", "timeout", "diverge")))
    summary = launch(sweep, tmp_path, "debug", log=lambda *_: None)
    assert summary["submitted"] == 6
    assert summary["statuses"] == {"ok": 2, "failed": 1, "oom": 1, "timeout": 1, "diverged": 1}
    recs = records(tmp_path)
    assert set(recs) == {r.run_id for r in sweep.runs}
    bad = recs[sweep.runs[2].run_id]
    assert bad["status"] == "failed" and "deliberate failure" in bad["error"] and "Traceback" in bad["error"]
    ok = recs[sweep.runs[0].run_id]
    assert ok["config"] == json.loads(json.dumps(sweep.runs[0].config.to_dict()))
    assert ok["label"] == "a" and ok["metrics"]["steps"] == 8 and ok["resumed"] is False
    prov = ok["provenance"]
    for key in ("git_commit", "packages", "host", "device", "dtype", "backends", "wall_time", "started"):
        assert key in prov, key
    assert prov["packages"]["torch"] and prov["git_commit"]
    assert not (tmp_path / "t" / "runs" / ok["run_id"] / "checkpoint.pt").exists()  # done: removed
    mtime = (tmp_path / "t" / f"{ok['run_id']}.json").stat().st_mtime_ns
    assert "out of memory" in recs[sweep.runs[3].run_id]["error"]
    again = launch(sweep, tmp_path, "debug", log=lambda *_: None)
    # the failed, oom and timeout runs again; ok and diverged are final
    assert again["submitted"] == 3 and again["skipped"] == 3
    assert (tmp_path / "t" / f"{ok['run_id']}.json").stat().st_mtime_ns == mtime  # untouched
    diverged = launch(sweep, tmp_path, "debug", log=lambda *_: None, final=("ok",))
    assert diverged["submitted"] == 4 and diverged["statuses"]["diverged"] == 1


def test_a_crashed_run_resumes_from_its_checkpoint_and_ends_where_an_unbroken_one_does(tmp_path):
    broken, clean = toy("broken", crash_at=5), toy("clean")
    sweep = sweep_of(broken, clean)
    assert launch(sweep, tmp_path, "debug", log=lambda *_: None)["statuses"] == {"failed": 1, "ok": 1}
    assert (tmp_path / "t" / "runs" / broken.run_id / "checkpoint.pt").exists()  # saved at step 4
    assert launch(sweep, tmp_path, "debug", log=lambda *_: None)["statuses"] == {"ok": 1}
    recs = records(tmp_path)
    rec = recs[broken.run_id]
    assert rec["status"] == "ok" and rec["resumed"] is True and rec["attempts"] == 2
    assert rec["metrics"]["resumed_from"] == 4
    assert rec["metrics"]["loss"] == pytest.approx(recs[clean.run_id]["metrics"]["loss"], rel=1e-6)


def test_local_scheduling_keeps_parallel_and_alone():
    a, b, timing = toy(seed=1), toy(seed=2), RunConfig("toy", ToyConfig(seed=3), exclusive=True)
    assert may_start(a, [], 1) and not may_start(a, [b], 1)
    assert may_start(a, [b], 2) and not may_start(a, [b, b], 2)
    assert may_start(timing, [], 2) and not may_start(timing, [a], 2) and not may_start(a, [timing], 4)


def test_local_executor_runs_jobs_in_subprocesses_and_a_timing_run_alone(tmp_path):
    sweep = sweep_of(toy(seed=0, step_delay=0.1), RunConfig("toy", ToyConfig(seed=1, step_delay=0.1), exclusive=True))
    summary = launch(sweep, tmp_path, "local", parallel=2, log=lambda *_: None)
    assert summary["statuses"] == {"ok": 2}
    spans = sorted((r["metrics"]["t_start"], r["metrics"]["t_end"]) for r in records(tmp_path).values())
    assert len({r["metrics"]["pid"] for r in records(tmp_path).values()} | {os.getpid()}) == 3
    assert spans[0][1] <= spans[1][0]  # the second started after the first ended
    cores = os.cpu_count() or 1
    threads = {r["run_id"]: r["metrics"]["threads"] for r in records(tmp_path).values()}
    assert threads == {sweep.runs[0].run_id: max(1, cores // 2), sweep.runs[1].run_id: cores}
    assert all(r["provenance"]["executor"] == "local" for r in records(tmp_path).values())


def test_local_executor_trains_one_run_on_two_processes_to_one_record(tmp_path):
    # --tasks-per-node 2: one run, two processes (DDP over gloo), rank 0 writes the record;
    # it ends where one process ends (the same global batch, dropout 0)
    sweep = sweep_of(toy(seed=4))
    alone = launch(sweep, tmp_path / "one", "debug", log=lambda *_: None)
    two = launch(sweep, tmp_path / "two", "local", slurm={"tasks_per_node": 2}, log=lambda *_: None)
    assert alone["statuses"] == two["statuses"] == {"ok": 1}
    (one,), (rec,) = records(tmp_path / "one").values(), records(tmp_path / "two").values()
    assert one["run_id"] == rec["run_id"]  # how the processes share the batch is not identity
    assert (rec["metrics"]["world_size"], rec["metrics"]["strategy"], rec["metrics"]["micro_batch_size"]) == (2, "ddp", 2)
    assert (one["metrics"]["world_size"], one["metrics"]["strategy"]) == (1, None)
    assert rec["metrics"]["loss"] == pytest.approx(one["metrics"]["loss"], rel=1e-5)
    assert rec["attempts"] == 1 and not (workdir_for(tmp_path / "two", "t", rec["run_id"]) / "checkpoint.pt").exists()


def test_cli_run_status_and_dry_run(tmp_path, capsys):
    path = tmp_path / "cli.py"
    path.write_text("from sweeps import RunConfig\n"
                    "configs = [RunConfig('toy', {'seed': 0}, 'fine'), RunConfig('toy', {'fail': 'error'}, 'bad')]\n")
    res = str(tmp_path / "res")
    assert cli(["run", str(path), "--executor", "debug", "--results-dir", res]) == 1  # one failed
    capsys.readouterr()
    assert cli(["status", str(path), "--results-dir", res, "--all-ok"]) == 1
    out = capsys.readouterr().out
    assert "1 ok" in out and "1 failed" in out and "deliberate failure" in out
    assert cli(["run", str(path), "--dry-run", "--results-dir", res]) == 0
    out = capsys.readouterr().out
    assert "ok" in out and "failed" in out and "2 configs valid" in out


def test_a_run_already_running_elsewhere_is_left_alone(tmp_path):
    run = toy(seed=5)
    workdir = workdir_for(tmp_path, "t", run.run_id)
    workdir.mkdir(parents=True)
    with _exclusive(workdir) as mine:  # as another process training this run would
        assert mine
        assert execute(run, "t", tmp_path, toy_run) == "busy"
    assert not records(tmp_path)
    assert execute(run, "t", tmp_path, toy_run) == "ok"


SLOW_TO_LOAD = {"wikitext2_paper"}  # matches parameters of 10 paper-size models at load: ~20 s on 2 cores


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW_TO_LOAD else [])
                                  for n in sweeps.shipped_sweeps()])
def test_shipped_sweeps_validate(name):
    sweep = load_sweep(name)
    assert len(sweep) and all(run.task in tasks.TASKS for run in sweep.runs)
    assert len({run.run_id for run in sweep.runs}) == len(sweep)


@pytest.mark.parametrize("name", ["scaling", "decode", "mad", "smoke"])
def test_exploratory_sweeps_run_every_registered_mixer(name):
    # a mixer added to the registry joins these, or the test names what they miss; the
    # reference sweeps name their own (tests/test_registering.py)
    ran = {getattr(run.config, "mixer", None) or run.config.model.mixer for run in load_sweep(name).runs}
    assert not set(zoo.MIXERS) - ran, f"{name} leaves out {sorted(set(zoo.MIXERS) - ran)}"


def test_output_into_a_closed_pipe_ends_quietly(tmp_path, capsys, monkeypatch):
    # `linbench status smoke | head`: head leaves, the next write fails with EPIPE; the
    # command ends with 141 (a shell's SIGPIPE status) and no traceback
    read_end, write_end = os.pipe()
    os.close(read_end)
    closed = os.fdopen(write_end, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", closed)
    try:
        rc = cli(["status", "smoke", "--results-dir", str(tmp_path)])
    finally:
        monkeypatch.undo()
    assert rc == 141
    closed.write("x\n")  # stdout now goes to /dev/null: a last flush cannot fail
    closed.close()


def test_status_from_another_directory_finds_the_records(tmp_path, capsys, monkeypatch):
    # the results folder is looked for beside the sweep file when none is given
    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    path = home / "here.py"
    path.write_text("from sweeps import RunConfig\nconfigs = [RunConfig('toy', {'seed': 0}, 'one')]\n")
    monkeypatch.chdir(home)
    assert cli(["run", str(path), "--executor", "debug"]) == 0
    capsys.readouterr()
    monkeypatch.chdir(elsewhere)
    assert cli(["status", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 runs: 1 ok" in out and f"records in {home / 'results' / 'here'}" in out
    assert cli(["status", str(path), "--results-dir", str(elsewhere / "results"), "--all-ok"]) == 1  # as named
    assert "1 not run" in capsys.readouterr().out


# --- what `run` refuses before it sends anything, and what a Slurm dry run shows -----

CORPUS_MODEL = {"vocab_size": 64, "d_model": 16, "n_layers": 1, "d_ff": 32, "max_len": 16,
                "mixer_options": {"n_heads": 2}}


def corpus_sweep(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "corp.py"
    configs = {"seq_len": 16, "model": CORPUS_MODEL, **fields}
    path.write_text("from sweeps import RunConfig\n"
                    f"configs = [RunConfig('corpus', {{**{configs!r}, 'seed': s}}, 'lm') for s in range(3)]\n")
    return path


def refused(capsys, argv: list[str]) -> str:
    """The one line ``linbench`` ends ``argv`` with (exit 2)."""
    assert cli(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("linbench: ") and "Traceback" not in captured.err, captured.err
    assert "configs valid" not in captured.out  # nothing listed as if it could run
    return lines[0]


def test_a_corpus_source_that_is_not_there_is_refused_before_anything_is_made(tmp_path, capsys):
    res = tmp_path / "res"
    path = corpus_sweep(tmp_path, source=str(tmp_path / "nowhere" / "*.jsonl"))
    for extra in (["--dry-run"], ["--executor", "debug"], ["--executor", "local"]):
        line = refused(capsys, ["run", str(path), "--results-dir", str(res), *extra])
        assert line == (f"linbench: corp: CorpusConfig: source='{tmp_path / 'nowhere' / '*.jsonl'}': no "
                        ".txt/.jsonl/.parquet file there; give a local file, folder or glob, or "
                        "hf:NAME[:CONFIG][@SPLIT] (runs: lm)")
        assert not res.exists()
    # valid and test sources, and a tokenizer file, are looked for too
    (tmp_path / "docs.txt").write_text("one document\nanother\n")
    path = corpus_sweep(tmp_path, source=str(tmp_path / "docs.txt"), test_source=str(tmp_path / "gone.txt"))
    assert "CorpusConfig: test_source=" in refused(capsys, ["run", str(path), "--dry-run"])
    path = corpus_sweep(tmp_path, source=str(tmp_path / "docs.txt"), tokenizer=str(tmp_path / "tok.json"))
    assert f"tokenizer='{tmp_path / 'tok.json'}' is not valid: 'wordpiece', 'hub:NAME'" \
        in refused(capsys, ["run", str(path), "--dry-run"])
    # `status` reads the sweep all the same: the data may have moved since its runs ran
    assert cli(["status", str(path), "--results-dir", str(res)]) == 0
    assert "3 not run" in capsys.readouterr().out and not res.exists()


def test_a_corpus_column_the_files_lack_is_refused_reading_one_record(tmp_path, capsys):
    res = tmp_path / "res"
    folder = tmp_path / "texts"
    folder.mkdir()
    # the second line is no JSON: the check reads the first record only
    (folder / "a.jsonl").write_text(json.dumps({"body": "a document", "id": 1}) + "\n{cut off\n")
    path = corpus_sweep(tmp_path, source=str(folder))
    line = refused(capsys, ["run", str(path), "--results-dir", str(res), "--executor", "debug"])
    assert line == (f"linbench: corp: CorpusConfig: text_field='text' is not a column of {folder / 'a.jsonl'} "
                    "(source); it has ['body', 'id'] (runs: lm)")
    assert not res.exists()
    path = corpus_sweep(tmp_path, source=str(folder), text_field="body")
    assert cli(["run", str(path), "--results-dir", str(res), "--dry-run"]) == 0
    assert "3 configs valid" in capsys.readouterr().out and not res.exists()
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"content": ["x", "y"]}), folder / "b.parquet")
    line = refused(capsys, ["run", str(path), "--results-dir", str(res), "--dry-run"])
    assert line.endswith(f"text_field='body' is not a column of {folder / 'b.parquet'} (source); "
                         "it has ['content'] (runs: lm)")


def test_log_with_a_tracker_that_does_not_import_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    import importlib.machinery
    path = tmp_path / "logged.py"
    path.write_text("from sweeps import RunConfig\nconfigs = [RunConfig('toy', {'seed': 0}, 'one')]\n")
    res = tmp_path / "res"
    monkeypatch.setitem(sys.modules, "wandb", None)  # find_spec answers None: not importable
    monkeypatch.setitem(sys.modules, "tensorboard", sys.modules.get("tensorboard") or
                        type(sys)("tensorboard"))
    sys.modules["tensorboard"].__spec__ = sys.modules["tensorboard"].__spec__ or \
        importlib.machinery.ModuleSpec("tensorboard", None)
    for extra in (["--dry-run"], ["--executor", "debug"]):
        line = refused(capsys, ["run", str(path), "--results-dir", str(res), "--log", "wandb", *extra])
        assert line == ("linbench: --log wandb needs the `wandb` package, which does not import here: "
                        "pip install wandb, or use --log tensorboard, or leave --log out")
        assert not res.exists()
    assert cli(["run", str(path), "--results-dir", str(res), "--log", "tensorboard", "--dry-run"]) == 0
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    line = refused(capsys, ["run", str(path), "--results-dir", str(res), "--log", "tensorboard", "--dry-run"])
    assert line.endswith("pip install tensorboard, or leave --log out") and not res.exists()


def fake_command(folder: Path, name: str, script: str) -> Path:
    """An executable ``name`` in ``folder`` that runs ``script`` (sh), its arguments
    appended to ``folder/name.calls``."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f'#!/bin/sh\necho "$@" >> "{folder / name}.calls"\n{script}\n')
    path.chmod(0o755)
    return path


SINFO = """case "$*" in
  *"-p gpu"*) echo 'gpu|gpu:a100:4(S:0-1),shard:8'; echo 'gpu|(null)' ;;
  *"-p cpu"*) echo 'cpu*|(null)' ;;
  *"-p broken"*) echo 'sinfo: error: something' >&2; exit 1 ;;
  *"-p"*) ;;
  *) echo 'cpu*|(null)'; echo 'gpu|gpu:a100:4(S:0-1)' ;;
esac"""


def test_gpus_on_a_partition_without_gpus_is_refused_from_sinfo(tmp_path, capsys, monkeypatch):
    path = tmp_path / "gpu.py"
    path.write_text("from sweeps import RunConfig\nconfigs = [RunConfig('toy', {'seed': 0}, 'one')]\n")
    res, bin_ = tmp_path / "res", tmp_path / "bin"
    fake_command(bin_, "sinfo", SINFO)
    fake_command(bin_, "sbatch", "exit 1")
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    base = ["run", str(path), "--executor", "slurm", "--results-dir", str(res), "--gpus", "1"]
    for extra, name in (([], "cpu (the default)"), (["--partition", "cpu"], "cpu")):
        for dry in ([], ["--dry-run"]):
            line = refused(capsys, [*base, *extra, *dry])
            assert line == (f"linbench: partition {name} has no GPUs (sinfo Gres: (null)); "
                            "leave --gpus out on a CPU partition")
    assert not (bin_ / "sbatch.calls").exists() and not res.exists()  # nothing was submitted
    assert (bin_ / "sinfo.calls").read_text().splitlines()[:2] == ["-h -o %P|%G", "-h -o %P|%G"]
    # a partition with GPUs on some nodes, one sinfo does not know, or a failing sinfo: sbatch decides
    for partition in ("gpu", "nowhere", "broken"):
        assert cli([*base, "--partition", partition, "--dry-run"]) == 0, capsys.readouterr().err
        assert "GPUs per node    1" in capsys.readouterr().out
    assert (bin_ / "sinfo.calls").read_text().splitlines()[-1] == "-h -p broken -o %P|%G"
    # without --gpus, sinfo is not asked
    calls = (bin_ / "sinfo.calls").read_text()
    assert cli([*base[:-2], "--dry-run"]) == 0 and (bin_ / "sinfo.calls").read_text() == calls
    # and without sinfo on PATH nothing more is checked
    (bin_ / "sinfo").unlink()
    monkeypatch.setenv("PATH", str(bin_))
    assert cli([*base, "--dry-run"]) == 0
    assert not res.exists()


def test_a_refused_sbatch_leaves_no_folder_behind(tmp_path, capfd, monkeypatch):
    path = tmp_path / "refused.py"
    path.write_text("from sweeps import RunConfig\n"
                    "configs = [RunConfig('toy', {'seed': s}, f'r{s}') for s in range(2)]\n")
    bin_ = tmp_path / "bin"
    fake_command(bin_, "sbatch", "echo 'sbatch: error: invalid partition specified: nowhere' >&2\n"
                                 "echo 'sbatch: error: Batch job submission failed: Invalid partition name "
                                 "specified' >&2\nexit 1")
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    res = tmp_path / "fresh" / "res"  # neither it nor its parent exists yet
    argv = ["run", str(path), "--executor", "slurm", "--partition", "nowhere", "--results-dir", str(res)]
    line = refused(capfd, argv)
    assert line == ("linbench: sbatch refused the submission: sbatch: error: invalid partition specified: "
                    "nowhere; sbatch: error: Batch job submission failed: Invalid partition name specified")
    assert (bin_ / "sbatch.calls").exists()  # it was asked, and said no
    assert not (tmp_path / "fresh").exists()
    # a results folder that was there stays, with what it held; only what this call made goes
    (res / "refused").mkdir(parents=True)
    (res / "refused" / "notes.txt").write_text("mine")
    refused(capfd, argv)
    assert sorted(p.name for p in res.rglob("*")) == ["notes.txt", "refused"]


def test_a_slurm_dry_run_shows_each_jobs_resources_as_sbatch_reads_them(tmp_path, capsys, monkeypatch):
    path = tmp_path / "res_sweep.py"
    path.write_text("from sweeps import RunConfig\n"
                    "configs = [RunConfig('toy', {'seed': s}, f'r{s}') for s in range(4)]\n"
                    "configs.append(RunConfig('toy', {'seed': 9}, 'timing', exclusive=True))\n")
    res = tmp_path / "res"
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no sinfo, no sbatch: a dry run needs neither
    assert cli(["run", str(path), "--results-dir", str(res), "--executor", "debug", "--only", "r0"]) == 0
    capsys.readouterr()
    base = ["run", str(path), "--results-dir", str(res), "--dry-run"]
    assert cli(base) == 0
    plain = capsys.readouterr().out.splitlines()
    assert len(plain) == 6 and plain[-1] == "5 configs valid"  # without --executor slurm: as it was
    assert cli([*base, "--executor", "slurm"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:6] == plain
    assert out[6:] == ["Slurm: 4 run(s) to submit; each job as sbatch reads it:",
                       "  time limit       0-02:00:00",
                       "  signal           USR1 300 s before the time limit (checkpoint and requeue)",
                       "  partition        the cluster's default",
                       "  GPUs per node    none",
                       "  nodes            1",
                       "  tasks per node   1",
                       "  cpus per task    1",
                       "  memory per node  the partition's default",
                       "  submitted as     an array of 3 jobs, at most 3 at once",
                       "  timing runs      1 job, each with a node to itself (--exclusive)"]
    assert cli([*base, "--executor", "slurm", "--time", "1-2:30:05", "--partition", "p", "--gpus", "2",
                "--nodes", "2", "--tasks-per-node", "2", "--cpus-per-task", "4", "--mem-gb", "1.5",
                "--array-parallelism", "2", "--account", "acc", "--qos", "high", "--constraint", "a100",
                "--signal-lead", "60", "--slurm-arg", "exclude=node3", "--only", "r1", "--only", "r2",
                "--only", "r3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[4:] == ["Slurm: 3 run(s) to submit; each job as sbatch reads it:",
                       "  time limit       1-02:31:00",
                       "  signal           USR1 60 s before the time limit (checkpoint and requeue)",
                       "  partition        p",
                       "  GPUs per node    2",
                       "  nodes            2",
                       "  tasks per node   2",
                       "  cpus per task    4",
                       "  memory per node  1536M",
                       "  account          acc",
                       "  qos              high",
                       "  constraint       a100",
                       "  --exclude        node3",
                       "  submitted as     an array of 3 jobs, at most 2 at once"]
    assert not (res / "res_sweep" / "submitit").exists()
