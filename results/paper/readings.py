"""The block-reading verdict: for each reading of the paper's Grassmann block in a sweep
(its post-LN blend, the gated residual, pre-LN, pre-LN with a small init; ``roles.LM_ROLES``),
whether it trails attention built the same way, closes the gap or reverses it, on
validation perplexity with Welch's interval and the seeds, each model at its own best
learning rate; beside it, each published reproduction at the same depth and context, with
the block its source states.
"""
from __future__ import annotations

import re

import pandas as pd

from ..report import markdown_table
from ..stats import at_best_lr, block_attention, gap_interval
from .findings import _pct, published_gap_rows
from .roles import LM_ROLES, by_role

PAPER_RANGE = (0.10, 0.15)  # the paper's claimed gap to a size-matched Transformer


def reads_as(gap: float, low: float | None, high: float | None) -> str:
    """What a gap with its interval says: "reverses the gap" (all of it below 0), "closes
    the gap" (the interval holds 0), "trails" (all of it above 0), the paper's range named
    where the gap falls in it; with no interval (a side with one seed), no verdict."""
    inside = " (in the paper's 10–15 %)" if PAPER_RANGE[0] <= gap <= PAPER_RANGE[1] else ""
    if low is None:
        return f"one seed on a side: no verdict{inside}"
    if high < 0:
        return "reverses the gap"
    return ("closes the gap" if low <= 0 else "trails") + inside


def stated_block(note) -> str:
    """The block a published row's note states: pre-LN or post-LN, a small init named."""
    text = str(note) if pd.notna(note) else ""
    block = "pre-LN" if re.search(r"\bpre-norm", text) else "post-LN" if re.search(r"\bpost-norm", text) else ""
    if block and re.search(r"N\(0, 0\.02\)", text):
        block += ", small init"
    return block or "block not stated"


def _our_block(runs: pd.DataFrame) -> str:
    first = runs.iloc[0]
    block = "pre-LN" if first.get("config.model.block") == "prenorm" else "post-LN"
    if pd.notna(first.get("config.model.init_std")):
        block += ", small init"
    if first.get("config.model.mixer_options.mixing") == "gated_residual":
        block += ", gated residual"
    return block


def reading_verdicts(frame: pd.DataFrame, published: pd.DataFrame, base: str = "grassmann") -> str:
    """One row per reading of ``base``'s block the sweep ran: the attention of the same
    block it is read against, the gap on validation perplexity with its interval, both
    sides' seeds at their best rates, what it reads as (``reads_as``) and the gap to the
    attention of lowest perplexity in any block (at its best rate); then each
    published gap at the sweep's depth and context with the block its source states."""
    ok = by_role(frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok")], LM_ROLES)
    if ok.empty:
        return "*No finished run yet.*"
    ok = ok.assign(lr=ok["config.train.lr"])
    best = at_best_lr(ok)
    setting = str(ok["setting"].iloc[0])
    attention = best[best["mixer"] == "attention"]
    top = attention.groupby("label")["best_val_ppl"].mean().idxmin() if len(attention) else None
    lines = []
    for label in sorted(m for m in best["label"].unique() if m == base or m.startswith(f"{base} ")):
        runs = best[best["label"] == label]
        control = block_attention(best, runs)
        ours = runs["best_val_ppl"].tolist()
        overall = "–" if top is None else \
            f"{_pct(gap_interval(ours, attention.loc[attention['label'] == top, 'best_val_ppl'].tolist())[0])} ({top})"
        if control.empty:
            lines.append([label, _our_block(runs), "–", "no attention in this block yet", "–", "–", overall])
            continue
        gap, low, high = gap_interval(ours, control["best_val_ppl"].tolist())
        said = _pct(gap) + ("" if low is None else f" [{_pct(low)}, {_pct(high)}]")
        lines.append([label, _our_block(runs), control["label"].iloc[0], said, f"{len(runs)} / {len(control)}",
                      reads_as(gap, low, high), overall])
    header = ["reading (ours)", "block", "against", f"gap on validation perplexity at {setting} [95 % CI]",
              "seeds (ours / attention)", "reads", "gap to the best attention of any block"]
    table = markdown_table(header, lines, ["---", "---", "---", "---:", "---:", "---", "---:"])
    theirs = [f"{r['source']} {_pct(r['gap'])} ({stated_block(_note(published, r))})"
              for r in published_gap_rows(published, (setting,))]
    said = ("Published at " + setting + ", each against its own Transformer: " + "; ".join(theirs) + "."
            if theirs else f"No published gap at {setting}.")
    return f"{table}\n\n{said}"


def _note(published: pd.DataFrame, row: dict):
    """The note of the published Grassmann value a gap row was read from."""
    hit = published[(published["task"] == "wikitext2") & (published["source"] == row["source"])
                    & (published["setting"] == row["setting"]) & (published["mixer"] == "grassmann")
                    & (published["split"] == row["split"])]
    return hit["note"].iloc[0] if len(hit) else None
