"""Figures: each is drawn from the CSV of points saved beside it, so the tests read those
CSVs. Every model is read as the tables read it (its chosen learning rate, its seeds at
that rate), each mixer has one look in every figure, and several sweeps draw on one."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from results import plots
from results.records import load_records, records_frame, write_record
from results.report import _fmt
from results.style import MIXERS, look, looks, split_label
from sweeps.cli import main as cli
from test_results import FLOPS_PER_TOKEN, rec, synthetic_frame

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "results" / "reference"
FIGURE_DIRS = sorted(p for p in REFERENCE.glob("*/plots") if any(p.glob("*.png")))


def points(folder: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(folder / name.replace(".png", ".csv"))


# --- the rule every figure reads by -----------------------------------------------------

def lm_records(values: dict, extra: dict | None = None) -> list[dict]:
    """Wikitext-2 records: ``values`` {(label, lr): [best val ppl per seed]}, test ppl
    the same plus 1."""
    out = []
    for (label, lr), ppls in values.items():
        for seed, ppl in enumerate(ppls):
            metrics = {"best_val_ppl": ppl, "test_ppl": ppl + 1, "params": 1e6, "setting": "2L/128",
                       "mixer": label, **(extra or {})}
            out.append(rec(f"{label}{lr}{seed}", "wikitext2", metrics, label=label, mixer=label, seed=seed,
                           train={"lr": lr}))
    return out


def test_lm_figures_read_each_model_at_its_chosen_rate_not_pooled(tmp_path):
    # attention's bracket: 2e-3 wins on seed 0 and runs 3 seeds; pooled, 1e-3's 300 would drag it up
    frame = records_frame(lm_records({("attention", 1e-3): [300.0], ("attention", 2e-3): [100.0, 102.0, 104.0],
                                      ("grassmann", 1e-3): [110.0, 111.0, 112.0]}))
    plots.plot_lm_comparison(frame, tmp_path)
    drawn = points(tmp_path, "wikitext2_perplexity_by_model.png")
    val = drawn[drawn["panel"] == "2L/128 best validation perplexity"].set_index("label")
    assert val.at["attention", "y"] == pytest.approx(102.0) and val.at["attention", "seeds"] == 3
    assert val.at["grassmann", "gap"] > 0  # worse than attention: pooling would read it as better
    assert val.at["attention", "lo"] < 102.0 < val.at["attention", "hi"]
    assert list(val.index) == ["attention", "grassmann"]  # best first
    assert val.at["attention", "entry"] == "attention, 3 seeds"


def test_lr_bracket_figure_shows_every_rate_and_rings_the_chosen_one(tmp_path):
    frame = records_frame(lm_records({("attention", 1e-3): [300.0], ("attention", 2e-3): [100.0, 102.0],
                                      ("mamba", 1e-3): [120.0]}))
    plots.plot_lr_bracket(frame, tmp_path)
    drawn = points(tmp_path, "wikitext2_lr_bracket.png")
    assert drawn[["label", "x", "y", "chosen"]].values.tolist() == [["attention", 1e-3, 300.0, False],
                                                                    ["attention", 2e-3, 100.0, True]]
    assert plots.plot_lr_bracket(records_frame(lm_records({("mamba", 1e-3): [1.0]})), tmp_path) is None


def test_matched_sizes_are_not_drawn_against_parameters(tmp_path):
    frame = records_frame(lm_records({("attention", 1e-3): [100.0], ("mamba", 1e-3): [90.0]}))
    assert plots.plot_perplexity(frame, tmp_path) is None  # 1M and 1M: the comparison figure says it
    bigger = records_frame(lm_records({("attention", 1e-3): [100.0]}) +
                           lm_records({("mamba", 1e-3): [90.0]}, {"params": 4e6}))
    assert plots.plot_perplexity(bigger, tmp_path).name == "wikitext2_perplexity_vs_params.png"


def test_lm_curves_are_seed_means_over_training_tokens(tmp_path):
    plots.plot_lm_curves(synthetic_frame(), tmp_path)
    drawn = points(tmp_path, "wikitext2_val_ppl_vs_tokens.png")
    # steps 10 and 20 at 4 x 8 tokens a step; seeds 0..2 averaged
    curves = {label: (list(g["x"]), list(g["y"])) for label, g in drawn.groupby("label")}
    assert curves == {"attention": ([320, 640], [310.0, 280.0]), "mamba": ([320, 640], [310.0, 285.0])}
    assert set(drawn["seeds"]) == {3}


def test_lm_curves_against_flops_name_each_models_flops_per_token(tmp_path):
    df = synthetic_frame()
    assert [p.name for p in plots.plot_lm_curves(df, tmp_path)] == ["wikitext2_val_ppl_vs_tokens.png",
                                                                    "wikitext2_val_ppl_vs_flops.png"]
    drawn = points(tmp_path, "wikitext2_val_ppl_vs_flops.png")
    for label, grp in drawn.groupby("label"):
        assert list(grp["x"]) == [t * FLOPS_PER_TOKEN[label] for t in (320.0, 640.0)]
    old = df.copy()  # one run from before records carried the field: tokens only
    old.loc[old.index[old["task"] == "wikitext2"][0], "train_flops_per_token"] = np.nan
    assert [p.name for p in plots.plot_lm_curves(old, tmp_path)] == ["wikitext2_val_ppl_vs_tokens.png"]


def test_mqar_points_are_the_best_lr_per_seed_then_the_seed_mean(tmp_path):
    df = synthetic_frame()
    plots.plot_mqar(df, tmp_path)
    plots.plot_mqar_state(df, tmp_path)
    m = df[df["task"] == "mqar"]
    best = m.groupby(["mixer", "d_model", "seq_len", "seed"])["accuracy"].max()
    expect = best.groupby(["mixer", "seq_len", "d_model"]).mean()
    for name in ("mqar_accuracy_vs_d_model.png", "mqar_accuracy_vs_state_size.png"):
        drawn = points(tmp_path, name)
        assert set(drawn["panel"]) == {"L = 64, 4 kv pairs", "L = 256, 4 kv pairs"}
        for _, p in drawn.iterrows():
            L = int(p["panel"].split("=")[1].split(",")[0])
            d = p["x"] if name.endswith("d_model.png") else p["d_model"]
            assert p["y"] == pytest.approx(expect[p["label"], L, d]) and p["seeds"] == 3
    state = points(tmp_path, "mqar_accuracy_vs_state_size.png")
    assert set(state.loc[state["label"] == "mamba", "x"]) == {500}  # two widths, one state: both drawn
    # a control run at one of the two lengths stays out of the figure (the tables read it)
    control = m[(m["mixer"] == "mamba") & (m["seq_len"] == 64)].assign(mixer="mamba", label="mamba control")
    plots.plot_mqar_state(pd.concat([df, control]), tmp_path)
    assert set(points(tmp_path, "mqar_accuracy_vs_state_size.png")["label"]) == {"attention", "mamba"}


def test_scaling_points_are_seed_means_and_oom_is_marked(tmp_path):
    plots.plot_scaling(synthetic_frame(), tmp_path)
    drawn = points(tmp_path, "scaling_latency_vs_L.png")
    ok = drawn[drawn["status"] == "ok"]
    assert sorted(ok["y"].round(6)) == [2.56, 2.56, 5.12, 5.12]  # (1.28 + 2.56 + 3.84) / 3 at L=128
    failed = drawn[drawn["status"] == "oom"]
    assert failed[["label", "x"]].values.tolist() == [["attention", 4096]] and failed["y"].isna().all()


def test_mad_bars_are_the_best_of_sweep_per_task_and_the_score(tmp_path):
    rows = pd.DataFrame([{"task": "mad", "run_status": "ok", "label": label, "mad_task": task, "setting": task,
                          "lr": lr, "weight_decay": 0.0, "accuracy": acc, "seed": 0}
                         for label, task, lr, acc in (("a", "copy", 1e-3, 0.9), ("a", "copy", 1e-4, 0.1),
                                                      ("a", "recall", 1e-3, 0.5), ("b", "copy", 1e-3, 0.2),
                                                      ("b", "recall", 1e-3, 0.4))])
    plots.plot_mad(rows, tmp_path)
    drawn = points(tmp_path, "mad_accuracy_by_task.png")
    assert sorted(drawn["y"].round(6)) == [0.2, 0.3, 0.4, 0.5, 0.7, 0.9]
    assert plots.plot_mad(rows.assign(task="mqar"), tmp_path) is None  # no MAD runs: no figure


def test_mad_figure_sets_ours_against_the_published_scores(tmp_path):
    rows = pd.DataFrame([{"task": "mad", "run_status": "ok", "label": label, "mad_task": task, "setting": task,
                          "lr": 1e-3, "weight_decay": 0.0, "accuracy": acc, "seed": 0}
                         for label, task, acc in (("attention", "copy", 0.9), ("attention", "recall", 0.5),
                                                  ("mamba", "copy", 0.3), ("grassmann", "copy", 0.1))])
    published = pd.DataFrame([{"task": "mad", "model": model, "mixer": mixer, "setting": task, "value": v}
                              for model, mixer, c, r in (("Transformer", "attention", 1.0, 0.8),
                                                         ("Mamba", "mamba", 0.6, 0.4), ("Hyena", "grassmann", 0.2, 0.2))
                              for task, v in (("copy", c), ("recall", r), ("average", (c + r) / 2))])
    plots.plot_mad_published(rows, tmp_path, published)
    drawn = points(tmp_path, "mad_vs_published.png")
    # (published, ours) per mixer both have and task both ran; the MAD score only where we ran
    # every task the published one averages (mamba and grassmann lack recall)
    tasks = drawn[drawn["task"] != "MAD score"]
    assert sorted(map(tuple, tasks[["x", "y"]].round(6).values.tolist())) == [
        (0.2, 0.1), (0.6, 0.3), (0.8, 0.5), (1.0, 0.9)]
    assert drawn.loc[drawn["task"] == "MAD score", ["x", "y"]].round(6).values.tolist() == [[0.9, 0.7]]
    assert plots.plot_mad_published(rows, tmp_path, None) is None
    assert plots.plot_mad_published(rows.assign(label="gla"), tmp_path, published) is None


def test_plot_all_writes_other_formats_beside_each_png(tmp_path):
    paths = plots.plot_all(synthetic_frame(), tmp_path, formats=("svg",))
    assert paths and all(p.with_suffix(".svg").is_file() and p.with_suffix(".csv").is_file() for p in paths)


# --- one look per mixer -----------------------------------------------------------------

def test_each_mixer_has_one_colour_and_marker_and_variants_differ_in_line_only():
    assert len({c for c, _ in MIXERS.values()}) == len(MIXERS)  # colours differ between mixers
    assert len({m for _, m in MIXERS.values()}) == len(MIXERS)  # and so do markers
    base, reading = look("grassmann"), look("grassmann gated_residual")
    assert (base.colour, base.marker) == (reading.colour, reading.marker) and base.linestyle != reading.linestyle
    hybrid = look("grassmann+attention")
    assert hybrid.colour == base.colour and hybrid.marker == look("attention").marker
    assert split_label("grassmann odd offsets") == (["grassmann"], "odd offsets")
    mine = look("my_mixer")  # a mixer outside the zoo: the same look from its name, every time
    assert mine == look("my_mixer") and mine.colour not in {c for c, _ in MIXERS.values()} - {"#AA4499"}
    variants = looks(["grassmann a", "grassmann b", "grassmann c", "grassmann d"])  # never two alike
    assert len({v.linestyle for v in variants.values()}) == 4


def test_every_reference_figure_gives_each_mixer_the_same_look():
    seen = {}
    for folder in FIGURE_DIRS:
        for csv in folder.glob("*.csv"):
            for _, p in pd.read_csv(csv).drop_duplicates("label").iterrows():
                parts, _ = split_label(p["label"])
                if len(parts) == 1 and parts[0] in MIXERS:
                    seen.setdefault(parts[0], set()).add((p["colour"], p["marker"]))
    assert seen and all(len(v) == 1 for v in seen.values()), seen


# --- several sweeps on one figure -------------------------------------------------------

def test_plot_draws_two_sweeps_on_one_figure(tmp_path, capsys):
    for name, shift in (("mine", 0.0), ("theirs", 50.0)):
        for r in lm_records({("attention", 1e-3): [100.0 + shift, 101.0 + shift],
                             (f"only_{name}", 1e-3): [90.0]}):
            write_record(tmp_path / name / f"{r['run_id']}.json", r)
    out = tmp_path / "out"
    assert cli(["plot", str(tmp_path / "mine"), str(tmp_path / "theirs"), "--out", str(out)]) == 0
    drawn = points(out, "wikitext2_perplexity_by_model.png")
    assert set(drawn["label"]) == {"attention [mine]", "attention [theirs]", "only_mine", "only_theirs"}
    both = drawn.drop_duplicates("label").set_index("label")
    assert both.at["attention [mine]", "colour"] == both.at["attention [theirs]", "colour"]  # one mixer ...
    assert both.at["attention [mine]", "linestyle"] != both.at["attention [theirs]", "linestyle"]  # ... two sweeps


# --- the committed figures are their records, and agree with their tables ---------------

@pytest.mark.parametrize("folder", FIGURE_DIRS, ids=lambda p: p.parent.name)
def test_reference_figures_are_their_records(folder, tmp_path):
    """Each committed PNG has its CSV, and redrawing from the records gives the same
    figures with the same points."""
    pngs = {p.stem for p in folder.glob("*.png")}
    assert pngs == {p.stem for p in folder.glob("*.csv")}
    fresh = plots.plot_all(records_frame(load_records(folder.parent)), tmp_path, ROOT / "tasks" / "published.csv")
    assert {p.stem for p in fresh} == pngs
    for path in fresh:
        pd.testing.assert_frame_equal(pd.read_csv(path.with_suffix(".csv")), points(folder, path.name),
                                      check_exact=False, rtol=1e-9)


def _cells(table: str) -> dict[str, list[str]]:
    """A Markdown table's rows by their first cell."""
    lines = [line for line in table.splitlines() if line.startswith("|")][2:]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)}


