"""``linbench vet``: a card for a mixer from outside the zoo, in one command. The correctness
checks come first and a mixer that fails one gets a card that names the check and trains
nothing; otherwise the recall and cost stages run as a sweep and the card reads them."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pytest

import zoo
from results.card import NOT_READ, _verdict, cost_rows, lm_rows, mad_rows, recall_rows
from results.records import load_records, records_frame
from sweeps.cli import main as cli
from sweeps.spec import local_data_dir
from sweeps.vet import BUDGETS, REFERENCE, first_runs, reference_records, seeded_runs

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def outside_on_path(monkeypatch):
    """The outside mixers reach the child processes of the local executor as a user's
    package would: on PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(TESTS))


def card(tmp_path, mixer: str) -> tuple[str, Path]:
    assert cli(["vet", mixer, "--budget", "test", "--results-dir", str(tmp_path)]) == 0
    path = next((tmp_path / "vet").glob("*/test/report.md"))
    return path.read_text(), path.parent


def test_a_correct_outside_mixer_gets_every_section(tmp_path):
    text, folder = card(tmp_path, "outside_mixers.shift:ShiftMix")
    assert text.startswith("# linbench vet: outside_mixers.shift:ShiftMix\n\nBudget **test**")
    assert re.search(r"seeds 0; CPU .*; commit [0-9a-f]{12}", text)
    verdicts = text.split("## Verdicts")[1].split("\n## ")[0]
    assert "| correct: causal, returns its update, trains finite (fp32, bf16) | 9 of 9 checks pass | holds |" in verdicts
    assert "recall (MQAR, L 32, d 16)" in verdicts and "cost: training step faster than attention at L 64" in verdicts
    for section in ("## Correctness", "## Recall: MQAR", "## Capabilities: MAD's six tasks",
                    "## Language modelling: Wikitext-2", "## Cost: the training step against L"):
        assert section in text
    for figure in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (folder / figure).is_file()
    lm = 2 if local_data_dir() else 0  # Wikitext-2 runs where the data is here: it and attention
    decodes = sum(zoo.mixer_class(m).has_step_form() for m in ("outside_mixers.shift:ShiftMix", "attention"))
    # MQAR (it and 2 controls), MAD (6 tasks x 2), training-step timings (it and attention), decode timings
    assert len(list(folder.glob("*.json"))) == 3 + 12 + lm + 2 + decodes
    # a measured verdict where the data is here; without it, a row saying why it did not run
    assert ("lower validation perplexity than attention, matched parameters" in verdicts) == bool(lm)
    assert ("not run: no local Wikitext-2 (set LINBENCH_DATA)" in verdicts) == (not lm)
    assert "capabilities (MAD, test accuracy): above attention on the tasks the control solves" in verdicts
    # the test budget says nothing of quality or cost: its numbers are shown, no verdict read from them
    rows = [line.split(" | ") for line in verdicts.splitlines() if line.startswith("| ") and " --- " not in line]
    measured = [row[-1].rstrip(" |") for row in rows[2:]]  # past the header and the correctness row
    assert measured and all(v == NOT_READ or v.startswith("not run") for v in measured), measured
    # a second vet resumes: nothing reruns, the same card
    assert cli(["vet", "outside_mixers.shift:ShiftMix", "--budget", "test", "--results-dir", str(tmp_path)]) == 0


@pytest.mark.parametrize("mixer, check", [("outside_mixers.broken:Peek", "causal: the mixer"),
                                          ("outside_mixers.broken:NanGrad", "forward: finite outputs"),
                                          ("outside_mixers.broken:WrongStep", "step form = parallel form (float64)")])
def test_a_failing_check_ends_the_card_there(tmp_path, mixer, check):
    text, folder = card(tmp_path, mixer)
    assert f"| stopped at: {check} |" in text and "does not hold" in text
    assert "The card stops here" in text and "## Recall" not in text
    assert not list(folder.glob("*.json"))  # nothing trained or timed
    assert "Traceback" not in text


