"""Published findings checked against the records: the README's point-by-point
comparisons are computed here, so a verdict changes when the records do, never by hand.

``zoology_findings``: one row per finding of Zoology (arXiv 2312.04927: attention solves MQAR
at every width, fixed-state mixers need more state as L grows, hybrids with attention close
most of the gap) and Based (arXiv 2402.18668: recall is bounded by the state, a sliding
window's by its window), and for this project's prediction for the Grassmann mixer: the
claim, the numbers it rests on, and whether it holds ("yes", "no (where)", "so far yes (k of
n)" while points are missing, "untested" where the grid cannot show it; a place marked †
involves a point, unsolved but above chance, whose best learning rate is an end of the
grid, which may not bracket its best, so its "no" may be the grid's). A local mixer's
ceiling is measured, not assumed: the share of test targets whose answer lies within the
receptive field of the model its records describe (``zoo.causality.receptive_offsets``),
on the regenerated test split. ``gap_placement``: where our Grassmann-vs-attention gap, with
its interval, falls among the published ones. ``mad_agreement``: per MAD task, whether the
mixers both MAD and we ran come in the same order. ``mad_reach``: a local mixer's MAD
scores beside the ceilings its receptive field sets (``tasks.mad_sources``).
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

import zoo
from tasks.mad_data import generate
from tasks.mad_sources import answer_offsets
from tasks.mqar_data import key_distances, mqar_examples
from zoo.causality import receptive_offsets

from .report import markdown_table
from .stats import best_over_lr, gap_interval, mad_scores, published_mad_by_mixer

SOLVED = 0.99  # Zoology's stopping accuracy: a point at or above it is solved
CHANCE = 0.01  # slack for guessing: a value is one of V/2 tokens (256 here)
LIKE = 0.1  # "behaves like the window": within this accuracy of it at every point
FIXED_STATE = ("mamba2", "rwkv6", "gated_deltanet")


def mqar_best(frame: pd.DataFrame) -> pd.DataFrame:
    """The finished MQAR runs, best over learning rates per (mixer, L, width)."""
    ok = frame[(frame["task"] == "mqar") & (frame["run_status"] == "ok")]
    return best_over_lr(ok, ["label", "seq_len", "d_model"])


def _model(row: pd.Series, **override):
    """The model a record trained (at fresh weights), from its flattened config."""
    fields = {c.split(".", 2)[2]: row[c] for c in row.index
              if c.startswith("config.model.") and not c.startswith("config.model.mixer_options")}
    fields = {k: v.item() if hasattr(v, "item") else v for k, v in {**fields, **override}.items()}
    return zoo.build_model(zoo.ModelConfig(**fields, mixer_options=json.loads(row["mixer_options"])))


def grid_bound(accuracy: float, lr_edge: str) -> bool:
    """A point that may owe its failure to the lr grid: short of solved, above chance, and
    best at an end of its learning rates (``best_over_lr``'s ``lr_edge``); marked †."""
    return bool(lr_edge) and CHANCE < accuracy < SOLVED


def reach_shares(best: pd.DataFrame, label: str) -> dict[int, float]:
    """Per L: the share of the test split's queries (regenerated from the records'
    configs) whose value token lies within the receptive field of ``label``'s model: an
    upper bound on its accuracy, up to guessing."""
    out = {}
    for L, row in best[best["label"] == label].groupby("seq_len").first().iterrows():
        kv = int(row["num_kv_pairs"])
        x, y = mqar_examples(int(row["config.num_test_examples"]), int(L), kv, int(row["vocab_size"]),
                             seed=int(row["seed"]), split="test", power_a=float(row["config.power_a"]),
                             random_non_queries=bool(row["config.random_non_queries"]))
        reach = sorted(receptive_offsets(_model(row), int(L)))
        out[int(L)] = float(np.isin(key_distances(x, y, kv) - 1, reach).mean())
    return out


def _verdict(checks: list[tuple[bool, bool, str]], expected: int) -> str:
    """checks: (complete, holds, where) per unit; a finished unit that fails decides."""
    failed = [where for complete, holds, where in checks if complete and not holds]
    if failed:
        return f"no ({'; '.join(failed)})"
    done = sum(complete for complete, _, _ in checks)
    if done == expected:
        return "yes"
    return f"so far yes ({done} of {expected})" if done else "pending"


def zoology_findings(frame: pd.DataFrame) -> str:
    """The README's MQAR table of findings (module docstring), from mqar_cpu's records."""
    best = mqar_best(frame)
    lengths, widths = sorted(best["seq_len"].unique()), sorted(best["d_model"].unique())
    full = best["lrs_tried"].max()
    at = {(r.label, r.seq_len, r.d_model): (r.accuracy, r.lrs_tried == full) for r in best.itertuples()}
    edged = {(r.label, r.seq_len, r.d_model) for r in best.itertuples() if grid_bound(r.accuracy, r.lr_edge)}
    wide = widths[-1]

    def mark(where, *points):  # † as in the accuracy table: the lr grid may not bracket a point's best
        return where + ("†" if edged.intersection(points) else "")

    def cell(label, L, width):
        return f"{at[label, L, width][0]:.3f}" if (label, L, width) in at else "–"

    def widths_at(label, L):
        return " / ".join(cell(label, L, d) for d in widths)

    def complete(*points):
        return all(p in at and at[p][1] for p in points)

    rows = []

    def solves(label, source, claim):
        checks = [(complete((label, L, wide)), (label, L, wide) in at and at[label, L, wide][0] >= SOLVED,
                   mark(f"L {L}", (label, L, wide))) for L in lengths]
        evidence = "; ".join(f"L {L}: {cell(label, L, wide)}" for L in lengths) + f" (d {wide})"
        rows.append([claim, source, evidence, _verdict(checks, len(lengths))])

    solves("attention", "Zoology Fig. 2", f"attention solves every setting (≥ {SOLVED} at the largest width)")

    shares = reach_shares(best, "sliding_window")
    checks = [(complete(("sliding_window", L, d)),
               ("sliding_window", L, d) in at and at["sliding_window", L, d][0] <= shares[L] + CHANCE,
               mark(f"L {L} d {d}", ("sliding_window", L, d))) for L in lengths for d in widths]
    evidence = "; ".join(f"L {L}: {widths_at('sliding_window', L)} ≤ {shares[L]:.3f}" for L in lengths
                         if L in shares)
    rows.append(["a local window recalls only within its reach (accuracy ≤ the share of queries "
                 "whose value lies in its receptive field)", "Based", evidence,
                 _verdict(checks, len(lengths) * len(widths))])

    pairs = [(L, d) for L in lengths for d in widths]
    diff = {(L, d): at["grassmann", L, d][0] - at["sliding_window", L, d][0]
            for L, d in pairs if ("grassmann", L, d) in at and ("sliding_window", L, d) in at}
    checks = [(complete(("grassmann", L, d), ("sliding_window", L, d)) and (L, d) in diff,
               abs(diff.get((L, d), 0.0)) <= LIKE, mark(f"L {L} d {d}", ("grassmann", L, d), ("sliding_window", L, d)))
              for L, d in pairs]
    reach = reach_shares(best, "grassmann")
    evidence = "; ".join(f"L {L}: {widths_at('grassmann', L)} vs {widths_at('sliding_window', L)}"
                         + (f" (its reach {reach[L]:.3f})" if L in reach else "") for L in lengths)
    rows.append([f"the Grassmann mixer behaves like the window (within {LIKE} of it at every point)",
                 "our prediction (issue 16)", evidence, _verdict(checks, len(pairs))])

    control = [L for L in lengths if any(("grassmann+positions", L, d) in at for d in widths)] or lengths[:1]
    checks = [(complete(("grassmann+positions", L, d), ("grassmann", L, d)),
               complete(("grassmann+positions", L, d), ("grassmann", L, d))
               and abs(at["grassmann+positions", L, d][0] - at["grassmann", L, d][0]) <= LIKE,
               mark(f"L {L} d {d}", ("grassmann+positions", L, d), ("grassmann", L, d))) for L in control for d in widths]
    evidence = "; ".join(f"L {L}: {widths_at('grassmann+positions', L)} vs {widths_at('grassmann', L)}"
                         for L in control)
    rows.append([f"learned positions (the paper's LM) do not change the Grassmann row (within {LIKE})",
                 "our control", evidence, _verdict(checks, len(checks))])

    for label in FIXED_STATE:
        mine = [(L, d) for L, d in pairs if (label, L, d) in at]
        evidence = "; ".join(f"d {d}: " + " → ".join(cell(label, L, d) for L in lengths) for d in widths)
        if len(mine) == len(pairs) and complete(*((label, L, d) for L, d in pairs)) and all(
                at[label, L, d][0] >= SOLVED for L, d in pairs):
            verdict = "untested: solves every point"
        else:
            first, last = lengths[0], lengths[-1]
            checks = [(complete((label, first, d), (label, last, d)),
                       complete((label, first, d), (label, last, d))
                       and at[label, last, d][0] < at[label, first, d][0] - CHANCE,
                       mark(f"d {d}", (label, first, d), (label, last, d))) for d in widths]
            verdict = _verdict(checks, len(widths))
        rows.append([f"{label}, a fixed state, loses recall as L and the pairs grow (L {lengths[0]} → "
                     f"{lengths[-1]} at each width)", "Zoology Fig. 2, Based", evidence, verdict])

    solves("grassmann+attention", "Zoology (hybrids)", f"one attention layer gives the Grassmann stack recall "
           f"(≥ {SOLVED} at the largest width)")
    header = ["finding", "source", f"linbench, best over lrs (d {' / '.join(map(str, widths))})", "holds?"]
    return markdown_table(header, rows, ["---", "---", "---", "---"])


def gap_placement(frame: pd.DataFrame, published: pd.DataFrame, setting: str = "6L/128") -> str:
    """One sentence: our Grassmann-vs-attention validation gap, its interval, and how
    it compares with each published gap at ``setting``."""
    ok = frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok")]
    ours = {m: ok.loc[ok["mixer"] == m, "best_val_ppl"].tolist() for m in ("grassmann", "attention")}
    if not all(ours.values()):
        return "No Grassmann-vs-attention gap yet: a side has no finished run."
    gap, low, high = gap_interval(ours["grassmann"], ours["attention"])
    rows = published[(published["task"] == "wikitext2") & (published["split"] == "validation")
                     & (published["setting"] == setting)]
    theirs = []
    for source, grp in rows.groupby("source", sort=False):
        by = grp.groupby("mixer")["value"].first()
        if {"attention", "grassmann"} <= set(by.index):
            theirs.append(float(by["grassmann"]) / float(by["attention"]) - 1)
    pct = (lambda x: f"{100 * x:+.1f} %".replace("-", "−"))
    seeds = f"seeds: {len(ours['grassmann'])} Grassmann, {len(ours['attention'])} attention"
    if low is None:
        lo = hi = gap
        said = f"{pct(gap)} ({seeds}; no interval yet)"
    else:
        lo, hi = low, high
        said = f"{pct(gap)} [95 % CI {pct(low)}, {pct(high)}] ({seeds})"
    below, above = sum(t < lo for t in theirs), sum(t > hi for t in theirs)
    it = "it" if low is None else "its interval"
    return (f"Ours at {setting}: {said}. Of the {len(theirs)} published gaps at {setting} ({pct(min(theirs))} to "
            f"{pct(max(theirs))}), {below} lie below {it}, {len(theirs) - below - above} within and "
            f"{above} above.")


def mad_agreement(frame: pd.DataFrame, published: pd.DataFrame) -> str:
    """Per MAD task (and the MAD score): the mixers both MAD's published table and our
    records have, in MAD's order and in ours, and how many of their pairs keep MAD's
    order (a tie on either side counts as kept). The MAD score row counts only the mixers
    we have run on every task the published score averages."""
    ok = frame[(frame["task"] == "mad") & (frame["run_status"] == "ok")]
    ours = mad_scores(ok)
    theirs = published_mad_by_mixer(published)
    common = [m for m in theirs.index if m in ours.index]
    rows = []
    for task in [t for t in theirs.columns if t in ours.columns]:
        have = [m for m in common if pd.notna(ours.at[m, task]) and pd.notna(theirs.at[m, task])
                and (task != "MAD score" or all(t in ours.columns and pd.notna(ours.at[m, t])
                                                for t in theirs.columns if t != "MAD score"))]
        if len(have) < 2:
            continue
        order = (lambda table: " > ".join(f"{m} {table.at[m, task]:.3f}"
                                           for m in sorted(have, key=lambda m: -table.at[m, task])))
        pairs = [(a, b) for i, a in enumerate(have) for b in have[i + 1:]]
        kept = sum((theirs.at[a, task] - theirs.at[b, task]) * (ours.at[a, task] - ours.at[b, task]) >= 0
                   for a, b in pairs)
        rows.append([task, order(theirs), order(ours), f"{kept} of {len(pairs)}"])
    header = ["task", "MAD (published)", "linbench (mad_cpu)", "pairs in MAD's order"]
    return markdown_table(header, rows, ["---", "---", "---", "---:"])


def mad_reach(frame: pd.DataFrame) -> str:
    """Per mixer whose receptive field misses part of some setting's sequence (a local
    one), per task: its score (best over the sweep, mean over the task's settings, as
    ``mad_scores``) and its ceiling: the mean over the same settings of the share of
    test targets with an answer inside the field ("–" for fuzzy recall, which has no
    single answer position). The ceiling is a pooled share and the score MAD's macro
    accuracy, so a model answering exactly what it can reach may sit a little off it."""
    ok = frame[(frame["task"] == "mad") & (frame["run_status"] == "ok")]
    best = best_over_lr(ok, ["label", "mad_task", "setting"])
    answers = {}  # (task, setting, seed) -> answer offsets of the test split
    lines, tasks = [], sorted(best["mad_task"].unique())
    for label, mine in best.groupby("label"):
        cells, local = {}, False
        for task, grp in mine.groupby("mad_task"):
            scores, ceilings = [], []
            for _, row in grp.iterrows():
                setting = json.loads(row["setting"])
                L = setting["seq_len"]
                reach = sorted(receptive_offsets(_model(row, vocab_size=int(row["vocab_size"]), max_len=L), L))
                local |= len(reach) < L
                key = (task, row["setting"], int(row["seed"]))
                if key not in answers:
                    answers[key] = answer_offsets(task, *generate(task, setting, "test", key[2]), setting["vocab_size"])
                scores.append(row["accuracy"])
                ceilings.append(None if answers[key] is None else answers[key][:, reach].any(1).mean())
            ceiling = "–" if None in ceilings else f"{np.mean(ceilings):.3f}"
            cells[task] = f"{np.mean(scores):.3f} / {ceiling}"
        if local:
            lines.append([label, *(cells.get(t, "–") for t in tasks)])
    return markdown_table(["mixer (score / ceiling)", *tasks], lines, ["---"] + ["---:"] * len(tasks))
