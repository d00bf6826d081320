"""A sweep's Markdown report: what ran, our numbers per task (mean ± sd over seeds),
and our numbers beside the published ones of ``tasks/published.csv``.

Every model is read at one learning rate, the one ``stats.chosen`` picks on validation
(the rule the figures and the headline share), with every seed run there; the rates it
was chosen from stand beneath each table (``bracket_table``), so nothing is pooled
silently. The published table has columns task, source, setting, model, mixer, params,
metric, split, value (and note). Perplexity does not carry across the sources'
tokenizers and recipes, so for it each source's gap to its own attention stands beside
ours to our attention in the same setting (``published_gaps``); only accuracies in the
same setting are set side by side as numbers (``published_values``).
"""
from __future__ import annotations

import collections
import datetime
import json
import math
from pathlib import Path

import pandas as pd

from .stats import (SELECT_ON, best_over_lr, block_attention, bracket, chosen, gap_interval, mad_params, mad_runs, mad_scores,
                    mad_totals,
                    model_keys, published_mad_scores, read_published, shared_settings, tried_runs)

# The metrics a task's table shows first; other tasks show what looks like a metric.
HEADLINE = {
    "wikitext2": ("best_val_ppl", "test_ppl"),
    "mqar": ("accuracy",),
    "snli": ("test_accuracy", "best_val_accuracy", "accuracy"),
}
# Parameter counts a table shows: matching is done without embeddings, which a
# resized d_model changes, so both are shown where the record has both.
COUNTS = {"params": "params", "params_no_embeddings": "params w/o embeddings"}
SPLITS = {"valid": ("val", "valid", "validation", "dev"), "validation": ("val", "valid", "validation", "dev"),
          "dev": ("dev", "val", "valid"), "test": ("test",), "train": ("train",)}
METRICS = {"ppl": ("ppl", "perplexity"), "perplexity": ("ppl", "perplexity"),
           "accuracy": ("accuracy", "acc"), "acc": ("accuracy", "acc")}


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def _stat(values: pd.Series) -> str:
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return "–"
    if len(v) == 1:
        return _fmt(float(v.iloc[0]))
    return f"{_fmt(float(v.mean()))} ± {_fmt(float(v.std()))} (n={len(v)})"