def test_verdicts_need_a_gap_beyond_noise_and_the_seeds_spread():
    assert _verdict([0.9], [0.5]) == "holds"
    assert _verdict([0.5], [0.9]) == "does not hold"
    assert _verdict([0.52], [0.5]) == "not separable"  # within SEPARABLE on one seed a side
    assert _verdict([0.9, 0.1, 0.95], [0.5, 0.55, 0.45]) == "not separable"  # bimodal seeds: no verdict


def test_vet_takes_one_mixer(tmp_path, capsys):
    assert cli(["vet", "attention,mamba", "--budget", "test", "--results-dir", str(tmp_path)]) == 2
    assert "put the others in --against" in capsys.readouterr().err


# --- the cpu budget: the reference sweeps' recipes, the zoo read from their records ------

MINGRU = "examples.mingru:MinGRU"


def test_the_cpu_budget_reads_every_control_from_a_committed_record():
    """Built by the reference sweep files' own code, each control's first-seed run has the
    id of a committed record (read, not run); the mixer's runs have none."""
    first = first_runs(MINGRU, {}, BUDGETS["cpu"])
    found = reference_records([run.run_id for run in first], REFERENCE)
    mine = [run for run in first if run.label == MINGRU]
    controls = [run for run in first if run.label != MINGRU]
    assert len([r for r in mine if r.task == "mqar"]) == 18 and len([r for r in mine if r.task == "mad"]) == 10
    assert not any(run.run_id in found for run in mine)
    lm = [run for run in controls if run.task == "wikitext2"]
    assert len(lm) == (3 if local_data_dir() else 0)  # attention over the bracket: 1e-3 is the reference's
    assert {run.run_id for run in controls if run.task != "wikitext2"} <= set(found)
    assert sum(run.run_id in found for run in lm) == (1 if lm else 0)


def test_seeds_follow_each_brackets_best_rate():
    """Seeds 1 and 2 at the best learning rate of each finished bracket: MQAR on accuracy
    (higher), Wikitext-2 on validation perplexity (lower); an unfinished bracket waits."""
    first = [run for run in first_runs(MINGRU, {}, BUDGETS["cpu"]) if run.label == MINGRU]
    mqar = [run for run in first if run.task == "mqar"]
    point = [run for run in mqar if (run.config.seq_len, run.config.model.d_model) == (64, 32)]
    records = {run.run_id: {"status": "ok", "metrics": {"accuracy": acc}}
               for run, acc in zip(point, (0.2, 0.7, 0.4))}
    seeded = seeded_runs(mqar, records, (1, 2))
    assert [(r.config.seed, r.config.train.lr) for r in seeded] == [(1, point[1].config.train.lr),
                                                                     (2, point[1].config.train.lr)]
    del records[point[0].run_id]
    assert seeded_runs(mqar, records, (1, 2)) == []
    lm = [run for run in first if run.task == "wikitext2"]
    if lm:
        records = {run.run_id: {"status": "ok", "metrics": {"best_val_ppl": ppl}} for run, ppl in zip(lm, (300, 250, 260))}
        assert {r.config.train.lr for r in seeded_runs(lm, records, (1, 2))} == {lm[1].config.train.lr}


def test_the_cards_mad_verdict_reads_only_the_tasks_the_control_solves():
    frame = records_frame(load_records(REFERENCE / "mad_cpu"))
    line = mad_rows(frame, "grassmann")[0]
    assert line[0] == "capabilities (MAD, test accuracy): above attention on the tasks the control solves"
    assert "the control solves" in line[1] and line[2] in ("holds", "does not hold", "not separable")
    unsolved = frame.assign(accuracy=frame["accuracy"].where(frame["label"] != "attention", 0.5))
    assert mad_rows(unsolved, "grassmann")[0][2] == "does not hold: no task is read"


