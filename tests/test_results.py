"""Records (atomic, concurrent writers), the long-format table, figures and the report."""
from __future__ import annotations

import json
import math
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tasks.published import PUBLISHED as PUBLISHED_CSV
from results.records import load_records, read_record, records_frame, write_record
from results.report import report_markdown, write_report
from results.stats import gap_interval, mad_runs, mad_scores, read_published, t_quantile
from sweeps.cli import main as cli
from test_sweeps import toy_task  # noqa: F401  (autouse: registers the toy task)


def rec(run_id, task, metrics, status="ok", label="", **config):
    return {"run_id": run_id, "sweep": "s", "task": task, "label": label, "status": status,
            "error": None if status == "ok" else "Traceback ...\nRuntimeError: boom",
            "config": {"seed": config.pop("seed", 0), "model": {"mixer": config.pop("mixer", "attention"),
                                                             "d_model": config.pop("d_model", 64)}, **config},
            "metrics": metrics, "resumed": False, "attempts": 1, "provenance": {"git_commit": "abc"}}


# --- records ------------------------------------------------------------------------

def test_record_values_become_plain_json(tmp_path):
    path = write_record(tmp_path / "a" / "r.json", {"nan": float("nan"), "np": np.float32(0.5),
                                                     "t": torch.tensor(3), "tup": (1, 2), "p": Path("/x")})
    assert json.loads(path.read_text()) == {"nan": None, "np": 0.5, "t": 3, "tup": [1, 2], "p": "/x"}
    assert read_record(tmp_path / "missing.json") is None


def _writer(args):
    path, k = args
    for i in range(30):
        write_record(path, {"status": "ok", "writer": k, "i": i, "pad": "x" * 20_000})  # big enough to tear if not atomic
        write_record(Path(path).with_name(f"own{k}.json"), {"status": "ok", "writer": k, "i": i})
    return k


def test_concurrent_writers_never_leave_a_torn_or_temporary_file(tmp_path):
    shared = tmp_path / "shared.json"
    write_record(shared, {"writer": -1, "i": -1, "pad": ""})
    with mp.get_context("fork").Pool(4) as pool:
        pending = pool.map_async(_writer, [(str(shared), k) for k in range(4)])
        seen = set()
        while not pending.ready():  # a reader racing the writers always sees a whole record
            rec_ = json.loads(shared.read_text())
            seen.add(rec_["writer"])
        assert sorted(pending.get()) == [0, 1, 2, 3]
    assert json.loads(shared.read_text())["i"] == 29
    assert {r["writer"] for r in load_records(tmp_path) if "pad" not in r} == {0, 1, 2, 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own0.json", "own1.json", "own2.json", "own3.json",
                                                          "shared.json"]


def test_records_frame_is_long_format_with_points_exploded():
    records = [rec("m1", "mqar", {"accuracy": 0.9, "seq_len": 64, "params": 1000}, mixer="mamba", d_model=32),
               rec("s1", "scaling", {"params": 5, "points": [{"seq_len": 128, "median_ms": 1.0, "status": "ok"},
                                                             {"seq_len": 256, "status": "oom"}]}, mixer="rwkv6"),
               rec("f1", "mqar", {}, status="failed")]
    df = records_frame(records)
    assert len(df) == 4 and list(df["run_id"]) == ["m1", "s1", "s1", "f1"]
    assert list(df["mixer"]) == ["mamba", "rwkv6", "rwkv6", "attention"]  # alias of config.model.mixer
    assert list(df["config.model.d_model"]) == [32, 64, 64, 64]
    assert list(df["status"]) == ["ok", "ok", "oom", "failed"]  # a point's own status wins ...
    assert list(df["run_status"]) == ["ok", "ok", "ok", "failed"]  # ... the record's stays here
    assert df.loc[2, "seq_len"] == 256 and math.isnan(df.loc[2, "median_ms"])
    assert df.loc[0, "accuracy"] == 0.9 and df.loc[3, "error"].endswith("boom")


