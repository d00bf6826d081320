"""The committed reference results are what their runs produced, and the README and docs/
show only them: every figure they link is a file under results/reference/, each
reference report is regenerated here from its committed records and must come out the
same (apart from the time it was written), and so must every table they quote."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from results.records import load_records, records_frame
from results.report import report_markdown
from results.stats import read_published
from sweeps import load_sweep
from tasks.published import PUBLISHED

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "results" / "reference"
REPORTS = sorted(p.parent for p in REFERENCE.glob("*/report.md"))
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS_PAGE = ROOT / "docs" / "results.md"  # where `linbench headline --write` puts every table


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_figures_shown_are_committed_reference_results(page):
    for path in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
        target = (page.parent / path).resolve()
        assert target.is_relative_to(REFERENCE) and target.is_file(), f"{page.name}: {path}"


def test_the_readme_and_the_results_page_show_figures():
    for page in (ROOT / "README.md", RESULTS_PAGE):
        assert re.search(r"!\[[^\]]*\]\(", page.read_text()), f"{page.name} shows no figure"


def test_every_reference_sweep_with_records_has_a_report():
    """A sweep folder with records has its report and figures, and a report its records
    (a sweep being rerun from scratch has neither); superseded records make none."""
    with_records = {p.parent.name for p in REFERENCE.glob("*/*.json")}
    assert {p.name for p in REPORTS} == with_records
    assert with_records >= {"smoke", "mqar_cpu", "mad_cpu"}


# the states of a run without a record, which this machine's workdirs and jobs give (a
# fresh checkout has neither: every such run is "not run" there)
RECORDLESS = {"not run", "partial", "lost", "queued", "running", "unknown"}


def written_states(report: str) -> dict[str, str]:
    """{run_id: state} of a report's runs without an ok record, as it was written."""
    text = report.split("## Runs without an ok record\n")[1].split("\n## ")[0] if "## Runs without" in report else ""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()]
    return {row[0]: row[2] for row in rows if len(row) > 2 and re.fullmatch(r"[0-9a-f]{12}", row[0])}


@pytest.mark.parametrize("folder", REPORTS, ids=lambda p: p.name)
def test_reference_report_is_regenerated_from_its_records(folder, tmp_path, monkeypatch):
    """The report `linbench report` writes, its sweep's runs without an ok record included;
    the state of one that has no record at all (not run, partial, running ...) was where
    and when the report was written, as its time stamp was, and is read back from it."""
    import argparse

    from sweeps.cli import not_ok_runs

    monkeypatch.setenv("LINBENCH_DATA", str(tmp_path))  # any folder: run ids do not record where the data is
    records = load_records(folder)
    assert records, f"{folder} has a report but no records"
    written = (folder / "report.md").read_text()
    not_ok = not_ok_runs(argparse.Namespace(results_dir=str(REFERENCE)), load_sweep(folder.name))
    states = written_states(written)
    for run in not_ok:
        if run["state"] in RECORDLESS and run["run_id"] in states:
            assert states[run["run_id"]] in RECORDLESS, f"{folder.name} {run['run_id']}: it has a record now"
            run["state"] = states[run["run_id"]]
    published = read_published(PUBLISHED)
    fresh = report_markdown(records_frame(records), published, title=folder.name, not_ok=not_ok)
    stamp = re.compile(r" Written \d{4}-\d\d-\d\d \d\d:\d\d UTC\.")
    assert stamp.sub("", fresh) == stamp.sub("", written)
    assert any((folder / "plots").glob("*.png")), f"{folder} has no figures"


def test_written_states_are_read_from_the_list_of_runs_not_ok():
    not_ok = [{"run_id": "0123456789ab", "label": "a | b", "state": "not run", "config": "seed=1", "note": ""},
              {"run_id": "ba9876543210", "label": "c", "state": "partial"}]
    text = report_markdown(records_frame([]).assign(run_id=[], run_status=[], task=[]), not_ok=not_ok)
    assert written_states(text) == {"0123456789ab": "not run", "ba9876543210": "partial"}
    assert written_states("# a report\n\n## wikitext2\n\n| 0123456789ab | x | ok |\n") == {}


