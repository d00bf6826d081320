"""Published findings checked against the records: the results page's point-by-point
comparisons are computed here, so a verdict changes when the records do, never by hand.

``zoology_findings``: one row per finding of Zoology (arXiv 2312.04927: attention solves MQAR
at every width, fixed-state mixers need more state as L grows, hybrids with attention close
most of the gap) and Based (arXiv 2402.18668: recall is bounded by the state, a sliding
window's by its window), and for this project's prediction for the Grassmann mixer: the
claim, the numbers it rests on, and whether it holds ("yes", "no (where)", "so far yes (k of
n)" while points are missing, "untested" where the grid cannot show it, "yes at" the widths
where a claim made per width holds when others keep; a place marked †
rests on a point, unsolved but above the 1/kv floor, whose best learning rate is an end of
the grid, which may not bracket its best, and whose better value could turn the verdict
there, "no" or "yes"). A verdict read on a mean over seeds states beside it how many
seeds, each at its best learning rate, solve the point (reach SOLVED) or lose recall on
their own: the seeds of a point are often all or nothing. Accuracy is read against MQAR's floor: a model that has learnt the
format but recalls nothing scores 1/kv (``recall``); a local stack may not even see the
values, so it can sit below that floor. A local mixer's reach is measured on the
regenerated test split, not assumed, two ways (``reach_shares``): the share of queries
whose key and value its layers can bind into one feature at the query (the key-value
reach, ``zoo.causality.bound_pair_reach``), and the looser share whose value lies within
its receptive field at all (``zoo.causality.receptive_offsets``). ``gap_placement``: where our Grassmann-vs-attention gap, with
its interval, falls among the published ones. ``mad_agreement``: per MAD task, whether the
mixers both MAD and we ran come in the same order. ``mad_reach``: a local mixer's MAD
scores beside chance and the ceilings its receptive field sets (``tasks.mad.sources``).
The decode benchmark's readings are in ``results.paper.decoding``.
"""
from __future__ import annotations

import functools
import json
from typing import NamedTuple

import numpy as np
import pandas as pd

import zoo
from tasks.mad.data import generate
from tasks.mad.sources import answer_offsets, guess_accuracy
from tasks.mqar.data import key_distances, mqar_examples
from zoo.causality import bound_pair_reach, receptive_offsets

from ..report import markdown_table
from .roles import LM_ROLES, MQAR_ROLES, by_role
from ..stats import (at_best_lr, best_over_lr, gap_interval, mad_runs, mad_scores, over_seeds, published_mad_by_mixer,
                    shared_settings, split_agreement, tried_runs)

SOLVED = 0.99  # Zoology's stopping accuracy: a point at or above it is solved
# A model that has learnt the format but recalls nothing answers each query with one of the
# kv values in its context: accuracy 1/kv (0.25 at 4 pairs). Points within NOISE of that floor
# show no recall; which learning rate won among them is noise.
NOISE = 0.01
SAME_WITHIN = 0.1  # "behaves like the window": within this accuracy of it at every point
RECALL_DROP = 0.05  # "loses recall": recall (above the floor, ``recall``) falls by more than this
FIXED_STATE = ("mamba2", "rwkv6", "gated_deltanet")
# mqar_cpu's controls for the local Grassmann row (at its two shortest lengths), by role (roles.MQAR_ROLES):
# what each changes
CONTROLS = {"grassmann 4L": "4 layers", "grassmann odd offsets": "odd offsets", "grassmann+mlp": "an MLP"}


def mqar_best(frame: pd.DataFrame) -> pd.DataFrame:
    """The MQAR runs tried (``tried_runs``), best over learning rates per (mixer, L, width)
    and seed, then the mean over seeds (``over_seeds``: a point's extra seeds run at its
    best learning rate only)."""
    keys = ["label", "seq_len", "d_model"]
    per_seed = mqar_seeds(frame)
    best = over_seeds(per_seed, keys)
    solved = (per_seed["accuracy"] >= SOLVED).groupby([per_seed[k] for k in keys]).sum().rename("seeds_solved")
    return best.merge(solved.reset_index(), on=keys, how="left") if not best.empty else best.assign(seeds_solved=[])


def mqar_seeds(frame: pd.DataFrame) -> pd.DataFrame:
    """The MQAR runs tried, best over learning rates per (mixer, L, width) and seed: a row
    per seed of each point (what ``mqar_best`` means over)."""
    return best_over_lr(tried_runs(frame[frame["task"] == "mqar"]), ["label", "seq_len", "d_model"])


