"""results.paper.figure: the headline figure's points are the headline tables' numbers.

Our points are checked against ``gap_interval`` over ``chosen`` rows of the committed
records and against ``lm_table``'s printed gaps (figure against table); the published ones
against their source's two perplexities in published.csv; and a small synthetic frame
against rows worked out by hand."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from results.paper import figure
from results.paper.headline import REFERENCE, lm_table
from results.plots import save_figure
from results.records import load_records, records_frame
from results.stats import chosen, gap_interval, read_published

CSV = REFERENCE / "headline" / "gap_to_attention.csv"


@pytest.fixture(scope="module")
def drawn() -> pd.DataFrame:
    return pd.read_csv(CSV, dtype={"panel": str})


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok")]


def test_the_committed_figure_is_what_the_records_draw(tmp_path, drawn):
    """`linbench headline` redraws it; a record or published row added without redrawing fails here."""
    fresh = pd.read_csv(figure.gap_figure(tmp_path).with_suffix(".csv"), dtype={"panel": str})
    pd.testing.assert_frame_equal(fresh, drawn)
    assert (tmp_path / "gap_to_attention.png").stat().st_size > 10_000


@pytest.mark.parametrize("sweep", figure.SWEEPS)
def test_our_points_are_the_gap_over_the_chosen_runs(sweep, drawn):
    frame = records_frame(load_records(REFERENCE / sweep))
    rows = chosen(_ok(frame), "wikitext2")
    labels = sorted(label for label in rows["label"].unique() if label.startswith("grassmann"))
    ours = drawn[drawn["source"] == sweep].set_index("reading")
    assert sorted(ours.index) == labels and len(labels) >= 2
    lines = lm_table(frame).splitlines()
    column = [c.strip() for c in lines[0].strip("|").split("|")].index("val ppl vs attention [95 % CI]")
    table = {cells[0]: cells[column] for cells in
             ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}
    for label in labels:
        # each reading against attention in its own block: the pre-LN blend against pre-LN attention
        control = "attention pre-LN" if "pre-LN" in label else "attention"
        base = rows.loc[rows["label"] == control, "best_val_ppl"].tolist()
        mine = rows.loc[rows["label"] == label, "best_val_ppl"].tolist()
        gap, low, high = gap_interval(mine, base)
        point = ours.loc[label]
        assert point["x"] == pytest.approx(100 * gap, rel=1e-12)
        assert (point["seeds"], point["attention_seeds"]) == (len(mine), len(base))
        if low is None:
            assert math.isnan(point["lo"]) and math.isnan(point["hi"]) and "no interval" in point["label"]
        else:
            assert (point["lo"], point["hi"]) == pytest.approx((100 * low, 100 * high), rel=1e-12)
            assert f"{len(mine)} vs {len(base)} seeds" in point["label"]
        # figure against table: the headline prints the same gap
        assert table[label].startswith(f"{100 * gap:+.1f} %".replace("-", "−"))


def test_the_six_layer_readings_are_the_headline_numbers(drawn):
    six = drawn[drawn["source"] == "wikitext2_6L_cpu"].set_index("reading")
    shown = {label: (round(r.x, 1), None if math.isnan(r.lo) else (round(r.lo, 1), round(r.hi, 1)))
             for label, r in six.iterrows()}
    assert shown == {"grassmann": (22.3, (20.7, 23.9)), "grassmann gated_residual": (10.4, (9.5, 11.3)),
                     "grassmann pre-LN": (0.0, (-6.7, 7.2))}  # against pre-LN attention's three seeds
    assert six.loc["grassmann pre-LN", "seeds"] == 2 and "2 vs 3 seeds" in six.loc["grassmann pre-LN", "label"]


def test_every_published_point_is_its_sources_ratio(drawn):
    pub = read_published()
    pub = pub[pub["task"] == "wikitext2"]
    points = drawn[~drawn["filled"]]
    expected = set()
    for (source, setting), grp in pub[pub["setting"].isin(figure.PUBLISHED_SETTINGS)].groupby(["source", "setting"]):
        val = grp[grp["split"] == "validation"].groupby("mixer")["value"].first()
        if {"attention", "grassmann"} <= set(val.index):
            expected.add((source, setting))
            point = points[(points["source"] == source) & (points["panel"] == setting)]
            assert len(point) == 1 and point["split"].item() == "validation"
            assert point["x"].item() == pytest.approx(100 * (val["grassmann"] / val["attention"] - 1), rel=1e-12)
            assert point["colour"].item() == figure.GREY and math.isnan(point["lo"].item())
    assert set(zip(points["source"], points["panel"])) == expected
    youdie = points[(points["source"] == "youdie006/grassmann") & (points["panel"] == "12L/256")]
    assert round(youdie["x"].item(), 2) == -8.24 and "pre-norm" in youdie["label"].item()
    # a distinct marker per source, kept across settings
    assert (points.groupby("source")["marker"].nunique() == 1).all()
    assert points.groupby("marker")["source"].nunique().max() == 1


def _config(mixing="blend", block="postnorm", hybrid=None) -> str:
    return json.dumps({"block": block, "mixer_options": {"impl": "factored", **({"mixing": mixing} if mixing != "blend" else {})},
                       "hybrid": hybrid or {}})


def _run(label, mixer, seed, val, lr=1e-3, setting="2L/128", **config):
    return {"task": "wikitext2", "run_status": "ok", "label": label, "mixer": mixer, "seed": seed, "setting": setting,
            "best_val_ppl": val, "config.train.lr": lr, "epochs_seen": 0.5, "model_json": _config(**config),
            "config.model.block": config.get("block", "postnorm")}


def test_a_small_frame_gives_the_rows_worked_out_by_hand(tmp_path):
    frame = pd.DataFrame([
        _run("attention", "attention", 0, 100.0), _run("attention", "attention", 1, 104.0),
        _run("attention", "attention", 0, 90.0, lr=2e-3),  # the better rate, on seed 0 alone
        _run("attention", "attention", 1, 92.0, lr=2e-3),
        _run("grassmann", "grassmann", 0, 110.0), _run("grassmann", "grassmann", 1, 112.0),
        _run("grassmann pre-LN", "grassmann", 0, 120.0, block="prenorm"),
        _run("attention pre-LN", "attention", 0, 100.0, block="prenorm"),  # the pre-LN blend's control
        _run("grassmann+attention", "grassmann+attention", 0, 95.0,
             hybrid={"mixer": "attention", "every": 2}),
        _run("mamba2", "mamba2", 0, 80.0),  # not a Grassmann model: not drawn
        {**_run("grassmann", "grassmann", 2, 50.0), "run_status": "failed"},  # not a result
    ])
    rows = figure.our_gaps(frame, "toy")
    assert [r["reading"] for r in rows] == ["grassmann", "grassmann pre-LN", "grassmann+attention"]
    base = [90.0, 92.0]  # attention at its chosen rate, 2e-3
    by = {r["reading"]: r for r in rows}
    gap, low, high = gap_interval([110.0, 112.0], base)
    assert (by["grassmann"]["x"], by["grassmann"]["lo"], by["grassmann"]["hi"]) == pytest.approx(
        (100 * gap, 100 * low, 100 * high))
    assert by["grassmann"]["label"] == "ours, 0.5 epochs: paper's block (blend, post-LN), 2 vs 2 seeds"
    assert by["grassmann pre-LN"]["x"] == pytest.approx(100 * (120 / 100 - 1))  # not post-LN attention's 90, 92
    assert by["grassmann pre-LN"]["lo"] is None
    assert by["grassmann pre-LN"]["label"] == "ours, 0.5 epochs: blend, pre-LN, 1 seed vs 1: no interval"
    # without a control in its block a reading is not drawn at all
    alone = figure.our_gaps(frame[frame["label"] != "attention pre-LN"], "toy")
    assert "grassmann pre-LN" not in [r["reading"] for r in alone]
    assert "attention in 1 of every 2 layers" in by["grassmann+attention"]["label"]
    assert by["grassmann+attention"]["marker"] != by["grassmann"]["marker"]  # the hybrid's look


def test_published_points_and_the_drawing_order(tmp_path):
    published = pd.DataFrame([
        {"task": "wikitext2", "source": "a", "setting": "12L/256", "mixer": m, "split": "validation", "value": v,
         "note": "pre-norm"} for m, v in (("attention", 200.0), ("grassmann", 180.0))] + [
        {"task": "wikitext2", "source": "b", "setting": "6L/128", "mixer": m, "split": "test", "value": v, "note": ""}
        for m, v in (("attention", 100.0), ("grassmann", 125.0), ("grassmann", 999.0))] + [
        {"task": "wikitext2", "source": "c", "setting": "6L/128", "mixer": "attention", "split": "validation",
         "value": 1.0, "note": ""}])  # c gives no Grassmann number: no point
    pub = figure.published_points(published)
    assert [(p["source"], p["panel"], round(p["x"], 6)) for p in pub] == [("b", "6L/128", 25.0), ("a", "12L/256", -10.0)]
    assert pub[0]["label"] == "published: b (test split)" and pub[1]["label"] == "published: a (pre-norm)"
    ours = figure.our_gaps(pd.DataFrame([_run("attention", "attention", 0, 100.0), _run("grassmann", "grassmann", 0, 101.0)]),
                           "toy")
    points = figure.gap_points(ours, pub)
    # 2L before 6L before 12L (not text order), one heading row above each group
    assert list(zip(points["panel"], points["y"])) == [("2L/128", 1), ("6L/128", 3), ("12L/256", 5)]
    path = save_figure(figure._draw(points), tmp_path / "gap.png", points)
    assert path.is_file() and len(pd.read_csv(path.with_suffix(".csv"))) == 3
