"""SNLI's headline: the paper's head comparison over a frozen encoder, the controls that
say what its accuracies mean, and every mixer from scratch, each model at the learning
rate chosen on validation (``stats.chosen``) with every seed run there.

A run's role comes from its record, not its label: a head over the pretrained encoder's
features of the whole pair (``head`` transformer or grassmann), a control (the class
prior, a linear probe, the hypothesis alone, a randomly initialised encoder), or a zoo
LM trained from scratch (``setting`` "scratch").
"""
from __future__ import annotations

import pandas as pd

from ..report import markdown_table
from ..stats import SNLI_HEADS, lr_means, snli_chosen, snli_order, split_agreement, welch_interval

METRICS = (("best_val_accuracy", "validation"), ("test_accuracy", "test"))
HEAD_NAMES = {"transformer": "Transformer", "grassmann": "Grassmann-Plücker"}  # for a head with no record yet


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    if "task" not in frame:
        return frame.iloc[0:0]
    rows = frame[(frame["task"] == "snli") & (frame["run_status"] == "ok")]
    return rows.assign(**{c: rows[c] if c in rows else None for c in ("head", "backbone", "inputs")})


def _reads(row: pd.Series) -> str:
    if row["setting"] == "scratch":
        return "word ids, trained from scratch"
    encoder = str(row["backbone"]).split(" (")[0]
    return f"{encoder} features, {'the hypothesis only' if row['inputs'] == 'hypothesis' else 'the pair'}"


def _chosen(frame: pd.DataFrame) -> pd.DataFrame:
    """The ok SNLI runs at each model's chosen rate, with ``role`` and ``rates`` (every
    rate the model was tried at, whatever the seed)."""
    ok = _ok(frame)
    if ok.empty:
        return ok
    rates = ok.groupby("label")["config.train.lr"].agg(lambda r: tuple(sorted(set(r))))
    picked = snli_chosen(ok)
    # whether the chosen rate beats every other on the seeds all rates ran (a tie, as the
    # class prior's at every rate, says nothing of where the best lies)
    alone = {label: (lambda means: (means == means.max()).sum() == 1)(lr_means(grp, "best_val_accuracy")[0])
             for label, grp in ok.assign(lr=ok["config.train.lr"]).groupby("label")}
    return picked.assign(rates=picked["label"].map(rates), alone=picked["label"].map(alone))


def _accuracy(values: pd.Series) -> str:
    """Mean over seeds in percent, ± their sd where there are two or more."""
    v = 100 * values.dropna()
    if v.empty:
        return "–"
    return f"{v.mean():.2f}" + (f" ± {v.std():.2f}" if len(v) > 1 else "")


def _count(n: int) -> str:
    """A parameter count: in millions, or whole where it is small (a probe's, a prior's)."""
    return f"{n / 1e6:.2f}M" if n >= 100_000 else f"{int(n):,}"


def _rate(runs: pd.DataFrame) -> str:
    lr, rates = runs["lr"].iloc[0], runs["rates"].iloc[0]
    if len(rates) < 2:
        return f"{lr:g}"
    edge = None if not runs["alone"].iloc[0] else "largest" if lr == rates[-1] else "smallest" if lr == rates[0] \
        else None
    return f"{lr:g} ({edge} of {len(rates)})" if edge else f"{lr:g} (of {len(rates)})"


def snli_table(frame: pd.DataFrame) -> str:
    """One row per model at its chosen rate: what it reads, its trainable and total
    parameters (the frozen encoder counts in the total), the rate and how many were tried
    (an end of the bracket named), its seeds, and accuracy on validation and test (mean ±
    sd over the seeds, percent)."""
    picked = _chosen(frame)
    if picked.empty:
        return "*No finished run yet.*"
    lines = []
    for label in snli_order(picked):
        runs = picked[picked["label"] == label]
        first = runs.iloc[0]
        lines.append([label, _reads(first), _count(first["params_trainable"]), f"{first['params'] / 1e6:.1f}M",
                      _rate(runs), ", ".join(str(int(s)) for s in sorted(runs["seed"])),
                      *(_accuracy(runs[m]) for m, _ in METRICS)])
    header = ["model", "reads", "trainable params", "params total", "lr (of the rates tried)", "seeds",
              "validation accuracy %", "test accuracy %"]
    return markdown_table(header, lines, ["---", "---", "---:", "---:", "---:", "---:", "---:", "---:"])


