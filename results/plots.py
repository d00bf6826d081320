"""Figures of a sweep (or of several side by side), drawn from its long-format table
(``records.records_frame``).

Every figure is drawn from a table of points computed first and saved beside the PNG as a
CSV (``save_figure``): label, x, y, the 95 % interval over seeds (``stats.seed_interval``),
the seed count and the look. Models are read as the report and the headline read them
(``stats.chosen``: each at the learning rate chosen on validation, its seeds at that rate);
MQAR and MAD points take the best rate per seed, as Zoology and MAD do and as their tables
do. Each mixer has one look in every figure (``results.style``), and a legend entry names
its seeds. A figure is drawn only when the records hold its data, so ``plot_all`` works on
any sweep.
"""
from __future__ import annotations

import ast
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a cluster node or in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import ticker  # noqa: E402

from results.stats import (SELECT_ON, SNLI_ROLES, best_over_lr, block_attention, bracket, chosen, gap_interval,  # noqa: E402
                           mad_scores, position_curves, published_mad_by_mixer, read_published, seed_interval,
                           snli_chosen, snli_order, tried_runs)
from results.style import looks, mixer_of  # noqa: E402

# Scaling measurements by the names a record may use for them, with their axis label.
SCALING_METRICS = {
    "latency": (("median_ms", "latency_ms"), "latency (ms)"),
    "throughput": (("tokens_per_s", "throughput"), "throughput (tokens/s)"),
    "memory": (("peak_mem_mb", "peak_memory_mb"), "peak memory (MB)"),
}
FAILED_POINT = {"oom": "x", "timeout": "+"}  # how a point that could not be measured is marked
LM_METRICS = {"best_val_ppl": "best validation perplexity", "test_ppl": "test perplexity"}
SNLI_METRICS = {"best_val_accuracy": "validation accuracy", "test_accuracy": "test accuracy"}
SNLI_GROUPS = {"head": "heads", "control": "controls", "scratch": "from scratch"}
# Columns of the CSV beside every figure: the points exactly as drawn
POINT_COLUMNS = ["panel", "label", "x", "y", "lo", "hi", "seeds", "colour", "marker", "linestyle"]
EXTRA_FORMATS: list[str] = []  # set by ``plot_all(formats=...)``: "svg", "pdf" beside each PNG


def save_figure(fig, path: Path, points: pd.DataFrame) -> Path:
    """The figure as ``path`` (PNG), in each of ``EXTRA_FORMATS`` beside it, and the points
    it draws as ``path`` with ".csv" (``POINT_COLUMNS`` first, then any others): what a
    reader replots from, and what the tests hold against the tables."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    for fmt in EXTRA_FORMATS:
        fig.savefig(path.with_suffix(f".{fmt}"), bbox_inches="tight")
    plt.close(fig)
    first = [c for c in POINT_COLUMNS if c in points]
    points[first + [c for c in points.columns if c not in first]].to_csv(path.with_suffix(".csv"), index=False)
    return path


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
    if "mixer" in rows and (rows["label"] == task).all():  # a sweep that gave no labels: its mixers tell runs apart
        rows["label"] = rows["mixer"]
    for col in ("seq_len", "d_model", "num_kv_pairs", "seed", "params", "n_layers", "context", "batch"):
        if col in rows and pd.api.types.is_float_dtype(rows[col]):
            values = rows[col].dropna()
            if len(values) == len(rows) and (values == values.round()).all():
                rows[col] = rows[col].astype(int)
    return rows


def seed_points(rows: pd.DataFrame, keys: list[str], y: str) -> pd.DataFrame:
    """One point per ``keys`` (label, panel, x): ``y`` the mean over the rows' seeds, lo
    and hi its 95 % t interval (empty for one seed), seeds how many."""
    out = []
    for key, grp in rows.groupby(keys, dropna=False, sort=True):
        values = pd.to_numeric(grp[y], errors="coerce").dropna()
        if values.empty:
            continue
        mean, lo, hi = seed_interval(values)
        out.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))), "y": mean, "lo": lo, "hi": hi,
                    "seeds": len(values)})
    return pd.DataFrame(out, columns=[*keys, "y", "lo", "hi", "seeds"])


def _styled(points: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """``points`` with each label's look (``style.looks``) and legend entry as columns."""
    labels = points["label"].unique()
    found = looks(labels, [mixer_of(rows).get(m) for m in labels])
    seeds = points.groupby("label")["seeds"].agg(["min", "max"]) if points["seeds"].notna().any() else None
    table = pd.DataFrame([{"label": k, **v.csv(), "entry": _entry(k, None if seeds is None else seeds.loc[k])}
                          for k, v in found.items()], columns=["label", "colour", "marker", "linestyle", "entry"])
    return points.merge(table, on="label", how="left")


