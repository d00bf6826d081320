"""Live curves, optional: a run's loss, learning rate, tokens/s, validation metrics and
backends sent to TensorBoard or Weights & Biases while it trains.

Nothing here is a dependency: ``linbench run SWEEP --log tensorboard`` (or ``wandb``) opens
a ``session`` around each run (sweeps.jobs), and the training loop calls ``log`` /
``text``, which do nothing outside one. Rank 0 alone logs. The tracker's run is named by the
run id, so a requeued or resumed run appends to its own curve: TensorBoard writes a new
event file into the run's folder (its steps go on from the checkpoint's), and wandb resumes
the run of that id. wandb runs offline (``wandb sync`` later) unless WANDB_MODE says
otherwise, since compute nodes often have no network.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

TRACKERS = ("tensorboard", "wandb")
_active = None  # the open tracker of this process, if any


class _TensorBoard:
    def __init__(self, run_id: str, folder: Path, config: dict):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("--log tensorboard needs the `tensorboard` package: pip install tensorboard") from e
        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard" / run_id))
        self.writer.add_text("config", f"```\n{json.dumps(config, indent=1, sort_keys=True, default=str)}\n```")

    def log(self, step: int, metrics: dict) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def text(self, name: str, value: str, step: int) -> None:
        self.writer.add_text(name, value, step)

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, run_id: str, folder: Path, config: dict, project: str):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("--log wandb needs the `wandb` package: pip install wandb") from e
        self.wandb = wandb
        self.run = wandb.init(project=project, id=run_id, name=run_id, resume="allow", config=config,
                              dir=str(folder), mode=os.environ.get("WANDB_MODE", "offline"))

    def log(self, step: int, metrics: dict) -> None:
        self.run.log(metrics, step=step)

    def flush(self) -> None:
        pass  # wandb writes as it goes

    def text(self, name: str, value: str, step: int) -> None:
        self.run.summary[name] = value

    def close(self) -> None:
        self.run.finish()


@contextlib.contextmanager
def session(kind: str | None, run_id: str, folder: str | Path, config: dict, project: str = "linbench"):
    """Log this process's training to ``kind`` (None: nowhere) under ``folder``."""
    global _active
    if kind is None:
        yield None
        return
    if kind not in TRACKERS:
        raise ValueError(f"log={kind!r} is not valid; choose one of {list(TRACKERS)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _active = _TensorBoard(run_id, folder, config) if kind == "tensorboard" else _Wandb(run_id, folder, config, project)
    try:
        yield _active
    finally:
        _active.close()
        _active = None


def active() -> bool:
    """Whether a session is open (the loop builds its metrics only then)."""
    return _active is not None


def log(step: int, metrics: dict) -> None:
    """Scalars at ``step`` (those that are numbers), when a session is open."""
    if _active is not None:
        scalars = {k: float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if scalars:
            _active.log(step, scalars)


def text(name: str, value: str, step: int) -> None:
    if _active is not None:
        _active.text(name, value, step)


def flush() -> None:
    """Make what was logged readable now (the loop calls it with each progress beat and
    evaluation: a curve to look at while the run trains)."""
    if _active is not None:
        _active.flush()