def point_text(row) -> str:
    """A point's accuracy: the one run's, or, where it has several seeds, the mean ± sd
    (seeds; how many of them solve it, at or above SOLVED): seeds are often bimodal, all or
    nothing, and a mean alone hides it."""
    seeds = getattr(row, "seeds", 1)
    seeds = 1 if pd.isna(seeds) else int(seeds)
    solved = getattr(row, "seeds_solved", None)
    solved = "" if solved is None or pd.isna(solved) else f"; {int(solved)} ≥ {SOLVED}"
    return f"{row.accuracy:.3f}" + (f" ± {row.accuracy_sd:.3f} ({seeds}{solved})" if seeds > 1 else "")


def _model(row: pd.Series, **override):
    """The model a record trained (at fresh weights), from its config (``model_json``)."""
    return zoo.build_model(zoo.ModelConfig(**{**json.loads(row["model_json"]), **override}))


def recall(accuracy: float, kv: int) -> float:
    """Accuracy above the format's floor 1/kv, as a share of the way from it to 1 (0: no
    recall, 1: all; below 0 where a model has not even learnt which tokens are values)."""
    return (accuracy - 1 / kv) / (1 - 1 / kv)


def grid_bound(accuracy: float, lr_edge: str, kv: int) -> bool:
    """A point that may owe its failure to the lr grid: short of solved, above the floor
    1/kv (so its learning rates differ in more than noise), and best at an end of them
    (``best_over_lr``'s ``lr_edge``); marked †."""
    return bool(lr_edge) and 1 / kv + NOISE < accuracy < SOLVED


def reach_shares(best: pd.DataFrame, label: str) -> dict[int, tuple[float, float]]:
    """Per L: (key-value reach, read reach) of ``label``'s model over the test split's
    queries, regenerated from the records' configs. The key-value reach is the share of
    queries whose key (q - k back) and value (q - k - 1 back) the layers can bind into one
    product at the query (``bound_pair_reach``): what recall needs, up to what a
    nonlinearity makes of sums. The read reach is the share whose value lies within the
    receptive field at all (``receptive_offsets``), an upper bound on any reading.
    Both bound the accuracy up to guessing."""
    return {int(L): _reaches(row["model_json"], int(L), int(row["num_kv_pairs"]), int(row["vocab_size"]),
                             int(row["seed"]), int(row["config.num_test_examples"]), float(row["config.power_a"]),
                             bool(row["config.random_non_queries"]))
            for L, row in best[best["label"] == label].groupby("seq_len").first().iterrows()}


@functools.lru_cache(maxsize=None)
def _reaches(model_json: str, L: int, kv: int, vocab: int, seed: int, n: int, power_a: float,
             random_non_queries: bool) -> tuple[float, float]:
    # cached: the findings table and the reach table ask for the same stacks, and each
    # answer regenerates a test split and traces a model
    x, y = mqar_examples(n, L, kv, vocab, seed=seed, split="test", power_a=power_a,
                         random_non_queries=random_non_queries)
    model = zoo.build_model(zoo.ModelConfig(**json.loads(model_json)))
    back = key_distances(x, y, kv)  # (n, kv) q - k
    bound = np.isin(back, sorted(bound_pair_reach(model, L))).mean()
    read = np.isin(back - 1, sorted(receptive_offsets(model, L))).mean()
    return float(bound), float(read)


def _verdict(checks: list[Check], expected: int) -> str:
    """A finding's verdict over its units: a finished unit that fails decides, and a "yes"
    names its doubtful units."""
    mark = (lambda where, doubtful: where + ("†" if doubtful else ""))
    failed = [mark(where, doubt) for complete, holds, where, doubt in checks if complete and not holds]
    if failed:
        return f"no ({'; '.join(failed)})"
    done = sum(check[0] for check in checks)
    if done < expected:
        return f"so far yes ({done} of {expected})" if done else "pending"
    doubts = [mark(where, True) for _, _, where, doubt in checks if doubt]
    return "yes" + (f" ({'; '.join(doubts)})" if doubts else "")


