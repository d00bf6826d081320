"""Where a sweep's files live under a results folder; every other module asks here.

    RESULTS_DIR/SWEEP/RUN_ID.json    the run's record (``results.records``)
    RESULTS_DIR/SWEEP/runs/RUN_ID/   its working folder: checkpoint, progress, lock
    RESULTS_DIR/SWEEP/submitit/      submitit's job files and logs, and the job ledger

Only the records are results; the other two folders are working state (not committed)."""
from __future__ import annotations

from pathlib import Path


def record_path(results_dir: str | Path, sweep: str, run_id: str) -> Path:
    return Path(results_dir) / sweep / f"{run_id}.json"


def workdir_for(results_dir: str | Path, sweep: str, run_id: str) -> Path:
    return Path(results_dir) / sweep / "runs" / run_id


def jobs_dir(results_dir: str | Path, sweep: str) -> Path:
    return Path(results_dir) / sweep / "submitit"
