"""The report reads each model at its chosen learning rate (``stats.chosen``), shows the
bracket it was chosen from, and sets perplexities beside the published ones as gaps."""
from __future__ import annotations

import time

import pandas as pd
import pytest

from results.layout import workdir_for
from results.records import records_frame
from results.report import report_markdown
from results.stats import gap_interval
from sweeps import cli as cli_module
from tasks.engine.progress import write_progress
from test_results import rec
from test_sweep_ops import sweep_file
from test_sweeps import toy_task  # noqa: F401  (the autouse fixture registers the toy task)

# (label, mixer, lr, seed, best_val_ppl, test_ppl): attention's best rate (1e-3, 3 seeds) is
# bracketed by two single-seed rates far worse; pooled, those would drag attention up to
# ~112 test ppl, below the gated model's, and flip the sign of its gap
SWEEP = [("attention", "attention", 5e-4, 0, 140.0, 130.0),
         ("attention", "attention", 1e-3, 0, 100.0, 95.0),
         ("attention", "attention", 1e-3, 1, 102.0, 96.0),
         ("attention", "attention", 1e-3, 2, 104.0, 97.0),
         ("attention", "attention", 2e-3, 0, 160.0, 150.0),
         ("grassmann gated", "grassmann", 1e-3, 0, 120.0, 110.0),
         ("grassmann gated", "grassmann", 2e-3, 0, 108.0, 104.0),
         ("grassmann gated", "grassmann", 2e-3, 1, 109.0, 105.0),
         ("grassmann gated", "grassmann", 2e-3, 2, 110.0, 106.0),
         ("mamba2", "mamba2", 1e-3, 0, 105.0, 99.0)]


def lm_frame(runs=SWEEP, setting: str = "6L/128") -> pd.DataFrame:
    return records_frame([rec(f"r{i}", "wikitext2", {"best_val_ppl": val, "test_ppl": test, "params": 1000,
                                                     "setting": setting, "mixer": mixer},
                              label=label, mixer=mixer, seed=seed, train={"lr": lr})
                          for i, (label, mixer, lr, seed, val, test) in enumerate(runs)])


def section(text: str, title: str) -> str:
    return text.split(f"## {title}\n")[1].split("\n## ")[0]


def test_each_model_is_read_at_its_chosen_rate_and_the_gap_at_attentions():
    table = section(report_markdown(lm_frame()), "wikitext2").split("###")[0]
    assert "chosen on validation" in table and "seeds at that rate" in table
    assert "| label | params | best_val_ppl | test_ppl | lr | seeds | test_ppl vs attention |" in table
    assert "| attention | 1,000 | 102 ± 2 (n=3) | 96 ± 1 (n=3) | 0.001 (best of 3) | 3 | +0.0% |" in table
    point, low, high = gap_interval([104.0, 105.0, 106.0], [95.0, 96.0, 97.0])
    assert point > 0  # pooled over attention's rates it reads about -5%: better, which it is not
    assert (f"| grassmann gated | 1,000 | 109 ± 1 (n=3) | 105 ± 1 (n=3) | 0.002 (best of 2) | 3 | "
            f"{100 * point:+.1f}% [{100 * low:+.1f}%, {100 * high:+.1f}%] |") in table
    assert f"| mamba2 | 1,000 | 105 | 99 | 0.001 | 1 | {100 * (99 / (95 * 96 * 97) ** (1 / 3) - 1):+.1f}% |" in table


