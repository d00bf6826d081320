"""The statistics the reports and the headline tables share: Zoology's and MAD's
best-of-sweep rule, MAD's score, the gap to attention with its interval, and the
length-extrapolation curves."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd

from tasks.published import PUBLISHED


def tried_runs(rows: pd.DataFrame) -> pd.DataFrame:
    """The runs that count in a best-of-learning-rates point: the finished ones and the
    diverged ones (final too: a learning rate tried, which failed; left out, its point
    would wait for it forever), a diverged run scored by its best evaluation before it
    diverged, 0 where it had none."""
    rows = rows[rows["run_status"].isin(("ok", "diverged"))]
    if "accuracy" not in rows:
        return rows
    unscored = (rows["run_status"] == "diverged") & rows["accuracy"].isna()
    return rows.assign(accuracy=rows["accuracy"].mask(unscored, 0.0))


def best_over_lr(rows: pd.DataFrame, keys) -> pd.DataFrame:
    """Zoology's rule for MQAR: a point (``keys`` and seed) is its run of best accuracy
    over the learning rates tried, so a model is not judged by a learning rate that
    suits another. Whole rows come back: the winning ``lr``, ``state_size``, params, and
    ``lrs_tried``, the number of learning rates the point was the best of, and
    ``lr_edge``: "largest" or "smallest" where the winner is an end of two or more
    learning rates tried and beats every other (the grid may not bracket the point's
    best), else "" (a tie says nothing of where the best lies). A run with a validation
    split (``best_val_accuracy``) competes on it and reports its test ``accuracy``, read
    once at the checkpoint validation chose; a run without one competes on ``accuracy``."""
    rows = rows[rows["accuracy"].notna()]
    by = [k for k in (*keys, "seed") if k in rows]
    on = rows["best_val_accuracy"].fillna(rows["accuracy"]) if "best_val_accuracy" in rows else rows["accuracy"]
    rows = rows.assign(_on=on)
    if "lr" in rows:
        point = rows.groupby(by, dropna=False)
        tried, low, high = (point["lr"].transform(f) for f in ("nunique", "min", "max"))
        top = rows["_on"] == point["_on"].transform("max")
        alone = top.groupby([rows[k] for k in by], dropna=False).transform("sum") == 1  # no tie for best
        edge = (tried > 1) & ((rows["lr"] == high) | (rows["lr"] == low)) & alone
        rows = rows.assign(lrs_tried=tried, lr_edge=(rows["lr"] == high).map({True: "largest", False: "smallest"})
                           .where(edge, ""))
    return rows.loc[rows.groupby(by, dropna=False)["_on"].idxmax()].drop(columns="_on")


def over_seeds(best: pd.DataFrame, keys) -> pd.DataFrame:
    """One row per point (``keys``) of ``best_over_lr``'s per-seed rows: ``accuracy`` the
    mean over its seeds, ``accuracy_sd`` their sd (NaN for one), ``seeds`` how many. The
    other columns (lr, lrs_tried, lr_edge, state_size, ...) are those of the seed that
    tried the most learning rates: the bracket's, where more seeds ran at its best only."""
    if best.empty:
        return best.assign(accuracy_sd=[], seeds=[])
    keys = [k for k in keys if k in best]
    order = best.sort_values("lrs_tried", ascending=False, kind="stable") if "lrs_tried" in best else best
    point = order.groupby(keys, dropna=False)
    first = point.head(1).set_index(keys)
    first["accuracy"] = point["accuracy"].mean()
    first["accuracy_sd"] = point["accuracy"].std()
    first["seeds"] = point["accuracy"].size()
    return first.reset_index()


# The validation metric each task's models are chosen on between learning rates, and
# whether higher is better; a task not named here is never pooled over rates (``chosen``).
SELECT_ON = {"wikitext2": ("best_val_ppl", False), "corpus": ("best_val_ppl", False),
             "snli": ("best_val_accuracy", True)}


# SNLI's roles: the paper's two heads over a frozen encoder's features of the whole pair
# (the Transformer head first: the control), the controls beside them, the LMs from scratch.
SNLI_HEADS = ("transformer", "grassmann")
SNLI_ROLES = ("head", "control", "scratch")


