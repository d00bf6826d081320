"""A mixer from outside the repository, named by its import path and never registered:
the shared harness checks it, parameter matching sizes it, and ``linbench run`` trains
and times it in child processes (submitit's local jobs, and the timing's own child),
exactly as a shipped mixer. Its package, tests/outside_mixers/, reaches those processes
through PYTHONPATH, as a user's package would (or by being installed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from test_toy_mixer import harness_cases, run_check
from sweeps import matched_models

OUTSIDE = "outside_mixers.shift:ShiftMix"
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def test_it_is_outside_the_zoo_and_resolved_by_its_path():
    assert OUTSIDE not in zoo.MIXERS and "shift_mix" not in zoo.MIXERS
    cls = zoo.mixer_class(OUTSIDE)
    assert cls.__module__ == "outside_mixers.shift" and cls.option_names == ("shift",)
    assert zoo.ModelConfig(mixer=OUTSIDE, mixer_options={"shift": 2}).mixer == OUTSIDE
    with pytest.raises(ValueError, match="unknown option.*'width'.*valid options: \\['shift'\\]"):
        zoo.ModelConfig(mixer=OUTSIDE, mixer_options={"width": 2})
    with pytest.raises(ValueError, match="cannot import it .*No module named 'outside_mixers.nope'"):
        zoo.ModelConfig(mixer="outside_mixers.nope:ShiftMix")
    with pytest.raises(ValueError, match="not a subclass of zoo.Mixer"):
        zoo.ModelConfig(mixer="outside_mixers.shift:F")  # a module attribute that is no mixer


@pytest.mark.parametrize("check, kwargs", list(harness_cases(OUTSIDE)))
def test_shared_harness(check, kwargs, request):
    run_check(check, kwargs, request)


def test_the_task_commands_take_its_import_path_for_mixer(capsys):
    from tasks.engine.cli import mixer_name
    from tasks.wikitext2 import main as wikitext2_main
    assert mixer_name(OUTSIDE) == OUTSIDE and mixer_name("gla") == "gla"
    with pytest.raises(SystemExit) as exit:  # refused before any data is read, in one line
        wikitext2_main(["--mixer", "outside_mixers.shift:Nope"])
    assert exit.value.code == 2 and "argument --mixer: " in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the import path passes: the next bad argument is the one named
        wikitext2_main(["--mixer", OUTSIDE, "--preset", "nope"])
    err = capsys.readouterr().err
    assert "argument --preset: " in err and "--mixer" not in err.splitlines()[-1]


def test_parameter_matching_resizes_it():
    base = zoo.ModelConfig(vocab_size=64, d_model=64, n_layers=2, mixer_options={"n_heads": 2})
    model = matched_models(base, {"shift": (OUTSIDE, {})}, knob="auto")["shift"]
    target = zoo.config_params(base, include_embeddings=False)
    assert model.mixer == OUTSIDE and abs(zoo.config_params(model, include_embeddings=False) / target - 1) <= 0.02


SWEEP = f'''"""Written by tests/test_outside_mixer.py: an outside mixer trained and timed."""
from sweeps import RunConfig
from tasks.benchmarks.scaling import ScalingConfig
from tasks.engine.train import TrainConfig
from tasks.mqar.task import MQARConfig
import zoo

model = zoo.ModelConfig(vocab_size=32, d_model=16, n_layers=1, max_len=16, d_ff=0, mixer="{OUTSIDE}",
                        positions="none")
configs = [
    RunConfig("mqar", MQARConfig(model=model, seq_len=16, num_kv_pairs=2, vocab_size=32, num_train_examples=16,
                                 num_test_examples=8, cache_dir=CACHE,
                                 train=TrainConfig(steps=2, batch_size=4, warmup_steps=1, eval_every=2,
                                                   device="cpu")), label="outside mqar"),
    # isolate=True (the default): each point is measured in a child of the job's process
    RunConfig("scaling", ScalingConfig(mixer="{OUTSIDE}", d_model=16, min_len=16, max_len=16, tokens=32,
                                       warmup=0, repeats=1, device="cpu"), label="outside scaling"),
]
'''


def test_linbench_run_trains_and_times_it_in_child_processes(tmp_path):
    sweep = tmp_path / "outside.py"
    sweep.write_text(f"CACHE = {str(tmp_path / 'cache')!r}\n" + SWEEP)
    results = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "sweeps.cli", "run", str(sweep), "--executor", "local",
                           "--parallel", "1", "--threads", "1", "--results-dir", str(results)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(p.read_text()) for p in (results / "outside").glob("*.json")]
    by_label = {r["label"]: r for r in records}
    assert set(by_label) == {"outside mqar", "outside scaling"}, proc.stdout + proc.stderr
    for rec in records:
        assert rec["status"] == "ok" and rec["provenance"]["executor"] == "local", rec.get("error")
    mqar = by_label["outside mqar"]
    assert mqar["config"]["model"]["mixer"] == OUTSIDE and mqar["metrics"]["steps"] == 2
    assert mqar["metrics"]["mixer_state_size"] == 16  # ShiftMix.state_size: shift * d_model
    points = by_label["outside scaling"]["metrics"]["points"]
    assert points and all(p["status"] == "ok" and p["backend"] == "torch" for p in points)