def _number(cell: str) -> float:
    return float(re.match(r"[−+-]?[\d.,]+", cell).group().replace(",", "").replace("−", "-"))


@pytest.mark.parametrize("sweep", ["wikitext2_cpu", "wikitext2_6L_cpu"])
def test_lm_figure_numbers_are_the_headline_tables(sweep):
    from results.paper.headline import lm_table
    text = lm_table(records_frame(load_records(REFERENCE / sweep)))
    table = _cells(text)
    # columns by their header, not their place: the table gains columns
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")][1:]
    at = {name: header.index(name) for name in ("seeds", "best val ppl", "test ppl")}
    gap = next(i for i, name in enumerate(header) if name.startswith("val ppl vs attention"))
    drawn = points(REFERENCE / sweep / "plots", "wikitext2_perplexity_by_model.png")
    for metric, column in (("best_val_ppl", at["best val ppl"]), ("test_ppl", at["test ppl"])):
        mine = drawn[drawn["metric"] == metric].set_index("label")
        assert set(mine.index) == set(table)
        for label, cells in table.items():
            assert round(mine.at[label, "y"], 1) == _number(cells[column])
            assert mine.at[label, "seeds"] == int(cells[at["seeds"]])
    val = drawn[drawn["metric"] == "best_val_ppl"].set_index("label")
    for label, cells in table.items():
        if cells[gap] == "0":  # a control (attention in its block): no gap drawn
            assert math.isnan(val.at[label, "gap"]) and label.startswith("attention")
        else:  # the gap column: "+22.3 % [+20.7 %, +23.9 %]"
            assert f"{100 * val.at[label, 'gap']:+.1f} %".replace("-", "−") == cells[gap].split(" [")[0]