def markdown_table(header: list[str], rows: list[list], align: list[str] | None = None) -> str:
    """A Markdown table; ``align`` gives each column's rule ("---", "---:"), default left."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align or ["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _metric_columns(rows: pd.DataFrame, task: str) -> list[str]:
    wanted = [c for c in HEADLINE.get(task, ()) if c in rows and rows[c].notna().any()]
    if wanted:
        return wanted
    guess = [c for c in rows.columns if any(k in c for k in ("acc", "ppl", "loss"))
             and not c.startswith("config.") and pd.api.types.is_numeric_dtype(rows[c])]
    return guess[:4]


def mqar_section(tried: pd.DataFrame) -> str:
    """A row per point of Zoology's grid (label, length, kv pairs, width); its accuracy is
    the best over learning rates per seed (``tried``: ``stats.tried_runs``), then mean ±
    sd over seeds."""
    keys = [k for k in ("label", "seq_len", "num_kv_pairs", "d_model") if k in tried]
    best = best_over_lr(tried, keys)
    counts = [c for c in ("state_size", *COUNTS) if c in best and best[c].notna().any()]
    has_lr = "lr" in best and best["lr"].notna().any()
    body = []
    for key, grp in best.groupby(keys, dropna=False, sort=True):
        cells = [k if isinstance(k, str) else f"{k:g}" for k in key]
        cells += [_fmt(float(grp[c].iloc[0])) if grp[c].notna().any() else "–" for c in counts]
        cells.append(_stat(grp["accuracy"]))
        if has_lr:  # seeds may pick different lrs, or have had different numbers to pick from
            cells += [", ".join(f"{v:.3g}" for v in sorted(grp[c].dropna().unique())) for c in ("lr", "lrs_tried")]
        body.append([*cells, grp["seed"].nunique() if "seed" in grp else len(grp)])
    names = {"seq_len": "L", "num_kv_pairs": "kv pairs", "state_size": "state size", **COUNTS}
    header = [names.get(c, c) for c in (*keys, *counts)] + ["accuracy"]
    header += ["best lr", "lrs tried"] if has_lr else []
    return ("## mqar\n\nState size: floats of inference state. Accuracy: per seed the best over the "
            "learning rates tried (finished runs, and diverged ones at their best evaluation before), then "
            "mean ± sd over seeds." + _selection_note(tried) + "\n\n"
            + markdown_table([*header, "seeds"], body))


def _selection_note(runs: pd.DataFrame) -> str:
    """What picked the checkpoints and rates of ``runs``, where some had a validation split."""
    on = runs["selected_on"].fillna("test") if "selected_on" in runs else pd.Series("test", index=runs.index)
    n = int((on == "validation").sum())
    if not n:
        return ""
    return (f" {n} of {len(runs)} runs had a validation split: for those, validation picked the checkpoint "
            "and the rate, and the accuracy is on test, read once at that checkpoint; the others were "
            "picked on test.")


def mad_section(runs: pd.DataFrame) -> str:
    """MAD's score per model beside its mean per task (``stats.mad_scores``) of ``runs``
    (``stats.mad_runs``), and the settings left out of it (``mad_changes``)."""
    table = mad_scores(runs)
    tasks = [c for c in table.columns if c not in ("MAD score", "settings")]
    params, totals = mad_params(runs), mad_totals(runs)
    span = (lambda low, high: "–" if pd.isna(low) else str(int(low)) if low == high else f"{int(low)}–{int(high)}")
    body = [[label, _fmt(row["MAD score"]), *(_fmt(row[t]) for t in tasks), int(row["settings"]),
             "–" if pd.isna(params[label]) else int(params[label]), span(*totals[label])]
            for label, row in table.iterrows()]
    return ("## mad\n\nPer setting the test accuracy MAD reports (its macro accuracy at the evaluation of "
            "lowest test perplexity), best over the learning-rate x weight-decay sweep (mean over seeds); "
            "per task, the mean over the task's settings that every model which ran it has run; MAD score: "
            "the mean of the task columns (the published tables' Average); params: outside the embedding and "
            "head (MAD fixes the width, not the size); params total: with them, over the settings run (the "
            "embedding grows with a task's vocabulary)." + _selection_note(runs) + "\n\n"
            + markdown_table(["label", "MAD score", *tasks, "settings", "params", "params total"], body)
            + "\n\nThe settings only some models ran, each model's baseline → the change:\n\n" + mad_changes(runs))


def mad_changes(frame: pd.DataFrame) -> str:
    """The MAD settings outside the scored ones (``stats.shared_settings``: those only some
    mixers ran), a row per task and change to its MAD baseline, a column per mixer that ran
    one: its best accuracy at the baseline → at the change ("–" where it has not run one)."""
    from tasks.mad.data import mad_settings

    ok = mad_runs(frame)
    if ok.empty:
        return "No MAD run has finished yet."
    best = best_over_lr(ok, ["label", "mad_task", "setting"])
    acc = best.groupby(["label", "mad_task", "setting"])["accuracy"].mean()  # mean over seeds
    scored = shared_settings(ok)
    shared = set(zip(scored["mad_task"], scored["setting"]))
    changed = sorted({key for key in zip(ok["mad_task"], ok["setting"]) if key not in shared})
    if not changed:
        return "Every mixer has run the same settings: no change to read apart."
    labels = sorted({label for label, task, setting in acc.index if (task, setting) in changed})
    cell = (lambda label, task, setting: f"{acc[label, task, setting]:.3f}"
            if (label, task, setting) in acc.index else "–")
    lines = []
    for task, setting in changed:
        base = mad_settings(task)[0]
        change = ", ".join(f"{k} {v}" for k, v in json.loads(setting).items() if base.get(k) != v) or "none"
        base_key = json.dumps(base, sort_keys=True)
        lines.append([task, change, *(f"{cell(m, task, base_key)} → {cell(m, task, setting)}" for m in labels)])
    return markdown_table(["task", "change to the baseline", *labels], lines, ["---", "---"] + ["---:"] * len(labels))


def mad_published_section(published: pd.DataFrame) -> str:
    """MAD's published scores (published.csv rows of task "mad", one per model and task,
    "average" the mean of the six) as one table, to read beside ``mad_section``."""
    table = published_mad_scores(published)
    if table.empty:
        return ""
    tasks = sorted(c for c in table.columns if c != "average")
    body = [[model, _fmt(row.get("average")), *(_fmt(row[t]) for t in tasks)] for model, row in table.iterrows()]
    sources = ", ".join(sorted(published.loc[published["task"] == "mad", "source"].unique()))
    return (f"## mad: the published scores\n\n{sources}; the published tables' Average is our MAD score.\n\n"
            + markdown_table(["model", "average", *tasks], body))


# Benchmarks whose records hold points: (the point's axis and its column title, the keys
# that tell rows apart, the measurements with their table titles)
POINT_TABLES = {
    "scaling": (("seq_len", "L"), ("label", "pass"),
                (("median_ms", "median latency (ms)"), ("peak_mem_mb", "peak memory (MB)"))),
    "decode": (("context", "context"), ("label", "d_model", "batch"),
               (("ms_per_token", "median time per generated token (ms)"),
                ("decode_mem_mb", "memory held while decoding (MB)"),
                ("bandwidth_fraction", "fraction of the read bandwidth a step reaches"),
                ("compute_fraction", "fraction of the matmul rate a step reaches"))),
}


def points_section(rows: pd.DataFrame, task: str) -> str:
    """One table per measurement of a benchmark with points: a row per key (mixer and
    pass, or mixer, width and batch), a column per point; a point that could not be
    measured shows its status (oom, timeout, skipped)."""
    (x, x_title), keys, measured = POINT_TABLES[task]
    ok = rows[rows["run_status"] == "ok"]
    xs = sorted(ok[x].dropna().astype(int).unique())
    keys = [k for k in keys if k in ok]
    parts = [f"## {task}"]
    for metric, title in measured:
        if metric not in ok or ok[metric].isna().all():
            continue
        body = []
        for key, grp in ok.groupby(keys, sort=True):
            cells = []
            for value in xs:
                at = grp[grp[x] == value]
                good = at[at["status"] == "ok"]
                cells.append(_stat(good[metric]) if not good.empty else (at["status"].iloc[0] if len(at) else "–"))
            body.append([*(key if isinstance(key, tuple) else (key,)), *cells])
        parts.append(f"{title}, mean ± sd over seeds\n\n" + markdown_table([*keys, *(f"{x_title}={v}" for v in xs)], body))
    return "\n\n".join(parts)


def _finished(rows: pd.DataFrame) -> pd.DataFrame:
    """A task's finished runs without the columns only a sweep's other tasks fill: an MQAR
    ``lr``, empty for a language model, would hide the rate its config gives ``chosen``."""
    return rows[rows["run_status"] == "ok"].dropna(axis=1, how="all")


def task_section(rows: pd.DataFrame, task: str) -> str:
    if task in POINT_TABLES and POINT_TABLES[task][0][0] in rows:
        return points_section(rows, task)
    ok = _finished(rows)
    metrics = _metric_columns(ok, task)
    if ok.empty or not metrics:
        return f"## {task}\n\nNo finished runs with metrics."
    if task == "mqar" and "accuracy" in ok:
        return mqar_section(tried_runs(rows))
    if task == "mad" and "accuracy" in ok:
        return mad_section(mad_runs(rows))
    return chosen_section(ok, task, metrics)


def chosen_section(ok: pd.DataFrame, task: str, metrics: list[str]) -> str:
    """A row per model (``stats.model_keys``) at its chosen learning rate (``stats.chosen``),
    mean ± sd over the seeds at that rate, with the rate (and how many it was chosen from)
    and, for Wikitext-2, the gap to attention at attention's own chosen rate; beneath, the
    bracket the rates were chosen from."""
    picked = chosen(ok, task)
    keys = model_keys(picked)
    counts = [c for c in COUNTS if c in picked and picked[c].notna().any()]
    has_lr = picked["lr"].notna().any()
    gap = _gap_to_attention(picked, metrics[-1]) if task == "wikitext2" else None
    body = []
    for key, grp in picked.groupby(keys, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        params = [_fmt(float(grp[c].dropna().iloc[0])) if grp[c].notna().any() else "–" for c in counts]
        cells = [_stat(grp[m]) for m in metrics] + ([_rate(grp)] if has_lr else []) + [int(grp["seeds"].iloc[0])]
        body.append([*key, *params, *cells, *([gap(grp)] if gap else [])])
    header = [*keys, *(COUNTS[c] for c in counts), *metrics, *(["lr"] if has_lr else []), "seeds",
              *([f"{metrics[-1]} vs attention"] if gap else [])]
    caption = _rate_caption(ok, task) + (" " + GAP_CAPTION.format(metric=metrics[-1]) if gap else "")
    return f"## {task}\n\n{caption}\n\n" + markdown_table(header, body) + bracket_table(ok, task)


def _rate_caption(ok: pd.DataFrame, task: str) -> str:
    """How ``stats.chosen`` read the models: at a rate chosen on validation, or, with no
    validation metric to choose on, a row per rate."""
    metric, higher = SELECT_ON.get(task, (None, False))
    if metric in ok and ok[metric].notna().any():
        return (f"Each model at its learning rate chosen on validation: the rate of {'highest' if higher else 'lowest'} "
                f"mean {metric} over the seeds every rate ran; then mean ± sd over the seeds at that rate.")
    return ("No validation metric to choose a learning rate on: a model run at several rates has a row per rate "
            "(its label ends \" lr <rate>\"), none pooled; mean ± sd over the seeds at that rate.")


def _rate(grp: pd.DataFrame) -> str:
    """A model's learning rate, and how many it was the best of ("0.001 (best of 3)")."""
    lr, tried = grp["lr"].iloc[0], int(grp["lrs_tried"].iloc[0])
    return "–" if pd.isna(lr) else f"{lr:g}" + (f" (best of {tried})" if tried > 1 else "")