def _dash(text: str):
    """A line style as the CSV writes it, back to what matplotlib takes."""
    return ast.literal_eval(text) if text.startswith("(") else text  # a dash tuple: (offset, (on, off, ...))


def _entry(label: str, seeds: pd.Series | None) -> str:
    """A legend entry: the label and the seeds behind its points ("3 seeds", "1-3 seeds"
    where its points differ), from ``seeds``' min and max; the label alone without them."""
    if seeds is None or pd.isna(seeds["max"]):
        return label
    low, high = int(seeds["min"]), int(seeds["max"])
    return f"{label}, {low if low == high else f'{low}-{high}'} seed{'s' if high != 1 else ''}"


def _panels(n: int, width: float = 3.6, height: float = 3.2, sharey: bool = False):
    fig, axes = plt.subplots(1, max(n, 1), figsize=(width * max(n, 1) + 1.6, height), sharey=sharey, squeeze=False)
    return fig, list(axes[0])


def _draw_lines(ax, points: pd.DataFrame, band: bool = True, order=None, sort_x: bool = True) -> None:
    """One line per label of ``points`` (in ``order``, else by name), through its points
    by x (in row order where not ``sort_x``), its interval a band (bars where not ``band``)."""
    for label in order if order is not None else sorted(points["label"].unique()):
        mine = points[points["label"] == label]
        if mine.empty:
            continue
        mine = mine.sort_values("x", kind="stable") if sort_x else mine
        first = mine.iloc[0]
        style = {"color": first["colour"], "marker": first["marker"], "linestyle": _dash(first["linestyle"])}
        ax.plot(mine["x"], mine["y"], label=first["entry"], markersize=5, lw=1.4, **style)
        has = mine["lo"].notna() & mine["hi"].notna()
        if has.any() and band:
            ax.fill_between(mine.loc[has, "x"], mine.loc[has, "lo"], mine.loc[has, "hi"], color=first["colour"],
                            alpha=0.15, lw=0)
        elif has.any():
            ax.errorbar(mine.loc[has, "x"], mine.loc[has, "y"], yerr=[mine.loc[has, "y"] - mine.loc[has, "lo"],
                                                                   mine.loc[has, "hi"] - mine.loc[has, "y"]],
                        fmt="none", ecolor=first["colour"], capsize=2, lw=1)


def _legend(fig, axes, title: str) -> None:
    """One legend for the figure, outside the panels, titled with what its entries are."""
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    if labels:
        fig.legend([handles[lab] for lab in labels], labels, title=title, fontsize=7, title_fontsize=8,
                   loc="upper left", bbox_to_anchor=(1.0, 0.95))
    fig.tight_layout()


def _log2_axis(ax, values) -> None:
    """Log base 2 with a plain label at each length or width that was run."""
    values = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.xaxis.set_minor_locator(ticker.NullLocator())


def _log_y(ax) -> None:
    """Log y labelled at 1, 2, 5 x 10^k: readable over one decade or many."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(ticker.LogLocator(subs=(2, 5)))
    ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))


def _mark_failed(ax, failed: pd.DataFrame, x: str, colours: dict) -> None:
    """Points that could not be measured (oom, timeout), once per x along the panel's top."""
    top = ax.get_ylim()[1]
    for (label, status), pts in failed.groupby(["label", "status"]):
        xs = sorted(pts[x].unique())
        ax.scatter(xs, [top] * len(xs), marker=FAILED_POINT[status], s=60, color=colours.get(label, "0.3"),
                   clip_on=False, zorder=5)
    if not failed.empty:
        said = ", ".join(f"{m} = {s}" for s, m in FAILED_POINT.items() if s in set(failed["status"]))
        ax.annotate(said, (0.02, 0.97), xycoords="axes fraction", va="top", fontsize=8)