# --- a sweep of every kind (tests/test_figures.py draws it too) -----------------------

FLOPS_PER_TOKEN = {"attention": 42.3e6, "mamba": 1.5e3}


def synthetic_frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    records, n = [], 0
    for mixer in ("attention", "mamba"):
        for seed in (0, 1, 2):
            for d in (32, 64):
                for L in (64, 256):
                    for lr in (1e-3, 3e-3):
                        acc = float(rng.uniform(0, 1))
                        state = 2 * d * L if mixer == "attention" else 500  # mamba's: one size for all
                        records.append(rec(f"m{n}", "mqar", {"accuracy": acc, "seq_len": L, "d_model": d,
                                                             "num_kv_pairs": 4, "lr": lr, "mixer": mixer,
                                                             "state_size": state},
                                           label=mixer, mixer=mixer, d_model=d, seed=seed))
                        n += 1
            points = [{"seq_len": L, "pass": "fwd", "median_ms": L / 100 * (seed + 1), "status": "ok"}
                      for L in (128, 256)]
            if mixer == "attention":
                points.append({"seq_len": 4096, "pass": "fwd", "status": "oom"})
            records.append(rec(f"s{n}", "scaling", {"points": points, "mixer": mixer}, label=mixer, mixer=mixer,
                               seed=seed))
            records.append(rec(f"w{n}", "wikitext2", {"test_ppl": 200.0 + 10 * seed + (mixer == "mamba"),
                                                      "best_val_ppl": 210.0, "params": 1e6 + 1e4 * (mixer == "mamba"),
                                                      "setting": "6L/128", "mixer": mixer, "batch_size": 4,
                                                      "train_flops_per_token": FLOPS_PER_TOKEN[mixer],
                                                      "seq_len": 8, "eval_steps": [10, 20],
                                                      "val_ppl_history": [300.0 + 10 * seed, 250.0 + 30 * seed
                                                                          + 5 * (mixer == "mamba")]},
                                       mixer=mixer, seed=seed))
            n += 2
    return records_frame(records)



# --- report -------------------------------------------------------------------------

def test_report_puts_our_numbers_beside_the_published_ones(tmp_path):
    lm = {"params": 13_000_000, "setting": "6L/128"}
    records = [rec(f"g{s}", "wikitext2", {"test_ppl": 250.0 + 10 * s, "best_val_ppl": 240.0, "mixer": "grassmann", **lm},
                   label="grassmann", mixer="grassmann", seed=s, train={"lr": 1e-3}) for s in (0, 1)]
    records += [rec(f"a{s}", "wikitext2", {"test_ppl": 200.0 + 20 * s, "best_val_ppl": 200.0, "mixer": "attention", **lm},
                    label="attention", seed=s, train={"lr": 1e-3}) for s in (0, 1)]
    records += [rec("g9", "wikitext2", {"test_ppl": 300.0, "best_val_ppl": 290.0, "mixer": "grassmann", **lm},
                    label="grassmann no-norm", mixer="grassmann", train={"lr": 1e-3}),
                rec("n0", "snli", {"test_accuracy": 0.83, "best_val_accuracy": 0.84, "setting": "distilbert",
                                   "mixer": "grassmann", "params": 5000}, label="grassmann head", mixer="grassmann",
                    train={"lr": 1e-3}),
                rec("bad", "wikitext2", {}, status="failed", label="broken")]
    pub = tmp_path / "published.csv"
    pub.write_text("task,source,setting,model,mixer,params,metric,split,value,note\n"
                   "wikitext2,arXiv 2512.19428 Table 1,6L/128,TransformerLM,attention,12590000,ppl,test,220.0,\n"
                   "wikitext2,arXiv 2512.19428 Table 1,6L/128,GrassmannLM,grassmann,13000000,ppl,test,242.0,\n"
                   "wikitext2,arXiv 2512.19428 Table 1,12L/256,GrassmannLM,grassmann,18000000,ppl,test,200.0,\n"
                   "snli,arXiv 2512.19428 Table 3,distilbert,Grassmann head,grassmann,,accuracy,test,0.8538,\n"
                   "snli,arXiv 2512.19428 Table 3,,GrassmannLM,grassmann,,accuracy,test,0.8,\n")
    text = write_report(records_frame(records), tmp_path / "r.md", pub, title="t").read_text()
    assert text.startswith("# linbench report: t") and "7 runs: 6 ok, 1 failed" in text
    assert "| bad | broken | failed | RuntimeError: boom |" in text
    published = text.split("## Beside the published numbers")[1]
    # perplexity: the source's gap (242 / 220) beside ours, never a difference of perplexities
    lines = [ln for ln in published.splitlines() if "| 242 / 220 | +10.0% |" in ln]
    assert len(lines) == 2  # the 12L row matches nothing we ran; a source without attention gives no gap
    assert "| grassmann | +21.5% [" in lines[0] and "| 2 vs 2 seeds |" in lines[0]  # sqrt(250 * 260) / sqrt(200 * 220)
    assert "| grassmann no-norm | +43.0% | 1 vs 2 seeds |" in lines[1]
    # accuracy in the same setting: the numbers side by side; the row with no setting matches nothing
    acc = [ln for ln in published.splitlines() if "Grassmann" in ln and "accuracy" in ln]
    assert len(acc) == 1 and "| 0.8538 | grassmann head | 5,000 | 0.83 | 0.001 | -0.0238 |" in acc[0]
    section = text.split("## wikitext2")[1].split("##")[0]
    assert "| grassmann | 13,000,000 | 240 ± 0 (n=2) | 255 ± 7.071 (n=2) | 0.001 | 2 |" in section
    assert report_markdown(records_frame(records)).count("Beside the published") == 0


