"""The headline figure: the paper's question in one picture. How far behind attention is
the Grassmann mixer, in Wikitext-2 validation perplexity, in our reference sweeps and in
the published reproductions?

A forest plot, one row per (layers/context, reading of the block, source), grouped by
layers/context. Our points are filled, in the mixer's look (``results.style.look``), with
their 95 % Welch interval over seeds (``stats.gap_interval``) at each model's learning rate
chosen on validation (``stats.chosen``), each against attention built the same way
(``stats.block_attention``: a pre-LN reading against pre-LN attention): the numbers of
``headline.lm_table``. Published
points are hollow and grey, a marker per source, each gap against the source's own
Transformer (``findings.published_gap_rows``). The band is the paper's claimed 10–15 %.

The CSV beside the PNG (``plots.save_figure``) holds the points as drawn: ``x`` the gap in
% (ratio of geometric-mean perplexities minus 1, times 100), ``lo``/``hi`` its interval in
% (empty for a single seed and for published points), ``y`` the row (0 at the top),
``panel`` the layers/context, ``seeds`` the Grassmann seeds and ``attention_seeds`` the
attention seeds it is read against (ours only).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, as every figure of the suite
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from ..plots import save_figure  # noqa: E402
from ..records import load_records, records_frame  # noqa: E402
from ..stats import block_attention, chosen, gap_interval, read_published  # noqa: E402
from ..style import look  # noqa: E402
from .findings import published_gap_rows  # noqa: E402
from .headline import REFERENCE  # noqa: E402

SWEEPS = ("wikitext2_cpu", "wikitext2_6L_cpu")  # the reference sweeps running Grassmann beside attention
PUBLISHED_SETTINGS = ("6L/128", "6L/256", "12L/256")  # the paper's two tables and Infatoshi's context
OUT = REFERENCE / "headline"
CLAIM = (10.0, 15.0)  # the paper's claimed gap to the Transformer, %
GREY = "#777777"
SOURCE_MARKERS = ("s", "^", "v", "<", ">", "p", "h", "*")  # hollow, so unlike our filled points


def _reading(model_json: str) -> str:
    """How a record's model reads the Grassmann block, from its config: the mixing (the
    paper's blend or the gated residual), the block (post- or pre-LN) and any attention
    layers of a hybrid. Read from the config, not the label, so a label cannot mislead."""
    cfg = json.loads(model_json)
    blend = cfg.get("mixer_options", {}).get("mixing", "blend") == "blend"
    block = "pre-LN" if cfg.get("block") == "prenorm" else "post-LN"
    text = f"paper's block (blend, {block})" if blend and block == "post-LN" else \
        f"{'blend' if blend else 'gated residual'}, {block}"
    hybrid = cfg.get("hybrid") or {}
    return text + (f"; {hybrid['mixer']} in 1 of every {hybrid['every']} layers" if hybrid else "")


def _seeds_text(n: int, m: int) -> str:
    return f"{n} vs {m} seeds" if min(n, m) > 1 else f"{n} seed{'s' * (n > 1)} vs {m}: no interval"


def our_gaps(frame: pd.DataFrame, source: str) -> list[dict]:
    """Per setting, each Grassmann model's (label or mixer starting "grassmann") gap to
    attention's runs of that setting and block (``block_attention``: pre-LN against pre-LN
    attention), both at their chosen learning rate with every seed run there. ``source`` names the sweep in the CSV."""
    ok = chosen(frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok")], "wikitext2")
    ours = ok["label"].str.startswith("grassmann") | ok["mixer"].fillna("").str.startswith("grassmann")
    out = []
    for setting, rows in ok.groupby("setting"):
        for label, grp in rows[ours.loc[rows.index]].groupby("label"):  # sorted: the plain label first
            base = block_attention(rows, grp)["best_val_ppl"].tolist()
            if not base:  # no control built this way: nothing to read a gap against
                continue
            gap, lo, hi = gap_interval(grp["best_val_ppl"].tolist(), base)
            n, mixer = grp["seed"].nunique(), grp["mixer"].iloc[0]
            # the budget in the label: ours are read after a fraction of the published 30 epochs
            epochs = f"{grp['epochs_seen'].min():.2f}".rstrip("0").rstrip(".")
            out.append({"panel": setting, "label": f"ours, {epochs} epochs: {_reading(grp['model_json'].iloc[0])}, "
                        f"{_seeds_text(n, len(base))}", "x": 100 * gap,
                        "lo": None if lo is None else 100 * lo, "hi": None if hi is None else 100 * hi,
                        "seeds": n, "attention_seeds": len(base), **look(label, mixer).csv(), "source": source,
                        "reading": label, "mixer": mixer, "split": "validation", "filled": True})
    return out


def published_points(published: pd.DataFrame, settings=PUBLISHED_SETTINGS) -> list[dict]:
    """Each source's gap at each setting it reports (validation, else test, said in the
    label), hollow grey, a marker per source in the order the file names them."""
    rows = published_gap_rows(published, settings, ("validation", "test"))
    markers = {s: SOURCE_MARKERS[i % len(SOURCE_MARKERS)] for i, s in enumerate(dict.fromkeys(r["source"] for r in rows))}
    return [{"panel": r["setting"], "label": f"published: {r['source']}{_qualifier(published, r)}",
             "x": 100 * r["gap"], "lo": None, "hi": None, "seeds": None, "attention_seeds": None,
             "colour": GREY, "marker": markers[r["source"]], "linestyle": "", "source": r["source"],
             "reading": "", "mixer": "", "split": r["split"], "filled": False} for r in rows]


def _qualifier(published: pd.DataFrame, row: dict) -> str:
    """What sets a published row apart in its label: a test split, and a pre-norm block
    (published.csv has no block column; a source run pre-norm says so in its note, and the
    paper's block is post-LN)."""
    notes = published.loc[(published["source"] == row["source"]) & (published["setting"] == row["setting"])
                          & (published["task"] == "wikitext2"), "note"].fillna("")
    parts = (["test split"] if row["split"] == "test" else []) + (["pre-norm"] if notes.str.contains("pre-norm").any() else [])
    return f" ({', '.join(parts)})" if parts else ""


def _depth(setting: str) -> tuple[int, int]:
    """A setting's layers and context ("6L/128": (6, 128)): groups run shallow to deep,
    then short to long context, not in text order ("12L" before "2L")."""
    layers, context = re.fullmatch(r"(\d+)L/(\d+)", setting).groups()
    return int(layers), int(context)


def gap_points(ours: list[dict], published: list[dict]) -> pd.DataFrame:
    """The rows in drawing order, grouped by setting (ours first, then the published), with
    ``y`` the row's place from the top; each group leaves one row free for its heading."""
    rows, y = [], 0
    for setting in sorted({p["panel"] for p in ours + published}, key=_depth):
        y += 1  # the group's heading
        for point in [p for p in ours if p["panel"] == setting] + [p for p in published if p["panel"] == setting]:
            rows.append({**point, "y": y})
            y += 1
    points = pd.DataFrame(rows)
    return points.astype({"seeds": "Int64", "attention_seeds": "Int64", "lo": float, "hi": float})


def _draw(points: pd.DataFrame):
    """The forest: a row per point, headings in bold, the claim's band, 0 marked."""
    fig, ax = plt.subplots(figsize=(9.5, 0.34 * (points["y"].max() + 2) + 1.2))
    ax.axvspan(*CLAIM, color="#DDCC77", alpha=0.35, lw=0, zorder=0)
    ax.axvline(0, color="0.2", lw=1.0, zorder=2)
    ax.set_axisbelow(True)  # the grid under the zero line and the points
    for p in points.itertuples():
        if p.filled:
            err = None if pd.isna(p.lo) else [[p.x - p.lo], [p.hi - p.x]]
            bars = ax.errorbar(p.x, p.y, xerr=err, fmt=p.marker, color=p.colour, ms=7, capsize=3, lw=1.4, zorder=3)
            if err is not None:
                # the whisker carries the variant's dash (the CSV holds it as text)
                bars[2][0].set_linestyle(look(p.reading, p.mixer).linestyle)
        else:
            ax.scatter(p.x, p.y, marker=p.marker, s=55, facecolors="none", edgecolors=p.colour, lw=1.3, zorder=3)
        right = p.x if pd.isna(p.hi) else p.hi
        interval = "" if pd.isna(p.lo) else f" [{p.lo:+.1f}, {p.hi:+.1f}]"
        ax.annotate(f"{p.x:+.1f} %{interval}".replace("-", "−"), (right, p.y), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=7.5, color="0.25",
                    bbox={"fc": "white", "ec": "none", "pad": 0.5})  # legible where it crosses the zero line
    _axes(ax, points)
    return fig


def _axes(ax, points: pd.DataFrame) -> None:
    """Row labels on the left, group headings bold among them, and the legend below the
    axes, where it cannot cover a point."""
    heads = points.groupby("panel", sort=False)["y"].min() - 1
    ticks = [*points["y"], *heads]
    names = [*points["label"], *(f"{_depth(s)[0]} layers, L = {_depth(s)[1]}" for s in heads.index)]
    ax.set_yticks(ticks, names, fontsize=8)
    for tick in ax.get_yticklabels()[len(points):]:
        tick.set_fontweight("bold")
    ax.set_ylim(max(ticks) + 0.7, -0.7)
    low, high = min(points["x"].min(), points["lo"].min(), 0), max(points["x"].max(), points["hi"].max())
    ax.set_xlim(low - 4, high + 0.22 * (high - low))  # room on the right for the value labels
    ax.grid(axis="x", color="0.9")
    ax.set_xlabel("Grassmann's validation perplexity vs attention's in the same block (%; > 0: Grassmann worse)")
    ax.set_title("The Grassmann mixer's gap to attention on Wikitext-2", fontsize=10)
    handles = [Patch(color="#DDCC77", alpha=0.5, label="the paper's claim: 10–15 %"),
               Line2D([], [], color="0.3", marker="D", lw=1.4, label="ours: mean over seeds, 95 % Welch interval"),
               Line2D([], [], color=GREY, marker="s", mfc="none", lw=0, label="published: each source vs its own Transformer")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=3, fontsize=7.5, frameon=False)


def gap_figure(out_dir: Path = OUT, sweeps=SWEEPS, published: pd.DataFrame | None = None) -> Path:
    """Draw the figure from the committed records of ``sweeps`` and published.csv (or
    ``published``) into ``out_dir``/gap_to_attention.png, with its points' CSV beside it."""
    published = read_published() if published is None else published
    ours = [p for sweep in sweeps for p in our_gaps(records_frame(load_records(REFERENCE / sweep)), sweep)]
    points = gap_points(ours, published_points(published) if published is not None else [])
    return save_figure(_draw(points), Path(out_dir) / "gap_to_attention.png", points)