def bracket_table(ok: pd.DataFrame, task: str) -> str:
    """The learning-rate bracket behind ``chosen_section`` (``stats.bracket``): a row per
    model run at more than one rate, a column per rate, its validation metric on the seeds
    every one of its rates ran, the chosen rate in bold; "" where no model ran two rates."""
    table = bracket(ok, task)
    if table.empty:
        return ""
    keys = [c for c in table.columns if c not in ("lr", "value", "seeds", "chosen")]
    lrs = sorted(table["lr"].unique())
    body = []
    for key, grp in table.groupby(keys, dropna=False, sort=True):
        at = grp.set_index("lr")
        cells = ["–" if lr not in at.index else f"**{_fmt(at.at[lr, 'value'])}**" if at.at[lr, "chosen"]
                 else _fmt(at.at[lr, "value"]) for lr in lrs]
        body.append([*(key if isinstance(key, tuple) else (key,)), *cells, grp["seeds"].iloc[0]])
    header = [*keys, *(f"lr {lr:g}" for lr in lrs), "seeds"]
    return (f"\n\n### learning-rate bracket\n\n{SELECT_ON[task][0]} at each learning rate a model ran, the mean "
            "over the seeds every one of its rates ran (seeds); in bold the rate chosen, the one the table above "
            "reads it at.\n\n" + markdown_table(header, body, ["---"] * len(keys) + ["---:"] * len(lrs) + ["---"]))


