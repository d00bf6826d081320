"""The published numbers our results are drawn beside (``published.csv``, one row per
number: its task, source, setting, model, metric, split and value). Tasks print them next to a run's own
numbers; the reports and plots read the same file."""
from __future__ import annotations

import csv
from pathlib import Path

PUBLISHED = Path(__file__).resolve().parent / "published.csv"


def published_rows(task: str, setting: str | None = None) -> list[dict]:
    """Rows of published.csv for a task (and setting, e.g. "6L/128")."""
    with open(PUBLISHED, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    return [r for r in rows if r["task"] == task and setting in (None, r["setting"])]
