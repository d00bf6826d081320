"""Views over a sweep that the CLI prints: which fields tell its runs apart, a slice of
it by label, and the training time it has left."""
from __future__ import annotations

import ast
import collections
import dataclasses

import numpy as np

from tasks.engine.progress import format_duration

from .launch import FINAL
from .spec import SweepError, canonical


def distinguishing(runs) -> dict[str, str]:
    """{run_id: "model.d_model=72 seed=1 train.lr=0.001"}: the config fields whose values
    differ between the runs of one task, so a dry-run list tells them apart (runs of other
    tasks have other fields; the mixer's name is the label's to say)."""
    out = {}
    for task in dict.fromkeys(run.task for run in runs):
        flat = {run.run_id: {k: v for k, v in _flatten(canonical(run.config)).items() if k not in ("model.mixer", "mixer")}
                for run in runs if run.task == task}
        keys = sorted({k for f in flat.values() for k in f})
        varying = [k for k in keys if len({repr(f.get(k)) for f in flat.values()}) > 1]
        # a field this run does not set (None, or an option of another mixer) says nothing
        out.update({rid: " ".join(f"{k}={f[k]}" for k in varying if f.get(k) is not None) for rid, f in flat.items()})
    return out


def ago(seconds: float) -> str:
    """A span at the precision one reads it with: "40 s", "12 min", "2.4 h", "3.1 d"."""
    if seconds < 90:
        return f"{max(0, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h" if seconds < 48 * 3600 else f"{seconds / 86400:.1f} d"


# the metric an ok run is shown with: the first of these its record holds
OUTCOMES = ("test_ppl", "test_accuracy", "accuracy", "best_val_ppl", "loss")


def outcome(record: dict) -> str:
    """"test_ppl 103.3 in 1:02:11": an ok run's result and training time, from its record."""
    metrics = record.get("metrics") or {}
    name = next((k for k in OUTCOMES if isinstance(metrics.get(k), (int, float))), None)
    wall = metrics.get("wall_time") or (record.get("provenance") or {}).get("wall_time")
    parts = [f"{name} {metrics[name]:.4g}"] if name is not None else []
    return " ".join(parts + ([f"in {format_duration(wall)}"] if wall else []))


def _flatten(obj, prefix="") -> dict:
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _flatten(val, f"{prefix}{key}.").items()}
    return {prefix[:-1]: obj}


def only(sweep, keys: list[str] | None):
    """The sweep cut to the runs whose label is one of ``keys``, whose id starts with one,
    or whose config has a FIELD=VALUE one names (``seed=0``, ``train.lr=0.001``)."""
    if not keys:
        return sweep
    def named(run, key):
        if run.name == key or run.run_id.startswith(key):
            return True
        field, is_field, value = key.partition("=")  # a label may hold "=" too: tried first
        return is_field and field in (flat := _flatten(canonical(run.config))) and _same(flat[field], value)

    unknown = [k for k in keys if not any(named(r, k) for r in sweep.runs)]
    if unknown:
        labels = ", ".join(dict.fromkeys(r.name for r in sweep.runs))
        raise SweepError(f"--only {', '.join(unknown)}: no run of {sweep.name} has that label, id or FIELD=VALUE; "
                         f"its labels: {labels}")
    return dataclasses.replace(sweep, runs=[r for r in sweep.runs if any(named(r, k) for k in keys)])


def ordered(sweep, fields: list[str] | None):
    """The sweep's runs sorted by the config ``fields`` named (``seq_len``, ``train.lr``;
    "label" for the label), the first deciding, the next breaking its ties; otherwise in
    the file's order (the sort is stable). A run without a field goes after those with it."""
    if not fields:
        return sweep
    flat = {run.run_id: {"label": run.name, **_flatten(canonical(run.config))} for run in sweep.runs}
    unknown = [f for f in fields if not any(f in fl for fl in flat.values())]
    if unknown:
        names = sorted({k for fl in flat.values() for k in fl})
        raise SweepError(f"--order {', '.join(unknown)}: no run of {sweep.name} has that field; "
                         f"its fields: {', '.join(names)}")

    def key(run):
        values = flat[run.run_id]
        # None sorts apart from the values, so a field set only on some runs cannot mix types
        return tuple((0, values[f]) if values.get(f) is not None else (1, 0) for f in fields)
    return dataclasses.replace(sweep, runs=sorted(sweep.runs, key=key))