def snli_role(row: pd.Series) -> str:
    """"head", "control" or "scratch": what an SNLI record says its run read and trained
    (not its label). A control is a run over the encoder that is not one of the two heads
    on the pair's features of the pretrained encoder: the class prior, a linear probe, the
    hypothesis alone, a randomly initialised encoder."""
    if row["setting"] == "scratch":
        return "scratch"
    random_encoder = "random" in str(row.get("backbone"))
    return "head" if row.get("head") in SNLI_HEADS and row.get("inputs") == "pair" and not random_encoder \
        else "control"


def snli_chosen(rows: pd.DataFrame) -> pd.DataFrame:
    """SNLI runs (ok ones) at each model's chosen rate (``chosen``), with the columns a
    record of an older run may lack (head, backbone, inputs) filled with None and each
    run's ``role`` (``snli_role``) added."""
    picked = chosen(rows, "snli")
    picked = picked.assign(**{c: picked[c] if c in picked else None for c in ("head", "backbone", "inputs")})
    return picked.assign(role=picked.apply(snli_role, axis=1))


def snli_order(picked: pd.DataFrame) -> list[str]:
    """The labels of SNLI runs (``chosen``'s, with a ``role`` column) in reading order:
    heads (the Transformer head first), controls, scratch models, each group best first on
    validation (the split models are chosen on)."""
    key = picked.groupby("label").agg(role=("role", "first"), head=("head", "first"),
                                      val=("best_val_accuracy", "mean"))
    return sorted(key.index, key=lambda m: (SNLI_ROLES.index(key.at[m, "role"]),
                                            SNLI_HEADS.index(key.at[m, "head"]) if key.at[m, "role"] == "head" else 0,
                                            -key.at[m, "val"]))