@pytest.mark.parametrize("name", ["trainstep_cpu.csv", "trainstep_cpu_0141c2a.csv", "trainstep_cpu_avx512.csv",
                                  "trainstep_cpu_3a542b3.csv", "trainstep_cpu_d08475b.csv", "trainstep_cpu_before.csv"])
def test_readme_training_step_tables_are_the_committed_csvs(name):
    """The README's CPU training-step tables are tasks.benchmarks.trainstep's tables of the committed
    CSVs, verbatim, and each CSV says which command made it."""
    import csv

    from tasks.benchmarks.trainstep import markdown_table

    with open(REFERENCE / name, newline="") as f:
        rows = list(csv.DictReader(f))
    # the module moved to tasks/benchmarks/ after these were measured; the CSV keeps its command
    assert rows and all(re.match(r"python -m tasks\.(benchmarks\.)?trainstep ", r["command"]) for r in rows)
    assert markdown_table(rows) in (ROOT / "docs" / "performance.md").read_text()


def test_headline_tables_are_their_records():
    """The results page's recall, Wikitext-2 and MAD tables, and the published gaps beside
    them, are results.paper.headline's tables of the committed records and published.csv,
    verbatim (so every number in them comes from a record): rewriting them changes nothing.
    Every table is on that page, a sweep being rerun saying it has no finished run yet; the
    README's few copies are checked the same way."""
    from results.paper import headline

    made = headline.tables({s: len(load_sweep(s).runs) for s in headline.reference_sweeps()})
    assert set(headline.TABLES) | {"published_gaps"} <= set(made)
    text = RESULTS_PAGE.read_text()
    for name in made:
        assert f"<!-- headline:{name} -->" in text, name
    for page in PAGES:
        assert headline.update(page.read_text(), made) == page.read_text(), page.name
    assert "<!-- headline:" in (ROOT / "README.md").read_text()


def test_headline_update_rewrites_only_the_marked_tables():
    from results.paper.headline import update

    text = "a\n<!-- headline:t -->\nold\n<!-- /headline -->\nb <!-- headline:u -->x<!-- /headline -->"
    assert update(text, {"t": "new"}) == ("a\n<!-- headline:t -->\nnew\n<!-- /headline -->\n"
                                          "b <!-- headline:u -->x<!-- /headline -->")


@pytest.mark.parametrize("folder", REPORTS, ids=lambda p: p.name)
def test_every_lm_run_of_a_sweep_read_the_same_tokens(folder):
    """A trained WordPiece differs from one process to the next (huggingface/tokenizers#1794),
    and each run reads the cached one: were the cache lost mid-sweep, later runs would be
    scored on another vocabulary. Within a sweep, every Wikitext-2 run must have read the
    same number of training tokens through the same tokenizer."""
    lm = [r["metrics"] for r in load_records(folder) if r["task"] == "wikitext2" and r["status"] == "ok"]
    seen = {(m["train_tokens"], m["tokenizer"], m["vocab_size"]) for m in lm}
    assert len(seen) <= 1, f"{folder.name}: runs on different tokenizations {sorted(seen)}"


@pytest.mark.parametrize("folder", REPORTS, ids=lambda p: p.name)
def test_every_reference_record_is_a_run_of_its_sweep_today(folder, tmp_path, monkeypatch):
    """A record whose id the sweep file no longer makes is an orphan: `linbench run` would
    train it again under a new id and the tables would lose it. A field added to a config
    must keep the ids of configs that leave it at its default (sweeps.spec.identity). The
    reference runs read local data, and an id records only that (not where): any folder
    stands in for it on a machine without the data."""
    monkeypatch.setenv("LINBENCH_DATA", str(tmp_path))
    ids = {run.run_id for run in load_sweep(folder.name).runs}
    orphans = sorted(p.stem for p in folder.glob("*.json") if p.stem not in ids)
    assert not orphans, f"{folder.name}: records of no current run: {orphans}"


@pytest.mark.parametrize("table", sorted(REFERENCE.glob("*/runs.csv")), ids=lambda p: p.parent.name)
def test_committed_exports_are_their_records(table, tmp_path):
    """A committed runs.csv (`linbench export`) is its folder's records as they are."""
    from results.records import export_csv
    fresh = export_csv(records_frame(load_records(table.parent)), tmp_path / "runs.csv")
    assert fresh.read_text() == table.read_text()


