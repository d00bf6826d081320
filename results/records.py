"""Run records: one JSON file per finished run, and a sweep's records as one table.

A record is written to a temporary file in the same folder and renamed over its final
name, so a reader (or a second job) never sees half a record, and jobs that finish at
the same moment each replace only their own file.
"""
from __future__ import annotations

import json
import math
import os
import uuid
import warnings
from pathlib import Path

STATUSES = ("ok", "failed", "diverged", "oom", "timeout")


def _jsonable(obj):
    """Metrics may hold numpy/torch scalars or NaN; JSON gets plain numbers and null."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def write_record(path: str | Path, record: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")  # unique per writer
    try:
        with open(tmp, "w") as f:
            json.dump(_jsonable(record), f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# Scores a record's metrics hold as numbers wherever they appear.
NUMERIC_METRICS = ("test_ppl", "val_ppl", "best_val_ppl", "accuracy", "test_accuracy", "loss", "final_loss",
                   "wall_time")


def record_problem(rec) -> str | None:
    """Why a record read from disk cannot be used (None when it can): not an object, a
    status outside STATUSES, metrics or config that are not objects, a score that is not a
    number. A run whose record is damaged is shown as such and rerun, never counted."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    if rec.get("status") not in STATUSES:
        return f"status {rec.get('status')!r} is not one of {list(STATUSES)}"
    for part in ("metrics", "config"):
        if not isinstance(rec.get(part, {}), dict):
            return f"{part} is a {type(rec[part]).__name__}, not an object"
    bad = [k for k in NUMERIC_METRICS if k in (rec.get("metrics") or {})
           and not isinstance(rec["metrics"][k], (int, float, type(None)))]
    return f"metrics {bad} are not numbers" if bad else None


def read_record(path: str | Path) -> dict | None:
    """The record at ``path``, or None when there is none or it is damaged (``read_checked``
    says why)."""
    rec, _ = read_checked(path)
    return rec


def read_checked(path: str | Path) -> tuple[dict | None, str | None]:
    """(record, None), (None, None) where no file is, or (None, why) for a damaged one."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None, None
    if not text.strip():
        return None, "empty"
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at line {exc.lineno})"
    why = record_problem(rec)
    return (None, why) if why else (rec, None)


def load_records(sweep_dir: str | Path, run_ids=None) -> list[dict]:
    """Every usable record in a sweep folder (only those of ``run_ids`` when given); a
    damaged one is left out with a warning that names its file and why."""
    wanted = set(run_ids) if run_ids is not None else None
    out = []
    for path in sorted(Path(sweep_dir).glob("*.json")):
        if wanted is not None and path.stem not in wanted:
            continue
        rec, why = read_checked(path)
        if why:
            warnings.warn(f"{path}: damaged record ({why}), left out", stacklevel=2)
        elif rec is not None:
            out.append(rec)
    return out


# --- one table ------------------------------------------------------------------

def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and key not in ("backends", "chunk_sizes"):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# Short names for the config fields every plot groups by.
ALIASES = {"mixer": "config.model.mixer", "d_model": "config.model.d_model",
           "n_layers": "config.model.n_layers", "seed": "config.seed"}


def records_frame(records: list[dict]):
    """Long format: one row per run, or one row per point for multi-point runs (the
    ``points`` list is exploded). Columns: run_id, sweep, task, label, status and
    run_status (the record's), error, resumed, attempts, git_commit, host, executor,
    slurm_job_id, ``config.<path>`` for every config field, the
    task's metrics by their own names, ``model_json`` (the config's ``model``, whole, as
    JSON), and for exploded rows each point's fields (a
    point field that shadows a run-level one keeps the plain name, e.g. a point's
    ``status`` "oom"; the run-level value moves to ``run.<name>``)."""
    rows = []
    for rec in records:
        base = {"run_id": rec.get("run_id"), "sweep": rec.get("sweep"), "task": rec.get("task"),
                "label": rec.get("label") or (rec.get("metrics") or {}).get("label") or rec.get("task"),
                "status": rec.get("status"),
                "run_status": rec.get("status"), "error": rec.get("error"), "resumed": rec.get("resumed", False),
                "attempts": rec.get("attempts")}
        prov = rec.get("provenance") or {}
        base.update({k: prov.get(k) for k in ("git_commit", "host", "executor", "slurm_job_id")})
        base.update(_flatten(rec.get("config", {}), "config."))
        # The model's config whole as well: its nested fields (a hybrid's mixer and options)
        # are flattened into columns that other rows lack, so they cannot be read back exactly.
        model = (rec.get("config") or {}).get("model")
        base["model_json"] = json.dumps(model, sort_keys=True) if isinstance(model, dict) else None
        metrics = dict(rec.get("metrics") or {})
        points = metrics.pop("points", None)
        for key, value in metrics.items():
            base.setdefault(key, value if not isinstance(value, dict) else json.dumps(value, sort_keys=True))
        for alias, column in ALIASES.items():
            if column in base:
                base.setdefault(alias, base[column])
        if "precision" not in base and (rec.get("config") or {}).get("train") is not None:
            # training records made before the field: "auto", i.e. bf16 autocast on CUDA only
            base["precision"] = "bf16" if base.get("dtype") == "bfloat16" else "fp32"
        if not points:
            rows.append(base)
            continue
        for point in points:
            row = dict(base)
            for key, value in point.items():
                if key in row:
                    row[f"run.{key}"] = row[key]
                row[key] = value
            rows.append(row)
    import pandas as pd  # only the readers of results need it, not every job

    return pd.DataFrame(rows)


def combine(frames: dict):
    """Several sweeps' tables (``records_frame``, by sweep name) as one, to draw on one
    figure: a label that two sweeps share becomes "label [sweep]" in each, so a user's
    runs sit beside the reference ones without merging record folders."""
    import pandas as pd

    if len(frames) == 1:
        return next(iter(frames.values()))
    owners = pd.concat([f[["label"]].drop_duplicates().assign(source=name) for name, f in frames.items()])
    shared = set(owners["label"][owners["label"].duplicated()])
    return pd.concat([f.assign(label=f["label"].where(~f["label"].isin(shared), f["label"] + f" [{name}]"))
                      for name, f in frames.items()], ignore_index=True)


def export_csv(frame, out: str | Path) -> Path:
    """``records_frame``'s table as a CSV (``linbench export``): curves and other lists or
    dicts stay JSON in their cells."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v).to_csv(out, index=False)
    return out