def _with_lr(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with an ``lr`` column: the task's own, else the config's (NaN where neither)."""
    if "lr" in rows:
        return rows
    return rows.assign(lr=rows["config.train.lr"] if "config.train.lr" in rows else float("nan"))


def at_best_lr(rows: pd.DataFrame, keys=("label",), metric: str = "best_val_ppl",
               higher: bool = False) -> pd.DataFrame:
    """Each group's runs at its best learning rate (lowest ``metric``, highest where
    ``higher``), every seed run there, so a model is read at its own best rate. The rates
    are compared on the seeds that every rate of the group has run (a bracket at seed 0,
    then more seeds at its best: the extra seeds do not weigh in the choice). Adds ``lr``
    (from the config where the task does not report it) and ``lrs_tried``."""
    rows = _with_lr(rows)
    rows = rows[rows[metric].notna()]
    out = []
    for _, grp in rows.groupby(list(keys), dropna=False):
        means, _ = lr_means(grp, metric)
        out.append(grp[grp["lr"] == (means.idxmax() if higher else means.idxmin())].assign(lrs_tried=len(means)))
    return pd.concat(out) if out else rows.assign(lrs_tried=0)


def model_keys(rows: pd.DataFrame) -> list[str]:
    """What tells one model of a sweep from another: its label, and its setting where the
    sweep runs several (a setting is a layers/context pair or a task variant)."""
    many = "setting" in rows and rows["setting"].nunique(dropna=False) > 1
    return ["label"] + (["setting"] if many else [])


def chosen(rows: pd.DataFrame, task: str) -> pd.DataFrame:
    """The one reading of a sweep that reports, figures and the headline share: each model
    (``model_keys``) at the learning rate chosen on validation (``SELECT_ON``), with every
    seed run at that rate, so the seeds, not the rates, make the spread. A model run at one
    rate reads as it is. In a task with no validation metric a model's rates stay apart
    (the label gets " lr <rate>") rather than being pooled. Adds ``lr``, ``lrs_tried`` and
    ``seeds`` (the seeds at the chosen rate)."""
    rows = _with_lr(rows)
    if rows.empty:
        return rows.assign(lrs_tried=[], seeds=[])
    keys = model_keys(rows)
    several = rows.groupby(keys, dropna=False)["lr"].transform("nunique") > 1
    one = rows[~several].assign(lrs_tried=1)
    metric, higher = SELECT_ON.get(task, (None, False))
    if metric is not None and metric in rows and rows.loc[several, metric].notna().all():
        picked = pd.concat([one, at_best_lr(rows[several], keys, metric, higher)]) if several.any() else one
    else:
        named = rows["label"] + " lr " + rows["lr"].map("{:g}".format)
        picked = rows.assign(label=rows["label"].where(~several, named), lrs_tried=1)
    by = picked.groupby(model_keys(picked), dropna=False)
    seeds = by["seed"].transform("nunique") if "seed" in picked else by["label"].transform("size")
    return picked.assign(seeds=seeds)


def bracket(rows: pd.DataFrame, task: str) -> pd.DataFrame:
    """The learning-rate bracket behind ``chosen``: per model tried at more than one rate,
    its validation metric at each rate, the mean over the seeds every rate ran (those the
    choice was made on). Columns: the model keys, lr, value, seeds (the shared seeds, as
    text) and chosen (the rate ``chosen`` reads the model at)."""
    metric, higher = SELECT_ON.get(task, (None, False))
    empty = pd.DataFrame(columns=["label", "lr", "value", "seeds", "chosen"])
    if rows.empty or metric not in rows:
        return empty
    rows = _with_lr(rows)
    rows = rows[rows[metric].notna()]
    keys = model_keys(rows)
    out = []
    for key, grp in rows.groupby(keys, dropna=False):
        if grp["lr"].nunique() < 2:
            continue
        means, shared = lr_means(grp, metric)
        best = means.idxmax() if higher else means.idxmin()
        key = key if isinstance(key, tuple) else (key,)
        out += [{**dict(zip(keys, key)), "lr": lr, "value": v, "seeds": ", ".join(str(int(s)) for s in shared),
                 "chosen": lr == best} for lr, v in means.items()]
    return pd.DataFrame(out) if out else empty


def lr_means(runs: pd.DataFrame, metric: str) -> tuple[pd.Series, list]:
    """One model's mean ``metric`` per learning rate (a Series by lr) over the seeds every
    rate has run, and those seeds: rates compare on the same seeds."""
    shared = sorted(set.intersection(*(set(g["seed"]) for _, g in runs.groupby("lr"))))
    return runs[runs["seed"].isin(shared)].groupby("lr")[metric].mean(), shared


def seed_interval(values, level: float = 0.95) -> tuple[float, float | None, float | None]:
    """The mean of ``values`` (one per seed) and its Student t interval; low and high are
    None for a single value. Figures draw it as a point's band or bar."""
    v = [float(x) for x in values]
    mean = statistics.fmean(v)
    if len(v) < 2:
        return mean, None, None
    half = t_quantile((1 + level) / 2, len(v) - 1) * statistics.stdev(v) / math.sqrt(len(v))
    return mean, mean - half, mean + half


def welch_interval(ours, theirs, level: float = 0.95) -> tuple[float, float | None, float | None]:
    """The difference of the means of ``ours`` and ``theirs`` (one value per seed) and
    Welch's t interval on it (Welch–Satterthwaite degrees of freedom, so the two sides'
    spreads need not match); low and high are None unless both sides have at least 2
    values."""
    a, b = [float(v) for v in ours], [float(v) for v in theirs]
    diff = statistics.fmean(a) - statistics.fmean(b)
    if min(len(a), len(b)) < 2:
        return diff, None, None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:  # identical runs on both sides: no spread, no width
        return (diff,) * 3
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile((1 + level) / 2, df) * math.sqrt(va + vb)
    return diff, diff - half, diff + half


def gap_interval(ours, attention, level: float = 0.95) -> tuple[float, float | None, float | None]:
    """How much higher ``ours``' perplexities are than ``attention``'s, as fractions
    (gap, low, high). The gap is the ratio of geometric means minus 1: perplexity is the
    exp of a mean loss, so this compares mean losses. The interval is ``welch_interval``
    on the mean log perplexities, exponentiated; low and high are None unless both sides
    have at least 2 values."""
    diff, low, high = welch_interval([math.log(v) for v in ours], [math.log(v) for v in attention], level)
    return math.expm1(diff), None if low is None else math.expm1(low), None if high is None else math.expm1(high)