# --- language modelling -------------------------------------------------------------

def _lm_chosen(df: pd.DataFrame, task: str = "wikitext2") -> pd.DataFrame:
    """The LM runs the figures read: each model at its chosen rate (``stats.chosen``)."""
    rows = _ok(df, task)
    return chosen(rows, task) if not rows.empty else rows


def _control(rows: pd.DataFrame, model: pd.DataFrame) -> str | None:
    """The attention label ``model``'s gap is read against: the one attention label of
    ``rows`` built as it is (``stats.block_attention``: setting, block, init), and none
    where two are, as when sweeps drawn together both had one (``records.combine``)."""
    named = block_attention(rows, model)["label"].unique()
    return named[0] if len(named) == 1 else None


def plot_lm_comparison(df: pd.DataFrame, out: Path) -> Path | None:
    """Matched models compared as such: per perplexity (best validation, test), each model
    at its chosen rate as a point with its 95 % interval over seeds, best first, its gap to
    attention of the same setting and block beside it (``stats.gap_interval``)."""
    rows = _lm_chosen(df)
    metrics = [m for m in LM_METRICS if m in rows and rows[m].notna().any()]
    if rows.empty or not metrics:
        return None
    setting = rows["setting"] if "setting" in rows else pd.Series("", index=rows.index)
    rows = rows.assign(panel_setting=setting.fillna(""))
    points = []
    for (where, metric) in [(s, m) for s in sorted(rows["panel_setting"].unique()) for m in metrics]:
        mine = rows[rows["panel_setting"] == where]
        pts = seed_points(mine, ["label"], metric).sort_values("y", kind="stable").reset_index(drop=True)
        for rank, p in pts.iterrows():
            model = mine[mine["label"] == p["label"]]
            control = _control(mine, model)
            ours, base = (mine.loc[mine["label"] == x, metric].dropna().tolist() for x in (p["label"], control))
            gap = gap_interval(ours, base) if base and p["label"] != control else (None, None, None)
            points.append({**p, "panel": f"{where} {LM_METRICS[metric]}".strip(), "x": rank, "metric": metric,
                           "gap": gap[0], "gap_lo": gap[1], "gap_hi": gap[2]})
    points = _styled(pd.DataFrame(points), rows)
    panels = list(dict.fromkeys(points["panel"]))
    fig, axes = _panels(len(panels), width=0.45 * points.groupby("panel").size().max() + 1.5, height=3.6)
    for ax, panel in zip(axes, panels):
        mine = points[points["panel"] == panel]
        for _, p in mine.iterrows():
            err = [[p["y"] - p["lo"]], [p["hi"] - p["y"]]] if pd.notna(p["lo"]) else None
            ax.errorbar([p["x"]], [p["y"]], yerr=err, fmt=p["marker"], color=p["colour"], capsize=3, ms=6)
            gap = "" if pd.isna(p["gap"]) else f"{100 * p['gap']:+.1f}%"
            ax.annotate(gap, (p["x"], p["hi"] if pd.notna(p["hi"]) else p["y"]), textcoords="offset points",
                        xytext=(0, 4), ha="center", fontsize=6.5)
        ax.set_xticks(mine["x"], mine["entry"], rotation=40, ha="right", fontsize=7)
        ax.set(title=panel, ylabel="perplexity (lower is better)")
        ax.title.set_fontsize(9)
    fig.suptitle("each model at its chosen learning rate; 95% interval over seeds; % = gap to attention in the same block",
                 fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out / "wikitext2_perplexity_by_model.png", points)


