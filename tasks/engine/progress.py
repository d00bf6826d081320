"""Progress you can watch: a heartbeat file beside a run's checkpoint, and plain log lines.

Every ``log_every_s`` seconds, and once at the end, the training loop writes
``progress.json`` next to its checkpoint (atomically, so a reader never sees half a file)
and, where no terminal shows the tqdm bar (a job log), prints one line to stdout:

    [train] step 1200/5000 (24%) loss 3.214 accuracy 0.812 1.9k tok/s ETA 0:33:10

``read_progress(workdir)`` reads the heartbeat back (``linbench status``); it returns None
when there is none or it cannot be read, and never raises.
"""
from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path

PROGRESS_FILE = "progress.json"


def write_progress(path: str | Path, data: dict) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def read_progress(workdir: str | Path) -> dict | None:
    """The heartbeat of the run in ``workdir`` (or of the ``progress.json`` named), or None."""
    try:
        path = Path(workdir)
        if path.suffix != ".json":
            path = path / PROGRESS_FILE
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else None
    except Exception:  # absent, unreadable, torn by a foreign writer: no progress to show
        return None


def _num(x) -> float | None:
    """A finite float, or None (JSON has no NaN)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def format_duration(seconds: float) -> str:
    s = int(round(max(0.0, seconds)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def format_rate(x: float) -> str:
    """1234 -> '1.2k', 3.5e6 -> '3.5M', 12.34 -> '12.3'."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{suffix}"
    return f"{x:.3g}"


def format_line(p: dict) -> str:
    """One log line from a heartbeat dict."""
    status = p.get("status", "running")
    parts = ["[train]"] + ([status] if status != "running" else [])
    step, steps = p.get("step", 0), p.get("steps") or 0
    parts.append(f"step {step}/{steps}" + (f" ({100 * step // steps}%)" if steps else ""))
    if p.get("train_loss") is not None:
        parts.append(f"loss {p['train_loss']:.4g}")
    value, best = p.get("metric_value"), p.get("best")
    if value is not None:
        parts.append(f"{p.get('metric', 'metric')} {value:.4g}"
                     + (f" (best {best:.4g})" if best not in (None, value) else ""))
    if p.get("tokens_per_s") is not None:
        parts.append(f"{format_rate(p['tokens_per_s'])} tok/s")
    elif p.get("steps_per_s") is not None:
        parts.append(f"{format_rate(p['steps_per_s'])} steps/s")
    if status == "running":
        if p.get("eta_s") is not None:
            parts.append(f"ETA {format_duration(p['eta_s'])}")
    elif p.get("elapsed_s") is not None:
        parts.append(f"in {format_duration(p['elapsed_s'])}")
    return " ".join(parts)


class Heartbeat:
    """Rates, ETA and cadence of one training segment. ``res`` is the loop's TrainResult
    (read for steps, final_loss, history, best, wall_time). ``beat()`` when ``due()``,
    ``finish(status)`` once at the end; a failure inside the ``with`` block finishes as
    "failed" (Ctrl-C: "interrupted"). A heartbeat that cannot be written never stops training."""

    def __init__(self, res, steps: int, path: str | Path | None = None, every_s: float = 30.0,
                 tokens_per_step: int | None = None, metric: str = "loss", lines: bool = False):
        self.res, self.steps, self.path = res, steps, Path(path) if path else None
        self.every_s, self.tokens_per_step, self.metric, self.lines = every_s, tokens_per_step, metric, lines
        self.last_t, self.last_step = time.monotonic(), res.steps
        self.steps_per_s: float | None = None
        self.checkpoint_step = res.resumed_from  # the step of the last checkpoint written
        self.finished = False

    def due(self) -> bool:
        return time.monotonic() - self.last_t >= self.every_s

    def beat(self, status: str = "running", echo: bool = True) -> dict:
        now, res = time.monotonic(), self.res
        if res.steps > self.last_step and now > self.last_t:
            self.steps_per_s = (res.steps - self.last_step) / (now - self.last_t)
        self.last_t, self.last_step = now, res.steps
        tps = self.tokens_per_step
        last = next((h[self.metric] for h in reversed(res.history) if h.get(self.metric) is not None), None)
        rate = self.steps_per_s
        data = {
            "status": status, "step": res.steps, "steps": self.steps,
            "tokens": res.steps * tps if tps else None,
            "train_loss": _num(res.final_loss), "metric": self.metric,
            "metric_value": _num(last), "best": _num(res.best),
            "steps_per_s": rate, "tokens_per_s": rate * tps if rate and tps else None,
            "eta_s": (max(0.0, (self.steps - res.steps) / rate) if rate else None) if status == "running" else 0.0,
            "elapsed_s": round(res.wall_time, 3), "resumed_from": res.resumed_from,
            "checkpoint_step": self.checkpoint_step, "updated": time.time(), "pid": os.getpid(), "host": socket.gethostname(),
        }
        if self.path is not None:
            try:
                write_progress(self.path, data)
            except OSError:
                pass
        if echo and self.lines:
            print(format_line(data), flush=True)
        return data

    def saved(self) -> None:
        """A checkpoint of this step was written: the heartbeat says so at once, so a run
        whose process dies later shows the step a rerun resumes from."""
        self.checkpoint_step = self.res.steps
        self.beat(echo=False)

    def finish(self, status: str) -> None:
        if not self.finished:
            self.finished = True
            self.beat(status)

    def __enter__(self):
        self.beat(echo=False)  # "running" from the first step on
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, (Exception, KeyboardInterrupt)):
            self.finish("interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed")