def test_a_gap_is_read_against_attention_of_the_same_block():
    # pre-LN attention far worse than post-LN: pooled into one baseline it would make
    # post-LN attention read below itself and the pre-LN Grassmann look close to it
    pre = [("attention pre-LN", "attention", 1e-3, 0, 150.0, 140.0), ("grassmann pre-LN", "grassmann", 1e-3, 0, 160.0, 154.0)]
    frame = lm_frame(SWEEP + pre)
    frame.loc[frame["label"].str.endswith("pre-LN"), "config.model.block"] = "prenorm"
    frame.loc[~frame["label"].str.endswith("pre-LN"), "config.model.block"] = "postnorm"
    table = section(report_markdown(frame), "wikitext2").split("###")[0]
    assert "same setting and block" in table
    assert "| attention | 1,000 | 102 ± 2 (n=3) | 96 ± 1 (n=3) | 0.001 (best of 3) | 3 | +0.0% |" in table
    assert "| attention pre-LN | 1,000 | 150 | 140 | 0.001 | 1 | +0.0% |" in table
    assert f"| grassmann pre-LN | 1,000 | 160 | 154 | 0.001 | 1 | {100 * (154 / 140 - 1):+.1f}% |" in table
    point, _, _ = gap_interval([104.0, 105.0, 106.0], [95.0, 96.0, 97.0])
    assert f"| 0.002 (best of 2) | 3 | {100 * point:+.1f}% [" in table


def test_the_bracket_shows_every_rate_on_shared_seeds_and_bolds_the_chosen_one():
    bracket = section(report_markdown(lm_frame()), "wikitext2").split("### learning-rate bracket")[1]
    assert "| label | lr 0.0005 | lr 0.001 | lr 0.002 | seeds |" in bracket
    # on seed 0, the one every rate ran: 1e-3's other seeds do not weigh in the choice
    assert "| attention | 140 | **100** | 160 | 0 |" in bracket
    assert "| grassmann gated | – | 120 | **108** | 0 |" in bracket
    assert "mamba2" not in bracket  # one rate: nothing to choose between
    one_rate = lm_frame([r for r in SWEEP if r[2] == 1e-3])
    assert "learning-rate bracket" not in report_markdown(one_rate)


PUBLISHED = pd.DataFrame(
    [("wikitext2", "paper", "6L/128", "Transformer", "attention", 250.0, "validation"),
     ("wikitext2", "paper", "6L/128", "Transformer", "attention", 260.0, "validation"),  # a second run: not read
     ("wikitext2", "paper", "6L/128", "Grassmann", "grassmann", 275.0, "validation"),
     ("wikitext2", "paper", "6L/128", "Transformer", "attention", 240.0, "test"),
     ("wikitext2", "paper", "6L/128", "Grassmann", "grassmann", 300.0, "test"),
     ("wikitext2", "repo", "6L/128", "Transformer", "attention", 200.0, "test"),
     ("wikitext2", "repo", "6L/128", "Grassmann", "grassmann", 230.0, "test"),
     ("wikitext2", "paper", "12L/256", "Transformer", "attention", 230.0, "validation"),
     ("wikitext2", "paper", "12L/256", "Grassmann", "grassmann", 260.0, "validation"),
     ("snli", "paper", "distilbert", "Grassmann head", "grassmann", 0.85, "test")],
    columns=["task", "source", "setting", "model", "mixer", "value", "split"]).assign(metric="ppl", params=None)
PUBLISHED.loc[PUBLISHED["task"] == "snli", "metric"] = "accuracy"


def test_published_perplexities_are_read_as_gaps_to_each_sources_attention():
    text = section(report_markdown(lm_frame(), PUBLISHED), "Beside the published numbers")
    assert "ours − published" not in text and "does not carry" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("| wikitext2")]
    assert len(lines) == 2  # one per source at 6L/128; the 12L/256 rows match nothing we ran
    # the paper: validation preferred, its first attention value; ours on best_val_ppl, each at its rate
    val, _, _ = gap_interval([108.0, 109.0, 110.0], [100.0, 102.0, 104.0])
    assert "| paper | validation | 275 / 250 | +10.0% | grassmann gated |" in lines[0]
    assert f"| {100 * val:+.1f}% [" in lines[0] and lines[0].endswith("| 3 vs 3 seeds |")
    # the repo gives test only: ours on test_ppl
    test, _, _ = gap_interval([104.0, 105.0, 106.0], [95.0, 96.0, 97.0])
    assert "| repo | test | 230 / 200 | +15.0% | grassmann gated |" in lines[1]
    assert f"| {100 * test:+.1f}% [" in lines[1]