# What makes a block besides its mixer: a gap is read against attention built the same way
# (pre-LN Grassmann against pre-LN attention), never against attention of another block.
BLOCK_FIELDS = ("setting", "config.model.block", "config.model.init_std")


def block_attention(rows: pd.DataFrame, like: pd.DataFrame) -> pd.DataFrame:
    """The attention rows of ``rows`` (mixer "attention") built as ``like``'s first row is
    on ``BLOCK_FIELDS``: the baseline a gap of ``like`` is taken to. Pass rows already at
    attention's chosen rate (``chosen``, ``at_best_lr``). Rows without a mixer column (a
    hand-made frame) are told apart by label."""
    same = rows[rows["mixer" if "mixer" in rows else "label"] == "attention"]
    for col in BLOCK_FIELDS:
        if col in same and col in like:
            value = like[col].iloc[0]
            same = same[same[col].isna()] if pd.isna(value) else same[same[col] == value]
    return same


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile, for real df >= 1 (a Welch df is at least 1), without scipy.
    With t = sqrt(df) tan(u) the density becomes c cos(u)^(df - 1) on [0, pi/2): smooth
    and bounded, so Simpson's rule gives P(0 < T < t) and bisection on u inverts it."""
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"t_quantile: need 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    n = 200  # Simpson intervals: the integrand is smooth, so far below the 4 digits shown

    def mass(u: float) -> float:
        h = u / n
        weights = (1 if i in (0, n) else 4 if i % 2 else 2 for i in range(n + 1))
        return c * h / 3 * sum(w * math.cos(i * h) ** (df - 1) for i, w in enumerate(weights))

    # Cauchy (df = 1) has the widest quantiles; bracketing with it keeps the Simpson grid
    # fine where the density is a narrow peak at large df
    lo, hi = 0.0, math.atan(math.tan(math.pi * (p - 0.5)) / math.sqrt(df))
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mass(mid) < p - 0.5 else (lo, mid)
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def mad_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """The MAD runs a score counts: the finished ones and the diverged ones, a diverged run
    at its evaluation of lowest perplexity before it diverged (the checkpoint MAD would
    score), 0 where none ran (``tried_runs``). Left out, a diverged run at MAD's single
    learning rate of a sweep would drop its setting from every mixer's score."""
    return tried_runs(frame[frame["task"] == "mad"]) if "task" in frame else frame.iloc[0:0]


def shared_settings(rows: pd.DataFrame) -> pd.DataFrame:
    """The MAD rows at the (task, setting)s that every label which ran the task has run.
    A sweep that gives some mixers harder settings as well (mad_cpu: four of them) would
    otherwise average those into their scores alone and rank unlike with unlike; scored on
    the shared settings (there, the baselines) they compare, and the rest is read apart
    (``report.mad_changes``). In MAD's full protocol every mixer runs every setting."""
    if rows.empty:
        return rows
    ran = rows.groupby(["mad_task", "setting"])["label"].nunique()
    per_task = rows.groupby("mad_task")["label"].nunique()
    shared = {key for key, n in ran.items() if n == per_task[key[0]]}
    return rows[[key in shared for key in zip(rows["mad_task"], rows["setting"])]]


def mad_scores(rows: pd.DataFrame) -> pd.DataFrame:
    """MAD's score (Poli et al. 2024; mad-lab's ``benchmark.py``): per model and setting, the
    best test accuracy over the learning-rate x weight-decay sweep (mean over seeds); per
    task, the mean of those over the task's settings (a column per task); the MAD score, the
    mean over the tasks run (each task weighs the same, however many settings it has: the
    published tables' "Average"). Only the settings every model that ran the task has run
    count (``shared_settings``). Best score first; "settings" counts the settings scored."""
    best = best_over_lr(shared_settings(rows), ["label", "mad_task", "setting"])
    per_setting = best.groupby(["label", "mad_task", "setting"])["accuracy"].mean().reset_index()
    table = per_setting.pivot_table(index="label", columns="mad_task", values="accuracy", aggfunc="mean")
    table["MAD score"] = table.mean(axis=1)
    table["settings"] = per_setting.groupby("label").size()
    return table.sort_values("MAD score", ascending=False)


