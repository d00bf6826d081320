"""A mixer's report card (``linbench vet``): one page that says, claim by claim, how a
researcher's mixer compares with the zoo, every number from its records.

The verdict table comes first: each line a claim, its number with the seeds behind it,
and "holds", "does not hold" or "not separable". The correctness checks decide whether
anything else is read: a mixer that fails one gets a card that stops there. Recall is read
only where the attention control solves the task (a column no control solves says nothing
about the mixer)."""
from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from .plots import plot_lm_comparison, plot_mad, plot_mqar_state, plot_scaling
from .report import markdown_table, task_section
from .stats import best_over_lr, chosen, gap_interval, mad_runs, mad_scores, tried_runs

SOLVED = 0.9  # the attention control must reach this MQAR accuracy before recall is read
SEPARABLE = 0.05  # two accuracies closer than this, on one seed a side, are not told apart


def _verdict(ours: list[float], theirs: list[float], higher_is_better: bool = True) -> str:
    """Is ``ours`` better than ``theirs``? Means apart by more than SEPARABLE and by more
    than both sides' seed spreads, else not separable."""
    gap = statistics.fmean(ours) - statistics.fmean(theirs)
    spread = max((statistics.stdev(v) for v in (ours, theirs) if len(v) > 1), default=0.0)
    if abs(gap) <= max(SEPARABLE, 2 * spread):
        return "not separable"
    return "holds" if (gap > 0) == higher_is_better else "does not hold"


def _seeds(values: list) -> str:
    return f"{len(values)} seed{'s' if len(values) != 1 else ''}"


def correctness_rows(checks: list[dict]) -> tuple[list[list], bool]:
    """The verdict lines of the correctness checks (dicts of name, passed, detail), and
    whether every one that applies passed."""
    failed = [c for c in checks if c["passed"] is False]
    applied = [c for c in checks if c["passed"] is not None]
    rows = [["correct: causal, returns its update, trains finite (fp32, bf16)",
             f"{len(applied) - len(failed)} of {len(applied)} checks pass",
             "does not hold" if failed else "holds"]]
    rows += [[f"stopped at: {c['name']}", c["detail"], "does not hold"] for c in failed]
    return rows, not failed


def recall_rows(frame: pd.DataFrame, mixer: str) -> list[list]:
    """MQAR: per width, the mixer's accuracy (best learning rate per seed, mean over
    seeds) against the window control's, read only where attention solves the task."""
    rows = tried_runs(frame[frame.get("task") == "mqar"]) if "task" in frame else frame.iloc[0:0]
    if rows.empty:
        return [["recall (MQAR)", "no run finished", "not run"]]
    best = best_over_lr(rows, ("label", "d_model", "seq_len"))
    out = []
    for (d, L), at in best.groupby(["d_model", "seq_len"]):
        acc = {label: grp["accuracy"].tolist() for label, grp in at.groupby("label")}
        where = f"L {int(L)}, d {int(d)}"
        control = acc.get("attention", [])
        if not control or statistics.fmean(control) < SOLVED:
            out.append([f"recall (MQAR, {where}): the attention control solves it (≥ {SOLVED})",
                        f"{statistics.fmean(control):.3f} ({_seeds(control)})" if control else "not run",
                        "does not hold: recall not read"])
            continue
        mine, window = acc.get(mixer, []), acc.get("sliding_window", [])
        if mine and window:
            out.append([f"recall (MQAR, {where}): above the sliding-window control",
                        f"{statistics.fmean(mine):.3f} vs {statistics.fmean(window):.3f} ({_seeds(mine)} a side)",
                        _verdict(mine, window)])
        if mine:
            out.append([f"recall (MQAR, {where}): within {SEPARABLE} of attention",
                        f"{statistics.fmean(mine):.3f} vs {statistics.fmean(control):.3f} ({_seeds(mine)} a side)",
                        "holds" if statistics.fmean(control) - statistics.fmean(mine) <= SEPARABLE else
                        "does not hold"])
    return out


def mad_rows(frame: pd.DataFrame, mixer: str) -> list[list]:
    """MAD's score (``stats.mad_scores``) of the mixer against attention's."""
    runs = mad_runs(frame)
    scores = mad_scores(runs)["MAD score"] if not runs.empty else pd.Series(dtype=float)
    if mixer not in scores or "attention" not in scores:
        return [["capabilities (MAD): score at or above attention's", "no run finished", "not run"]]
    seeds = runs.loc[runs["label"] == mixer, "seed"].nunique()
    return [["capabilities (MAD): score above attention's",
             f"{scores[mixer]:.3f} vs {scores['attention']:.3f} ({int(mad_scores(runs).at[mixer, 'settings'])} "
             f"settings, {_seeds(range(seeds))})", _verdict([scores[mixer]], [scores["attention"]])]]