def test_published_accuracy_in_the_same_setting_is_beside_ours_at_the_chosen_rate():
    runs = [(1e-3, 0, 0.80, 0.79), (1e-3, 1, 0.82, 0.81), (3e-3, 0, 0.70, 0.95)]  # 3e-3: best on test, not val
    frame = records_frame([rec(f"s{i}", "snli", {"best_val_accuracy": val, "test_accuracy": test,
                                                 "setting": "distilbert", "mixer": "grassmann"},
                               label="grassmann head", mixer="grassmann", seed=seed, train={"lr": lr})
                           for i, (lr, seed, val, test) in enumerate(runs)])
    text = section(report_markdown(frame, PUBLISHED), "Beside the published numbers")
    line = next(ln for ln in text.splitlines() if ln.startswith("| snli"))
    assert "| 0.85 | grassmann head |" in line and "| 0.8 ± 0.01414 (n=2) | 0.001 (best of 2) | -0.05 |" in line
    other = frame.assign(setting="scratch")  # another setup: no number beside it
    assert "No published row matches" in report_markdown(other, PUBLISHED)


def test_a_task_without_a_validation_metric_keeps_its_rates_apart():
    runs = [(1e-3, 0, 0.5), (1e-3, 1, 0.7), (1e-2, 0, 2.0)]
    frame = records_frame([rec(f"t{i}", "toy", {"loss": loss}, label="a", seed=seed, train={"lr": lr})
                           for i, (lr, seed, loss) in enumerate(runs)])
    table = section(report_markdown(frame), "toy")
    assert "No validation metric" in table and "(n=3)" not in table
    assert "| a lr 0.001 | 0.6 ± 0.1414 (n=2) | 0.001 | 2 |" in table
    assert "| a lr 0.01 | 2 | 0.01 | 1 |" in table


@pytest.mark.parametrize("split", ["validation", "test"])
def test_no_gap_without_our_attention_in_the_setting(split):
    ours = lm_frame([r for r in SWEEP if r[1] != "attention"])
    text = section(report_markdown(ours, PUBLISHED[PUBLISHED["split"] == split]), "Beside the published numbers")
    line = next(ln for ln in text.splitlines() if "grassmann gated" in ln)
    assert line.endswith("| – | 3 vs 0 seeds |")


# --- a sweep only partly run: `linbench report` names every run without an ok record

def test_report_names_every_run_of_the_sweep_without_an_ok_record(tmp_path, capsys, monkeypatch):
    path = sweep_file(tmp_path, *(f'RunConfig("toy", {{"seed": {s}, "train": train}}, "t")' for s in range(3)),
                      'RunConfig("toy", {"seed": 0, "train": {**train, "lr": 0.02}}, "stopped")',
                      'RunConfig("toy", {"seed": 1, "train": {**train, "lr": 0.02}}, "killed")',
                      'RunConfig("toy", {"fail": "error", "train": train}, "broken")',
                      'RunConfig("toy", {"seed": 9, "train": train}, "never")')
    ok0, ok1, damaged, stopped, killed, broken, never = (r.run_id for r in cli_module.load_sweep(path).runs)
    base = ["--results-dir", str(tmp_path)]
    assert cli_module.main(["run", str(path), "--executor", "debug", "--only", "t", "--only", "broken", *base]) == 1
    (tmp_path / "ops" / f"{damaged}.json").write_text('{"run_id": "x", "sta')
    for rid, beat in ((stopped, "interrupted"), (killed, "running")):  # stopped in order; died without a word
        workdir = workdir_for(tmp_path, "ops", rid)
        workdir.mkdir(parents=True)
        write_progress(workdir / "progress.json", {"status": beat, "step": 3, "steps": 8, "updated": time.time()})
        (workdir / "checkpoint.pt").touch()
    capsys.readouterr()
    with pytest.warns(UserWarning, match="damaged record"):  # left out of the tables, named in the list
        assert cli_module.main(["report", str(path), *base]) == 0
    out = capsys.readouterr().out
    report = (tmp_path / "ops" / "report.md").read_text()
    counts = "7 runs in the sweep: 2 ok; not ok: 1 damaged, 1 partial, 1 lost, 1 failed, 1 not run"
    assert f"\n{counts}. Written " in report and f"ops: {counts}\n" in out
    listed = section(report, "Runs without an ok record")
    rows = {line.split(" | ")[0].strip("| "): line for line in listed.splitlines() if line.startswith("| ")}
    assert set(rows) - {"run", "---"} == {damaged, stopped, killed, broken, never}  # and no ok run
    assert rows[damaged].startswith(f"| {damaged} | t | damaged | seed=2 | not valid JSON")
    assert f"| {stopped} | stopped | partial |" in rows[stopped] and f"| {killed} | killed | lost |" in rows[killed]
    assert rows[broken].endswith("| broken | failed |  | RuntimeError: deliberate failure |")
    assert f"| {never} | never | not run |" in rows[never]
    printed = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert set(printed) == {damaged, stopped, killed, broken, never}
    assert printed[damaged].split()[1:4] == ["damaged", "t", "seed=2"] and "not valid JSON" in printed[damaged]
    assert "Runs that did not finish ok" not in report  # the failed run is listed once, above
    # a long list is cut on the screen, never in the file
    monkeypatch.setattr(cli_module, "PRINTED", 2)
    with pytest.warns(UserWarning, match="damaged record"):
        assert cli_module.main(["report", str(path), *base]) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.startswith("  ")]) == 3
    assert f"... 3 more: in {tmp_path / 'ops' / 'report.md'}, and `linbench status {path} --brief" in out
    assert section((tmp_path / "ops" / "report.md").read_text(), "Runs without an ok record") == listed