def test_mqar_figure_numbers_are_the_headline_table():
    from results.paper.findings import mqar_best
    best = mqar_best(records_frame(load_records(REFERENCE / "mqar_cpu"))).set_index(["label", "seq_len", "d_model"])
    drawn = points(REFERENCE / "mqar_cpu" / "plots", "mqar_accuracy_vs_d_model.png")
    assert len(drawn) > 20
    for _, p in drawn.iterrows():
        L = int(p["panel"].split("=")[1].split(",")[0])
        row = best.loc[(p["label"], L, p["x"])]
        assert p["y"] == pytest.approx(row["accuracy"]) and p["seeds"] == row["seeds"]


def test_mad_figure_numbers_are_the_headline_table():
    from results.paper.headline import mad_table
    table = _cells(mad_table(records_frame(load_records(REFERENCE / "mad_cpu"))))
    header = [c.strip() for c in mad_table(records_frame(load_records(REFERENCE / "mad_cpu"))).splitlines()[0]
              .strip("|").split("|")][1:]
    drawn = points(REFERENCE / "mad_cpu" / "plots", "mad_accuracy_by_task.png")
    assert len(drawn) >= 9 * 7
    for _, p in drawn.iterrows():
        assert f"{p['y']:.3f}" == table[f"{p['label']} (ours)"][header.index(p["x"])].rstrip("*")