# Which way each task's score is better: a point's extra seeds run at its best rate by this.
BETTER = {"mqar": ("accuracy", max), "wikitext2": ("best_val_ppl", min), "snli": ("best_val_accuracy", max)}


@pytest.mark.parametrize("folder", [f for f in REPORTS if f.name in ("mqar_cpu", "wikitext2_6L_cpu", "snli_cpu")],
                         ids=lambda p: p.name)
def test_extra_seeds_run_at_the_best_rate_of_seed_0(folder, tmp_path, monkeypatch):
    """A sweep that runs a point's bracket of learning rates at seed 0 and more seeds at
    its best names that rate in the file: it must be the best rate the committed seed-0
    records show, once all of them are in (a rerun that moves the best fails here)."""
    import json

    from sweeps.spec import resolve_sweep_path, sweep_module

    monkeypatch.setenv("LINBENCH_DATA", str(tmp_path))
    scores = {r["run_id"]: r["metrics"] for r in load_records(folder) if r["status"] == "ok"}
    points: dict[str, dict] = {}  # the point (task, label, config but seed and rate) -> its runs
    for run in load_sweep(folder.name).runs:
        config = run.config.to_dict()
        seed, lr = config.pop("seed"), config["train"].pop("lr")
        key = json.dumps([run.task, run.label, config], sort_keys=True, default=str)
        point = points.setdefault(key, {"task": run.task, "label": run.label, "bracket": {}, "seeded": set()})
        if seed == 0:
            point["bracket"][lr] = run.run_id
        else:
            point["seeded"].add(lr)
    first_lr = getattr(sweep_module(resolve_sweep_path(folder.name)), "FIRST_LR", None)
    checked = 0
    for key, point in points.items():
        bracket = point["bracket"]
        if not point["seeded"] or len(bracket) < 2 or not all(i in scores for i in bracket.values()):
            continue  # no extra seeds, or the bracket is not all in: no best rate to hold them to yet
        metric, pick = BETTER[point["task"]]
        best = pick(bracket, key=lambda lr: scores[bracket[lr]][metric])
        # named by its label and the best seed-0 run's id (`linbench status` shows its config);
        # a sweep that ran every model at one rate before its bracket keeps those seeds (FIRST_LR)
        seeded = point["seeded"]
        assert best in seeded and seeded <= {best, first_lr}, (f"{folder.name} {point['label']}: extra seeds at lr "
                                                               f"{sorted(seeded)}, the best seed-0 rate is {best} "
                                                               f"(run {bracket[best]})")
        checked += 1
    if any(point["seeded"] for point in points.values()):
        assert checked, f"{folder.name}: no point with extra seeds and a complete bracket"


def test_the_compiled_decode_step_table_is_the_committed_csvs():
    """docs/performance.md's eager-against-auto decode table is step_impl_table of the
    committed CSVs, each pair made by one command apart from --step-impl."""
    import csv

    from tasks.benchmarks.decode import step_impl_table

    folder, pairs = REFERENCE / "decode_steps_cpu", []
    for name, setting in (("d256", "d 256, batch 1"), ("d1024", "d 1024, batch 16")):
        rows = {}
        for impl in ("eager", "auto"):
            with open(folder / f"{name}_{impl}.csv", newline="") as f:
                rows[impl] = list(csv.DictReader(f))
            assert rows[impl] and all(f"--step-impl {impl}" in r["command"] for r in rows[impl])
        assert {r["command"].replace("eager", "auto") for r in rows["eager"]} == {r["command"] for r in rows["auto"]}
        pairs.append((setting, rows["eager"], rows["auto"]))
    assert step_impl_table(pairs) in (ROOT / "docs" / "performance.md").read_text()