def _gap_text(mine: pd.Series, theirs: pd.Series, same_runs: bool = False) -> str:
    """``mine`` relative to ``theirs`` (``gap_interval``: ``+12.0%`` = 12% higher), with
    its 95% Welch interval where both sides have at least 2 values."""
    mine, theirs = (pd.to_numeric(v, errors="coerce").dropna().tolist() for v in (mine, theirs))
    if not mine or not theirs:
        return "–"
    point, low, high = gap_interval(mine, theirs)
    # runs compared with themselves are not two independent samples: no interval
    if low is None or same_runs:
        return f"{100 * point:+.1f}%"
    return f"{100 * point:+.1f}% [{100 * low:+.1f}%, {100 * high:+.1f}%]"


def _gap_to_attention(picked: pd.DataFrame, metric: str):
    """The paper's question, as a column: a model's ``metric`` relative to the attention
    runs of the same setting, each at its chosen rate (``picked``: ``stats.chosen``)."""
    if "mixer" not in picked or not (picked["mixer"] == "attention").any():
        return None

    def gap(grp: pd.DataFrame) -> str:
        base = block_attention(picked, grp)
        return _gap_text(grp[metric], base[metric], same_runs=grp.index.isin(base.index).any())
    return gap


GAP_CAPTION = ("{metric} vs attention: the geometric mean of {metric} over seeds relative to that of the "
               "attention runs of the same setting and block (norm placement, init) at attention's chosen rate (exp "
               "of the difference in mean log {metric}, minus 1); in brackets, where both have at least 2 seeds, "
               "a 95% Welch t interval on that "
               "difference.")