def test_report_wikitext2_gap_to_attention_is_per_setting():
    runs = [("attention", "2L/128", 200.0), ("attention", "2L/128", 220.0), ("grassmann", "2L/128", 231.0),
            ("attention", "6L/128", 100.0), ("grassmann", "6L/128", 90.0)]
    records = [rec(f"r{i}", "wikitext2", {"test_ppl": ppl, "best_val_ppl": ppl, "params": 1000, "setting": setting,
                                          "mixer": mixer}, label=mixer, mixer=mixer, seed=i, train={"lr": 1e-3})
               for i, (mixer, setting, ppl) in enumerate(runs)]
    section = report_markdown(records_frame(records)).split("## wikitext2")[1]
    assert "test_ppl vs attention" in section
    assert "| grassmann | 2L/128 | 1,000 | 231 | 231 | 0.001 | 1 | +10.1% |" in section  # 231 / sqrt(200 * 220)
    assert "| grassmann | 6L/128 | 1,000 | 90 | 90 | 0.001 | 1 | -10.0% |" in section
    assert "| attention | 2L/128 | 1,000 | 210 ± 14.14 (n=2) | 210 ± 14.14 (n=2) | 0.001 | 2 | +0.0% |" in section


def test_report_mqar_rows_are_the_best_lr_per_seed_then_mean():
    df = synthetic_frame().assign(**{"config.train.lr": 1e-3})  # the LM runs are read at a rate (stats.chosen)
    m = df[df["task"] == "mqar"]
    section = report_markdown(df).split("## mqar")[1].split("## ")[0]
    assert "| label | L | kv pairs | d_model | state size | accuracy | best lr | lrs tried | seeds |" in section
    for mixer in ("attention", "mamba"):
        for L in (64, 256):
            for d in (32, 64):
                at = m[(m["mixer"] == mixer) & (m["seq_len"] == L) & (m["d_model"] == d)]
                per_seed = [at[at["seed"] == s].sort_values("accuracy").iloc[-1] for s in (0, 1, 2)]
                acc = [r["accuracy"] for r in per_seed]
                lrs = ", ".join(f"{lr:g}" for lr in sorted({r["lr"] for r in per_seed}))
                state = f"{2 * d * L:,}" if mixer == "attention" else "500"
                cell = f"{np.mean(acc):.4g} ± {np.std(acc, ddof=1):.4g} (n=3)"
                assert f"| {mixer} | {L} | 4 | {d} | {state} | {cell} | {lrs} | 2 | 3 |" in section


