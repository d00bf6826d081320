"""SNLI's pairs from the hub, or offline from ``../shared/data/snli`` (dev as the training
split, the gold pairs of the train sample as validation), with labels 0/1/2."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from ..engine.sources import HUB_SPLIT, SPLITS, hub_split, local_file

SNLI_HUB = "stanfordnlp/snli"
SNLI_LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}


def snli_splits(data_dir: str | None) -> tuple[dict[str, dict], dict]:
    """``{split: {"premise": [...], "hypothesis": [...], "label": [...]}}`` with labels
    0/1/2 (entailment/neutral/contradiction) and unlabelled pairs dropped, plus a dict
    saying which data each split is (an offline run trains on dev, and says so)."""
    if data_dir is None:
        splits = {}
        for s in SPLITS:
            ds = hub_split(SNLI_HUB, None, HUB_SPLIT[s])
            cols = {k: list(ds[k]) for k in ("premise", "hypothesis", "label")}  # one read per column
            keep = [i for i, y in enumerate(cols["label"]) if y != -1]  # -1: no annotator majority
            splits[s] = {k: [v[i] for i in keep] for k, v in cols.items()}
        about = {s: f"hub:{SNLI_HUB}/{HUB_SPLIT[s]}" for s in SPLITS}
        return splits, about
    root = Path(data_dir) / "snli"
    splits = {"train": read_tsv(root / "dev.tsv"), "valid": read_jsonl(root / "train_sample_1000.jsonl"),
              "test": read_tsv(root / "test.tsv")}
    about = {"train": f"local:{root / 'dev.tsv'} (offline substitute for the 550k train split)",
             "valid": f"local:{root / 'train_sample_1000.jsonl'} (the gold-labelled of the first 1,000 "
                      f"train pairs, held out from training)",
             "test": f"local:{root / 'test.tsv'}"}
    return splits, about


def read_tsv(path: Path) -> dict:
    with open(local_file(path), encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))  # fields are CSV-quoted
    return {"premise": [r["premise"] for r in rows], "hypothesis": [r["hypothesis"] for r in rows],
            "label": [int(r["label"]) for r in rows]}


def read_jsonl(path: Path) -> dict:
    with open(local_file(path), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r["gold_label"] in SNLI_LABELS]  # "-": no annotator majority
    return {"premise": [r["sentence1"] for r in rows], "hypothesis": [r["sentence2"] for r in rows],
            "label": [SNLI_LABELS[r["gold_label"]] for r in rows]}