def _per_width(checks: list[Check]) -> str:
    """The fixed-state verdict: the claim is that recall is lost at a width, so a width that
    keeps it does not refute the claim at another (Zoology: more state, longer reach). "yes"
    where every tested width loses; "yes at" the losing ones, the others named as kept,
    where some do; "no" where every width is finished and keeps its recall."""
    lost = [where + ("†" if doubt else "") for complete, holds, where, doubt in checks if complete and holds]
    kept = [where + ("†" if doubt else "") for complete, holds, where, doubt in checks if complete and not holds]
    pending = [where for complete, _, where, _ in checks if not complete]
    if lost and not kept and not pending:
        return _verdict(checks, len(checks))
    if not lost:
        return f"no ({'; '.join(kept)})" if not pending else "pending" + (f" (kept at {', '.join(kept)})" if kept else "")
    return (f"yes at {', '.join(lost)}" + (f" (kept at {', '.join(kept)})" if kept else "")
            + (f"; {', '.join(pending)} pending" if pending else ""))


class Point(NamedTuple):
    """One MQAR point of mqar_cpu's grid: a model (its label), a length and a width."""
    label: str
    L: int
    width: int


class PointResult(NamedTuple):
    accuracy: float  # the best over learning rates, the mean over seeds
    every_lr: bool  # whether it ran at every learning rate of the grid
    text: str  # its table cell


class Check(NamedTuple):
    """One unit of a finding (a point, a width): ``_verdict`` reads a list of them."""
    complete: bool  # its points have run
    holds: bool  # the claim holds there
    where: str  # how the verdict names it
    doubtful: bool  # a † point (one the lr grid may not bracket) could turn it


class _Points:
    """mqar_cpu's best points (``results``: Point -> PointResult), and the questions a
    finding asks of them: a point's accuracy and cell text, whether it ran at every learning
    rate (``complete``), and whether a better learning rate could move it (``edge_points``)."""

    def __init__(self, frame: pd.DataFrame):
        frame = by_role(frame[frame["task"] == "mqar"], MQAR_ROLES)  # labelled as the findings name the models
        self.best = best = mqar_best(frame)
        self.lengths, self.widths = sorted(best["seq_len"].unique()), sorted(best["d_model"].unique())
        full = best["lrs_tried"].max()
        self.kv = best.groupby("seq_len")["num_kv_pairs"].first().astype(int).to_dict()
        self.results = {Point(r.label, r.seq_len, r.d_model): PointResult(r.accuracy, r.lrs_tried == full, point_text(r))
                        for r in best.itertuples()}
        self.edge_points = {Point(r.label, r.seq_len, r.d_model) for r in best.itertuples()
                            if grid_bound(r.accuracy, r.lr_edge, self.kv[r.seq_len])}
        self.widest = self.widths[-1]
        seeds = mqar_seeds(frame)
        self.seeds = {key: dict(zip(grp["seed"].astype(int), grp["accuracy"]))
                      for key, grp in seeds.groupby(["label", "seq_len", "d_model"])}

    def solved_seeds(self, point) -> str:
        """"k of n seeds": how many of the point's seeds reach SOLVED (each seed at its best
        learning rate)."""
        accs = self.seeds.get(point, {})
        return f"{sum(a >= SOLVED for a in accs.values())} of {len(accs)} seed{'s' if len(accs) != 1 else ''}"

    def acc(self, point):
        return self.results[point].accuracy if point in self.results else None

    def cell(self, label, L, width) -> str:
        point = Point(label, L, width)
        return self.results[point].text if point in self.results else "–"

    def widths_at(self, label, L) -> str:
        return " / ".join(self.cell(label, L, d) for d in self.widths)

    def complete(self, *points) -> bool:
        return all(p in self.results and self.results[p].every_lr for p in points)

    def close_to(self, a, b, where) -> Check:
        """A check that two points lie within SAME_WITHIN of each other."""
        done = self.complete(a, b)
        gap = self.acc(a) - self.acc(b) if done else 0.0
        # a better a could close a gap where a is behind, a better b one where b is; either could open one
        doubt = a in self.edge_points if gap < -SAME_WITHIN else b in self.edge_points if gap > SAME_WITHIN \
            else bool(self.edge_points & {a, b})
        return Check(done, abs(gap) <= SAME_WITHIN, where, doubt)


def _solves_row(pts: _Points, label: str, source: str, claim: str) -> list:
    checks = []
    for L in pts.lengths:
        point = Point(label, L, pts.widest)
        holds = point in pts.results and pts.results[point].accuracy >= SOLVED
        checks.append(Check(pts.complete(point), holds, f"L {L}", not holds and point in pts.edge_points))
    evidence = "; ".join(f"L {L}: {pts.cell(label, L, pts.widest)}" for L in pts.lengths) + f" (d {pts.widest})"
    seeds = ", ".join(f"L {L} {pts.solved_seeds(Point(label, L, pts.widest))}" for L in pts.lengths
                      if Point(label, L, pts.widest) in pts.results)
    return [claim, source, evidence,
            _verdict(checks, len(pts.lengths)) + (f"; reaching {SOLVED} (solved): {seeds}" if seeds else "")]


