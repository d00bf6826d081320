"""Tasks: each is a typed config (rejecting unknown keys) plus ``run(cfg, workdir,
progress) -> dict``, a flat record of metrics and metadata. ``TASKS`` maps a task
name to ``(ConfigClass, run)``; the sweep launcher only ever goes through it."""
from .train import TrainConfig, TrainResult, train

TASKS: dict = {}
