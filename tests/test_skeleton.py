"""The skeleton every task shares (tasks.engine) and the generic task CLI (python -m tasks)."""
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zoo
from tasks.__main__ import main as task_cli
from tasks.engine.batches import epoch_indices
from tasks.engine.runs import checkpoint_path, refuse_non_causal, run_fields, score_best
from tasks.engine.train import TrainConfig, TrainResult

ROOT = Path(__file__).resolve().parents[1]


def test_epoch_indices_depend_on_the_seed_and_nothing_else():
    a, b = epoch_indices(50, 7, seed=1), epoch_indices(50, 7, seed=2)
    torch.manual_seed(0)
    first = a(3)
    torch.manual_seed(99)  # torch's global generator plays no part
    assert torch.equal(first, epoch_indices(50, 7, seed=1)(3))
    assert not torch.equal(first, b(3))


def test_a_non_causal_model_is_refused_naming_the_task():
    leaky = zoo.build_model(zoo.ModelConfig(vocab_size=16, d_model=16, n_layers=1, max_len=16, mixer="grassmann",
                                            mixer_options={"r": 4, "offsets": (1,), "pairing": "future"}))
    with pytest.raises(ValueError, match="^mad: refusing to train a non-causal model: mixer 'grassmann'"):
        refuse_non_causal(leaky, "mad")
    refuse_non_causal(zoo.build_model(zoo.ModelConfig(vocab_size=16, d_model=16, n_layers=1, max_len=16)), "mad")


def test_score_best_uses_the_best_weights_or_reports_none(tmp_path):
    model = torch.nn.Linear(2, 1)
    best = {k: torch.full_like(v, 3.0) for k, v in model.state_dict().items()}
    tcfg = TrainConfig(device="cpu")
    done = TrainResult(status="ok", steps=5, final_loss=0.1, best=0.5, best_state=best)
    assert score_best(model, done, tcfg, lambda m: m.weight.sum().item()) == 6.0
    assert not model.training  # scored in eval mode
    diverged = TrainResult(status="diverged", steps=1, final_loss=float("nan"), best=None)
    assert score_best(model, diverged, tcfg, lambda m: 1 / 0) is None  # nothing evaluated: no score
    fields = run_fields(done, tcfg, seed=4)
    assert fields["seed"] == 4 and fields["status"] == "ok" and fields["steps"] == 5 and fields["device"] == "cpu"
    assert checkpoint_path(None) is None and checkpoint_path(tmp_path / "w") == tmp_path / "w" / "checkpoint.pt"
    assert (tmp_path / "w").is_dir()


def test_any_task_runs_from_the_generic_cli(tmp_path, capsys):
    out = tmp_path / "record.json"
    sets = ["train.steps=4", "train.eval_every=2", "num_train_examples=64", "num_test_examples=16",
            f"cache_dir={tmp_path}"]
    task_cli(["mqar", "--device", "cpu", "--out", str(out), *[a for s in sets for a in ("--set", s)]])
    record = json.loads(out.read_text())
    assert record["task"] == "mqar" and record["steps"] == 4 and record["device"] == "cpu"
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 4
    with pytest.raises(SystemExit):  # one line naming the field and the valid ones, not a traceback
        task_cli(["mqar", "--set", "train.stepz=3"])
    err = capsys.readouterr().err
    assert re.search(r"unknown field.*'stepz'.*valid fields.*'steps'", err) and "Traceback" not in err


def test_the_tools_run_under_linbench_as_under_python_m(tmp_path, capsys):
    """One command surface: each single-run tool is a linbench verb that hands its words,
    options included, to the module's own command line."""
    from sweeps.cli import main as linbench
    from sweeps.tools import TOOLS
    assert linbench(["mixers", "--d-model", "32"]) == 0
    assert "| gla |" in capsys.readouterr().out
    out = tmp_path / "record.json"
    linbench(["task", "mqar", "--device", "cpu", "--out", str(out), "--set", "train.steps=2",
              "--set", "num_train_examples=32", "--set", "num_test_examples=8", "--set", f"cache_dir={tmp_path}"])
    assert json.loads(out.read_text())["steps"] == 2
    assert linbench(["bench"]) == 2 and "name one of scaling, decode" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # the tool's own help, which exits 0
        linbench(["bench", "decode", "--help"])
    help_text = capsys.readouterr().out
    assert "--new-tokens" in help_text and help_text.startswith("usage: linbench bench decode ")
    for tools in TOOLS.values():  # every module named is a command line
        for module, _ in tools.values():
            assert callable(importlib.import_module(module).main)


@pytest.mark.parametrize("module", ["tasks", "tasks.snli", "tasks.mqar", "tasks.benchmarks.step_forms", "zoo"])
def test_a_python_m_tool_names_itself_in_its_usage_line(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.startswith(f"usage: python -m {module} "), out.stdout[:200]
    if module == "tasks":  # the tasks with their own command line are named there
        assert "python -m tasks.snli" in out.stdout and "linbench task wikitext2-paper" in out.stdout