def _window_row(pts: _Points) -> list:
    """A consistency check of the ceiling: the window cannot read what lies beyond its
    receptive field but through a bug or guessing; a better learning rate could only break
    a "yes"."""
    shares = reach_shares(pts.best, "sliding_window")
    window = [Point("sliding_window", L, d) for L in pts.lengths for d in pts.widths]
    checks = []
    for p in window:
        holds = p in pts.results and pts.results[p].accuracy <= shares[p.L][1] + NOISE
        checks.append(Check(pts.complete(p), holds, f"L {p.L} d {p.width}", holds and p in pts.edge_points))
    evidence = "; ".join(f"L {L}: {pts.widths_at('sliding_window', L)} ≤ {shares[L][1]:.3f}" for L in pts.lengths
                         if L in shares)
    return ["a local window recalls only within its reach (accuracy ≤ the share of queries "
            "whose value lies in its receptive field)", "Based", evidence, _verdict(checks, len(window))]


def _like_window_row(pts: _Points, mine: str = "grassmann", window: str = "sliding_window",
                     claim: str = "the Grassmann mixer behaves like the window", source: str = "our prediction") -> list:
    """``mine`` within SAME_WITHIN of ``window`` at every point either ran (every L of the
    grid for the figure's rows, the controls' own lengths for theirs)."""
    lengths = [L for L in pts.lengths if any(Point(label, L, d) in pts.results for label in (mine, window) for d in pts.widths)]
    lengths = lengths or pts.lengths
    pairs = [(L, d) for L in lengths for d in pts.widths]
    checks = [pts.close_to(Point(mine, L, d), Point(window, L, d), f"L {L} d {d}") for L, d in pairs]
    reach = reach_shares(pts.best, mine)
    evidence = "; ".join(f"L {L}: {pts.widths_at(mine, L)} vs {pts.widths_at(window, L)}"
                         + (f" (its key-value reach {reach[L][0]:.3f})" if L in reach else "") for L in lengths)
    return [f"{claim} (within {SAME_WITHIN} of it at every point)", source, evidence, _verdict(checks, len(pairs))]


def _controls_row(pts: _Points) -> list:
    """Whether the protocol, not the mixer, holds the 2-layer Grassmann row down: a
    control that gives it the pairs MQAR needs (CONTROLS, run at the grid's two shortest
    lengths) lifts it by more than SAME_WITHIN at some point. "yes (where)" once one does;
    "no" once every control point has run without; a point not lifted whose best rate is
    an end of the grid could still be, and is marked †."""
    lengths = pts.lengths[:2]
    points = [Point(control, L, d) for control in CONTROLS for L in lengths for d in pts.widths]
    done = [p for p in points if pts.complete(p, p._replace(label="grassmann"))]
    where = (lambda p: f"{CONTROLS[p.label]} L {p.L} d {p.width}")
    lifted = [where(p) for p in done if pts.acc(p) - pts.acc(p._replace(label="grassmann")) > SAME_WITHIN]
    doubts = [where(p) + "†" for p in done if p in pts.edge_points]
    verdict = (f"yes ({'; '.join(lifted)})" if lifted else "pending" if not done else
               f"so far no ({len(done)} of {len(points)})" if len(done) < len(points) else
               "no" + (f" ({'; '.join(doubts)})" if doubts else ""))
    evidence = []
    for control, name in CONTROLS.items():
        reach = reach_shares(pts.best, control)
        evidence.append(f"{name}: " + "; ".join(
            f"L {L}: {pts.widths_at(control, L)}" + (f" (key-value reach {reach[L][0]:.3f})" if L in reach else "")
            for L in lengths))
    rows = "; ".join(f"L {L}: {pts.widths_at('grassmann', L)}" for L in lengths)
    return [f"the protocol holds the Grassmann row down: a control that lets it bind keys to values lifts it "
            f"(more than {SAME_WITHIN} above the 2-layer row at some point)", "our control",
            " — ".join(evidence) + f" — the 2-layer row: {rows}", verdict]