def test_decode_figure_numbers_are_the_headline_table():
    from results.paper.headline import decode_table
    text = decode_table(records_frame(load_records(REFERENCE / "decode_cpu")))
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    table = _cells(text)
    drawn = points(REFERENCE / "decode_cpu" / "plots", "decode_time_vs_context.png")
    drawn = drawn[drawn["status"] == "ok"]
    checked = 0
    for column, title in enumerate(header[1:-1]):
        d, b = map(int, re.match(r"d (\d+), batch (\d+)", title).groups())
        at = drawn[drawn["panel"] == f"d_model {d}, batch {b}"]
        for label, cells in table.items():
            mine = at[at["label"] == label].set_index("x")["y"]
            first, last = (float(v) for v in re.findall(r"[\d.]+", cells[column])[:2])
            assert (round(mine[1024], 2), round(mine[mine.index.max()], 2)) == (first, last)
            checked += 1
    assert checked == 4 * 9


def test_lm_figures_of_every_reference_sweep_match_its_report():
    """The report's Wikitext-2 table and the comparison figure read the same runs: each
    label's test perplexity and seeds agree, for every reference sweep that has one."""
    checked = 0
    for folder in FIGURE_DIRS:
        if not (folder / "wikitext2_perplexity_by_model.csv").is_file():
            continue
        section = (folder.parent / "report.md").read_text().split("## wikitext2")[1].split("\n## ")[0].split("\n### ")[0]
        header = next(line for line in section.splitlines() if line.startswith("|"))
        names = [c.strip() for c in header.strip("|").split("|")]
        table = _cells(section)
        drawn = points(folder, "wikitext2_perplexity_by_model.png")
        drawn = drawn[drawn["metric"] == "test_ppl"].set_index("label")
        for label, cells in table.items():
            cell = cells[names.index("test_ppl") - 1]
            assert _fmt(drawn.at[label, "y"]) == cell.split(" ±")[0], (folder, label)
            assert drawn.at[label, "seeds"] == int(cells[names.index("seeds") - 1]), (folder, label)
            checked += 1
    assert checked >= 20