def plot_perplexity(df: pd.DataFrame, out: Path, spread: float = 1.2) -> Path | None:
    """Perplexity against parameter count, one line per model at its chosen rate; drawn
    only where sizes really differ (the largest over ``spread`` times the smallest), since
    matched sizes are compared by ``plot_lm_comparison``."""
    rows = _lm_chosen(df)
    y = next((c for c in ("test_ppl", "best_val_ppl") if c in rows and rows[c].notna().any()), None)
    if rows.empty or y is None or "params" not in rows or rows["params"].max() < spread * rows["params"].min():
        return None
    points = seed_points(rows.assign(x=rows["params"], panel=""), ["label", "panel", "x"], y)
    points = _styled(points, rows)
    fig, axes = _panels(1)
    _draw_lines(axes[0], points, band=False)
    axes[0].set(xscale="log", xlabel="parameters", ylabel=LM_METRICS[y])
    axes[0].xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
    _legend(fig, axes, "model, seeds at its chosen rate")
    return save_figure(fig, out / "wikitext2_perplexity_vs_params.png", points)


def plot_lr_bracket(df: pd.DataFrame, out: Path, task: str = "wikitext2") -> Path | None:
    """The learning-rate bracket behind the chosen rates (``stats.bracket``): the task's
    validation metric (``stats.SELECT_ON``) against the rate, one line per model tried at
    several, on the seeds every rate ran; the chosen rate ringed. Nothing the other figures
    read is pooled over rates."""
    rows = _ok(df, task)
    table = bracket(rows, task)
    if table.empty:
        return None
    points = _styled(table.assign(panel="", x=table["lr"], y=table["value"], lo=np.nan, hi=np.nan,
                                  seeds=table["seeds"].str.count(",") + 1), rows)
    fig, axes = _panels(1, width=4.2)
    _draw_lines(axes[0], points)
    pick = points[points["chosen"].astype(bool)]
    axes[0].scatter(pick["x"], pick["y"], s=160, facecolors="none", edgecolors=pick["colour"], lw=1.4, zorder=4)
    metric = SELECT_ON[task][0]
    axes[0].set(xscale="log", xlabel="learning rate",
                ylabel={**LM_METRICS, **SNLI_METRICS}.get(metric, metric.replace("_", " ")))
    rates = sorted(points["x"].unique())
    axes[0].set_xticks(rates, [f"{r:g}" for r in rates])  # the rates tried, as written in a sweep
    axes[0].xaxis.set_minor_locator(ticker.NullLocator())
    if metric.endswith("ppl"):
        _log_y(axes[0])
    axes[0].set_title("ringed: the rate each model is read at", fontsize=8)
    _legend(fig, axes, "model, seeds every rate ran")
    return save_figure(fig, out / f"{task}_lr_bracket.png", points)


def plot_snli(df: pd.DataFrame, out: Path) -> Path | None:
    """SNLI accuracy per model at its chosen rate (``stats.chosen``), a panel per split:
    the mean over seeds with its 95 % interval, grouped as the headline table reads them
    (``stats.snli_order``: the heads, the controls, the models from scratch)."""
    rows = _ok(df, "snli")
    metrics = [m for m in SNLI_METRICS if m in rows and rows[m].notna().any()]
    if rows.empty or not metrics:
        return None
    rows = snli_chosen(rows)
    order = snli_order(rows)
    roles = rows.groupby("label")["role"].first()
    points = pd.concat([seed_points(rows.assign(y=100 * rows[m]), ["label"], "y").assign(panel=SNLI_METRICS[m])
                        for m in metrics])
    points = _styled(points.assign(x=points["label"].map(order.index), role=points["label"].map(roles)), rows)
    fig, axes = _panels(len(metrics), width=0.42 * len(order) + 1.2, height=3.6, sharey=True)
    for ax, panel in zip(axes, dict.fromkeys(points["panel"])):
        mine = points[points["panel"] == panel].sort_values("x")
        for _, p in mine.iterrows():
            err = [[p["y"] - p["lo"]], [p["hi"] - p["y"]]] if pd.notna(p["lo"]) else None
            ax.errorbar([p["x"]], [p["y"]], yerr=err, fmt=p["marker"], color=p["colour"], capsize=3, ms=6)
        groups = [r for r in SNLI_ROLES if (mine["role"] == r).any()]
        for role in groups:  # each group named over its span, a rule between groups
            xs = mine.loc[mine["role"] == role, "x"]
            ax.text((xs.min() + xs.max()) / 2, 1.01, SNLI_GROUPS[role], transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=7)
            if role != groups[-1]:
                ax.axvline(xs.max() + 0.5, color="0.7", lw=0.8, ls=":")
        ax.set_xticks(mine["x"], mine["entry"], rotation=40, ha="right", fontsize=7)
        ax.set_title(panel, fontsize=9, pad=14)
    axes[0].set_ylabel("accuracy % (higher is better)")  # the panels share it
    fig.suptitle("each model at its learning rate chosen on validation; 95% interval over seeds", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out / "snli_accuracy_by_model.png", points)


