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

import zoo

from .plots import plot_decode, plot_lm_comparison, plot_mad, plot_mqar_state, plot_scaling
from .report import markdown_table, task_section
from .stats import best_over_lr, chosen, gap_interval, mad_runs, mad_scores, split_agreement, tried_runs

SOLVED = 0.9  # the attention control must reach this MQAR accuracy before recall is read
SEPARABLE = 0.05  # two accuracies closer than this, on one seed a side, are not told apart


NOT_READ = "not read at this budget"


def _verdict(ours: list[float], theirs: list[float], higher_is_better: bool = True) -> str:
    """Is ``ours`` better than ``theirs``? Means apart by more than SEPARABLE and by more
    than both sides' seed spreads, else not separable."""
    gap = statistics.fmean(ours) - statistics.fmean(theirs)
    spread = max((statistics.stdev(v) for v in (ours, theirs) if len(v) > 1), default=0.0)
    if abs(gap) <= max(SEPARABLE, 2 * spread):
        return "not separable"
    return "holds" if (gap > 0) == higher_is_better else "does not hold"


def _seeds(values) -> str:
    """'1 seed', '3 seeds': ``values`` is the seeds' values or their count."""
    n = values if isinstance(values, int) else len(values)
    return f"{n} seed{'s' if n != 1 else ''}"


def _solving(values) -> str:
    """"k of n seeds ≥ SOLVED": how many seeds reach the accuracy the control must, each
    at its best learning rate, since MQAR seeds are often all or nothing."""
    return f"{sum(v >= SOLVED for v in values)} of {_seeds(values)} ≥ {SOLVED}"


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
            out.append([f"recall (MQAR, {where}): the attention control solves it (mean test accuracy ≥ {SOLVED})",
                        f"{statistics.fmean(control):.3f} ({_solving(control)})" if control else "not run",
                        "does not hold: recall not read"])
            continue
        mine, window = acc.get(mixer, []), acc.get("sliding_window", [])
        if mine and window:
            out.append([f"recall (MQAR, {where}): above the sliding-window control (test accuracy)",
                        f"{statistics.fmean(mine):.3f} vs {statistics.fmean(window):.3f} ({_seeds(mine)} a side; "
                        f"{_solving(mine)} vs {_solving(window)})", _verdict(mine, window)])
        if mine:
            out.append([f"recall (MQAR, {where}): within {SEPARABLE} of attention (test accuracy)",
                        f"{statistics.fmean(mine):.3f} vs {statistics.fmean(control):.3f} ({_seeds(mine)} a side; "
                        f"{_solving(mine)} vs {_solving(control)})",
                        "holds" if statistics.fmean(control) - statistics.fmean(mine) <= SEPARABLE else
                        "does not hold"])
    return out


def mad_rows(frame: pd.DataFrame, mixer: str) -> list[list]:
    """MAD's score (``stats.mad_scores``) of the mixer beside attention's, the verdict read
    on the tasks the attention control solves (a task no control solves says nothing of
    the mixer): the mean over those tasks, mixer against control."""
    runs = mad_runs(frame)
    scored = mad_scores(runs) if not runs.empty else pd.DataFrame()
    claim = "capabilities (MAD, test accuracy): above attention on the tasks the control solves"
    if mixer not in scored.index or "attention" not in scored.index:
        return [[claim, "no run finished", "not run"]]
    tasks = [c for c in scored.columns if c not in ("MAD score", "settings")]
    solved = [t for t in tasks if scored.at["attention", t] >= SOLVED]
    seeds = int(runs.loc[runs["label"] == mixer, "seed"].nunique())
    number = (f"MAD score {scored.at[mixer, 'MAD score']:.3f} vs {scored.at['attention', 'MAD score']:.3f} "
              f"({int(scored.at[mixer, 'settings'])} settings, up to {_seeds(seeds)}); the control solves "
              f"{len(solved)} of {len(tasks)} tasks (≥ {SOLVED})")
    if not solved:
        return [[claim, number, "does not hold: no task is read"]]
    mine, control = (float(scored.loc[label, solved].mean()) for label in (mixer, "attention"))
    return [[claim, f"{mine:.3f} vs {control:.3f} on {', '.join(solved)}; {number}", _verdict([mine], [control])]]