def test_records_with_a_model_json_still_read_their_mixer():
    # a hybrid's look comes from its label; a control labelled apart from its mixer from the record's mixer
    frame = records_frame([rec("a", "wikitext2", {"best_val_ppl": 1.0, "test_ppl": 1.0}, label="control x",
                               mixer="grassmann")])
    assert json.loads(frame["model_json"].iloc[0])["mixer"] == "grassmann"
    assert look("control x", "grassmann").colour == MIXERS["grassmann"][0]


def _report_rows(folder: Path, task: str, title: str = "") -> tuple[list[str], list[list[str]]]:
    """The header and rows of the report's table for ``task`` (the one after ``title``)."""
    section = (folder / "report.md").read_text().split(f"## {task}\n")[1].split("\n## ")[0]
    section = section.split(title, 1)[1] if title else section
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    rows = rows[:next((i for i, r in enumerate(rows) if r[0] == header[0]), len(rows))]
    return header, rows


def test_mqar_and_benchmark_figures_of_every_reference_sweep_match_its_report():
    """Every MQAR point and every scaling and decode point drawn is the number its
    sweep's report gives (to the report's four digits), for each reference sweep."""
    checked = 0
    for folder in FIGURE_DIRS:
        sweep = folder.parent
        if (folder / "mqar_accuracy_vs_d_model.csv").is_file():
            header, rows = _report_rows(sweep, "mqar")
            cell = {(r[0], int(r[1]), int(r[header.index("d_model")])): r[header.index("accuracy")] for r in rows}
            for _, p in points(folder, "mqar_accuracy_vs_d_model.png").iterrows():
                L = int(p["panel"].split("=")[1].split(",")[0])
                assert _fmt(p["y"]) == cell[p["label"], L, p["x"]].split(" ±")[0], (sweep.name, p["label"], L)
                checked += 1
        for name, task, title in (("decode_time_vs_context.png", "decode", "median time per generated token"),
                                  ("scaling_latency_vs_L.png", "scaling", "median latency")):
            if not (folder / name.replace(".png", ".csv")).is_file():
                continue
            header, rows = _report_rows(sweep, task, title)
            keys = header[:header.index(next(h for h in header if "=" in h))]
            drawn = points(folder, name)
            for _, p in drawn[drawn["status"] == "ok"].iterrows():
                facets = dict(part.split(" ") for part in p["panel"].split(", ")) if isinstance(p["panel"], str) else {}
                row = next(r for r in rows if r[0] == p["label"] and all(
                    float(r[keys.index(k)]) == float(v) if k in ("d_model", "batch") else r[keys.index(k)] == v
                    for k, v in facets.items() if k in keys))
                column = next(h for h in header if h.endswith(f"={int(p['x'])}"))
                assert _fmt(p["y"]) == row[header.index(column)].split(" ±")[0], (sweep.name, name, p["label"])
                checked += 1
    assert checked >= 100


