"""The on-disk cache every task shares: built once per entry (a file lock makes concurrent
runs of a sweep wait for the first build), keyed by a hash of what the data depend on."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

import torch


def cache_root(cache_dir: str | None = None) -> Path:
    root = Path(cache_dir or os.environ.get("LINBENCH_CACHE") or Path.home() / ".cache" / "linbench")
    root.mkdir(parents=True, exist_ok=True)
    return root


def fingerprint(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_once(path: Path, write) -> Path:
    """Make sure ``path`` exists: if not, ``write(tmp)`` and rename ``tmp`` to ``path``.
    Runs of a sweep that miss the same cache entry at once build it one at a time (a
    file lock): the first builds, the others wait and read its file, so every run gets
    the same bytes. Without it each kept its own build, and two WordPiece trainings of
    the same text in two processes gave different ids (2,473,123 vs 2,473,105 tokens)."""
    if path.exists():
        return path
    with open(path.with_name(path.name + ".lock"), "w") as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if not path.exists():  # nobody built it while we waited
                tmp = path.with_name(path.name + f".tmp{os.getpid()}")
                write(tmp)
                os.replace(tmp, path)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    return path


def cached(path: Path, build):
    """``build()``, saved to ``path`` by the first run that needs it; every run, that
    one included, loads the saved file."""
    build_once(path, lambda tmp: torch.save(build(), tmp))
    return torch.load(path, weights_only=False)


def cached_examples(cache_dir: str | None, task: str, split: str, key: dict, make) -> tuple:
    """A generated split's (inputs, targets), made by ``make()`` once and cached under
    ``cache_root/task/`` by a hash of ``key`` (everything the data depends on); int32 on
    disk halves the file, and the key rides along so a cached file explains itself."""
    path = cache_root(cache_dir) / task / f"{task}-{split}-{fingerprint(key)}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)

    def build() -> dict:
        inputs, targets = make()
        return {"inputs": inputs.int(), "targets": targets.int(), "key": key}
    data = cached(path, build)
    if data.keys() != {"inputs", "targets", "key"} or data["key"] != key:
        # A file of another layout or another key under the same hash: the data are a
        # function of the key, so build it again.
        path.unlink(missing_ok=True)
        data = cached(path, build)
    return data["inputs"].long(), data["targets"].long()