def plot_lm_curves(df: pd.DataFrame, out: Path) -> list[Path]:
    """Validation perplexity against training tokens, one line per model at its chosen
    rate (mean over its seeds, 95 % band), from each run's evaluation history; and the
    same against training FLOPs where every run records its FLOPs per token, since models
    of matched parameters can differ in compute."""
    rows = _lm_chosen(df)
    need = ("eval_steps", "val_ppl_history", "batch_size", "seq_len")
    if rows.empty or any(c not in rows for c in need):
        return []
    rows = rows[rows["eval_steps"].apply(lambda v: isinstance(v, list))]
    curves = pd.DataFrame([{"label": r["label"], "run": i, "tokens": step * r["batch_size"] * r["seq_len"],
                            "ppl": ppl}
                           for i, r in rows.iterrows()
                           for step, ppl in zip(r["eval_steps"], r["val_ppl_history"]) if ppl is not None])
    if curves.empty:
        return []
    paths = [_lm_curve_figure(curves.assign(x=curves["tokens"]), rows, "training tokens",
                              out / "wikitext2_val_ppl_vs_tokens.png")]
    per_token = rows.get("train_flops_per_token", pd.Series(float("nan"), index=rows.index))
    if per_token.notna().all():  # records older than this field: the tokens figure only
        flops = curves.assign(x=curves["tokens"] * per_token.loc[curves["run"]].to_numpy())
        paths.append(_lm_curve_figure(flops, rows, "training FLOPs", out / "wikitext2_val_ppl_vs_flops.png",
                                      per_token.groupby(rows["label"]).unique()))
    return paths


def _lm_curve_figure(curves: pd.DataFrame, rows: pd.DataFrame, xlabel: str, path: Path,
                     per_token: pd.Series | None = None) -> Path:
    """Validation perplexity against ``curves``' x, mean over seeds; the legend lists the
    models best first by their mean at their last evaluation, each with its FLOPs per
    token where ``per_token`` gives them."""
    points = _styled(seed_points(curves.assign(panel=""), ["label", "panel", "x"], "ppl"), rows)
    last = points[points["x"] == points.groupby("label")["x"].transform("max")]
    order = list(last.sort_values("y", kind="stable")["label"])
    fig, axes = _panels(1, width=4.6, height=3.6)
    _draw_lines(axes[0], points, order=order)
    if per_token is not None:
        per_flop = ticker.EngFormatter(places=1, unit="FLOP/token")
        for line, label in zip(axes[0].get_lines(), order):
            line.set_label(f"{line.get_label()} ({'/'.join(per_flop(v) for v in sorted(per_token[label]))})")
    axes[0].set(xlabel=xlabel, ylabel="validation perplexity")
    axes[0].xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
    _log_y(axes[0])
    _legend(fig, axes, "model, seeds at its chosen rate (95% band)")
    return save_figure(fig, path, points)


# --- recall and capabilities ----------------------------------------------------------

def _mqar_best(df: pd.DataFrame) -> pd.DataFrame | None:
    """Each (model, width, length, kv pairs, seed) at its best learning rate, as the MQAR
    tables read it. A model run at only some of the lengths the others ran is a control
    (mqar_cpu's, at L 64 and 128): left to the tables, so the figure keeps Zoology's rows
    (a row being run joins it once it has every length)."""
    rows = _ok(df, "mqar", tried=True)
    if rows.empty or "accuracy" not in rows:
        return None
    lengths = rows.groupby("label")["seq_len"].nunique()
    rows = rows[rows["label"].isin(lengths.index[lengths == lengths.max()])]
    best = best_over_lr(rows, ("label", "d_model", "seq_len", "num_kv_pairs"))
    return best if not best.empty else None


