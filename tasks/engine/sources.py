"""Where a task's data comes from: the Hugging Face hub (``data_dir=None``) or a local
folder (``data_dir``, laid out as ``../shared/data``), never one after failing the other:
a run asked for the hub that cannot reach it stops with a message naming ``--data-dir``.
Each loader returns a ``source`` string for the record, so a result always says where its
data came from.
"""
from __future__ import annotations

from pathlib import Path

from zoo.config import id_as

SPLITS = ("train", "valid", "test")
HUB_SPLIT = {"train": "train", "valid": "validation", "test": "test"}  # the hub's names for them


class DataUnavailable(RuntimeError):
    """The requested source (hub or folder) cannot give the data; nothing was substituted."""


def need(module: str, what: str):
    """Import an optional NLP package, or say which extra installs it."""
    try:
        return __import__(module)
    except ImportError as e:
        raise ImportError(f"{what} needs the `{module}` package: pip install -e '.[nlp]'") from e


# A data folder enters a run's identity only as "local copy" against "the hub": an offline
# run trains on other splits (SNLI) or another copy of the same text, wherever it lives.
LOCAL_OR_HUB = id_as(lambda v: {"data_dir": "local" if v is not None else None})


def hub_split(name: str, config: str | None, split: str):
    datasets = need("datasets", "loading from the Hugging Face hub")
    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as e:  # offline, rate-limited, renamed: all end the run the same way
        raise DataUnavailable(
            f"could not load {name} ({config or 'default'}, split {split!r}) from the Hugging Face hub: "
            f"{type(e).__name__}: {e}. Offline, point the task at a local copy instead: "
            f"--data-dir ../shared/data (config field data_dir)") from e


def local_file(path: Path) -> Path:
    if not path.is_file():
        raise DataUnavailable(f"{path} does not exist; data_dir must be laid out as ../shared/data "
                              f"(see its README.md)")
    return path


def read_lines(path: Path) -> list[str]:
    with open(local_file(path), encoding="utf-8") as f:
        return f.read().splitlines()