def lm_rows(frame: pd.DataFrame, mixer: str) -> list[list]:
    """Wikitext-2: the mixer's validation perplexity against parameter-matched attention's,
    as the gap of geometric means with its Welch interval where both have 2 seeds."""
    ok = frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok")] if "task" in frame else frame
    if ok.empty:
        return [["language modelling (Wikitext-2): lower perplexity than attention",
                 "not run: no local Wikitext-2 (set LINBENCH_DATA)", "not run"]]
    picked = chosen(ok.dropna(axis=1, how="all"), "wikitext2")
    mine, base = (picked.loc[picked["label"] == m, "best_val_ppl"].tolist() for m in (mixer, "attention"))
    if not mine or not base:
        return [["language modelling (Wikitext-2): lower perplexity than attention", "a side has not finished",
                 "not run"]]
    gap, low, high = gap_interval(mine, base)
    if low is None:
        verdict = "not separable" if abs(gap) <= SEPARABLE else "holds" if gap < 0 else "does not hold"
    else:
        verdict = "holds" if high < 0 else "does not hold" if low > 0 else "not separable"
    where = "" if low is None else f" [95 % CI {100 * low:+.1f} %, {100 * high:+.1f} %]"
    return [["language modelling (Wikitext-2): lower validation perplexity than attention, matched parameters",
             f"{100 * gap:+.1f} %{where} ({len(mine)} vs {len(base)} seeds)", verdict]]


def cost_rows(frame: pd.DataFrame, mixer: str) -> list[list]:
    """The training step (forward and backward) at the longest length both ran, against
    attention's: faster or slower, by the ratio of mean times over seeds."""
    rows = frame[(frame.get("task") == "scaling") & (frame.get("status") == "ok")] if "task" in frame else frame
    if rows.empty or "median_ms" not in rows:
        return [["cost: training step faster than attention", "no run finished", "not run"]]
    rows = rows[rows["pass"] == "fwd_bwd"] if "pass" in rows else rows
    times = rows.groupby(["label", "seq_len"])["median_ms"].mean()
    lengths = [L for L in sorted(rows["seq_len"].unique()) if (mixer, L) in times and ("attention", L) in times]
    if not lengths:
        return [["cost: training step faster than attention", "no length both ran", "not run"]]
    L = lengths[-1]
    ratio = times[mixer, L] / times["attention", L]
    seeds = rows.loc[rows["label"] == mixer, "seed"].nunique() if "seed" in rows else 1
    verdict = "not separable" if abs(ratio - 1) < 0.1 else "holds" if ratio < 1 else "does not hold"
    return [[f"cost: training step faster than attention at L {int(L)}",
             f"{ratio:.2f}x attention's time ({times[mixer, L]:.1f} vs {times['attention', L]:.1f} ms, "
             f"{_seeds(range(seeds))})", verdict]]


def _stage(title: str, frame: pd.DataFrame, task: str, figures: list, plots_dir: Path) -> list[str]:
    """A stage's section: the report's table of its runs, then its figures."""
    rows = frame[frame["task"] == task] if "task" in frame else frame.iloc[0:0]
    if rows.empty:
        return [f"## {title}\n\nNo run of this stage has finished yet."]
    table = task_section(rows, task).split("\n", 1)[1].strip()  # without the report's own heading
    return [f"## {title}\n\n{table}", *(f"![{p.stem}]({p.relative_to(plots_dir.parent)})" for p in figures if p)]


def card_markdown(mixer: str, meta: dict, checks: list[dict], frame: pd.DataFrame | None, plots_dir: Path) -> str:
    """The whole page: the verdict table, then a section per stage with its table and
    figure. ``meta``: budget, its note, seeds, hardware, commit; ``frame``: the stage
    runs' records (None when correctness stopped the card)."""
    lines, correct = correctness_rows(checks)
    if correct and frame is not None:
        lines += recall_rows(frame, mixer) + mad_rows(frame, mixer) + lm_rows(frame, mixer) + cost_rows(frame, mixer)
    parts = [f"# linbench vet: {mixer}",
             f"Budget **{meta['budget']}** ({meta['note']}); seeds {', '.join(map(str, meta['seeds']))}; "
             f"{meta['hardware']}; commit {meta['commit']}.",
             "## Verdicts\n\n" + markdown_table(["claim", "number", "verdict"], lines)]
    parts.append("## Correctness\n\n" + markdown_table(
        ["check", "result", "detail"],
        [[c["name"], {True: "pass", False: "FAIL", None: "n/a"}[c["passed"]], c["detail"] or ""] for c in checks]))
    if not correct:
        parts.append("The card stops here: a mixer that fails a check is not trained or timed.")
        return "\n\n".join(parts) + "\n"
    if frame is not None:
        parts += _stage("Recall: MQAR", frame, "mqar", [plot_mqar_state(frame, plots_dir)], plots_dir)
        parts += _stage("Capabilities: MAD's six tasks", frame, "mad", [plot_mad(frame, plots_dir)], plots_dir)
        parts += _stage("Language modelling: Wikitext-2", frame, "wikitext2", [plot_lm_comparison(frame, plots_dir)],
                        plots_dir)
        parts += _stage("Cost: the training step against L", frame, "scaling", plot_scaling(frame, plots_dir),
                        plots_dir)
    parts.append("Not on this card yet: the zoo's own rows beside the mixer (from the reference records where the "
                 "settings match) and the `cpu` and `gpu` budgets.")
    return "\n\n".join(parts) + "\n"