def _mqar_panel(best: pd.DataFrame) -> pd.Series:
    """Zoology's panel titles: the length, with its kv pairs."""
    kv = best["num_kv_pairs"].astype(int).astype(str) + " kv pairs" if "num_kv_pairs" in best else ""
    return "L = " + best["seq_len"].astype(int).astype(str) + (", " + kv if "num_kv_pairs" in best else "")


def _mqar_figure(points: pd.DataFrame, xlabel: str, path: Path, band: bool, sort_x: bool = True,
                 log_x: bool = False) -> Path:
    """A panel per length (shortest first), accuracy on a shared axis."""
    panels = sorted(points["panel"].unique(), key=lambda p: int(p.split("=")[1].split(",")[0]))
    fig, axes = _panels(len(panels), sharey=True)
    for ax, panel in zip(axes, panels):
        mine = points[points["panel"] == panel]
        _draw_lines(ax, mine, band=band, sort_x=sort_x)
        if log_x:  # decades only: minor labels collide over a narrow range
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        else:
            _log2_axis(ax, mine["x"])
        ax.set(title=panel, xlabel=xlabel, ylim=(-0.02, 1.02))
    axes[0].set_ylabel("accuracy (best learning rate per seed)")
    _legend(fig, axes, "model, seeds")
    return save_figure(fig, path, points)


def plot_mqar(df: pd.DataFrame, out: Path) -> Path | None:
    """MQAR accuracy against model width, a panel per sequence length (Zoology's figure):
    per seed the best learning rate, then the mean over seeds with its 95 % interval."""
    best = _mqar_best(df)
    if best is None:
        return None
    points = _styled(seed_points(best.assign(panel=_mqar_panel(best), x=best["d_model"]), ["label", "panel", "x"],
                                 "accuracy"), best)
    return _mqar_figure(points, "model width (d_model)", out / "mqar_accuracy_vs_d_model.png", band=True)


def plot_mqar_state(df: pd.DataFrame, out: Path) -> Path | None:
    """MQAR accuracy against the model's inference state (floats, log axis): Zoology's
    view of recall against memory. A point is a width at its best learning rate, mean
    over seeds; no interval, as one state size can hold several widths (a fixed-state
    mixer), drawn in width order along the line rather than averaged together."""
    best = _mqar_best(df)
    if best is None or "state_size" not in best:
        return None
    best = best.assign(panel=_mqar_panel(best))
    points = seed_points(best, ["label", "panel", "d_model"], "accuracy")
    states = best.groupby(["label", "panel", "d_model"])["state_size"].mean()
    points = points.assign(x=[states[k] for k in zip(points["label"], points["panel"], points["d_model"])],
                           lo=np.nan, hi=np.nan).sort_values(["label", "panel", "x", "d_model"])
    return _mqar_figure(_styled(points, best), "state size (floats)", out / "mqar_accuracy_vs_state_size.png",
                        band=False, sort_x=False, log_x=True)