def test_extrapolation_and_published_mad_figures_are_their_headline_tables():
    from results.paper.headline import extrapolation_table, mad_table
    text = extrapolation_table(records_frame(load_records(REFERENCE / "extrapolation_cpu")))
    drawn = points(REFERENCE / "extrapolation_cpu" / "plots", "wikitext2_ppl_by_position.png")
    table = _cells(text)
    assert set(drawn["label"]) == set(table)
    for label, cells in table.items():
        mine = drawn[drawn["label"] == label]
        assert f"{mine.loc[mine['x'].idxmax(), 'y']:.1f}" == cells[-2]  # the last bucket of the longest contexts
    mad = mad_table(records_frame(load_records(REFERENCE / "mad_cpu")))
    header = [c.strip() for c in mad.splitlines()[0].strip("|").split("|")][1:]
    table = _cells(mad)
    pairs = points(REFERENCE / "mad_cpu" / "plots", "mad_vs_published.png")
    published = {mixer: model for model, mixer in (("Transformer", "attention"), ("Mamba", "mamba"), ("GLA", "gla"))}
    checked = 0
    for _, p in pairs[pairs["label"].isin(published)].iterrows():
        column = header.index(p["task"])
        assert f"{p['y']:.3f}" == table[f"{p['label']} (ours)"][column].rstrip("*")
        assert f"{p['x']:.3f}" == table[f"{published[p['label']]} (MAD)"][column]
        checked += 1
    assert checked >= 3 * 6
