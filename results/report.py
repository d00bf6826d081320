"""A sweep's Markdown report: what ran, our numbers per task (mean ± sd over seeds),
and our numbers beside the published ones of ``results/published.csv``.

The published table has columns task, source, setting, model, mixer, params, metric,
split, value (and note). One of our rows matches a published row when task, setting
(where both give one) and mixer agree; each of our labels of that mixer gets its own
line, so variants of one mixer sit side by side under the number they try to reproduce.
"""
from __future__ import annotations

import datetime
import math
from pathlib import Path

import pandas as pd

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


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _metric_columns(rows: pd.DataFrame, task: str) -> list[str]:
    wanted = [c for c in HEADLINE.get(task, ()) if c in rows and rows[c].notna().any()]
    if wanted:
        return wanted
    guess = [c for c in rows.columns if any(k in c for k in ("acc", "ppl", "loss"))
             and not c.startswith("config.") and pd.api.types.is_numeric_dtype(rows[c])]
    return guess[:4]


def _group_keys(rows: pd.DataFrame, task: str) -> list[str]:
    keys = ["label"]
    extra = {"wikitext2": ("setting",), "mqar": ("seq_len", "num_kv_pairs", "d_model"),
             "snli": ("setting",)}.get(task, ("setting",))
    keys += [k for k in extra if k in rows and rows[k].nunique(dropna=False) > 1]
    return keys


def scaling_section(rows: pd.DataFrame) -> str:
    """One table per measurement: a row per mixer and pass, a column per length; a
    point that could not be measured shows its status (oom, timeout, skipped)."""
    ok = rows[rows["run_status"] == "ok"]
    lengths = sorted(ok["seq_len"].dropna().astype(int).unique())
    keys = [k for k in ("label", "pass") if k in ok]
    parts = ["## scaling"]
    for metric, title in (("median_ms", "median latency (ms)"), ("peak_mem_mb", "peak memory (MB)")):
        if metric not in ok:
            continue
        body = []
        for key, grp in ok.groupby(keys, sort=True):
            cells = []
            for L in lengths:
                at = grp[grp["seq_len"] == L]
                good = at[at["status"] == "ok"]
                cells.append(_stat(good[metric]) if not good.empty else (at["status"].iloc[0] if len(at) else "–"))
            body.append([*(key if isinstance(key, tuple) else (key,)), *cells])
        parts.append(f"{title}, mean ± sd over seeds\n\n" + _table([*keys, *(f"L={L}" for L in lengths)], body))
    return "\n\n".join(parts)