def test_report_of_a_finished_sweep_says_nothing_more(tmp_path, capsys):
    path = sweep_file(tmp_path, *(f'RunConfig("toy", {{"seed": {s}, "train": train}}, "t")' for s in range(2)))
    base = ["--results-dir", str(tmp_path)]
    assert cli_module.main(["run", str(path), "--executor", "debug", *base]) == 0
    capsys.readouterr()
    assert cli_module.main(["report", str(path), *base]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'ops' / 'report.md'}\n"
    report = (tmp_path / "ops" / "report.md").read_text()
    assert "\n2 runs: 2 ok. Written " in report
    assert "in the sweep" not in report and "## Runs" not in report and "not ok" not in report


def test_without_the_sweep_the_report_lists_the_records_not_ok():
    frame = lm_frame().assign(run_status=["ok"] * 9 + ["diverged"], error=[None] * 9 + ["loss is nan"])
    text = report_markdown(frame)
    assert "\n10 runs: 9 ok, 1 diverged. Written" in text
    assert "| r9 | mamba2 | diverged | loss is nan |" in section(text, "Runs that did not finish ok")
    assert report_markdown(lm_frame(), not_ok=[]).split("Written")[0] == report_markdown(lm_frame()).split("Written")[0]


def test_mqar_and_mad_sections_say_what_a_validation_split_picked():
    from results.report import mqar_section
    rows = pd.DataFrame([
        {"label": "a", "seq_len": 64, "num_kv_pairs": 4, "d_model": 32, "seed": 0, "lr": 1e-3, "accuracy": 0.9,
         "best_val_accuracy": 0.5, "selected_on": "validation", "run_status": "ok"},
        {"label": "a", "seq_len": 64, "num_kv_pairs": 4, "d_model": 32, "seed": 0, "lr": 3e-3, "accuracy": 0.7,
         "best_val_accuracy": 0.6, "selected_on": "validation", "run_status": "ok"},
        {"label": "b", "seq_len": 64, "num_kv_pairs": 4, "d_model": 32, "seed": 0, "lr": 1e-3, "accuracy": 0.4,
         "run_status": "ok"}])
    text = mqar_section(rows)
    assert "2 of 3 runs had a validation split" in text
    assert "| a | 64 | 4 | 32 | 0.7 | 0.003 | 2 | 1 |" in text  # picked on validation, read on test
    assert "validation split" not in mqar_section(rows[rows["label"] == "b"].drop(columns=["selected_on"]))