def test_the_step_forms_table_is_the_committed_csv():
    """docs/performance.md's table of the step forms is forms_table of the committed CSV,
    every row made by the one step_forms command it names."""
    import csv

    from tasks.benchmarks.step_forms import forms_table

    with open(REFERENCE / "decode_steps_cpu" / "forms_d1024_b16.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and len({r["command"] for r in rows}) == 1
    assert rows[0]["command"].startswith("python -m tasks.benchmarks.step_forms ")
    assert {r["form"] for r in rows if float(r["ratio"]) == 1.0} >= {rows[0]["form"]}
    assert forms_table(rows) in (ROOT / "docs" / "performance.md").read_text()


def _table_rows(text: str, name: str) -> dict[str, list[str]]:
    """{first cell: cells} of the headline table NAME as a page shows it."""
    body = text.split(f"<!-- headline:{name} -->\n", 1)[1].split("<!-- /headline -->", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in body.splitlines() if line.startswith("|")]
    return {row[0]: row for row in rows[2:]}


def test_the_lm_tables_total_is_zoos_count_of_each_records_model():
    """The README's Wikitext-2 table shows, beside the count the models are matched on (no
    embeddings), the total with tied embeddings: both are zoo's count of the model each
    record's config builds, at the vocabulary it trained with."""
    import json

    from zoo import ModelConfig, config_params

    rows = _table_rows((ROOT / "README.md").read_text(), "wikitext2_cpu")
    header = (ROOT / "README.md").read_text().split("<!-- headline:wikitext2_cpu -->\n", 1)[1].splitlines()[0]
    cells = [c.strip() for c in header.strip().strip("|").split("|")]
    matched, total = cells.index("params w/o embeddings (matched)"), cells.index("params total")
    seen = set()
    for path in sorted((REFERENCE / "wikitext2_cpu").glob("*.json")):
        record = json.loads(path.read_text())
        label = record.get("label") or record["config"]["model"]["mixer"]
        if record["status"] != "ok" or label not in rows or label in seen:
            continue
        seen.add(label)
        cfg = ModelConfig(**{**record["config"]["model"], "vocab_size": record["metrics"]["vocab_size"]})
        assert rows[label][total] == f"{config_params(cfg) / 1e6:.2f}M", label
        assert rows[label][matched] == f"{config_params(cfg, include_embeddings=False) / 1e6:.2f}M", label
        # tied embeddings are most of a 2-layer model: the totals are what differ, not the matched counts
        assert config_params(cfg) > 2 * config_params(cfg, include_embeddings=False)
    assert rows and seen == set(rows)


def test_the_recall_findings_count_the_seeds_that_solve_from_the_records():
    """The results page's MQAR findings say how many seeds of a point reach 0.99: counted
    here from the records themselves (per seed the best accuracy over the learning rates)."""
    import json

    best: dict[tuple, float] = {}
    for path in (REFERENCE / "mqar_cpu").glob("*.json"):
        record = json.loads(path.read_text())
        if record["status"] != "ok" or (record.get("label") or "") != "grassmann+attention":
            continue
        m = record["metrics"]
        key = (m["seq_len"], m["d_model"], m["seed"])
        best[key] = max(best.get(key, 0.0), m["accuracy"])
    L = max(k[0] for k in best)
    seeds = [acc for (length, d, _), acc in best.items() if length == L and d == max(k[1] for k in best)]
    assert len(seeds) > 1  # a point with several seeds: the count is what the mean alone hides
    row = _table_rows(RESULTS_PAGE.read_text(), "mqar_cpu_findings")[
        "one attention layer gives the Grassmann stack recall (≥ 0.99 at the largest width)"]
    n = len(seeds)
    assert f"L {L} {sum(a >= 0.99 for a in seeds)} of {n} seeds" in row[-1]
    assert f"({n}; {sum(a >= 0.99 for a in seeds)} ≥ 0.99)" in row[2]


def test_the_flat_decoding_sentence_counts_from_the_records():
    """The hand-written decoding sentence (results page and README) says in how many
    fixed-state mixer-settings the time per token stays within 1.5x from 1,024 tokens to the
    longest context, and the results page names each exception's ratio: both counted here
    from the decode_cpu records."""
    from results.paper.decoding import decode_flat
    from results.paper.headline import _decode_points

    points = _decode_points(records_frame(load_records(REFERENCE / "decode_cpu")))
    within, total, others = decode_flat(points)
    assert total > within > 0
    results, readme = (" ".join(p.read_text().split()) for p in (RESULTS_PAGE, ROOT / "README.md"))
    assert f"within 1.5x in {within} of {total} mixer-settings" in results
    assert f"within 1.5x in {within} of {total} mixer-settings" in readme
    bullet = results[results.index(f"{within} of {total} mixer-settings"):][:800]
    for (d, _, _), ratio in others.items():
        assert f"{ratio:.2f}x" in bullet and f"d {d}" in bullet