def test_a_run_with_a_validation_split_competes_on_it_and_reports_test():
    from results.stats import best_over_lr
    rows = pd.DataFrame([  # one point, one seed, three rates
        {"label": "a", "seq_len": 64, "d_model": 32, "seed": 0, "lr": 1e-3, "accuracy": 0.95, "best_val_accuracy": 0.80},
        {"label": "a", "seq_len": 64, "d_model": 32, "seed": 0, "lr": 3e-3, "accuracy": 0.90, "best_val_accuracy": 0.85},
        {"label": "a", "seq_len": 64, "d_model": 32, "seed": 0, "lr": 1e-2, "accuracy": 0.10, "best_val_accuracy": 0.20}])
    best = best_over_lr(rows, ["label", "seq_len", "d_model"])
    # chosen on validation (0.85 at 3e-3), reported on test (0.90), though test was higher at 1e-3
    assert best[["lr", "accuracy", "lrs_tried", "lr_edge"]].values.tolist() == [[3e-3, 0.90, 3, ""]]
    assert "_on" not in best
    zoology = best_over_lr(rows.drop(columns="best_val_accuracy"), ["label", "seq_len", "d_model"])
    assert zoology[["lr", "accuracy", "lr_edge"]].values.tolist() == [[1e-3, 0.95, "smallest"]]


def test_t_quantile_matches_the_tables():
    for df, t in ((1, 12.706), (2, 4.303), (10, 2.228), (30, 2.042), (1e6, 1.960)):
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-3)
    assert t_quantile(0.995, 1) == pytest.approx(63.657, abs=1e-3)
    assert t_quantile(0.025, 10) == pytest.approx(-2.228, abs=1e-3) and t_quantile(0.5, 3) == 0


def test_gap_interval_is_welch_on_mean_log_perplexity():
    gap, low, high = gap_interval([231.0], [200.0, 220.0])  # one run: the gap only
    assert gap == pytest.approx(231 / math.sqrt(200 * 220) - 1) and low is None and high is None
    # equal spreads of the logs, 2 runs a side: Welch's df is 2
    gap, low, high = gap_interval([220.0, 242.0], [200.0, 220.0])
    half = 4.302653 * math.log(1.1) / math.sqrt(2)
    assert (gap, low, high) == pytest.approx((0.1, math.expm1(math.log(1.1) - half), math.expm1(math.log(1.1) + half)))
    # attention without spread: all the uncertainty is ours, 2 runs, so df is 1 (pooled would be 3)
    gap, low, high = gap_interval([220.0, 242.0], [200.0, 200.0, 200.0])
    d, se = math.log(math.sqrt(220 * 242) / 200), math.log(1.1) / 2  # sd of the logs / sqrt(2)
    assert (low, high) == pytest.approx((math.expm1(d - 12.706205 * se), math.expm1(d + 12.706205 * se)))


def test_report_wikitext2_gap_has_an_interval_where_both_sides_have_seeds():
    runs = [("attention", 200.0), ("attention", 220.0), ("grassmann", 220.0), ("grassmann", 242.0), ("mamba", 190.0)]
    records = [rec(f"r{i}", "wikitext2", {"test_ppl": ppl, "params": 1000, "setting": "2L/128", "mixer": mixer},
                   label=mixer, mixer=mixer, seed=i) for i, (mixer, ppl) in enumerate(runs)]
    section = report_markdown(records_frame(records)).split("## wikitext2")[1]
    assert "95% Welch t interval" in section and "geometric mean" in section
    low, high = (100 * math.expm1(math.log(1.1) + s * 4.302653 * math.log(1.1) / math.sqrt(2)) for s in (-1, 1))
    assert f"| grassmann | 1,000 | 231 ± 15.56 (n=2) | 2 | +10.0% [{low:+.1f}%, {high:+.1f}%] |" in section
    assert "| attention | 1,000 | 210 ± 14.14 (n=2) | 2 | +0.0% |" in section  # itself: no interval
    assert f"| mamba | 1,000 | 190 | 1 | {100 * (190 / math.sqrt(200 * 220) - 1):+.1f}% |" in section