def _positions_row(pts: _Points) -> list:
    control = [L for L in pts.lengths if any(("grassmann+positions", L, d) in pts.results for d in pts.widths)] \
        or pts.lengths[:1]
    checks = [pts.close_to(("grassmann+positions", L, d), ("grassmann", L, d), f"L {L} d {d}")
              for L in control for d in pts.widths]
    evidence = "; ".join(f"L {L}: {pts.widths_at('grassmann+positions', L)} vs {pts.widths_at('grassmann', L)}"
                         for L in control)
    return [f"learned positions (the paper's LM) do not change the Grassmann row (within {SAME_WITHIN})",
            "our control", evidence, _verdict(checks, len(checks))]


def _fixed_state_row(pts: _Points, label: str) -> list:
    """Per width, recall above the format's floor (``recall``) at the shortest and the
    longest L. A width solved at both ends, or with no recall at the shortest, cannot show
    a loss: it is named, not counted. A loss a better lr at the longest L could undo, or a
    kept recall a better lr at the shortest could turn into a loss, is †."""
    first, last = pts.lengths[0], pts.lengths[-1]
    checks, untested = [], []
    for d in pts.widths:
        short, long = Point(label, first, d), Point(label, last, d)
        if pts.complete(short) and recall(pts.acc(short), pts.kv[first]) <= NOISE:
            untested.append(f"d {d} recalls nothing at L {first}")
        elif not pts.complete(short, long):
            checks.append(Check(False, False, f"d {d}", False))
        elif min(pts.acc(short), pts.acc(long)) >= SOLVED:
            untested.append(f"d {d} solves both")
        else:
            lost = recall(pts.acc(long), pts.kv[last]) < recall(pts.acc(short), pts.kv[first]) - RECALL_DROP
            checks.append(Check(True, lost, f"d {d}", (long if lost else short) in pts.edge_points))
    verdict = "; ".join(([_per_width(checks)] if checks else []) + ([f"untested: {', '.join(untested)}"]
                                                                      if untested else []))
    seeds = _seeds_losing(pts, label, first, last)
    verdict += f"; seeds that lose recall (on their own, at both ends): {seeds}" if seeds else ""
    evidence = "; ".join(f"d {d}: " + " → ".join(pts.cell(label, L, d) for L in pts.lengths) for d in pts.widths)
    return [f"{label}, a fixed state, loses recall as L and the pairs grow (recall above the "
            f"1/kv floor falls by more than {RECALL_DROP} from L {first} to {last} at a width)",
            "Zoology Fig. 2, Based", evidence, verdict]


def _seeds_losing(pts: _Points, label: str, first: int, last: int) -> str:
    """Per width, how many of the seeds run at both the shortest and the longest L lose
    recall on their own (``recall`` falls by more than RECALL_DROP, each seed at its best
    learning rate), with how many of them solve each end: a mean over bimodal seeds can
    read as a loss that one seed makes, or hide one."""
    parts = []
    for d in pts.widths:
        short, long = pts.seeds.get((label, first, d), {}), pts.seeds.get((label, last, d), {})
        both = sorted(set(short) & set(long))
        if not both:
            continue
        lost = sum(recall(long[s], pts.kv[last]) < recall(short[s], pts.kv[first]) - RECALL_DROP for s in both)
        solved = (lambda accs: sum(accs[s] >= SOLVED for s in both))
        parts.append(f"d {d} {lost} of {len(both)} (solved at L {first}: {solved(short)}, at L {last}: "
                     f"{solved(long)})")
    return ", ".join(parts)


def zoology_findings(frame: pd.DataFrame) -> str:
    """The results page's MQAR table of findings (module docstring), from mqar_cpu's records."""
    pts = _Points(frame)
    rows = [_solves_row(pts, "attention", "Zoology Fig. 2",
                        f"attention solves every setting (≥ {SOLVED} at the largest width)"),
            _window_row(pts), _like_window_row(pts), _positions_row(pts),
            *(_fixed_state_row(pts, label) for label in FIXED_STATE),
            _solves_row(pts, "grassmann+attention", "Zoology (hybrids)",
                        f"one attention layer gives the Grassmann stack recall (≥ {SOLVED} at the largest width)"),
            _controls_row(pts),
            _like_window_row(pts, "grassmann 4L", "sliding_window 4L",
                             "at Zoology's 4 layers, the Grassmann mixer behaves like the 4-layer window", "our control")]
    header = ["finding", "source", f"linbench, test-split accuracy, best over lrs (d {' / '.join(map(str, pts.widths))}; "
                                   f"one run a point unless mean ± sd (seeds; how many ≥ {SOLVED}) is given)",
              f"holds? (a seed solves a point at ≥ {SOLVED})"]
    return markdown_table(header, rows, ["---", "---", "---", "---"])


