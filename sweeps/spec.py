"""Sweeps as data: typed run configs, stable run ids, loading and validating a sweep
file, and helpers for parameter-matched grids.

A sweep file is plain Python exposing ``configs``, a list of ``RunConfig``. Each run is
identified by a hash of its full config, so the id survives reordering the list, and a
record written by an earlier invocation is recognised as the same run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tasks
import zoo
from tasks.engine.runs import REPO
from zoo.config import InvalidConfig, collecting
from zoo.mixers import is_mixer, mixer_class

SHIPPED = Path(__file__).resolve().parent / "shipped"  # the sweep files `linbench run NAME` finds


class SweepError(ValueError):
    """A sweep that cannot run; the message lists every bad config, not just the first."""


def canonical(obj: Any) -> Any:
    """The JSON form a config is hashed and recorded in: dataclasses become dicts,
    tuples lists, so a config read back from a record hashes the same."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = obj.to_dict() if hasattr(obj, "to_dict") else dataclasses.asdict(obj)
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    return obj


def identity(config: Any) -> Any:
    """What a run id hashes: the config as ``canonical`` writes it, each field of a typed
    config as its declaration says (``zoo.config``'s ``NOT_IN_ID``, ``WHEN_SET``, ``id_as``):
    where files live, how often a run checkpoints and reports and how its processes share
    the work are left out, and a field added after records were made counts only when set,
    so that those records keep their ids."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        out = {}
        for f in dataclasses.fields(config):
            value, rule = getattr(config, f.name), f.metadata.get("identity")
            if rule == "omit" or (rule == "when_set" and canonical(value) == canonical(_default(f))):
                continue
            if callable(rule):
                out.update(canonical(rule(value)))
            else:
                out[f.name] = identity(value)
        return out
    if isinstance(config, dict):
        return {str(k): identity(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [identity(v) for v in config]
    return config


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def mixer_revisions(config: Any) -> dict[str, int]:
    """{mixer: revision} for every zoo mixer the config names (a model's ``mixer``, a
    hybrid's) whose ``Mixer.revision`` is past 1: what an unchanged config computes
    changed with it, so it is part of the run's identity."""
    found = {}

    def walk(obj):
        if isinstance(obj, dict):
            name = obj.get("mixer")
            if isinstance(name, str) and is_mixer(name) and mixer_class(name).revision > 1:
                found[name] = mixer_class(name).revision
            for value in obj.values():
                walk(value)
        elif isinstance(obj, list):
            for value in obj:
                walk(value)

    walk(canonical(config))
    return dict(sorted(found.items()))


def make_run_id(task: str, config: Any) -> str:
    # Revisions join the hash only when there are any, so the ids of configs whose
    # mixers never changed stay what they were.
    key = {"task": task, "config": identity(_typed(task, config))}
    revisions = mixer_revisions(config)
    if revisions:
        key["revisions"] = revisions
    blob = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _typed(task: str, config: Any) -> Any:
    """``config`` as its task's config class where it is a dict of one (a record's), so that
    its fields' identity rules apply; as it is otherwise."""
    if isinstance(config, dict) and task in tasks.TASKS:
        try:
            return tasks.TASKS[task][0].from_dict(config)
        except (TypeError, ValueError):
            return config
    return config


_BUILT: set[str] = set()  # repr of every ModelConfig RunConfig.typed has built once


@dataclass
class RunConfig:
    """One run of a sweep: a task from ``tasks.TASKS`` and its config (the typed config,
    or a dict that is validated into one). Seed and budget live inside the task config.
    ``label`` names the run in tables and plots; neither it nor ``exclusive`` is part of
    the run's identity."""

    task: str
    config: Any
    label: str = ""
    exclusive: bool = False  # a timing run: the local executor runs nothing beside it

    def typed(self) -> RunConfig:
        """A copy whose config is the task's config class; raises ValueError (field and
        valid choices in the message) when the task or the config is invalid."""
        if self.task not in tasks.TASKS:
            raise ValueError(f"task={self.task!r} is not valid; choose one of {sorted(tasks.TASKS)}")
        cls, _ = tasks.TASKS[self.task]
        cfg = self.config
        if isinstance(cfg, InvalidConfig):  # built under collecting(): its error is this run's
            raise ValueError(cfg.error)
        if isinstance(cfg, dict):
            cfg = cls.from_dict(cfg)
        elif not isinstance(cfg, cls):
            raise ValueError(f"task {self.task!r} takes a {cls.__name__}, got {type(cfg).__name__}")
        model = getattr(cfg, "model", None)
        if isinstance(model, zoo.ModelConfig) and repr(model) not in _BUILT:
            # Mixer options are only fully checked when a layer is built (e.g. heads that
            # do not divide d_model): build on the meta device, which costs no memory, and
            # once per model, since a sweep repeats a few models over many runs.
            zoo.config_params(model)
            _BUILT.add(repr(model))
        return dataclasses.replace(self, config=cfg)

    @property
    def run_id(self) -> str:
        return make_run_id(self.task, self.config)

    @property
    def name(self) -> str:
        return self.label or self.task

    def to_dict(self) -> dict:
        return {"task": self.task, "label": self.label, "config": canonical(self.config)}


@dataclass
class Sweep:
    name: str
    path: Path
    runs: list  # validated RunConfig, in file order
    description: str = ""

    def __len__(self) -> int:
        return len(self.runs)


def resolve_sweep_path(sweep: str | Path) -> Path:
    """``smoke`` -> sweeps/shipped/smoke.py; anything with a slash or a .py suffix is a path."""
    text = str(sweep)
    if "/" in text or text.endswith(".py"):
        path = Path(text)
    else:
        path = SHIPPED / f"{text}.py"
    if not path.is_file():
        raise SweepError(f"no sweep file {path}; shipped sweeps: {shipped_sweeps()}")
    return path.resolve()


def shipped_sweeps() -> list[str]:
    """The names of the sweep files in sweeps/shipped/ (that folder holds nothing else)."""
    return sorted(p.stem for p in SHIPPED.glob("*.py"))


def sweep_module(sweep: str | Path):
    """Import a sweep file as a module (its constants and helpers, its ``configs``)."""
    path = resolve_sweep_path(sweep)
    spec = importlib.util.spec_from_file_location(f"linbench_sweep_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses defined in the file need their module
    try:
        # typed configs are built at import: under collecting() a bad one becomes an
        # InvalidConfig that validate() reports with its index and label, beside the others
        with collecting():
            spec.loader.exec_module(module)
    except Exception as exc:  # e.g. an invalid config's field used to build the next: report it
        raise SweepError(f"sweep {path.name}: building its configs failed: {type(exc).__name__}: {exc}") from exc
    return module


def load_sweep(sweep: str | Path) -> Sweep:
    """Import a sweep file and validate every config in it before anything runs."""
    path = resolve_sweep_path(sweep)
    module = sweep_module(path)
    configs = getattr(module, "configs", None)
    if not isinstance(configs, (list, tuple)) or not configs:
        raise SweepError(f"sweep {path.name}: must expose `configs`, a non-empty list of RunConfig")
    return Sweep(path.stem, path, validate(configs, path.name), (module.__doc__ or "").strip())


def validate(configs, where: str = "sweep") -> list:
    """Typed copies of ``configs``; every problem is collected into one SweepError."""
    runs, errors, seen = [], [], {}
    for i, run in enumerate(configs):
        tag = f"config #{i}"
        if not isinstance(run, RunConfig):
            errors.append(f"{tag}: expected a RunConfig, got {type(run).__name__}")
            continue
        tag += f" ({run.name})"
        try:
            run = run.typed()
        except (ValueError, TypeError) as exc:
            errors.append(f"{tag}: {exc}")
            continue
        if run.run_id in seen:
            errors.append(f"{tag}: same config as config #{seen[run.run_id]} (run id {run.run_id})")
            continue
        seen[run.run_id] = i
        runs.append(run)
    if errors:
        raise SweepError(f"{where}: {len(errors)} invalid config(s):\n  " + "\n  ".join(errors))
    return runs


def check_inputs(runs, where: str = "sweep") -> None:
    """What the runs read from this machine's disk (a corpus's files, a tokenizer file)
    is there, by each config's ``check_inputs()`` where its class has one: checked by
    ``linbench run`` before anything is queued, since a run sent without them fails only
    once its job starts. Not part of ``validate``: ``status`` and ``report`` read sweeps
    whose data may have moved since. Runs that share a problem (a sweep's runs mostly share
    their data) are named together, and every problem is said in one line."""
    problems: dict[str, list[str]] = {}
    for run in runs:
        check = getattr(run.config, "check_inputs", None)
        if check is None:
            continue
        try:
            check()
        except (ValueError, OSError) as exc:
            problems.setdefault(" ".join(str(exc).split()), []).append(run.name)  # one line, whatever it quotes
    if problems:
        def who(names):
            names = list(dict.fromkeys(names))
            return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise SweepError(f"{where}: " + "; ".join(f"{problem} (runs: {who(names)})"
                                                  for problem, names in problems.items()))


# --- grid helpers ---------------------------------------------------------------

def local_data_dir() -> str | None:
    """The local data folder (``$LINBENCH_DATA``, else ``../shared/data`` beside the
    checkout) when it exists; None means the Hugging Face hub."""
    path = Path(os.environ.get("LINBENCH_DATA", REPO.parent / "shared" / "data"))
    return str(path.resolve()) if path.is_dir() else None


def matched_models(base: zoo.ModelConfig, mixers: dict, knob: str = "d_model", tol: float = 0.02,
                   include_embeddings: bool = False) -> dict:
    """Parameter-matched models, ``{label: ModelConfig}``: each entry of ``mixers``
    (``label -> (mixer, options)`` or ``label -> (mixer, options, overrides)``) is resized
    along ``knob`` by ``zoo.match_params`` to the parameter count of ``base``. An entry
    equal to ``base``'s own mixer and options is taken as is. Embeddings are left out
    of the count by default, since they do not depend on the mixer."""
    out = {}
    for label, spec in mixers.items():
        mixer, options, overrides = (*spec, {})[:3]
        if mixer == base.mixer and dict(options) == dict(base.mixer_options) and not overrides:
            out[label] = base
            continue
        out[label] = zoo.match_params(base, mixer, knob=knob, tol=tol, mixer_options=dict(options),
                                      include_embeddings=include_embeddings, **overrides).config
    return out