def _our_column(metric: str, split: str, columns) -> str | None:
    """Our column of a published ``metric`` on ``split`` ("ppl", "validation": best_val_ppl)."""
    names = METRICS.get(metric.lower(), (metric.lower(),))
    splits = SPLITS.get(split.lower(), (split.lower(),)) if split else ("",)
    for s in splits:
        for m in names:
            for cand in (f"{s}_{m}", f"best_{s}_{m}", f"{m}_{s}", m if not s else None):
                if cand and cand in columns:
                    return cand
    return None


def _source_gaps(pub: pd.DataFrame) -> list[tuple[str, str, float, float]]:
    """One source's gaps at one setting: (mixer, split, its value, its attention's value)
    per mixer it gives beside attention on a common split, validation preferred, the
    first value each gives there (a source may print two runs of one model)."""
    out = []
    for mixer in pub.loc[pub["mixer"] != "attention", "mixer"].unique():
        both = [s for s in pub["split"].unique() if {mixer, "attention"} <= set(pub.loc[pub["split"] == s, "mixer"])]
        if both:
            split = next((s for s in both if s.lower() in SPLITS["validation"]), both[0])
            first = pub[pub["split"] == split].groupby("mixer")["value"].first()
            out.append((mixer, split, float(first[mixer]), float(first["attention"])))
    return out


def published_gaps(picked: dict[str, pd.DataFrame], published: pd.DataFrame) -> list[list]:
    """For perplexity, a line per published source, setting and mixer it sets beside its
    attention (``_source_gaps``) and each of our labels of that mixer in that setting: the
    source's gap, and ours to our attention on the same split (``picked``: each task's
    ``stats.chosen`` rows, so each side at its chosen rate) with the seeds of each side."""
    ppl = published[published["metric"].str.lower().isin(METRICS["ppl"]) & (published["setting"] != "")]
    lines = []
    for (task, setting, source), pub in ppl.groupby(["task", "setting", "source"], sort=False):
        ours = picked.get(task, pd.DataFrame())
        if "setting" not in ours or "mixer" not in ours:
            continue
        ours = ours[ours["setting"] == setting]
        for mixer, split, value, attention in _source_gaps(pub):
            col = _our_column("ppl", split, ours.columns)
            if col is None:
                continue
            for label, mine in ours[ours["mixer"] == mixer].groupby("label"):
                base = block_attention(ours, mine)
                lines.append([task, setting, source, split, f"{_fmt(value)} / {_fmt(attention)}",
                              f"{100 * (value / attention - 1):+.1f}%", label, _gap_text(mine[col], base[col]),
                              f"{mine[col].notna().sum()} vs {base[col].notna().sum()} seeds"])
    return lines


