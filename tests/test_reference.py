"""The committed reference results are what their runs produced, and the README shows
only them: every figure the README links is a file under results/reference/, and each
reference report is regenerated here from its committed records and must come out the
same (apart from the time it was written)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from results.records import PUBLISHED, load_records, records_frame
from results.report import report_markdown
from results.stats import read_published

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "results" / "reference"
REPORTS = sorted(p.parent for p in REFERENCE.glob("*/report.md"))


def test_readme_figures_are_committed_reference_results():
    figures = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    assert figures, "the README shows no figure"
    for path in figures:
        assert path.startswith("results/reference/") and (ROOT / path).is_file(), path


def test_every_reference_sweep_with_records_has_a_report():
    """A sweep folder with records has its report and figures, and a report its records
    (a sweep being rerun from scratch has neither); superseded records make none."""
    with_records = {p.parent.name for p in REFERENCE.glob("*/*.json")}
    assert {p.name for p in REPORTS} == with_records
    assert with_records >= {"smoke", "mqar_cpu", "mad_cpu"}


@pytest.mark.parametrize("folder", REPORTS, ids=lambda p: p.name)
def test_reference_report_is_regenerated_from_its_records(folder):
    records = load_records(folder)
    assert records, f"{folder} has a report but no records"
    published = read_published(PUBLISHED)
    fresh = report_markdown(records_frame(records), published, title=folder.name)
    stamp = re.compile(r" Written \d{4}-\d\d-\d\d \d\d:\d\d UTC\.")
    assert stamp.sub("", fresh) == stamp.sub("", (folder / "report.md").read_text())
    assert any((folder / "plots").glob("*.png")), f"{folder} has no figures"


@pytest.mark.parametrize("name", ["trainstep_cpu.csv", "trainstep_cpu_before.csv"])
def test_readme_training_step_tables_are_the_committed_csvs(name):
    """The README's CPU training-step tables are tasks.trainstep's tables of the committed
    CSVs, verbatim, and each CSV says which command made it."""
    import csv

    from tasks.trainstep import markdown_table

    with open(REFERENCE / name, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["command"].startswith("python -m tasks.trainstep") for r in rows)
    assert markdown_table(rows) in (ROOT / "README.md").read_text()


def test_readme_headline_tables_are_their_records():
    """The README's recall, 6-layer and MAD tables, and the published gaps beside them, are
    results.headline's tables of the committed records and published.csv, verbatim (so
    every number in them comes from a record): rewriting them changes nothing. Every
    table is in the README, a sweep being rerun saying it has no finished run yet."""
    from results import headline

    made = headline.tables()
    text = (ROOT / "README.md").read_text()
    assert set(headline.TABLES) | {"published_gaps"} <= set(made)
    for name in made:
        assert f"<!-- headline:{name} -->" in text, name
    assert headline.update(text, made) == text


def test_headline_update_rewrites_only_the_marked_tables():
    from results.headline import update

    text = "a\n<!-- headline:t -->\nold\n<!-- /headline -->\nb <!-- headline:u -->x<!-- /headline -->"
    assert update(text, {"t": "new"}) == "a\n<!-- headline:t -->\nnew\n<!-- /headline -->\nb <!-- headline:u -->x<!-- /headline -->"


@pytest.mark.parametrize("folder", REPORTS, ids=lambda p: p.name)
def test_every_lm_run_of_a_sweep_read_the_same_tokens(folder):
    """A trained WordPiece differs from one process to the next (huggingface/tokenizers#1794),
    and each run reads the cached one: were the cache lost mid-sweep, later runs would be
    scored on another vocabulary. Within a sweep, every Wikitext-2 run must have read the
    same number of training tokens through the same tokenizer."""
    lm = [r["metrics"] for r in load_records(folder) if r["task"] == "wikitext2" and r["status"] == "ok"]
    seen = {(m["train_tokens"], m["tokenizer"], m["vocab_size"]) for m in lm}
    assert len(seen) <= 1, f"{folder.name}: runs on different tokenizations {sorted(seen)}"