def test_cli_plot_and_report_read_the_sweep_records(tmp_path, capsys):
    path = tmp_path / "toys.py"
    path.write_text("from sweeps import RunConfig\nconfigs = [RunConfig('toy', {'seed': s}, 'toy') for s in (0, 1)]\n")
    res = str(tmp_path / "res")
    assert cli(["report", str(path), "--results-dir", res]) == 2  # nothing ran yet: says so
    assert "run it first" in capsys.readouterr().err
    assert cli(["run", str(path), "--executor", "debug", "--results-dir", res]) == 0
    assert cli(["plot", str(path), "--results-dir", res]) == 0
    assert "no figure applies" in capsys.readouterr().out  # the toy task has no figure
    assert cli(["report", str(path), "--results-dir", res]) == 0
    report = (tmp_path / "res" / "toys" / "report.md").read_text()
    assert "2 runs: 2 ok" in report and "## toy" in report and "loss" in report
    assert cli(["export", str(path), "--results-dir", res]) == 0
    table = pd.read_csv(tmp_path / "res" / "toys" / "runs.csv")
    assert sorted(table["config.seed"]) == [0, 1] and set(table["status"]) == {"ok"}
    assert json.loads(table["config.train.betas"][0]) == [0.9, 0.95]  # lists as JSON, readable elsewhere


def test_report_scaling_tables_have_a_column_per_length_and_mark_oom():
    text = report_markdown(synthetic_frame().assign(**{"config.train.lr": 1e-3}))  # the LM runs' rate (stats.chosen)
    section = text.split("## scaling")[1].split("## ")[0]
    lat = [1.28 * k for k in (1, 2, 3)]  # L=128 over the three seeds; L=256 doubles it
    mean, sd = np.mean(lat), np.std(lat, ddof=1)
    cell = lambda m, s: f"{m:.4g} ± {s:.4g} (n=3)"
    assert f"| attention | fwd | {cell(mean, sd)} | {cell(2 * mean, 2 * sd)} | oom |" in section
    assert f"| mamba | fwd | {cell(mean, sd)} | {cell(2 * mean, 2 * sd)} | – |" in section







def test_mad_score_is_the_mean_of_best_of_sweep_accuracies():
    def run(label, task, setting, lr, wd, acc):
        return {"task": "mad", "run_status": "ok", "label": label, "mad_task": task, "setting": setting,
                "lr": lr, "weight_decay": wd, "accuracy": acc, "seed": 0}
    rows = pd.DataFrame([run("a", "copy", "s1", 1e-3, 0.0, 0.2), run("a", "copy", "s1", 1e-3, 0.1, 0.8),
                         run("a", "copy", "s2", 1e-3, 0.0, 0.4), run("a", "recall", "s3", 1e-3, 0.0, 0.9),
                         run("b", "copy", "s1", 1e-3, 0.0, 0.1), run("b", "copy", "s2", 1e-3, 0.0, 0.3)])
    table = mad_scores(rows)
    # best of the sweep per setting (s1: 0.8), a task's settings averaged (copy: 0.6), then
    # each task weighs the same (not the three settings': 0.7), as mad-lab's benchmark.py
    assert table.loc["a", "copy"] == pytest.approx(0.6) and table.loc["a", "settings"] == 3
    assert table.loc["a", "MAD score"] == pytest.approx((0.6 + 0.9) / 2)
    assert table.loc["b", "MAD score"] == pytest.approx(0.2)  # the mean over the tasks it ran
    assert list(table.index) == ["a", "b"]
    # params: outside the embedding (MAD fixes the width, so they differ by mixer)
    sized = rows.assign(run_id=range(6), params_no_embeddings=[1000] * 4 + [2000] * 2)
    assert "| a | 0.75 | 0.6 | 0.9 | 3 | 1000 |" in report_markdown(sized)
    assert "| b | 0.2 | 0.2 | – | 2 | – |" in report_markdown(rows.assign(run_id=range(6)))  # older records
    # MAD's published scores get their own table; no "no published row matches" below it
    pub = pd.DataFrame([{"task": "mad", "source": "MAD", "setting": t, "model": "Transformer", "mixer": "attention",
                         "metric": "accuracy", "split": "test", "value": v}
                        for t, v in (("copy", 0.5), ("recall", 0.7), ("average", 0.6))])
    text = report_markdown(rows.assign(run_id=range(6)), pub)
    assert "## mad: the published scores" in text and "| Transformer | 0.6 | 0.5 | 0.7 |" in text
    assert "Beside the published numbers" not in text