def published_values(picked: dict[str, pd.DataFrame], published: pd.DataFrame) -> list[list]:
    """For accuracy, where the setup is the same (the setting matches), the published
    number beside ours at the chosen rate (``picked``: each task's ``stats.chosen`` rows)."""
    acc = published[published["metric"].str.lower().isin(METRICS["accuracy"]) & (published["setting"] != "")]
    lines = []
    for _, pub in acc.iterrows():
        ours = picked.get(pub["task"], pd.DataFrame())
        if "setting" not in ours or "mixer" not in ours:
            continue
        ours = ours[(ours["setting"] == pub["setting"]) & (ours["mixer"] == pub["mixer"])]
        col = _our_column(pub["metric"], pub["split"], ours.columns)
        if col is None:
            continue
        value = pd.to_numeric(pub["value"], errors="coerce")
        for label, grp in ours.groupby("label"):
            mine = pd.to_numeric(grp[col], errors="coerce").dropna()
            params = _fmt(float(grp["params"].iloc[0])) if "params" in grp else "–"
            if "params_no_embeddings" in grp and grp["params_no_embeddings"].notna().any():
                params += f" (w/o embeddings {_fmt(float(grp['params_no_embeddings'].dropna().iloc[0]))})"
            lines.append([pub["task"], pub["setting"], f"{pub['model']} ({pub['source']})",
                          _fmt(pd.to_numeric(pub.get("params"), errors="coerce")), f"{pub['metric']} {pub['split']}",
                          _fmt(value), label, params, _stat(grp[col]), _rate(grp),
                          _fmt(float(mine.mean() - value)) if len(mine) and pd.notna(value) else "–"])
    return lines


def published_section(df: pd.DataFrame, published: pd.DataFrame) -> str:
    """Our runs beside the published rows: gaps to attention for perplexity
    (``published_gaps``), numbers for accuracy in the same setting (``published_values``)."""
    published = published.fillna({"setting": "", "split": ""}).astype({"metric": str})
    tasks = set(published["task"]) & set(df.loc[df["run_status"] == "ok", "task"])
    picked = {task: chosen(_finished(df[df["task"] == task]), task) for task in tasks}
    gaps, values = published_gaps(picked, published), published_values(picked, published)
    if not gaps and not values:
        return "## Beside the published numbers\n\nNo published row matches these runs."
    parts = ["## Beside the published numbers", PUBLISHED_CAPTION]
    if gaps:
        parts.append(GAPS_CAPTION + "\n\n" + markdown_table(
            ["task", "setting", "source", "split", "theirs: mixer / attention", "their gap", "ours",
             "our gap [95% CI]", "seeds"], gaps))
    if values:
        parts.append("Accuracy in the same setting, ours at the learning rate chosen on validation (mean ± sd over "
                     "the seeds at that rate):\n\n" + markdown_table(
                         ["task", "setting", "published model", "params", "metric", "published", "ours", "params total",
                          "ours (mean ± sd)", "lr", "ours − published"], values))
    return "\n\n".join(parts)


PUBLISHED_CAPTION = ("Absolute perplexity does not carry across the sources' tokenizers and recipes, so no "
                     "perplexity is subtracted from another: each source's gap to its own attention stands beside "
                     "ours to our attention, and numbers stand side by side only for accuracy in the same setting.")