def _same(value, text: str) -> bool:
    """Whether a config value is the one ``text`` writes: 1e-3 is 0.001, true is True."""
    try:
        parsed = ast.literal_eval({"true": "True", "false": "False", "null": "None"}.get(text, text))
    except (ValueError, SyntaxError):
        parsed = text
    return parsed == value or str(value) == text


def _config_codes(runs) -> np.ndarray:
    """(runs, fields that vary across them): each value as a small integer, so that
    the number of fields two runs differ in is one vectorised comparison."""
    flat = [_flatten(canonical(run.config)) for run in runs]
    cols = []
    for key in sorted({k for f in flat for k in f}):
        values = [repr(f.get(key)) for f in flat]
        if len(set(values)) > 1:
            index = {}
            cols.append([index.setdefault(v, len(index)) for v in values])
    return np.array(cols, dtype=np.int64).T if cols else np.zeros((len(flat), 0), dtype=np.int64)


def planned_tokens(config) -> float:
    """The tokens a run's config plans to train (its ``planned_tokens()``), NaN where the
    task does not say (a config without the method, or one that returns None)."""
    plan = getattr(config, "planned_tokens", None)
    tokens = plan() if callable(plan) else None
    return float(tokens) if tokens else float("nan")


def _eta(beat: dict) -> float | None:
    """A heartbeat's training time left: its ETA while it runs; for a run that stopped
    (cancelled, timed out: its ETA reads 0), the steps from its last checkpoint to the end
    at the rate it ran."""
    if beat.get("status", "running") == "running":
        return beat.get("eta_s")
    rate, steps = beat.get("steps_per_s"), beat.get("steps")
    done = beat.get("checkpoint_step") or 0  # what a resumed run starts from
    return max(0.0, (steps - done) / rate) if rate and steps else None


def time_left(sweep, states: dict[str, str], heartbeats: dict[str, dict], walls: dict[str, float]) -> str:
    """The training time the runs a later `run` would train still need, summed over runs
    (so divide by --parallel): a run with a heartbeat by its ETA, any other from the
    finished runs nearest to it in config (fewest differing fields: a change of length
    moves several, a change of lr one), of its own label where it has any, else of any
    label (a rough guess: mixers differ in cost), and said which; a guess from runs of its
    label that differ in more than one field (another length, another task) is called
    rough too. From those runs, the median wall time per planned token times the run's
    planned tokens, where the task's configs plan tokens (``planned_tokens``: a longer run
    or sequence costs more), else their median wall time. Either way the medians count the
    early stops that runs still to come will make too."""
    todo = [i for i, run in enumerate(sweep.runs) if states[run.run_id] not in FINAL]
    if not todo:
        return "left: nothing"
    codes = _config_codes(sweep.runs)  # (runs, varying fields)
    labels = np.array([run.name for run in sweep.runs], dtype=object)
    finished = np.array([run.run_id in walls for run in sweep.runs])
    wall = np.array([walls.get(run.run_id, 0.0) for run in sweep.runs])
    tokens = np.array([planned_tokens(run.config) for run in sweep.runs])  # (runs,) NaN: unknown
    seconds, how = 0.0, collections.Counter()
    for i in todo:
        eta = _eta(heartbeats.get(sweep.runs[i].run_id) or {})
        own = finished & (labels == labels[i])
        peers = own if own.any() else finished
        if eta is not None:
            seconds += eta
            how["by heartbeat ETA"] += 1
        elif peers.any():
            dist = (codes[peers] != codes[i]).sum(1)  # (finished peers,) fields that differ
            near = dist == dist.min()
            per_token = wall[peers][near] / tokens[peers][near]  # NaN where a plan is unknown
            scaled = not np.isnan(tokens[i]) and not np.isnan(per_token).any()
            seconds += float(np.median(per_token) * tokens[i] if scaled else np.median(wall[peers][near]))
            how["by finished runs of other labels (rough)" if not own.any() else
                "by finished runs of the same label" if dist.min() <= 1 else
                "by finished runs of the same label in another setting (rough)"] += 1
        else:
            how["unknown (nothing finished yet), not counted"] += 1
    if len(how) == 1 and seconds == 0 and "unknown (nothing finished yet), not counted" in how:
        return f"left: {len(todo)} run(s), time unknown: no run has finished or reported an ETA yet"
    return (f"left: {len(todo)} run(s), about {ago(seconds)} of training summed over runs ("
            + ", ".join(f"{n} {what}" for what, n in how.items()) + ")")