def task_section(rows: pd.DataFrame, task: str) -> str:
    if task == "scaling" and "seq_len" in rows:
        return scaling_section(rows)
    ok = rows[rows["run_status"] == "ok"]
    metrics = _metric_columns(ok, task)
    if ok.empty or not metrics:
        return f"## {task}\n\nNo finished runs with metrics."
    keys = _group_keys(ok, task)
    counts = [c for c in COUNTS if c in ok]
    gap = _gap_to_attention(ok, metrics[-1]) if task == "wikitext2" else None
    body = []
    for key, grp in ok.groupby(keys, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        params = [_fmt(float(grp[c].iloc[0])) if grp[c].notna().any() else "–" for c in counts]
        cells = [_stat(grp[m]) for m in metrics] + ([gap(grp)] if gap else [])
        body.append([*key, *params, *cells, grp["seed"].nunique() if "seed" in grp else len(grp)])
    extra = [f"{metrics[-1]} vs attention"] if gap else []
    header = [*keys, *(COUNTS[c] for c in counts), *metrics, *extra, "seeds"]
    return f"## {task}\n\nMean ± sd over seeds.\n\n" + _table(header, body)


def _gap_to_attention(ok: pd.DataFrame, metric: str):
    """The paper's question, as a column: a model's mean ``metric`` relative to the mean
    of the attention runs of the same setting (``+12.0%`` = 12% higher perplexity)."""
    if "mixer" not in ok or not (ok["mixer"] == "attention").any():
        return None

    def gap(grp: pd.DataFrame) -> str:
        same = ok if "setting" not in ok else ok[ok["setting"] == grp["setting"].iloc[0]]
        base = pd.to_numeric(same.loc[same["mixer"] == "attention", metric], errors="coerce").mean()
        mine = pd.to_numeric(grp[metric], errors="coerce").mean()
        return f"{100 * (mine / base - 1):+.1f}%" if math.isfinite(base) and math.isfinite(mine) else "–"
    return gap


def _our_column(metric: str, split: str, columns) -> str | None:
    names = METRICS.get(metric.lower(), (metric.lower(),))
    splits = SPLITS.get(split.lower(), (split.lower(),)) if split else ("",)
    for s in splits:
        for m in names:
            for cand in (f"{s}_{m}", f"best_{s}_{m}", f"{m}_{s}", m if not s else None):
                if cand and cand in columns:
                    return cand
    return None


def published_section(df: pd.DataFrame, published: pd.DataFrame) -> str:
    ok = df[df["run_status"] == "ok"]
    lines = []
    for _, pub in published.iterrows():
        ours = ok[ok["task"] == pub["task"]]
        if isinstance(pub.get("setting"), str) and pub["setting"] and "setting" in ours:
            ours = ours[ours["setting"] == pub["setting"]]
        if isinstance(pub.get("mixer"), str) and pub["mixer"] and "mixer" in ours:
            ours = ours[ours["mixer"] == pub["mixer"]]
        col = _our_column(str(pub["metric"]), str(pub.get("split") or ""), ours.columns)
        if ours.empty or col is None:
            continue
        value = pd.to_numeric(pd.Series([pub["value"]]), errors="coerce").iloc[0]
        for label, grp in ours.groupby("label"):
            mine = pd.to_numeric(grp[col], errors="coerce").dropna()
            delta = _fmt(float(mine.mean() - value)) if len(mine) and pd.notna(value) else "–"
            params = _fmt(float(grp["params"].iloc[0])) if "params" in grp else "–"
            lines.append([pub["task"], pub.get("setting", ""), f"{pub['model']} ({pub['source']})",
                          _fmt(pd.to_numeric(pub.get("params"), errors="coerce")), f"{pub['metric']} {pub.get('split', '')}",
                          _fmt(float(value)) if pd.notna(value) else pub["value"], label, params, _stat(grp[col]),
                          delta])
    if not lines:
        return "## Beside the published numbers\n\nNo published row matches these runs."
    header = ["task", "setting", "published model", "params", "metric", "published", "ours", "params",
              "ours (mean ± sd)", "ours − published"]
    return "## Beside the published numbers\n\n" + _table(header, lines)


def report_markdown(df: pd.DataFrame, published: pd.DataFrame | None = None, title: str = "") -> str:
    counts = df.drop_duplicates("run_id")["run_status"].value_counts()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"# linbench report: {title}".rstrip(": "),
             f"{counts.sum()} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + f". Written {when}."]
    for col, what in (("git_commit", "commits"), ("device_name", "devices"), ("dtype", "dtypes")):
        if col in df:
            parts[-1] += f" {what}: {', '.join(sorted(map(str, df[col].dropna().unique())))}."
    bad = df[df["run_status"] != "ok"].drop_duplicates("run_id")
    if not bad.empty:
        rows = [[r.run_id, r.label, r.run_status, (str(r.error or "").strip().splitlines() or [""])[-1][:120]]
                for r in bad.itertuples()] if "error" in bad else []
        parts.append("## Runs that did not finish ok\n\n" + _table(["run", "label", "status", "error"], rows))
    for task in sorted(df["task"].dropna().unique()):
        parts.append(task_section(df[df["task"] == task], task))
    if published is not None and not published.empty:
        parts.append(published_section(df, published))
    return "\n\n".join(parts) + "\n"


def write_report(df: pd.DataFrame, out: str | Path, published: str | Path | None = None, title: str = "") -> Path:
    pub = pd.read_csv(published, dtype={"setting": str}) if published and Path(published).is_file() else None
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report_markdown(df, pub, title))
    return out
