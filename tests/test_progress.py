"""Work is not lost and progress can be watched: time-based checkpoints (not part of a
run's identity), the progress.json heartbeat, and the plain log line of a job log."""
import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from sweeps.spec import make_run_id
from tasks.mqar.task import MQARConfig
from tasks.engine.progress import format_line, read_progress
from tasks.engine.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]


def _toy():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _batch(step):
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(step))
    return x, x.sum(-1, keepdim=True)


def _mse(model, batch):
    x, y = batch
    return (model(x) - y).pow(2).mean()


def _cfg(**kw):
    return TrainConfig(**{"steps": 30, "lr": 1e-2, "warmup_steps": 2, "eval_every": 10, "device": "cpu", **kw})


def test_time_based_checkpoint_without_signals(tmp_path):
    ckpt = tmp_path / "checkpoint.pt"
    saved = []

    def batch_fn(step):  # the checkpoint exists mid-run, not only at the end
        saved.append(ckpt.exists())
        return _batch(step)

    res = train(_toy(), _cfg(checkpoint_minutes=1e-5), batch_fn, _mse, checkpoint=ckpt, progress=False)
    assert res.status == "ok" and ckpt.exists() and any(saved[:-1])
    assert torch.load(ckpt, weights_only=False)["result"].steps >= 1


def test_no_cadence_writes_no_checkpoint(tmp_path):
    ckpt = tmp_path / "checkpoint.pt"
    train(_toy(), _cfg(checkpoint_minutes=0, checkpoint_every=0), _batch, _mse, checkpoint=ckpt, progress=False)
    assert not ckpt.exists()
    assert read_progress(tmp_path)["status"] == "done"  # the heartbeat is still there


def test_checkpointing_is_on_by_default_and_validated():
    assert TrainConfig().checkpoint_minutes > 0 and MQARConfig().train.checkpoint_minutes > 0
    for bad in ({"checkpoint_minutes": -1}, {"checkpoint_minutes": math.inf}, {"checkpoint_minutes": math.nan},
                {"log_every_s": 0}, {"log_every_s": math.nan}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TrainConfig(**bad)


def test_cadence_is_not_part_of_the_run_id():
    base = MQARConfig()
    cadenced = base.replace(train=base.train.replace(checkpoint_every=100, checkpoint_minutes=0.5, log_every_s=5.0))
    assert make_run_id("mqar", base) == make_run_id("mqar", cadenced)
    assert make_run_id("mqar", base) != make_run_id("mqar", base.replace(seed=1))
    # a record written before the new fields existed keeps its id
    old = ROOT / "results" / "reference" / "superseded" / "wikitext2_cpu" / "2a292bd5ff58.json"  # attention
    config = json.loads(old.read_text())["config"]
    assert make_run_id("wikitext2", config) == old.stem
    config["train"].update(checkpoint_every=7, checkpoint_minutes=5.0, log_every_s=30.0)
    assert make_run_id("wikitext2", config) == old.stem


def test_heartbeat_during_and_after_training(tmp_path):
    ckpt = tmp_path / "checkpoint.pt"
    seen = []

    def batch_fn(step):
        seen.append(read_progress(tmp_path))
        return _batch(step)

    def eval_fn(m):
        return {"loss": 1.0 / (1 + len(seen))}

    res = train(_toy(), _cfg(log_every_s=1e-9), batch_fn, _mse, eval_fn=eval_fn, checkpoint=ckpt,
                progress=False, tokens_per_step=64)
    beats = [p for p in seen if p is not None]
    assert len(beats) == len(seen) == 30  # written before the first step, then every beat
    assert all(p["status"] == "running" and p["pid"] > 0 for p in beats)
    steps = [p["step"] for p in beats]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 29
    mid = beats[-1]
    assert mid["steps"] == 30 and mid["tokens"] == 29 * 64 and mid["eta_s"] >= 0
    assert mid["steps_per_s"] > 0 and mid["tokens_per_s"] == pytest.approx(64 * mid["steps_per_s"])
    assert mid["metric"] == "loss" and mid["best"] is not None and mid["train_loss"] > 0
    final = read_progress(tmp_path)
    assert final["status"] == "done" and final["step"] == 30 and final["eta_s"] == 0
    assert final["best"] == pytest.approx(res.best) and final["elapsed_s"] > 0
    assert read_progress(tmp_path / "nowhere") is None
    (tmp_path / "progress.json").write_text("{torn")
    assert read_progress(tmp_path) is None


def test_diverged_and_failed_runs_say_so(tmp_path):
    def nan_loss(m, b):
        return _mse(m, b) * float("nan")

    train(_toy(), _cfg(), _batch, nan_loss, checkpoint=tmp_path / "checkpoint.pt", progress=False)
    assert read_progress(tmp_path)["status"] == "diverged"

    def broken(m, b):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        train(_toy(), _cfg(), _batch, broken, checkpoint=tmp_path / "checkpoint.pt", progress=False)
    assert read_progress(tmp_path)["status"] == "failed"


def test_log_lines_when_the_bar_is_off(capsys):
    train(_toy(), _cfg(log_every_s=1e-9), _batch, _mse, eval_fn=lambda m: {"accuracy": 0.5},
          metric="accuracy", higher_is_better=True, progress=False, tokens_per_step=1900)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 31  # one per beat, then the last
    assert re.fullmatch(r"\[train\] step 12/30 \(40%\) loss \S+ accuracy 0\.5 \S+ tok/s ETA \d+:\d\d:\d\d", lines[11])
    assert re.fullmatch(r"\[train\] done step 30/30 \(100%\) loss \S+ accuracy 0\.5 \S+ tok/s in \d+:\d\d:\d\d",
                        lines[-1])
    assert format_line({"step": 1200, "steps": 5000, "train_loss": 3.2141, "metric": "acc", "metric_value": 0.812,
                        "tokens_per_s": 1900.0, "eta_s": 1990.4}) == \
        "[train] step 1200/5000 (24%) loss 3.214 acc 0.812 1.9k tok/s ETA 0:33:10"