def _points(x: float) -> str:
    return f"{x:+.2f}".replace("-", "−")


def _difference(picked: pd.DataFrame, mine: str, control: str) -> str:
    """``mine`` minus ``control`` in accuracy points on validation and on test, each with
    Welch's 95 % interval where both sides have two seeds or more, the seeds, and whether
    test says what validation does."""
    sides = {m: picked[picked["label"] == m] for m in (mine, control)}
    read = {}
    for metric, split in METRICS:
        values = [100 * sides[m][metric].dropna() for m in (mine, control)]
        read[split] = welch_interval(*values)
    said = [f"{_points(d)} points on {split}" + ("" if lo is None else f" [95 % CI {_points(lo)}, {_points(hi)}]")
            for split, (d, lo, hi) in read.items()]
    seeds = f"{len(sides[mine])} seed{'s' if len(sides[mine]) > 1 else ''} against {len(sides[control])}"
    agree = f"; test gives {split_agreement(read['validation'], read['test'])}"
    return f"{', '.join(said)} ({seeds}{agree})"


def _published(published: pd.DataFrame | None, setting: str) -> list[str]:
    """Each source's Grassmann minus attention accuracy in points at ``setting``, per split."""
    if published is None:
        return []
    rows = published[(published["task"] == "snli") & (published["setting"] == setting)]
    out = []
    for source, grp in rows.groupby("source", sort=False):
        said = []
        for split in ("test", "validation"):
            at = grp[grp["split"] == split].set_index("mixer")["value"].astype(float)
            if {"grassmann", "attention"} <= set(at.index):
                g, a = at["grassmann"], at["attention"]
                said.append(f"{_points(100 * (g - a))} on {split} ({100 * g:.2f} against {100 * a:.2f})")
        if said:
            out.append(f"{source}: {', '.join(said)}")
    return out


def snli_verdict(frame: pd.DataFrame, published: pd.DataFrame | None = None) -> str:
    """The sentences the SNLI section stands on: the Grassmann-Plücker head against the
    Transformer head (the paper's question), the controls beside the Transformer head,
    and Grassmann against attention from scratch, each difference with its interval and
    seeds, next to the published differences of the same comparison."""
    picked = _chosen(frame)
    if picked.empty:
        return "No SNLI run has finished yet."
    heads = picked[picked["role"] == "head"]
    by_head = {h: heads.loc[heads["head"] == h, "label"].unique() for h in SNLI_HEADS}
    parts = []
    if all(len(v) == 1 for v in by_head.values()):
        control, mine = by_head["transformer"][0], by_head["grassmann"][0]
        encoder = str(heads["backbone"].iloc[0]).split(" (")[0]
        parts.append(f"Over frozen {encoder} features, the {mine} minus the {control}: "
                     f"{_difference(picked, mine, control)}.")
        theirs = _published(published, "distilbert")
        if theirs:
            parts.append("Published, over DistilBERT features: " + "; ".join(theirs) + ".")
        controls = picked[picked["role"] == "control"]
        if not controls.empty:
            base = 100 * picked.loc[picked["label"] == control, "test_accuracy"].mean()
            listed = [f"{label} {100 * controls.loc[controls['label'] == label, 'test_accuracy'].mean():.2f}"
                      for label in snli_order(controls)]
            parts.append(f"Controls on test accuracy, beside the {control}'s {base:.2f}: " + ", ".join(listed) + ".")
    else:
        missing = [HEAD_NAMES[h] for h, v in by_head.items() if len(v) != 1]
        parts.append(f"No head comparison yet: the {' and the '.join(missing)} head "
                     f"{'has' if len(missing) == 1 else 'have'} no finished run.")
    scratch = picked[picked["role"] == "scratch"]
    by_mixer = {m: scratch.loc[scratch["mixer"] == m, "label"].unique() for m in ("grassmann", "attention")}
    if all(len(v) == 1 for v in by_mixer.values()):
        parts.append(f"From scratch, {by_mixer['grassmann'][0]} minus {by_mixer['attention'][0]}: "
                     f"{_difference(picked, by_mixer['grassmann'][0], by_mixer['attention'][0])}.")
        theirs = _published(published, "scratch")
        if theirs:
            parts.append("Published from scratch: " + "; ".join(theirs) + ".")
    return " ".join(parts)
