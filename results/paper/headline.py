"""The headline tables, made from a sweep's records and ``tasks/published.csv``.

docs/results.md quotes every one verbatim and the README a few; tests/test_reference.py
rebuilds them from the committed records and fails if a copy differs, so no number in them
is typed by hand. ``linbench headline --write docs/results.md`` (and ``--write README.md``)
rewrites the marked copies.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd

from ..records import load_records, records_frame
from ..report import mad_changes, markdown_table
from ..stats import (at_best_lr, block_attention, bracket, gap_interval, mad_params, mad_runs, mad_scores, mad_totals,
                     position_curves,
                     published_mad_scores, read_published)
from .decoding import decode_law, decode_readings, decode_targets
from .findings import (gap_placement, grid_bound, mad_agreement, mad_reach,
                       mad_seeds, mqar_best, mqar_reach, point_text, published_gap_rows, reading_gaps, zoology_findings)
from .readings import reading_verdicts
from .snli import snli_table, snli_verdict

REFERENCE = Path(__file__).resolve().parents[1] / "reference"


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %".replace("-", "−")


def _millions(column) -> str:
    """A per-model constant in millions; records older than the field give "–"."""
    value = column.iloc[0] if column is not None else None
    return "–" if value is None or pd.isna(value) else f"{value / 1e6:.1f}M"


def _thousands(value) -> str:
    return "–" if pd.isna(value) else f"{value / 1e3:.0f}k"


def mqar_table(frame: pd.DataFrame) -> str:
    """Best accuracy over learning rates at each (mixer, L, width) (mean ± sd (seeds) where
    the point has more than one: ``findings.point_text``), one row per mixer
    (best first at the longest L), one column per L holding the widths' values (marked *
    while some of the point's learning rates have not finished, † where a point, unsolved
    but above the 1/kv floor (``findings.grid_bound``), has its best at the largest or
    smallest learning rate tried), and the model's
    inference state at the longest L (at the row's own longest, named, if it stops short)."""
    best = mqar_best(frame)
    lengths, widths = sorted(best["seq_len"].unique()), sorted(best["d_model"].unique())
    lrs = best["lrs_tried"].max()  # a point with fewer finished so far is marked *
    kv = best.groupby("seq_len")["num_kv_pairs"].first().astype(int)
    longest = best[best["seq_len"] == lengths[-1]]
    order = longest.groupby("label")["accuracy"].mean().sort_values(ascending=False).index.tolist()
    order += sorted(set(best["label"]) - set(order))
    lines = []
    for label in order:
        mine = best[best["label"] == label]
        cells = []
        for L in lengths:
            at = mine[mine["seq_len"] == L].set_index("d_model")
            cells.append(" / ".join(point_text(at.loc[d]) + ("*" if at.at[d, "lrs_tried"] < lrs else "")
                                    + ("†" if grid_bound(at.at[d, "accuracy"], at.at[d, "lr_edge"], kv[L]) else "")
                                    if d in at.index else "–" for d in widths))
        # a row run only at shorter lengths (a control) gives its state at its longest, named
        longest = mine["seq_len"].max()
        state = mine[mine["seq_len"] == longest].set_index("d_model")["state_size"]
        cells.append(" / ".join(f"{int(state[d]):,}" if d in state else "–" for d in widths)
                     + ("" if longest == lengths[-1] else f" (L = {int(longest)})"))
        lines.append([label, *cells])
    header = ["mixer", *(f"L = {int(L)}, {kv[L]} pairs" for L in lengths), f"state floats at L = {lengths[-1]}"]
    return markdown_table(header, lines, ["---"] + ["---:"] * (len(header) - 1))


def _gap_cell(values, base) -> str:
    point, low, high = gap_interval(values, base)
    return _pct(point) + (f" [{_pct(low)}, {_pct(high)}]" if low is not None else "")


def lm_table(frame: pd.DataFrame) -> str:
    """Per model at its best learning rate (``at_best_lr``): size (the parameters outside
    the embeddings, which the models are matched on, and the total, tied embeddings
    included), training FLOPs per token, epochs, the rate (and how many were tried), seeds,
    perplexities (mean ± sd over seeds) and the gap to attention with its 95% interval
    (``gap_interval``), on validation, where the rate was chosen, and on test on the same
    runs. The gap is to attention in the same block (``block_attention``: a pre-LN model
    against pre-LN attention)."""
    ok = at_best_lr(frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok")])
    lines = []
    for label, grp in sorted(ok.groupby("label"), key=lambda kv: kv[1]["best_val_ppl"].mean()):
        val, test = grp["best_val_ppl"].tolist(), grp["test_ppl"].tolist()
        base = block_attention(ok, grp)
        if grp.index.isin(base.index).any() or base.empty:
            gaps = ["0" if len(base) else "–"] * 2
        else:
            gaps = [_gap_cell(val, base["best_val_ppl"].tolist()), _gap_cell(test, base["test_ppl"].tolist())]
        sd = (lambda v: f" ± {statistics.stdev(v):.1f}" if len(v) > 1 else "")
        tried = int(grp["lrs_tried"].iloc[0])
        lines.append([label, f"{grp['params_no_embeddings'].iloc[0] / 1e6:.2f}M",
                      "–" if "params" not in grp or pd.isna(grp["params"].iloc[0]) else f"{grp['params'].iloc[0] / 1e6:.2f}M",
                      _millions(grp.get("train_flops_per_token")), f"{grp['epochs_seen'].min():.2f}",
                      f"{grp['lr'].iloc[0]:g}" + (f" (best of {tried})" if tried > 1 else ""),
                      str(len(grp)), f"{statistics.mean(val):.1f}{sd(val)}", f"{statistics.mean(test):.1f}{sd(test)}",
                      *gaps])
    header = ["model", "params w/o embeddings (matched)", "params total", "training FLOPs / token", "epochs", "lr",
              "seeds", "best val ppl", "test ppl", "val ppl vs attention [95 % CI]",
              "test ppl vs attention [95 % CI]"]
    return markdown_table(header, lines, ["---"] + ["---:"] * (len(header) - 1))


def lr_bracket(frame: pd.DataFrame) -> str:
    """Per model tried at more than one learning rate (``stats.bracket``): the best
    validation perplexity at each rate, on the seeds every rate has run (the bracket's),
    the best in bold: the rate ``lm_table`` reads the model at."""
    ok = frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok")]
    table = bracket(ok, "wikitext2")
    if table.empty:
        return "*No model has run at more than one learning rate yet.*"
    lrs = sorted(ok["config.train.lr"].unique())
    lines = []
    for label, grp in table.groupby("label"):
        at = grp.set_index("lr")
        cells = [("–" if lr not in at.index else f"**{at.at[lr, 'value']:.1f}**" if at.at[lr, "chosen"]
                  else f"{at.at[lr, 'value']:.1f}") for lr in lrs]
        lines.append([label, grp["seeds"].iloc[0], *cells])
    header = ["model", "seeds", *(f"lr {lr:g}" for lr in lrs)]
    return markdown_table(header, lines, ["---", "---"] + ["---:"] * len(lrs))


def _precision_rows(bf16: pd.DataFrame, fp32: pd.DataFrame, metric: str) -> list[dict]:
    """Per model (best first under fp32; a model run in bf16 alone last): its ``metric``
    by seed in each precision, the seeds both ran, the mean change over those seeds and the
    fp32 seed sd, both on the log of the metric (None where there is nothing to read)."""
    def ok(frame, rates=None):  # {label: the metric by seed} (a seed run twice: their mean)
        rows = frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok")]
        if rates is not None and "config.train.lr" in rows:  # fp32 at bf16's rates (its sweep holds a bracket)
            rows = rows[rows["config.train.lr"].isin(rates)]
        return {label: grp.groupby("seed")[metric].mean() for label, grp in rows.groupby("label")}

    low, high = ok(bf16), ok(fp32, set(bf16.get("config.train.lr", [])))
    empty = pd.Series(dtype=float)
    rows = []
    for label in sorted({*high, *low}, key=lambda m: (m not in high, high.get(m, empty).mean(), m)):
        a, b = high.get(label, empty), low.get(label, empty)
        shared = sorted(set(a.index) & set(b.index))
        rows.append({"label": label, "fp32": a, "bf16": b, "shared": shared,
                     "sd": statistics.stdev([math.log(v) for v in a]) if len(a) > 1 else None,
                     "change": statistics.fmean(math.log(b[s] / a[s]) for s in shared) if shared else None})
    return rows


def precision_table(bf16: pd.DataFrame, fp32: pd.DataFrame, metric: str = "best_val_ppl") -> str:
    """Does bf16 autocast move a result? Per model, its ``metric`` under fp32 and under
    bf16 (mean ± sd over seeds), the change on the seeds both ran (the same seed gives the
    same initialisation and batches, so the pair isolates the precision), and the fp32
    seed-to-seed spread it is judged against: "within" when the mean change is no larger
    than one fp32 seed sd (both on log perplexity, as fractions). Best first under fp32."""
    lines = []
    for row in _precision_rows(bf16, fp32, metric):
        change, sd = row["change"], row["sd"]
        verdict = ("–" if change is None or sd is None else "within" if abs(change) <= sd else
                   "outside" + (f" ({abs(change) / sd:.1f} sd)" if sd > 0 else ""))
        spread = (lambda v: "–" if v.empty else
                  f"{v.mean():.1f}" + (f" ± {v.std():.1f}" if len(v) > 1 else "") + f" ({len(v)})")
        # two decimals: a precision change is often a few hundredths of a per cent
        lines.append([row["label"], spread(row["fp32"]), spread(row["bf16"]),
                      "–" if change is None else
                      f"{100 * math.expm1(change):+.2f} % ({', '.join(map(str, row['shared']))})".replace("-", "−"),
                      "–" if sd is None else f"{100 * sd:.2f} %", verdict])
    header = ["model", f"fp32 {metric} (seeds)", f"bf16 {metric} (seeds)", "bf16 vs fp32, same seeds",
              "fp32 seed sd", "change within 1 sd?"]
    return markdown_table(header, lines, ["---", "---:", "---:", "---:", "---:", "---"])


def precision_verdict(bf16: pd.DataFrame, fp32: pd.DataFrame, metric: str = "best_val_ppl") -> str:
    """One sentence over ``precision_table``'s models: how many changed by no more than
    their fp32 seed sd, the largest change, and whether any two models swap places (on
    their means over the seeds both precisions ran), on validation and again on test."""
    rows = [r for r in _precision_rows(bf16, fp32, metric) if r["change"] is not None and r["sd"] is not None]
    if not rows:
        return "*No model has run in both precisions yet.*"
    within = [r for r in rows if abs(r["change"]) <= r["sd"]]
    top = max(rows, key=lambda r: abs(r["change"]))
    mean = {p: {r["label"]: statistics.fmean(r[p][s] for s in r["shared"]) for r in rows} for p in ("fp32", "bf16")}
    pairs = [(x["label"], y["label"]) for i, x in enumerate(rows) for y in rows[i + 1:]]
    swapped = [f"{x} / {y}" for x, y in pairs
               if (mean["fp32"][x] < mean["fp32"][y]) != (mean["bf16"][x] < mean["bf16"][y])]
    seeds = sorted({s for r in rows for s in r["shared"]})
    largest = f"{100 * math.expm1(top['change']):+.2f} %".replace("-", "−")
    ratio = f"{abs(top['change']) / top['sd']:.1f} sd" if top["sd"] > 0 else "no fp32 spread"
    name = {"best_val_ppl": "best validation perplexity", "test_ppl": "test perplexity"}.get(metric, metric)
    said = (f"{len(within)} of {len(rows)} models move their {name} by no more than one fp32 seed sd; the largest "
            f"change is {largest} ({top['label']}, {ratio}); {len(swapped)} of {len(pairs)} pairs of models change "
            f"order" + (f" ({', '.join(swapped)})" if swapped else ""))
    if metric != "best_val_ppl":
        return said
    on_test = precision_verdict(bf16, fp32, "test_ppl") if _has(bf16, fp32, "test_ppl") else ""
    return (f"Under bf16 autocast, on seeds {', '.join(map(str, seeds))}: {said}."
            + (f" Read again on test, on the same runs: {on_test}." if on_test and not on_test.startswith("*") else
               " No test perplexity to read it again on."))


def _has(bf16: pd.DataFrame, fp32: pd.DataFrame, metric: str) -> bool:
    return all(metric in f and f[metric].notna().any() for f in (bf16, fp32))


def published_gaps(published: pd.DataFrame, settings=("6L/128", "6L/256"), split: str = "validation") -> str:
    """Each source's Grassmann-vs-attention gap in each of ``settings`` (layers/context),
    from the first value it gives of each (``published_gap_rows``)."""
    lines = [[r["source"], r["setting"], f"{r['attention']:g}", f"{r['grassmann']:g}", _pct(r["gap"])]
             for r in published_gap_rows(published, settings, (split,))]
    header = ["source", "layers/L", f"attention {split} ppl", f"Grassmann {split} ppl", "gap"]
    return markdown_table(header, lines, ["---", "---", "---:", "---:", "---:"])


def status_line(records: list[dict], planned: int) -> str:
    """How far a sweep has got, and the training time its finished runs took."""
    done = [r for r in records if r["status"] == "ok"]
    hours = sum(r["metrics"].get("wall_time") or 0 for r in done) / 3600
    work = "measurement" if records and all(r.get("task") in ("decode", "scaling") for r in records) else "training"
    return (f"{len(done)} of its {planned} runs finished ({hours:.1f} h of {work}, one thread per run"
            f"{'' if len(done) == len(records) else f'; {len(records) - len(done)} did not finish ok'})")


def _decode_points(frame: pd.DataFrame) -> pd.DataFrame:
    rows = frame[(frame["task"] == "decode") & (frame["run_status"] == "ok") & (frame["status"] == "ok")]
    return rows.astype({"context": int, "batch": int, "d_model": int})


def decode_table(frame: pd.DataFrame, short: int = 1024) -> str:
    """Per mixer and setting (width, batch): the time per generated token after ``short``
    tokens of context and after the longest context measured, with their ratio, and the
    state one sequence holds there."""
    pts = _decode_points(frame)
    settings = sorted({(d, b) for d, b in zip(pts["d_model"], pts["batch"])})
    lines = []
    order = sorted(pts["label"].unique(), key=lambda m: (m != "attention", m))  # the control first
    for label, grp in ((m, pts[pts["label"] == m]) for m in order):
        cells, state = [], "–"
        for d, b in settings:
            one = grp[(grp["d_model"] == d) & (grp["batch"] == b)].set_index("context")
            top = one.index.max() if not one.empty else None
            if top is None or short not in one.index:
                cells.append("–")
                continue
            a, z = one.at[short, "ms_per_token"], one.at[top, "ms_per_token"]
            cells.append(f"{a:.2f} → {z:.2f} ({z / a:.2f}x)")
            state = f"{one.at[top, 'state_mb_per_seq']:.3g}"
        lines.append([label, *cells, state])
    longest = int(pts["context"].max()) if not pts.empty else 0
    header = ["mixer", *(f"d {d}, batch {b}: ms/token at {short:,} → {longest:,}" for d, b in settings),
              f"state MB / sequence at {longest:,} (d {settings[-1][0] if settings else '–'})"]
    return markdown_table(header, lines, ["---"] + ["---:"] * (len(header) - 1))


def extrapolation_table(frame: pd.DataFrame) -> str:
    """Per model: validation perplexity on contexts of the training length, in the last
    bucket of each longer context, and, on the longest contexts, the last bucket's ratio to
    the first bucket of the same sequences (mean over seeds)."""
    curves = position_curves(frame)
    if curves.empty:
        return "*No run with an extrapolation curve yet.*"
    factors = sorted(curves["factor"].unique())
    last = curves[curves["bucket"] == curves["factor"] - 1].groupby(["label", "factor"])["ppl"].mean()
    first = curves[curves["bucket"] == 0].groupby(["label", "factor"])["ppl"].mean()  # the same sequences' start
    top, base = factors[-1], factors[0]
    labels = sorted(first.index.get_level_values(0).unique(),
                    key=lambda m: last.get((m, top), float("inf")) / first.get((m, top), float("nan")))
    lines = [[label, f"{first.get((label, base), float('nan')):.1f}",
              *(f"{last.get((label, f), float('nan')):.1f}" for f in factors[1:]),
              f"{last.get((label, top), float('nan')) / first.get((label, top), float('nan')):.2f}x"]
             for label in labels]
    L = int(curves.loc[curves["bucket"] == 1, "position"].iloc[0]) if (curves["bucket"] == 1).any() else 0
    header = [f"model (trained at L = {L})", f"ppl, positions 0–{L - 1}",
              *(f"ppl, positions {(f - 1) * L:,}–{f * L - 1:,}" for f in factors[1:]), f"last / first at {top}x"]
    return markdown_table(header, lines, ["---"] + ["---:"] * (len(header) - 1))


def mad_table(frame: pd.DataFrame, published: pd.DataFrame | None = None) -> str:
    """Our MAD scores (``stats.mad_scores``: best over the sweep per setting, mean over a
    task's settings, the MAD score the mean over tasks) beside MAD's published ones, one row
    per model, a column per task, with our parameters outside the embeddings and in total
    (which varies with each task's vocabulary); ours first, best score first. A score of ours marked *
    averages fewer tasks than the published scores do (a sweep still running)."""
    if published is None:
        published = read_published()
    ok = mad_runs(frame)
    ours = mad_scores(ok)
    theirs = published_mad_scores(published).rename(columns={"average": "MAD score"})
    tasks = sorted({*ours.columns, *theirs.columns} - {"MAD score", "settings"})
    cell = (lambda row, t: f"{row[t]:.3f}" if t in row and pd.notna(row[t]) else "–")
    partial = (lambda row: "*" if any(t not in row or pd.isna(row[t]) for t in theirs.columns if t != "MAD score")
               else "")
    params, totals = mad_params(ok), mad_totals(ok)
    lines = [[f"{label} (ours)", _thousands(params[label]), _span(totals[label]), str(int(row["settings"])),
              cell(row, "MAD score") + partial(row), *(cell(row, t) for t in tasks)] for label, row in ours.iterrows()]
    lines += [[f"{model} (MAD)", "–", "–", "all", cell(row, "MAD score"), *(cell(row, t) for t in tasks)]
              for model, row in theirs.iterrows()]
    header = ["model", "params w/o embeddings", "params total (over the settings)", "settings", "MAD score", *tasks]
    return markdown_table(header, lines, ["---", "---:", "---:", "---:", "---:"] + ["---:"] * len(tasks))


def _span(low_high) -> str:
    """A range of parameter counts in thousands, one number where it is one."""
    low, high = low_high
    return _thousands(low) if pd.isna(low) or _thousands(low) == _thousands(high) else \
        f"{_thousands(low)}–{_thousands(high)}"


# table name: (the reference sweep whose records make it, how)
TABLES = {"wikitext2_cpu": ("wikitext2_cpu", lm_table),
          "wikitext2_cpu_bracket": ("wikitext2_cpu", lr_bracket),
          "mqar_cpu": ("mqar_cpu", mqar_table),
          "mqar_cpu_findings": ("mqar_cpu", zoology_findings),
          "mqar_cpu_reach": ("mqar_cpu", mqar_reach),
          "wikitext2_6L_cpu": ("wikitext2_6L_cpu", lm_table),
          "wikitext2_6L_cpu_bracket": ("wikitext2_6L_cpu", lr_bracket),
          "wikitext2_6L_cpu_gap": ("wikitext2_6L_cpu", lambda frame: gap_placement(frame, read_published())),
          "wikitext2_6L_cpu_readings": ("wikitext2_6L_cpu", reading_gaps),
          "wikitext2_6L_cpu_verdict": ("wikitext2_6L_cpu", lambda frame: reading_verdicts(frame, read_published())),
          "wikitext2_12L_cpu_verdict": ("wikitext2_12L_cpu", lambda frame: reading_verdicts(frame, read_published())),
          "decode_cpu": ("decode_cpu", decode_table),
          "decode_cpu_law": ("decode_cpu", lambda frame: decode_law(_decode_points(frame))),
          "decode_cpu_targets": ("decode_cpu", lambda frame: decode_targets(_decode_points(frame))),
          "decode_cpu_readings": ("decode_cpu", lambda frame: decode_readings(_decode_points(frame))),
          "extrapolation_cpu": ("extrapolation_cpu", extrapolation_table),
          "mad_cpu": ("mad_cpu", mad_table),
          "mad_cpu_agreement": ("mad_cpu", lambda frame: mad_agreement(frame, read_published())),
          "mad_cpu_reach": ("mad_cpu", mad_reach),
          "mad_cpu_seeds": ("mad_cpu", mad_seeds),
          "mad_cpu_changes": ("mad_cpu", mad_changes),
          "snli_cpu": ("snli_cpu", snli_table),
          "snli_cpu_verdict": ("snli_cpu", lambda frame: snli_verdict(frame, read_published())),
          "wikitext2_bf16_cpu": ("wikitext2_bf16_cpu", lambda frame: precision_table(frame, _fp32_lm())),
          "wikitext2_bf16_cpu_verdict": ("wikitext2_bf16_cpu", lambda frame: precision_verdict(frame, _fp32_lm()))}


def _fp32_lm() -> pd.DataFrame:
    """The fp32 records the bf16 sweep is compared with (wikitext2_cpu's)."""
    return records_frame(load_records(REFERENCE / "wikitext2_cpu"))


def reference_sweeps() -> list[str]:
    """The sweeps whose records the headline tables read, in table order."""
    return list(dict.fromkeys(sweep for sweep, _ in TABLES.values()))


def tables(planned: dict[str, int]) -> dict[str, str]:
    """Every headline table, by name, and each reference sweep's status line against the
    ``planned`` number of runs of each sweep; a sweep with no finished run yet (one being
    rerun) says so in place of its tables."""
    out = {}
    for name, (sweep, make) in TABLES.items():
        records = load_records(REFERENCE / sweep)
        out[name] = make(records_frame(records)) if records else "*No finished run yet.*"
        out[f"{sweep}_status"] = status_line(records, planned[sweep])
    out["published_gaps"] = published_gaps(read_published())
    return out


def update(text: str, made: dict[str, str]) -> str:
    """``text`` with the body between ``<!-- headline:NAME -->`` and ``<!-- /headline -->``
    replaced by table NAME: the pages' copies are rewritten, never edited by hand."""
    for name, table in made.items():
        start, end = f"<!-- headline:{name} -->", "<!-- /headline -->"
        if start in text:
            head, rest = text.split(start, 1)
            text = f"{head}{start}\n{table}\n{end}{rest.split(end, 1)[1]}"
    return text