def mqar_reach(frame: pd.DataFrame) -> str:
    """Per local stack of mqar_cpu (a model whose receptive field misses part of some L):
    at each L its best accuracy per width beside its two reaches (``reach_shares``): the
    key-value reach (queries whose key and value its layers can multiply together at the
    query) and the read reach (queries whose value it reads at all). A stack that recalls
    what its pairs can bind sits near the first; one that binds what it sums, nearer the
    second."""
    best = mqar_best(frame)
    lengths, widths = sorted(best["seq_len"].unique()), sorted(best["d_model"].unique())
    lines = []
    for label in sorted(best["label"].unique()):
        shares = reach_shares(best, label)
        if all(read >= 1 for _, read in shares.values()):
            continue
        mine = best[best["label"] == label].set_index(["seq_len", "d_model"])
        cells = []
        for L in lengths:
            if L not in shares:
                cells.append("–")
                continue
            accs = " / ".join(point_text(mine.loc[(L, d)]) if (L, d) in mine.index else "–" for d in widths)
            cells.append(f"{accs} ({shares[L][0]:.3f} / {shares[L][1]:.3f})")
        lines.append([label, *cells])
    header = [f"local stack: accuracy d {' / '.join(map(str, widths))} (key-value reach / read reach)",
              *(f"L = {int(L)}" for L in lengths)]
    return markdown_table(header, lines, ["---"] + ["---:"] * len(lengths))


def published_gap_rows(published: pd.DataFrame, settings, splits=("validation",)) -> list[dict]:
    """Each source's Grassmann-vs-attention gap in each of ``settings`` (layers/context),
    from the first value it gives of each mixer, in the first of ``splits`` where it gives
    both: dicts of source, setting, split, attention, grassmann (perplexities) and gap
    (grassmann / attention - 1, a fraction). The headline's table, ``gap_placement`` and
    the headline figure (``figure.gap_figure``) all read the published gaps here, so they
    cannot disagree."""
    rows = published[published["task"] == "wikitext2"]
    out = []
    for setting in settings:
        for source, grp in rows[rows["setting"] == setting].groupby("source", sort=False):
            for split in splits:
                by = grp[grp["split"] == split].groupby("mixer")["value"].first()
                if {"attention", "grassmann"} <= set(by.index):
                    a, g = float(by["attention"]), float(by["grassmann"])
                    out.append({"source": source, "setting": setting, "split": split,
                                "attention": a, "grassmann": g, "gap": g / a - 1})
                    break
    return out


def _test_gap(ok: pd.DataFrame, mine: str, control: str, val: tuple) -> str:
    """The clause that reads a validation gap again on test: ``mine``'s and ``control``'s
    test perplexities on the same runs (each at the rate chosen on validation), the gap
    with its interval, and whether it agrees with ``val`` (``split_agreement``)."""
    if "test_ppl" not in ok:
        return "no test perplexity recorded"
    sides = [ok.loc[ok["label"] == m, "test_ppl"].dropna().tolist() for m in (mine, control)]
    if not all(sides):
        return "no test perplexity recorded"
    test = gap_interval(*sides)
    said = _pct(test[0]) + ("" if test[1] is None else f" [95 % CI {_pct(test[1])}, {_pct(test[2])}]")
    return f"on test perplexity {said}: {split_agreement(val, test)}"


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %".replace("-", "−")