def test_mad_scores_rank_only_on_the_settings_every_mixer_of_a_task_ran():
    def run(label, task, setting, acc):
        return {"task": "mad", "run_status": "ok", "label": label, "mad_task": task, "setting": setting,
                "lr": 1e-3, "weight_decay": 0.0, "accuracy": acc, "seed": 0}
    rows = pd.DataFrame([run("a", "copy", "base", 0.9), run("a", "copy", "hard", 0.1), run("b", "copy", "base", 0.5),
                         run("a", "recall", "base", 0.7), run("a", "recall", "hard", 0.3)])
    table = mad_scores(rows)
    # copy: only a ran "hard", so both are scored on "base"; recall: a alone ran it, all of it counts
    assert table.loc["a", "copy"] == pytest.approx(0.9) and table.loc["b", "copy"] == pytest.approx(0.5)
    assert table.loc["a", "recall"] == pytest.approx(0.5) and table.loc["a", "settings"] == 3


def test_a_diverged_mad_run_counts_at_its_evaluation_before():
    from results.paper.headline import mad_table

    def run(label, status, acc, task="mad"):
        return {"task": task, "run_status": status, "label": label, "mad_task": "copy", "setting": "base",
                "lr": 1e-3, "weight_decay": 0.0, "accuracy": acc, "seed": 0}
    frame = pd.DataFrame([run("a", "ok", 0.9), run("b", "diverged", 0.4), run("c", "diverged", float("nan")),
                          run("d", "failed", float("nan")), run("e", "ok", 0.5, task="mqar")])
    table = mad_scores(mad_runs(frame))
    # as MAD scores the checkpoint from before; none before: 0. A failed run (a crash) is no result
    assert table["copy"].to_dict() == {"a": 0.9, "b": 0.4, "c": 0.0}
    published = pd.DataFrame(columns=["task", "model", "setting", "value"])
    assert "| b (ours) | – | – | 1 | 0.400 | 0.400 |" in mad_table(frame, published)




def test_mad_report_shows_the_published_scores_beside_ours():
    rows = pd.DataFrame([{"task": "mad", "run_status": "ok", "label": "a", "mad_task": "compression",
                          "setting": "{}", "lr": 1e-3, "weight_decay": 0.0, "accuracy": 0.5, "seed": 0, "run_id": 1,
                          "mixer": "attention"}])
    published = read_published(PUBLISHED_CSV)
    text = report_markdown(rows, published)
    section = text.split("## mad: the published scores")[1].split("\n## ")[0]
    # Transformer's row: its average, then the six tasks in name order (compression first)
    assert "| Transformer | 0.745 | 0.516 | 0.298 | 0.941 | 0.852 | 0.868 | 0.996 |" in section
    assert section.count("\n| ") == 1 + 6  # the header and six published models
    assert "## mad: the published" not in report_markdown(rows.assign(task="toy"), published)
