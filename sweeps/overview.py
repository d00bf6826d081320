"""Views over a sweep that the CLI prints: which fields tell its runs apart, a slice of
it by label, and the training time it has left."""
from __future__ import annotations

import collections
import dataclasses
import statistics

from .core import SweepError, canonical
from .launch import FINAL


def distinguishing(runs) -> dict[str, str]:
    """{run_id: "seed=1 train.lr=0.001"}: the config fields whose values differ between
    runs of the same label, so a dry-run list tells them apart."""
    out = {}
    for name in dict.fromkeys(run.name for run in runs):
        flat = {run.run_id: _flatten(canonical(run.config)) for run in runs if run.name == name}
        keys = sorted({k for f in flat.values() for k in f})
        varying = [k for k in keys if len({repr(f.get(k)) for f in flat.values()}) > 1]
        out.update({rid: " ".join(f"{k}={f.get(k)}" for k in varying) for rid, f in flat.items()})
    return out


def _flatten(obj, prefix="") -> dict:
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _flatten(val, f"{prefix}{key}.").items()}
    return {prefix[:-1]: obj}


def only(sweep, keys: list[str] | None):
    """The sweep cut to the runs whose label is one of ``keys`` or whose id starts with one."""
    if not keys:
        return sweep
    unknown = [k for k in keys if not any(r.name == k or r.run_id.startswith(k) for r in sweep.runs)]
    if unknown:
        labels = ", ".join(dict.fromkeys(r.name for r in sweep.runs))
        raise SweepError(f"--only {', '.join(unknown)}: no run of {sweep.name} has that label or id; "
                         f"its labels: {labels}")
    return dataclasses.replace(sweep, runs=[r for r in sweep.runs
                                            if r.name in keys or any(r.run_id.startswith(k) for k in keys)])


def _distance(a: dict, b: dict) -> int:
    return sum(a.get(k) != b.get(k) for k in a.keys() | b.keys())


def time_left(sweep, states: dict[str, str], heartbeats: dict[str, dict], walls: dict[str, float]) -> str:
    """The training time the runs a later `run` would train still need, summed over runs
    (so divide by --parallel): a run with a heartbeat by its ETA, any other by the median
    wall time of the finished runs nearest to it in config (fewest differing fields: a
    change of length moves several, a change of lr one), of its own label where it has
    any, else of any label (a rough guess: mixers differ in cost), and said which.
    Medians over finished runs count the early stops that runs still to come will make too."""
    flat = {run.run_id: _flatten(canonical(run.config)) for run in sweep.runs}
    todo = [run for run in sweep.runs if states[run.run_id] not in FINAL]
    if not todo:
        return "left: nothing"
    seconds, how = 0.0, collections.Counter()
    for run in todo:
        eta = (heartbeats.get(run.run_id) or {}).get("eta_s")
        own = [p for p in sweep.runs if p.name == run.name and p.run_id in walls]
        peers = own or [p for p in sweep.runs if p.run_id in walls]
        if eta is not None:
            seconds += eta
            how["by heartbeat ETA"] += 1
        elif peers:
            dist = {p.run_id: _distance(flat[run.run_id], flat[p.run_id]) for p in peers}
            nearest = min(dist.values())
            seconds += statistics.median(walls[p] for p, d in dist.items() if d == nearest)
            how["by finished runs of the same label" if own else "by finished runs of other labels (rough)"] += 1
        else:
            how["unknown (nothing finished yet), not counted"] += 1
    return (f"left: {len(todo)} run(s), about {seconds / 3600:.1f} h of training summed over runs ("
            + ", ".join(f"{n} {what}" for what, n in how.items()) + ")")