def gap_placement(frame: pd.DataFrame, published: pd.DataFrame, setting: str = "6L/128") -> str:
    """Our Grassmann-vs-attention validation gap at each model's best learning rate, its
    interval and seeds, read again on test on the same runs (``_test_gap``), beside the
    range of the published validation gaps at ``setting``: context, since no published
    recipe matches ours in tokenizer, epochs and block."""
    ok = at_best_lr(by_role(frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok")], LM_ROLES))
    ours = {m: ok.loc[ok["label"] == m, "best_val_ppl"].tolist() for m in ("grassmann", "attention")}
    if not all(ours.values()):
        return "No Grassmann-vs-attention gap yet: a side has no finished run."
    gap, low, high = val = gap_interval(ours["grassmann"], ours["attention"])
    theirs = [row["gap"] for row in published_gap_rows(published, (setting,))]
    pct = _pct
    tried = {m: int(ok.loc[ok["label"] == m, "lrs_tried"].iloc[0]) for m in ours}
    seeds = (f"seeds: {len(ours['grassmann'])} Grassmann, {len(ours['attention'])} attention; best of "
             f"{tried['grassmann']} and {tried['attention']} learning rates")
    said = f"{pct(gap)} ({seeds}; no interval yet)" if low is None else \
        f"{pct(gap)} [95 % CI {pct(low)}, {pct(high)}] ({seeds})"
    return (f"Ours at {setting}, each model at its best learning rate, on validation perplexity: {said}; "
            f"{_test_gap(ok, 'grassmann', 'attention', val)}. The {len(theirs)} published "
            f"validation gaps at {setting} run from {pct(min(theirs))} to {pct(max(theirs))}; they were measured with "
            f"other tokenizers, epochs and recipes, so they are context for ours, not a test of it.")


def reading_gaps(frame: pd.DataFrame, base: str = "grassmann", control: str = "attention") -> str:
    """How much the gap to ``control`` depends on reading the paper's block: each other
    reading of ``base`` (a role "grassmann <reading>", roles.LM_ROLES), at its own best rate with every seed
    run there, against ``control``'s seeds at its best rate, beside ``base`` itself on the
    same seeds and rate as that reading, so reading and mixer are compared like for like;
    and where ``control`` has run in the same reading (a label "attention <reading>", say
    the pre-LN Transformer), against that too, each at its own best rate: the reading read
    against attention in the same block. Every gap is on validation perplexity; each
    reading's gap to ``control`` is read again on test (``_test_gap``)."""
    ok = by_role(frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok")], LM_ROLES)
    ok = ok.assign(lr=ok["config.train.lr"])
    best = at_best_lr(ok)
    attention = best.loc[best["label"] == control, "best_val_ppl"].tolist()
    readings = sorted(label for label in best["label"].unique() if label.startswith(f"{base} "))
    if not attention or not readings:
        return f"No other reading of the {base} block has finished yet."
    pct = (lambda x: f"{100 * x:+.1f} %".replace("-", "−"))

    def seeds_rate(runs) -> str:
        seeds = ", ".join(str(int(s)) for s in sorted(runs["seed"].unique()))
        tried = int(runs["lrs_tried"].iloc[0])
        return (f"seed{'s' if len(runs) > 1 else ''} {seeds}, lr {runs['lr'].iloc[0]:g}"
                + (f", best of {tried} rates" if tried > 1 else ""))

    parts = []
    for label in readings:
        reading = label.removeprefix(base + " ")
        runs = best[best["label"] == label]
        same = ok[(ok["label"] == base) & ok["lr"].isin(runs["lr"]) & ok["seed"].isin(runs["seed"])]
        val = gap_interval(runs["best_val_ppl"].tolist(), attention)
        gap = val[0]
        beside = (f", where the paper's reading on the same seed{'s' if len(runs) > 1 else ''} and rate reads "
                  f"{pct(gap_interval(same['best_val_ppl'].tolist(), attention)[0])}") if len(same) == len(runs) else ""
        twin = best[best["label"] == f"{control} {reading}"]
        in_block = (f"; against {control} {reading} ({seeds_rate(twin)}): "
                    f"{pct(gap_interval(runs['best_val_ppl'].tolist(), twin['best_val_ppl'].tolist())[0])}"
                    ) if len(twin) else ""
        parts.append(f"{reading} {pct(gap)} ({seeds_rate(runs)}{beside}; {_test_gap(best, label, control, val)})"
                     f"{in_block}")
    return (f"The gap to {control} ({len(attention)} seeds at its best rate) on validation perplexity under other "
            f"readings of the {base} block, each read again on test on the same runs: " + "; ".join(parts) + ".")


def mad_agreement(frame: pd.DataFrame, published: pd.DataFrame) -> str:
    """Per MAD task (and the MAD score): the mixers both MAD's published table and our
    records have, in MAD's order and in ours, and how many of their pairs keep MAD's
    order. A pair within NOISE on either side is a tie, counted apart: three mixers that
    all solve a task at our budget say nothing about MAD's order among them. The MAD
    score row counts only the mixers we have run on every task the published score
    averages."""
    ok = mad_runs(frame)
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
        gaps = [(theirs.at[a, task] - theirs.at[b, task], ours.at[a, task] - ours.at[b, task]) for a, b in pairs]
        untied = [(t, o) for t, o in gaps if min(abs(t), abs(o)) >= NOISE]
        kept = sum(t * o > 0 for t, o in untied)
        tied = len(gaps) - len(untied)
        said = (f"{kept} of {len(untied)}" if untied else "–") + (f" ({tied} tied)" if tied else "")
        rows.append([task, order(theirs), order(ours), said])
    header = ["task (test accuracy)", "MAD (published)", f"linbench (mad_cpu; {_runs_per_setting(ok)})",
              "pairs in MAD's order"]
    return markdown_table(header, rows, ["---", "---", "---", "---:"])


def _runs_per_setting(rows: pd.DataFrame) -> str:
    """How many seeds a MAD score rests on, per (mixer, task, setting): a verdict says so."""
    seeds = rows.groupby(["label", "mad_task", "setting"])["seed"].nunique() if not rows.empty else pd.Series([1])
    low, high = int(seeds.min()), int(seeds.max())
    return "one run a setting" if high == 1 else f"{low}–{high} seeds a setting" if low < high else f"{low} seeds a setting"


def mad_seeds(frame: pd.DataFrame) -> str:
    """The MAD settings run at more than one seed, a column each: per mixer, the mean ± sd
    over its seeds (how many) and each seed's score in seed order, so a reader sees where
    an order between two mixers rests on the seed. Rows in MAD-score order, as the score
    table; a mixer with one seed at a setting reads its one run."""
    ok = mad_runs(frame)
    best = best_over_lr(shared_settings(ok), ["label", "mad_task", "setting"]) if not ok.empty else ok
    if best.empty:
        return "No MAD run has finished yet."
    seeds = best.groupby(["mad_task", "setting"])["seed"].nunique()
    seeded = [key for key, n in seeds.items() if n > 1]
    if not seeded:
        return "Every MAD setting rests on one run (seed 0)."
    titles = [task if sum(t == task for t, _ in seeded) == 1 else f"{task} {setting}" for task, setting in seeded]
    lines = []
    for label in mad_scores(ok).index:
        cells = []
        for task, setting in seeded:
            runs = best[(best["label"] == label) & (best["mad_task"] == task) & (best["setting"] == setting)]
            runs = runs.sort_values("seed")["accuracy"]
            if runs.empty:
                cells.append("–")
            elif len(runs) == 1:
                cells.append(f"{runs.iloc[0]:.3f} (1)")
            else:
                each = " / ".join(f"{v:.3f}" for v in runs)
                cells.append(f"{runs.mean():.3f} ± {runs.std():.3f} ({len(runs)}): {each}")
        lines.append([label, *cells])
    header = ["mixer: mean ± sd (seeds): each seed", *titles]
    return markdown_table(header, lines, ["---"] + ["---:"] * len(titles))


def mad_reach(frame: pd.DataFrame) -> str:
    """Per mixer whose receptive field misses part of some setting's sequence (a local
    one), per task: its score (best over the sweep, mean over the task's settings, as
    ``mad_scores``), chance (a uniform guess, ``guess_accuracy``) and its ceiling: the
    share of test targets with an answer inside the field plus chance's share of the
    rest, meaned over the same settings ("–" for fuzzy recall, which has no single
    answer position). The ceiling is a pooled share and the score MAD's macro accuracy,
    so a model answering exactly what it can reach may sit a little off it."""
    ok = mad_runs(frame)
    best = best_over_lr(shared_settings(ok), ["label", "mad_task", "setting"])
    answers = {}  # (task, setting, seed) -> answer offsets of the test split
    lines, tasks = [], sorted(best["mad_task"].unique())
    for label, mine in best.groupby("label"):
        cells, local = {}, False
        for task, grp in mine.groupby("mad_task"):
            scores, guesses, ceilings = [], [], []
            for _, row in grp.iterrows():
                setting = json.loads(row["setting"])
                L = setting["seq_len"]
                reach = sorted(receptive_offsets(_model(row, vocab_size=int(row["vocab_size"]), max_len=L), L))
                local |= len(reach) < L
                key = (task, row["setting"], int(row["seed"]))
                if key not in answers:
                    answers[key] = answer_offsets(task, *generate(task, setting, "test", key[2]), setting["vocab_size"])
                g = guess_accuracy(task, setting)
                scores.append(row["accuracy"])
                guesses.append(g)
                if answers[key] is not None:
                    seen = answers[key][:, reach].any(1).mean()
                    ceilings.append(seen + (1 - seen) * g)
            chance = "–" if None in guesses else f"{np.mean(guesses):.3f}"
            ceiling = "–" if len(ceilings) < len(scores) else f"{np.mean(ceilings):.3f}"
            cells[task] = f"{np.mean(scores):.3f} / {chance} / {ceiling}"
        if local:
            lines.append([label, *(cells.get(t, "–") for t in tasks)])
    return markdown_table(["mixer (score / chance / ceiling)", *tasks], lines, ["---"] + ["---:"] * len(tasks))