def _params_text(picked: pd.DataFrame, mixer: str) -> str:
    """The mixer's and attention's parameter counts: outside the embeddings (what the
    models are matched on) and in total (tied embeddings included), where records hold them."""
    def count(label, column):
        values = picked.loc[picked["label"] == label, column].dropna() if column in picked else pd.Series(dtype=float)
        return f"{values.iloc[0] / 1e6:.2f}M" if len(values) else "–"
    return (f"params w/o embeddings {count(mixer, 'params_no_embeddings')} vs "
            f"{count('attention', 'params_no_embeddings')}, total {count(mixer, 'params')} vs {count('attention', 'params')}")


def lm_rows(frame: pd.DataFrame, mixer: str) -> list[list]:
    """Wikitext-2: the mixer's validation perplexity against parameter-matched attention's,
    as the gap of geometric means with its Welch interval where both have 2 seeds, the
    parameter counts beside it (matched and total), and the same gap on test on the same
    runs, with whether it agrees (``stats.split_agreement``)."""
    ok = frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok")] if "task" in frame else frame
    if ok.empty:
        return [["language modelling (Wikitext-2): lower validation perplexity than attention",
                 "not run: no local Wikitext-2 (set LINBENCH_DATA)", "not run"]]
    picked = chosen(ok.dropna(axis=1, how="all"), "wikitext2")
    mine, base = (picked.loc[picked["label"] == m, "best_val_ppl"].tolist() for m in (mixer, "attention"))
    if not mine or not base:
        return [["language modelling (Wikitext-2): lower validation perplexity than attention",
                 "a side has not finished", "not run"]]
    gap, low, high = val = gap_interval(mine, base)
    if low is None:
        verdict = "not separable" if abs(gap) <= SEPARABLE else "holds" if gap < 0 else "does not hold"
    else:
        verdict = "holds" if high < 0 else "does not hold" if low > 0 else "not separable"
    where = "" if low is None else f" [95 % CI {100 * low:+.1f} %, {100 * high:+.1f} %]"
    tests = [picked.loc[picked["label"] == m, "test_ppl"].dropna().tolist() if "test_ppl" in picked else []
             for m in (mixer, "attention")]
    if all(tests):
        test = gap_interval(*tests)
        on_test = (f"; on test {100 * test[0]:+.1f} %"
                   + ("" if test[1] is None else f" [95 % CI {100 * test[1]:+.1f} %, {100 * test[2]:+.1f} %]")
                   + f": {split_agreement(val, test)}")
    else:
        on_test = "; no test perplexity recorded"
    return [["language modelling (Wikitext-2): lower validation perplexity than attention, matched parameters "
             "(outside the embeddings)",
             f"validation {100 * gap:+.1f} %{where} ({len(mine)} vs {len(base)} seeds){on_test}; "
             f"{_params_text(picked, mixer)}", verdict]]


def _ratio_row(rows: pd.DataFrame, mixer: str, x: str, y: str, claim: str, unit: str) -> list[list]:
    """The mixer's mean ``y`` over attention's at the largest ``x`` both measured: faster
    or slower beyond 10 %, else not separable."""
    times = rows.groupby(["label", x])[y].mean()
    common = [v for v in sorted(rows[x].unique()) if (mixer, v) in times and ("attention", v) in times]
    if not common:
        return [[claim.format(x="?"), f"no {x} both ran", "not run"]]
    at = common[-1]
    ratio = times[mixer, at] / times["attention", at]
    verdict = "not separable" if abs(ratio - 1) < 0.1 else "holds" if ratio < 1 else "does not hold"
    return [[claim.format(x=int(at)), f"{ratio:.2f}x attention's ({times[mixer, at]:.2f} vs "
             f"{times['attention', at]:.2f} {unit}, one timing run each, same machine)", verdict]]


def cost_rows(frame: pd.DataFrame, mixer: str) -> list[list]:
    """The training step (forward and backward) at the longest length both ran and a
    generated token after the longest context both held, against attention's."""
    out = []
    rows = frame[(frame.get("task") == "scaling") & (frame.get("status") == "ok")] if "task" in frame else frame.iloc[0:0]
    rows = rows[rows["pass"] == "fwd_bwd"] if "pass" in rows else rows
    claim = "cost: training step faster than attention at L {x}"
    out += _ratio_row(rows, mixer, "seq_len", "median_ms", claim, "ms") if "median_ms" in rows and not rows.empty \
        else [[claim.format(x="?"), "no run finished", "not run"]]
    rows = frame[(frame.get("task") == "decode") & (frame.get("status") == "ok")] if "task" in frame else frame.iloc[0:0]
    claim = "cost: a generated token cheaper than attention's after {x} tokens of context"
    if not zoo.mixer_class(mixer).has_step_form():
        out.append([claim.format(x="?"), "the mixer has no step (decode) form", "not run"])
    elif "ms_per_token" in rows and not rows.empty:
        out += _ratio_row(rows, mixer, "context", "ms_per_token", claim, "ms per token")
    else:
        out.append([claim.format(x="?"), "no run finished", "not run"])
    return out