def test_the_cards_lm_verdict_gives_both_counts_and_reads_test_too():
    """The Wikitext-2 verdict reads validation, names it, sets the test gap on the same runs
    beside it with whether it agrees, and both parameter counts: matched and total."""
    frame = records_frame(load_records(REFERENCE / "wikitext2_cpu"))
    claim, number, verdict = lm_rows(frame, "mamba2")[0]
    assert claim.startswith("language modelling (Wikitext-2): lower validation perplexity than attention")
    assert number.startswith("validation -") and "; on test -" in number
    assert ": the same sign, its interval excludes 0;" in number and verdict == "holds"
    ok = frame[(frame["label"] == "mamba2") & (frame["run_status"] == "ok")]
    assert f"params w/o embeddings {ok['params_no_embeddings'].iloc[0] / 1e6:.2f}M vs " in number
    assert f"total {ok['params'].iloc[0] / 1e6:.2f}M vs " in number
    flipped = frame.assign(test_ppl=frame["test_ppl"].where(frame["label"] != "mamba2", 1000.0))
    assert ": the opposite sign, its interval excludes 0;" in lm_rows(flipped, "mamba2")[0][1]


def test_the_cards_recall_rows_count_the_seeds_that_reach_the_bar():
    def run(label, seed, acc):
        return {"task": "mqar", "run_status": "ok", "label": label, "d_model": 64, "seq_len": 64, "seed": seed,
                "lr": 1e-3, "accuracy": acc}
    frame = pd.DataFrame([run("attention", s, a) for s, a in enumerate((1.0, 1.0, 0.95))]
                         + [run("mine", s, a) for s, a in enumerate((1.0, 0.3, 0.2))]
                         + [run("sliding_window", s, 0.3) for s in range(3)])
    rows = {row[0]: row for row in recall_rows(frame, "mine")}
    window = rows["recall (MQAR, L 64, d 64): above the sliding-window control (test accuracy)"]
    assert window[1].endswith("(3 seeds a side; 1 of 3 seeds ≥ 0.9 vs 0 of 3 seeds ≥ 0.9)")
    near = rows["recall (MQAR, L 64, d 64): within 0.05 of attention (test accuracy)"]
    assert near[1].endswith("(3 seeds a side; 1 of 3 seeds ≥ 0.9 vs 3 of 3 seeds ≥ 0.9)") and near[2] == "does not hold"


def test_the_cards_cost_rows_time_the_decode_step_beside_attention():
    frame = pd.DataFrame([
        {"task": "decode", "status": "ok", "label": label, "context": c, "ms_per_token": ms}
        for label, times in (("mine", (1.0, 1.0)), ("attention", (1.0, 4.0))) for c, ms in zip((0, 4096), times)])
    rows = cost_rows(frame.assign(label=frame["label"].replace("mine", "mamba2")), "mamba2")
    assert rows[-1][0] == "cost: a generated token cheaper than attention's after 4096 tokens of context"
    assert rows[-1][1].startswith("0.25x attention's") and rows[-1][2] == "holds"
    assert cost_rows(frame, "outside_mixers.shift:ShiftMix")[-1][1:] == ["the mixer has no step (decode) form",
                                                                          "not run"]


def test_vet_of_a_mixer_that_does_not_import_says_so_in_one_line(tmp_path, capsys):
    assert cli(["vet", "no_such_package.mixers:Mine", "--budget", "test", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot import it" in err and "PYTHONPATH" in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())  # nothing ran, nothing written


def test_the_card_names_the_machine_and_commit_its_own_runs_ran_on():
    """A card written again on another machine still says where its runs ran."""
    from sweeps.vet import meta
    own = [{"provenance": {"device": "cpu", "device_name": "Elsewhere", "git_commit": "abc123" * 3}}]
    m = meta("cpu", own, {})
    assert m["hardware"] == "CPU Elsewhere" and m["commit"] == ("abc123" * 3)[:12]
    assert meta("cpu", [], {})["hardware"].startswith("CPU ")  # nothing run yet: this machine