GAPS_CAPTION = ("Perplexity: a source's gap is its mixer's value over its attention's, minus 1 (the first value "
                "each gives, on validation where it gives both); ours is that of each of our labels of the mixer "
                "in the same setting over our attention, each at its learning rate chosen on validation, on the "
                "same split (best_val_ppl, or test_ppl for test), as a ratio of geometric means over seeds, with a "
                "95% Welch t interval where both sides have at least 2 seeds:")


def sweep_counts(ok: int, not_ok: list[dict]) -> str:
    """"6 runs in the sweep: 3 ok; not ok: 2 not run, 1 partial": ``ok`` runs with an ok
    record beside ``not_ok`` (``not_ok_section``'s rows), counted by state."""
    states = collections.Counter(run["state"] for run in not_ok).most_common()
    return (f"{ok + len(not_ok)} runs in the sweep: {ok} ok; not ok: "
            + ", ".join(f"{n} {state}" for state, n in states))


def not_ok_section(not_ok: list[dict]) -> str:
    """A row per run of the sweep without an ok record: ``not_ok`` holds, in the sweep's
    order, each one's run_id, label, state (not run, partial, lost, running, failed,
    diverged, damaged ...), config (the fields that tell it from its label's other runs)
    and note (its error's last line, or what is wrong with its record)."""
    rows = [[r["run_id"], r["label"], r["state"], r.get("config", ""), r.get("note", "")] for r in not_ok]
    return ("## Runs without an ok record\n\nEach in the state `linbench status` gave it when this report was "
            "written. The tables below read the records there are: a model or a learning rate none of whose runs "
            "has one is missing from them.\n\n"
            + markdown_table(["run", "label", "state", "config", "note"], rows))


def report_markdown(df: pd.DataFrame, published: pd.DataFrame | None = None, title: str = "",
                    not_ok: list[dict] | None = None) -> str:
    """The report of the records in ``df``. ``not_ok``: where the caller knows the sweep,
    its runs without an ok record (``not_ok_section``), counted and listed under the
    counts in place of the records' own non-ok ones, which miss every run that has no
    record; None for the records alone. A sweep whose every run is ok reads the same
    either way."""
    counts = df.drop_duplicates("run_id")["run_status"].value_counts()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    counted = (sweep_counts(int(counts.get("ok", 0)), not_ok) if not_ok else
               f"{counts.sum()} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    parts = [f"# linbench report: {title}".rstrip(": "), f"{counted}. Written {when}."]
    for col, what in (("git_commit", "commits"), ("device_name", "devices"), ("dtype", "dtypes")):
        if col in df:
            parts[-1] += f" {what}: {', '.join(sorted(map(str, df[col].dropna().unique())))}."
    bad = df[df["run_status"] != "ok"].drop_duplicates("run_id")
    if not_ok:
        parts.append(not_ok_section(not_ok))
    elif not bad.empty:
        rows = [[r.run_id, r.label, r.run_status, (str(r.error or "").strip().splitlines() or [""])[-1][:120]]
                for r in bad.itertuples()] if "error" in bad else []
        parts.append("## Runs that did not finish ok\n\n" + markdown_table(["run", "label", "status", "error"], rows))
    for task in sorted(df["task"].dropna().unique()):
        parts.append(task_section(df[df["task"] == task], task))
    if published is not None and not published.empty:
        if "mad" in set(df["task"]):  # MAD's scores are per model and task: a table of their own
            parts.append(mad_published_section(published))
        rest = df[df["task"] != "mad"]
        if not rest.empty:
            parts.append(published_section(rest, published[published["task"] != "mad"]))
    return "\n\n".join(parts) + "\n"


def write_report(df: pd.DataFrame, out: str | Path, published: str | Path | None = None, title: str = "",
                 not_ok: list[dict] | None = None) -> Path:
    pub = read_published(published)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report_markdown(df, pub, title, not_ok))
    return out
