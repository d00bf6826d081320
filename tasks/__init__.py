"""Tasks: each is a typed config (rejecting unknown keys) plus ``run(cfg, workdir,
progress) -> dict``, a flat record of metrics and metadata. ``TASKS`` maps a task
name to ``(ConfigClass, run)``; the sweep launcher only ever goes through it.

Layout: ``engine/`` is what every task shares (the training loop, losses, data cache,
run fields, CLI plumbing), ``benchmarks/`` the measurements (timing, scaling, trainstep,
gpu_check), and each task is a module (``wikitext2.py``) or a package with its data
generator beside it (``mqar/``, ``mad/``, ``snli/``). Task modules are imported on first
use, so ``python -m tasks.mqar`` does not import its own module twice and ``import
tasks`` stays cheap."""
from __future__ import annotations

import importlib
from collections.abc import Mapping

from .engine.train import TrainConfig, TrainResult, train

# name -> (module, config class); the module's ``run`` is the task's entry point.
_REGISTRY = {
    "mqar": ("mqar.task", "MQARConfig"),
    "scaling": ("benchmarks.scaling", "ScalingConfig"),
    "decode": ("benchmarks.decode", "DecodeConfig"),
    "wikitext2": ("wikitext2", "WikiText2Config"),
    "corpus": ("corpus", "CorpusConfig"),
    "snli": ("snli.task", "SNLIConfig"),
    "mad": ("mad.task", "MADConfig"),
}


class _Tasks(Mapping):
    def __init__(self):
        self._extra = {}  # tasks registered at run time (tests, plug-ins)

    def __getitem__(self, name):
        if name in self._extra:
            return self._extra[name]
        module, config = _REGISTRY[name]
        mod = importlib.import_module(f"{__name__}.{module}")
        return getattr(mod, config), mod.run

    def __setitem__(self, name, task):
        self._extra[name] = task

    def __delitem__(self, name):
        del self._extra[name]

    def pop(self, name, *default):
        return self._extra.pop(name, *default)

    def __iter__(self):
        return iter({**dict.fromkeys(_REGISTRY), **self._extra})

    def __len__(self):
        return len(set(_REGISTRY) | set(self._extra))


TASKS = _Tasks()