def plot_mad(df: pd.DataFrame, out: Path) -> Path | None:
    """MAD: each model's best-of-sweep accuracy per task (mean over the task's settings and
    seeds) beside its MAD score (the mean over the tasks, the published tables' Average),
    one bar per model, best first."""
    rows = _ok(df, "mad", tried=True)
    if rows.empty or "accuracy" not in rows:
        return None
    table = mad_scores(rows).drop(columns="settings")
    seeds = rows.groupby("label")["seed"].nunique() if "seed" in rows else pd.Series(1, index=table.index)
    points = _styled(pd.DataFrame([{"panel": "", "label": label, "x": task, "y": table.at[label, task],
                                    "lo": np.nan, "hi": np.nan, "seeds": seeds[label]}
                                   for label in table.index for task in table.columns
                                   if pd.notna(table.at[label, task])]), rows)
    tasks, labels = list(table.columns), list(table.index)
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(tasks), 3.6))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        mine = points[points["label"] == label].set_index("x")
        xs = [k + (i - (len(labels) - 1) / 2) * width for k, t in enumerate(tasks) if t in mine.index]
        ax.bar(xs, [mine.at[t, "y"] for t in tasks if t in mine.index], width, color=mine["colour"].iloc[0],
               label=mine["entry"].iloc[0], edgecolor="white", lw=0.3)
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right")
    ax.set(ylim=(0, 1), ylabel="best accuracy over the sweep")
    ax.legend(title="model, most seeds of a setting", fontsize=7, title_fontsize=8, bbox_to_anchor=(1.02, 1),
              loc="upper left")  # bars reach 1: keep it off them
    return save_figure(fig, out / "mad_accuracy_by_task.png", points)


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
    pairs = pd.DataFrame([{"panel": "", "label": m, "task": t, "x": theirs.at[m, t], "y": ours.at[m, t]}
                          for m in mixers for t in theirs.columns
                          if t in ours.columns and (t != "MAD score" or m in whole)]).dropna()
    if pairs.empty:
        return None
    points = _styled(pairs.assign(lo=np.nan, hi=np.nan, seeds=np.nan), rows)
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    ax.plot([0, 1], [0, 1], color="0.6", lw=0.8, ls="--", zorder=0)
    shapes = dict(zip(sorted(points["task"].unique()), "osD^v<>ph*"))
    for _, p in points.iterrows():  # colour: the mixer; shape: the task
        ax.scatter(p["x"], p["y"], color=p["colour"], marker=shapes[p["task"]], s=40)
    score = points[points["task"] == "MAD score"]
    ax.scatter(score["x"], score["y"], s=220, facecolors="none", edgecolors="0.2", lw=1.0)
    handles = [plt.Line2D([], [], ls="", marker="o", color=c, label=m)
               for m, c in points.groupby("label")["colour"].first().items()]
    handles += [plt.Line2D([], [], ls="", marker=s, color="0.4", label=t) for t, s in shapes.items()]
    ax.set(xlim=(0, 1.02), ylim=(0, 1.02), xlabel="MAD (published)", ylabel="linbench")
    ax.legend(handles=handles, title="mixer; task", fontsize=7, title_fontsize=8, bbox_to_anchor=(1.02, 1),
              loc="upper left")
    return save_figure(fig, out / "mad_vs_published.png", points)


# --- speed ------------------------------------------------------------------------------

def _point_figure(rows: pd.DataFrame, y: str, x: str, facets: list[str], xlabel: str, ylabel: str,
                  path: Path, log2_x: bool) -> Path | None:
    """A benchmark's points: ``y`` against ``x``, a panel per value of ``facets``, mean over
    seeds with its interval, and the points that could not be measured marked along the
    top (their rows in the CSV with an empty y and their status)."""
    panel = (rows[facets].apply(lambda r: ", ".join(f"{c} {r[c]}" for c in facets), axis=1)
             if facets else pd.Series("", index=rows.index))
    rows = rows.assign(panel=panel, x=rows[x])
    good = rows[(rows["status"] == "ok") & rows[y].notna()] if y in rows else rows.iloc[0:0]
    if good.empty:
        return None
    failed = rows[rows["status"].isin(list(FAILED_POINT))][["label", "panel", "x", "status"]].drop_duplicates()
    points = pd.concat([seed_points(good, ["label", "panel", "x"], y).assign(status="ok"), failed])
    points = _styled(points, rows)
    panels = list(dict.fromkeys(rows.sort_values(facets)["panel"])) if facets else [""]
    fig, axes = _panels(len(panels), height=3.2)
    colours = points.groupby("label")["colour"].first().to_dict()
    for ax, name in zip(axes, panels):
        mine = points[points["panel"] == name]
        _draw_lines(ax, mine[mine["status"] == "ok"])
        if log2_x:
            _log2_axis(ax, rows["x"].dropna())
        _log_y(ax)
        ax.set(title=name, xlabel=xlabel, ylabel=ylabel)
        ax.title.set_fontsize(9)
        _mark_failed(ax, mine[mine["status"] != "ok"], "x", colours)
    _legend(fig, axes, "mixer, seeds")
    return save_figure(fig, path, points)


