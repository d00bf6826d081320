"""Figures of a sweep, drawn from its long-format table (``records.records_frame``).

Every figure aggregates seeds the same way: the line is the mean over seeds and the
band seaborn's 95% bootstrap confidence interval (but for MQAR against state size,
whose points may share a state size, so it draws the means only). A figure is drawn only when the
records hold its data, so ``plot_all`` works on any sweep.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a cluster node or in CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib import ticker  # noqa: E402

from results.stats import (best_over_lr, mad_scores, position_curves, published_mad_by_mixer, read_published,  # noqa: E402
                           tried_runs)

CI = ("ci", 95)
# Scaling measurements by the names a record may use for them, with their axis label.
SCALING_METRICS = {
    "latency": (("median_ms", "latency_ms"), "latency (ms)"),
    "throughput": (("tokens_per_s", "throughput"), "throughput (tokens/s)"),
    "memory": (("peak_mem_mb", "peak_memory_mb"), "peak memory (MB)"),
}
FAILED_POINT = {"oom": "x", "timeout": "+"}  # how a point that could not be measured is marked


def _hue(df: pd.DataFrame) -> str:
    """Runs are told apart by their sweep label when the sweep gives labels, else by mixer."""
    if "label" in df and df["label"].nunique() > 1 and not (df["label"] == df.get("task")).all():
        return "label"
    return "mixer" if "mixer" in df else "label"


def _ok(df: pd.DataFrame, task: str, tried: bool = False) -> pd.DataFrame:
    """The task's rows of finished runs (``tried``: with the diverged ones, as
    ``stats.tried_runs`` scores them), with whole-number columns back to integers (a
    column that another task leaves empty turns float: "L = 64.0" in a title)."""
    if "task" not in df:
        return df.iloc[0:0]
    rows = df[df["task"] == task]
    if "run_status" in rows:
        rows = tried_runs(rows) if tried else rows[rows["run_status"] == "ok"]
    rows = rows.dropna(axis=1, how="all").copy()
    for col in ("seq_len", "d_model", "num_kv_pairs", "seed", "params", "n_layers"):
        if col in rows and pd.api.types.is_float_dtype(rows[col]):
            values = rows[col].dropna()
            if len(values) == len(rows) and (values == values.round()).all():
                rows[col] = rows[col].astype(int)
    return rows


def _lengths_axis(g, values) -> None:
    """Log base 2 with a plain label at each length or width that was run."""
    values = sorted({int(v) for v in values})
    for ax in g.axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, [str(v) for v in values])
        ax.xaxis.set_minor_locator(ticker.NullLocator())


def _log_y(g) -> None:
    """Log y labelled at 1, 2, 5 x 10^k: readable over one decade or many."""
    for ax in g.axes.flat:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_locator(ticker.LogLocator(subs=(2, 5)))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_perplexity(df: pd.DataFrame, out: Path) -> Path | None:
    """Language modelling: perplexity against parameter count, one line per model."""
    rows = _ok(df, "wikitext2")
    y = next((c for c in ("test_ppl", "best_val_ppl") if c in rows and rows[c].notna().any()), None)
    if rows.empty or y is None or "params" not in rows:
        return None
    rows = rows[rows[y].notna()]
    col = "setting" if "setting" in rows and rows["setting"].nunique() > 1 else None
    g = sns.relplot(rows, kind="line", x="params", y=y, hue=_hue(rows), col=col, marker="o",
                    errorbar=CI, err_style="bars", facet_kws={"sharey": False}, height=3.6)
    g.set(xscale="log", xlabel="parameters")
    for ax in g.axes.flat:
        ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
        ax.xaxis.set_minor_formatter(ticker.EngFormatter(sep=""))
    g.set_ylabels("test perplexity" if y == "test_ppl" else "best validation perplexity")
    return _save(g.figure, out / "wikitext2_perplexity_vs_params.png")


def plot_lm_curves(df: pd.DataFrame, out: Path) -> list[Path]:
    """Language modelling: validation perplexity against training tokens, one line per
    model (mean over seeds, 95% band), from each run's evaluation history; and the same
    against training FLOPs where every run records its FLOPs per token, since models of
    matched parameters can differ in compute."""
    rows = _ok(df, "wikitext2")
    need = ("eval_steps", "val_ppl_history", "batch_size", "seq_len")
    if rows.empty or any(c not in rows for c in need):
        return []
    rows = rows[rows["eval_steps"].apply(lambda v: isinstance(v, list))]
    hue = _hue(rows)
    points = [{hue: r[hue], "run": i, "seed": r.get("seed"), "tokens": step * r["batch_size"] * r["seq_len"],
               "ppl": ppl}
              for i, r in rows.iterrows()
              for step, ppl in zip(r["eval_steps"], r["val_ppl_history"]) if ppl is not None]
    if not points:
        return []
    curves = pd.DataFrame(points)
    paths = [_lm_curve_figure(curves, hue, "tokens", "training tokens", out / "wikitext2_val_ppl_vs_tokens.png")]
    per_token = rows.get("train_flops_per_token", pd.Series(float("nan"), index=rows.index))
    if per_token.notna().all():  # records older than this field: the tokens figure only
        curves["flops"] = curves["tokens"] * per_token.loc[curves["run"]].to_numpy()
        per_flop = ticker.EngFormatter(places=1, unit="FLOP/token")
        names = {k: f"{k} ({'/'.join(per_flop(v) for v in sorted(vs))})"
                 for k, vs in per_token.groupby(rows[hue]).unique().items()}
        curves[hue] = curves[hue].map(names)
        paths.append(_lm_curve_figure(curves, hue, "flops", "training FLOPs", out / "wikitext2_val_ppl_vs_flops.png"))
    return paths


def _lm_curve_figure(curves: pd.DataFrame, hue: str, x: str, xlabel: str, path: Path) -> Path:
    """Validation perplexity against the column ``x`` of ``curves``, mean over seeds."""
    # the legend lists the models best first, by their mean at their last evaluation
    last = curves[curves[x] == curves.groupby(hue)[x].transform("max")]
    order = list(last.groupby(hue)["ppl"].mean().sort_values().index)
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    sns.lineplot(curves, x=x, y="ppl", hue=hue, hue_order=order, marker="o", errorbar=CI, ax=ax)
    ax.set(xlabel=xlabel, ylabel="validation perplexity")
    ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    seeds = curves.groupby(hue)["seed"].nunique()
    if seeds.max() > 1:
        ax.set_title(f"mean of {seeds.min()}-{seeds.max()} seeds, 95% CI" if seeds.min() != seeds.max()
                     else f"mean of {seeds.max()} seeds, 95% CI", fontsize=9)
    return _save(fig, path)


def _mqar_panels(points: pd.DataFrame, x: str, hue: str, **line):
    """Zoology's layout: a panel per sequence length, titled with its kv pairs; a row
    per kv-pair count only where one length ran several (Zoology's grid pairs each
    length with one count, and a row per count would leave most panels empty)."""
    kv = "num_kv_pairs" in points
    several = kv and (points.groupby("seq_len")["num_kv_pairs"].nunique() > 1).any()
    g = sns.relplot(points, kind="line", x=x, y="accuracy", hue=hue, col="seq_len",
                    row="num_kv_pairs" if several else None, marker="o", height=3.2,
                    hue_order=sorted(points[hue].unique()), **line)  # same colours in both figures
    g.set(ylim=(-0.02, 1.02))
    g.set_titles(col_template="L = {col_name}", row_template="{row_name} kv pairs")
    if kv and not several:
        for L, ax in g.axes_dict.items():
            ax.set_title(f"L = {L}, {points.loc[points['seq_len'] == L, 'num_kv_pairs'].iloc[0]} kv pairs")
    return g


def _mqar_best(df: pd.DataFrame) -> tuple[pd.DataFrame, str] | None:
    """Each (model, width, length, kv pairs, seed) at its best learning rate. A model run
    at only some of the lengths the others ran is a control (mqar_cpu's, at L 64 and 128):
    left to the report's tables, so the figure keeps Zoology's rows (a row being run
    joins it once it has every length)."""
    rows = _ok(df, "mqar", tried=True)
    if rows.empty or "accuracy" not in rows:
        return None
    hue = _hue(rows)
    lengths = rows.groupby(hue)["seq_len"].nunique()
    if lengths.nunique() > 1:
        rows = rows[rows[hue].isin(lengths.index[lengths == lengths.max()])]
    best = best_over_lr(rows, (hue, "d_model", "seq_len", "num_kv_pairs"))
    return (best, hue) if not best.empty else None


def plot_mqar(df: pd.DataFrame, out: Path) -> Path | None:
    """MQAR accuracy against model width, one panel per sequence length (Zoology's
    figure). With several learning rates, each point takes the best one, per seed."""
    found = _mqar_best(df)
    if found is None:
        return None
    best, hue = found
    g = _mqar_panels(best, "d_model", hue, errorbar=CI)
    _lengths_axis(g, best["d_model"])
    return _save(g.figure, out / "mqar_accuracy_vs_d_model.png")


def plot_mqar_state(df: pd.DataFrame, out: Path) -> Path | None:
    """MQAR accuracy against the model's inference state (floats, log axis): Zoology's
    view of recall against memory. A point is a width at its best learning rate, mean
    over seeds; no band, as one state size can hold several widths (a fixed-state
    mixer), drawn in width order along the line rather than averaged together."""
    found = _mqar_best(df)
    if found is None or "state_size" not in found[0]:
        return None
    best, hue = found
    keys = [k for k in (hue, "seq_len", "num_kv_pairs", "d_model") if k in best]
    points = best.groupby(keys)[["state_size", "accuracy"]].mean().reset_index()
    points = points.sort_values(["state_size", "d_model"])
    g = _mqar_panels(points, "state_size", hue, estimator=None, sort=False)
    g.set(xscale="log", xlabel="state size (floats)")
    for ax in g.axes.flat:  # decades only: minor labels collide over a narrow range
        ax.xaxis.set_major_locator(ticker.LogLocator(base=10))
        ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    return _save(g.figure, out / "mqar_accuracy_vs_state_size.png")


def plot_scaling(df: pd.DataFrame, out: Path) -> list[Path]:
    """Latency, throughput and memory against sequence length, log-log, one line per
    mixer and a panel per pass; the lengths at which a mixer ran out of memory (or of
    time) are marked along the top of the panel."""
    if "task" not in df or "seq_len" not in df:
        return []
    rows = _ok(df, "scaling")
    if rows.empty:
        return []
    point_ok = rows["status"] == "ok" if "status" in rows else pd.Series(True, index=rows.index)
    failed = rows[rows["status"].isin(list(FAILED_POINT))] if "status" in rows else rows.iloc[0:0]
    hue = _hue(rows)
    facet = next((c for c in ("mode", "pass", "phase") if c in rows and rows[c].nunique() > 1), None)
    names = sorted(rows[hue].dropna().unique())  # one colour per mixer in lines and crosses alike
    palette = dict(zip(names, sns.color_palette(n_colors=len(names))))
    paths = []
    for name, (candidates, label) in SCALING_METRICS.items():
        y = next((c for c in candidates if c in rows and rows[c].notna().any()), None)
        if y is None:
            continue
        ok = rows[point_ok & rows[y].notna()]
        g = sns.relplot(ok, kind="line", x="seq_len", y=y, hue=hue, col=facet, marker="o", errorbar=CI,
                        hue_order=list(palette), palette=palette, height=3.4, facet_kws={"sharey": False})
        g.set(xlabel="sequence length L")
        _lengths_axis(g, rows["seq_len"].dropna())
        _log_y(g)
        g.set_ylabels(label)
        for key, ax in g.axes_dict.items() if facet else [(None, g.ax)]:
            marks = failed if facet is None else failed[failed[facet] == key]
            top = ax.get_ylim()[1]
            for (mixer, status), pts in marks.groupby([hue, "status"]):
                lengths = sorted(pts["seq_len"].unique())  # once per length, whatever the seeds
                ax.scatter(lengths, [top] * len(lengths), marker=FAILED_POINT[status], s=60,
                           color=palette[mixer], clip_on=False, zorder=5)
            if not marks.empty:
                legend = ", ".join(f"{m} = {s}" for s, m in FAILED_POINT.items() if s in set(marks["status"]))
                ax.annotate(legend, (0.02, 0.97), xycoords="axes fraction", va="top", fontsize=8)
        paths.append(_save(g.figure, out / f"scaling_{name}_vs_L.png"))
    return paths


# Decode measurements: the figure's file name, column and axis label
DECODE_METRICS = {"time": ("ms_per_token", "time per generated token (ms)"),
                  "memory": ("decode_mem_mb", "memory held while decoding (MB)")}


def plot_decode(df: pd.DataFrame, out: Path) -> list[Path]:
    """Time per generated token and the memory held while decoding, against the context
    already in the state: one line per mixer, a panel per width (columns) and batch (rows).
    A linear x axis, on which a cost that grows with the context is a rising straight line
    and a fixed state a flat one; contexts at which a mixer ran out of memory or time are
    marked along the top."""
    if "task" not in df or "context" not in df:
        return []
    rows = _ok(df, "decode")
    if rows.empty or "status" not in rows:
        return []
    for col in ("context", "batch"):
        rows[col] = rows[col].astype(int)
    hue = _hue(rows)
    names = sorted(rows[hue].dropna().unique())
    palette = dict(zip(names, sns.color_palette(n_colors=len(names))))
    facets = {k: c for k, c in (("col", "d_model"), ("row", "batch")) if c in rows and rows[c].nunique() > 1}
    failed = rows[rows["status"].isin(list(FAILED_POINT))]
    paths = []
    for name, (y, label) in DECODE_METRICS.items():
        ok = rows[(rows["status"] == "ok") & rows[y].notna()] if y in rows else rows.iloc[0:0]
        if ok.empty:
            continue
        g = sns.relplot(ok, kind="line", x="context", y=y, hue=hue, marker="o", errorbar=CI, hue_order=names,
                        palette=palette, height=3.2, facet_kws={"sharey": False, "margin_titles": True}, **facets)
        g.set(xlabel="context (tokens in the state)")
        _log_y(g)
        g.set_ylabels(label)
        by = [facets[k] for k in ("row", "col") if k in facets]  # how seaborn keys a panel: (row, col)
        for key, ax in g.axes_dict.items() if facets else [((), g.ax)]:
            marks = failed
            for column, value in zip(by, key if isinstance(key, tuple) else (key,)):
                marks = marks[marks[column] == value]
            top = ax.get_ylim()[1]
            for (mixer, status), pts in marks.groupby([hue, "status"]):
                ax.scatter(sorted(pts["context"].unique()), [top] * pts["context"].nunique(),
                           marker=FAILED_POINT[status], s=60, color=palette[mixer], clip_on=False, zorder=5)
        paths.append(_save(g.figure, out / f"decode_{name}_vs_context.png"))
    return paths


def plot_extrapolation(df: pd.DataFrame, out: Path) -> Path | None:
    """Validation perplexity by position on the longest contexts read (8x the training
    length, say): one line per model, a point per bucket of training-length positions; the
    dashed line marks the training length."""
    curves = position_curves(df)
    if curves.empty:
        return None
    longest = curves[curves["factor"] == curves["factor"].max()]
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    sns.lineplot(longest, x="position", y="ppl", hue="label", marker="o", errorbar=CI, ax=ax)
    seq_len = int(longest.loc[longest["bucket"] == 1, "position"].iloc[0]) if (longest["bucket"] == 1).any() else None
    if seq_len:
        ax.axvline(seq_len, color="0.5", ls="--", lw=0.8)
    ax.set(xlabel="position in the context (first of each bucket)", ylabel="validation perplexity")
    ax.set_yscale("log")  # then plain labels: a narrow log range has only minor ticks
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    return _save(fig, out / "wikitext2_ppl_by_position.png")


def plot_mad(df: pd.DataFrame, out: Path) -> Path | None:
    """MAD: each model's best-of-sweep accuracy per task (mean over the task's settings)
    beside its MAD score (the mean over the tasks, the published tables' Average), one bar
    per model, best first."""
    rows = _ok(df, "mad", tried=True)
    if rows.empty or "accuracy" not in rows:
        return None
    table = mad_scores(rows).drop(columns="settings")
    long = table.reset_index().melt(id_vars="label", var_name="task", value_name="accuracy")
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(table.columns), 3.6))
    sns.barplot(long, x="task", y="accuracy", hue="label", hue_order=list(table.index), ax=ax)
    ax.set(ylim=(0, 1), xlabel="", ylabel="best accuracy over the sweep")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")  # bars reach 1: keep it off them
    return _save(fig, out / "mad_accuracy_by_task.png")


def plot_mad_published(df: pd.DataFrame, out: Path, published: pd.DataFrame | None) -> Path | None:
    """MAD: our score against the published one, a point per mixer both have and per task
    (and the MAD score, ringed, once we have every task the published score averages), on
    the diagonal where they agree; a ranking that agrees rises left to right within each
    task's marker."""
    rows = _ok(df, "mad", tried=True)
    if rows.empty or "accuracy" not in rows or published is None:
        return None
    ours, theirs = mad_scores(rows), published_mad_by_mixer(published)
    mixers = [m for m in theirs.index if m in ours.index]
    tasks = [t for t in theirs.columns if t != "MAD score"]
    whole = {m for m in mixers if all(t in ours.columns and pd.notna(ours.at[m, t]) for t in tasks)}
    pairs = pd.DataFrame([{"mixer": m, "task": t, "published": theirs.at[m, t], "ours": ours.at[m, t]}
                          for m in mixers for t in theirs.columns
                          if t in ours.columns and (t != "MAD score" or m in whole)]).dropna()
    if pairs.empty:
        return None
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    ax.plot([0, 1], [0, 1], color="0.6", lw=0.8, ls="--", zorder=0)
    sns.scatterplot(pairs, x="published", y="ours", hue="mixer", style="task", hue_order=mixers, s=60, ax=ax)
    score = pairs[pairs["task"] == "MAD score"]
    ax.scatter(score["published"], score["ours"], s=220, facecolors="none", edgecolors="0.2", lw=1.0)
    ax.set(xlim=(0, 1.02), ylim=(0, 1.02), xlabel="MAD (published)", ylabel="linbench")
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    return _save(fig, out / "mad_vs_published.png")


def plot_all(df: pd.DataFrame, out: str | Path, published: str | Path | None = None) -> list[Path]:
    """Every figure the records hold data for; ``published``: the CSV of published numbers
    for the figures that set ours beside them (none without it)."""
    out = Path(out)
    sns.set_theme(style="whitegrid", context="paper")
    paths = [plot_perplexity(df, out), *plot_lm_curves(df, out), plot_mqar(df, out), plot_mqar_state(df, out),
             plot_mad(df, out), plot_mad_published(df, out, read_published(published)),
             *plot_scaling(df, out), *plot_decode(df, out), plot_extrapolation(df, out)]
    return [p for p in paths if p is not None]