def _stage(title: str, frame: pd.DataFrame, task: str, figures: list, plots_dir: Path) -> list[str]:
    """A stage's section: the report's table of its runs, then its figures."""
    rows = frame[frame["task"] == task] if "task" in frame else frame.iloc[0:0]
    if rows.empty:
        return [f"## {title}\n\nNo run of this stage has finished yet."]
    table = task_section(rows, task).split("\n", 1)[1].strip()  # without the report's own heading
    return [f"## {title}\n\n{table}", *(f"![{p.stem}]({p.relative_to(plots_dir.parent)})" for p in figures if p)]


def _first_lines(mixer: str, meta: dict) -> list[str]:
    """The title and the line that says what the card stands on: budget, seeds, machine,
    commit, and the committed records its zoo rows were read from."""
    lines = [f"# linbench vet: {mixer}",
             f"Budget **{meta['budget']}** ({meta['note']}); seeds {', '.join(map(str, meta['seeds']))}; "
             f"{meta['hardware']}; commit {meta['commit']}."]
    ref = meta.get("reference") or {}
    if ref.get("runs"):
        lines.append(f"The zoo's rows ({ref['runs']} runs: the controls, and every zoo mixer of the same settings "
                     f"in the tables and figures) are the committed records of {', '.join(ref['sweeps'])} "
                     f"(results/reference/), run on {'; '.join(ref['hardware'])}; they were read, not run again. "
                     "Timings are never read from records: every cost row ran here, side by side.")
    return lines


def card_markdown(mixer: str, meta: dict, checks: list[dict], frame: pd.DataFrame | None, plots_dir: Path,
                  zoo_rows: pd.DataFrame | None = None) -> str:
    """The whole page: the verdict table, then a section per stage with its table and
    figure. ``meta``: budget, its note, seeds, hardware, commit, reference; ``frame``: the
    runs of the mixer and its controls (None when correctness stopped the card);
    ``zoo_rows``: the zoo's other mixers at the same settings, shown beside it in the
    tables and figures, never in a verdict."""
    lines, correct = correctness_rows(checks)
    if correct and frame is not None:
        measured = recall_rows(frame, mixer) + mad_rows(frame, mixer) + lm_rows(frame, mixer) + cost_rows(frame, mixer)
        if not meta.get("reads", True):  # a budget too small to say anything of quality or cost
            measured = [[claim, number, verdict if verdict.startswith("not run") else NOT_READ]
                        for claim, number, verdict in measured]
        lines += measured
    parts = _first_lines(mixer, meta) + ["## Verdicts\n\n" + markdown_table(["claim", "number", "verdict"], lines)]
    parts.append("## Correctness\n\n" + markdown_table(
        ["check", "result", "detail"],
        [[c["name"], {True: "pass", False: "FAIL", None: "n/a"}[c["passed"]], c["detail"] or ""] for c in checks]))
    if not correct:
        parts.append("The card stops here: a mixer that fails a check is not trained or timed.")
        return "\n\n".join(parts) + "\n"
    if frame is not None:
        shown = pd.concat([frame, zoo_rows], ignore_index=True) if zoo_rows is not None else frame
        parts += _stage("Recall: MQAR", shown, "mqar", [plot_mqar_state(shown, plots_dir)], plots_dir)
        parts += _stage("Capabilities: MAD's six tasks", shown, "mad", [plot_mad(shown, plots_dir)], plots_dir)
        parts += _stage("Language modelling: Wikitext-2", shown, "wikitext2", [plot_lm_comparison(shown, plots_dir)],
                        plots_dir)
        parts += _stage("Cost: the training step against L", frame, "scaling", plot_scaling(frame, plots_dir),
                        plots_dir)
        parts += _stage("Cost: a generated token against context", frame, "decode", plot_decode(frame, plots_dir),
                        plots_dir)
    if zoo_rows is None:
        parts.append("The zoo's other mixers join the tables at the `cpu` budget, whose settings are the reference "
                     "sweeps' (their committed records are read, not run).")
    return "\n\n".join(parts) + "\n"
