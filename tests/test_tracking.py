"""Live curves (tasks.engine.tracking): `--log tensorboard` writes each run's loss, learning
rate, tokens/s, validation metrics, backends and config while it trains, under the run's id,
and a resumed run goes on with the same curve. Nothing is written without the flag."""
from __future__ import annotations

import pytest

from sweeps.launch import launch
from test_sweeps import records, sweep_of, toy, toy_task  # noqa: F401  (the autouse fixture registers the toy)

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _curves(folder):
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_curves_of_a_run_and_its_resumption(tmp_path):
    run = toy(seed=11, crash_at=5)  # the first attempt fails drawing batch 5, after the checkpoint of step 4
    sweep = sweep_of(run)
    first = launch(sweep, tmp_path, "debug", slurm={"log": "tensorboard"}, log=lambda *_: None)
    assert first["statuses"] == {"failed": 1}
    second = launch(sweep, tmp_path, "debug", slurm={"log": "tensorboard"}, log=lambda *_: None)
    assert second["statuses"] == {"ok": 1}
    folder = tmp_path / "t" / "logs" / "tensorboard" / run.run_id
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2  # one per attempt, one curve
    acc = _curves(folder)
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/tokens_per_s", "eval/train_loss"} <= tags
    points = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    # the first attempt logged steps 1-5 and checkpointed at 4; the second goes on from 4,
    # so step 5 is drawn twice, with the same loss (the resume is exact)
    assert [s for s, _ in points] == [1, 2, 3, 4, 5, 5, 6, 7, 8]
    assert points[4][1] == points[5][1]
    (rec,) = records(tmp_path).values()
    assert [e.value for e in acc.Scalars("train/loss")][-1] == pytest.approx(rec["metrics"]["loss"])
    assert [e.step for e in acc.Scalars("eval/train_loss")] == [4, 8]
    texts = set(acc.Tags()["tensors"])
    assert any(t.startswith("config") for t in texts) and any(t.startswith("backends") for t in texts)


def test_without_the_flag_nothing_is_logged(tmp_path):
    launch(sweep_of(toy(seed=12)), tmp_path, "debug", log=lambda *_: None)
    assert not (tmp_path / "t" / "logs").exists()


def test_an_unknown_tracker_is_refused():
    from tasks.engine.tracking import session
    with pytest.raises(ValueError, match=r"log='mlflow' is not valid; choose one of \['tensorboard', 'wandb'\]"):
        with session("mlflow", "x", "/tmp", {}):
            pass