def mad_params(rows: pd.DataFrame) -> pd.Series:
    """Per label, the parameters outside the embedding and head (which grow with a task's
    vocabulary): MAD fixes the width, not the size, so these differ by mixer; the largest
    where a label's runs differ, NaN for records without the field."""
    column = rows["params_no_embeddings"] if "params_no_embeddings" in rows else pd.Series(float("nan"), rows.index)
    return column.groupby(rows["label"]).max()


def mad_totals(rows: pd.DataFrame) -> pd.Series:
    """Per label, the range of its total parameters (embedding and head included) over the
    MAD settings it ran, as (smallest, largest): the totals grow with each task's
    vocabulary, so one number would hide which setting it is; (NaN, NaN) for records
    without the field."""
    column = rows["params"] if "params" in rows else pd.Series(float("nan"), rows.index)
    by = column.groupby(rows["label"])
    return pd.Series({label: (low, high) for label, low, high in zip(by.min().index, by.min(), by.max())},
                     dtype=object)


def read_published(path: str | Path | None = PUBLISHED) -> pd.DataFrame | None:
    """tasks/published.csv (or ``path``): a row per published number; None where ``path``
    is None or no file (a report or figure then leaves the published numbers out)."""
    return pd.read_csv(path, dtype={"setting": str}) if path and Path(path).is_file() else None


def published_mad_scores(published: pd.DataFrame) -> pd.DataFrame:
    """MAD's published scores (published.csv rows of task "mad": one per model and task,
    "average" the mean of the six) as a table, a row per model in the file's order."""
    pub = published[published["task"] == "mad"]
    return pub.assign(value=pd.to_numeric(pub["value"], errors="coerce")).pivot_table(
        index="model", columns="setting", values="value", aggfunc="first", sort=False)


def published_mad_by_mixer(published: pd.DataFrame) -> pd.DataFrame:
    """``published_mad_scores`` with a row per zoo mixer (published.csv's mixer column) and
    "average" named "MAD score", as ``mad_scores`` names it; of two published models of one
    mixer (the two Hyenas) the first is kept."""
    pub = published[published["task"] == "mad"]
    mixer_of = pub.groupby("model", sort=False)["mixer"].first()
    table = published_mad_scores(published).rename(index=mixer_of, columns={"average": "MAD score"})
    return table[~table.index.duplicated()]


def position_curves(frame: pd.DataFrame) -> pd.DataFrame:
    """The length-extrapolation curves of the finished language-model runs that have them
    (``tasks.wikitext2.ppl_by_position``): one row per (run, context factor, bucket of
    training-length positions), with its perplexity and the bucket's first position."""
    if "ppl_by_position" not in frame or "task" not in frame:
        return pd.DataFrame()
    rows = frame[(frame["task"] == "wikitext2") & (frame["run_status"] == "ok") & frame["ppl_by_position"].notna()]
    return pd.DataFrame([{"label": r["label"], "seed": r.get("seed"), "factor": int(f), "bucket": k,
                          "position": k * int(r["seq_len"]), "ppl": v}
                         for _, r in rows.iterrows() for f, ppls in json.loads(r["ppl_by_position"]).items()
                         for k, v in enumerate(ppls)])


def split_agreement(val: tuple, test: tuple) -> str:
    """Whether a gap read on test (``gap_interval``'s (gap, low, high)) says what the one
    read on validation does: "the same sign" or "the opposite sign", and, where the test
    gap has an interval, whether it excludes 0 (a validation verdict whose test interval
    includes 0 is not confirmed by test)."""
    sign = "the same sign" if (val[0] > 0) == (test[0] > 0) else "the opposite sign"
    if test[1] is None:
        return sign + " (no interval)"
    return sign + (", its interval includes 0" if test[1] <= 0 <= test[2] else ", its interval excludes 0")