def plot_scaling(df: pd.DataFrame, out: Path) -> list[Path]:
    """Latency, throughput and memory against sequence length, log-log, one line per
    mixer and a panel per pass; the lengths at which a mixer ran out of memory (or of
    time) are marked along the top of the panel."""
    rows = _ok(df, "scaling")
    if rows.empty or "seq_len" not in rows or "status" not in rows:
        return []
    facet = [c for c in ("mode", "pass", "phase") if c in rows and rows[c].nunique() > 1][:1]
    paths = []
    for name, (candidates, label) in SCALING_METRICS.items():
        y = next((c for c in candidates if c in rows and rows[c].notna().any()), None)
        if y is not None:
            paths.append(_point_figure(rows, y, "seq_len", facet, "sequence length L", label,
                                       out / f"scaling_{name}_vs_L.png", log2_x=True))
    return [p for p in paths if p is not None]


# Decode measurements: the figure's file name, column and axis label
DECODE_METRICS = {"time": ("ms_per_token", "time per generated token (ms)"),
                  "memory": ("decode_mem_mb", "memory held while decoding (MB)")}


def plot_decode(df: pd.DataFrame, out: Path) -> list[Path]:
    """Time per generated token and the memory held while decoding, against the context
    already in the state: one line per mixer, a panel per width and batch. A linear x
    axis, on which a cost that grows with the context is a rising straight line and a
    fixed state a flat one; contexts at which a mixer ran out of memory or time are marked
    along the top."""
    rows = _ok(df, "decode")
    if rows.empty or "context" not in rows or "status" not in rows:
        return []
    facets = [c for c in ("d_model", "batch") if c in rows and rows[c].nunique() > 1]
    paths = [_point_figure(rows, y, "context", facets, "context (tokens in the state)", label,
                           out / f"decode_{name}_vs_context.png", log2_x=False)
             for name, (y, label) in DECODE_METRICS.items() if y in rows]
    return [p for p in paths if p is not None]


def plot_extrapolation(df: pd.DataFrame, out: Path) -> Path | None:
    """Validation perplexity by position on the longest contexts read (8x the training
    length, say): one line per model, a point per bucket of training-length positions; the
    dashed line marks the training length."""
    curves = position_curves(df)
    if curves.empty:
        return None
    longest = curves[curves["factor"] == curves["factor"].max()]
    points = _styled(seed_points(longest.assign(panel="", x=longest["position"]), ["label", "panel", "x"], "ppl"),
                     _ok(df, "wikitext2"))
    fig, axes = _panels(1, width=4.6)
    _draw_lines(axes[0], points)
    first = longest.loc[longest["bucket"] == 1, "position"]
    if not first.empty:
        axes[0].axvline(int(first.iloc[0]), color="0.5", ls="--", lw=0.8)
    axes[0].set(xlabel="position in the context (first of each bucket)", ylabel="validation perplexity")
    _log_y(axes[0])
    _legend(fig, axes, "model, seeds")
    return save_figure(fig, out / "wikitext2_ppl_by_position.png", points)


def plot_all(df: pd.DataFrame, out: str | Path, published: str | Path | None = None,
             formats: tuple[str, ...] = ()) -> list[Path]:
    """Every figure the records hold data for, as PNG with its CSV (and each of
    ``formats``, "svg" or "pdf", beside it); ``published``: the CSV of published numbers
    for the figures that set ours beside them (none without it)."""
    out = Path(out)
    plt.style.use("seaborn-v0_8-whitegrid")
    EXTRA_FORMATS[:] = [f for f in formats if f != "png"]
    try:
        paths = [plot_lm_comparison(df, out), plot_perplexity(df, out), plot_lr_bracket(df, out),
                 *plot_lm_curves(df, out), plot_mqar(df, out), plot_mqar_state(df, out), plot_mad(df, out),
                 plot_mad_published(df, out, read_published(published)), plot_snli(df, out),
                 plot_lr_bracket(df, out, "snli"), *plot_scaling(df, out),
                 *plot_decode(df, out), plot_extrapolation(df, out)]
    finally:
        EXTRA_FORMATS.clear()
    return [p for p in paths if p is not None]
