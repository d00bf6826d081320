"""The step-form benchmark: every form of one mixer timed side by side in one process."""
import csv

import pytest
import torch

from tasks.benchmarks import decode, step_forms
from zoo.ops import blas as numpy_blas


def test_round_medians_runs_each_contender_from_its_start_in_reversed_order_every_other_round():
    log = []

    def contender(name):
        def step(x, state):
            log.append((name, int(state["n"])))
            state["n"] += 1
            return x, state
        return step

    starts = {k: {"n": torch.tensor(i * 10)} for i, k in enumerate("abc")}
    ms = decode.round_medians({k: (contender(k), starts[k]) for k in "abc"}, [torch.zeros(1)] * 4, 3,
                              torch.device("cpu"))
    assert {k: len(v) for k, v in ms.items()} == {"a": 3, "b": 3, "c": 3}
    firsts = log[::4]  # each round of 4 steps' first
    assert firsts == [("a", 0), ("b", 10), ("c", 20), ("c", 20), ("b", 10), ("a", 0), ("a", 0), ("b", 10),
                      ("c", 20)]
    assert all(int(s["n"]) == 10 * i for i, s in enumerate(starts.values()))  # the starts were copied


def test_ratio_summary_reads_round_against_round():
    out = decode.ratio_summary([2.0, 6.0, 3.0], [1.0, 2.0, 3.0])  # rounds: 2, 3, 1
    assert out == {"ratio": 2.0, "ratio_low": 1.0, "ratio_high": 3.0}


@pytest.mark.skipif(not numpy_blas.available(), reason="numpy's BLAS is not an OpenBLAS whose threads can be set")
def test_the_cli_writes_one_row_per_mixer_and_form_with_its_command(tmp_path, capsys):
    out = tmp_path / "forms.csv"
    argv = ["--mixers", "mamba,sliding_window:window=4", "--forms", "eager,blas", "--d-model", "32", "--batch",
            "3", "--context", "5", "--steps", "3", "--rounds", "3", "--threads", "1", "--out", str(out)]
    step_forms.main(argv)
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["label"], r["form"]) for r in rows] == [("mamba", "eager"), ("mamba", "blas"),
                                                      ("sliding_window:window=4", "eager"),
                                                      ("sliding_window:window=4", "blas")]
    for r in rows:
        assert r["command"].startswith("python -m tasks.benchmarks.step_forms --mixers mamba,")
        assert (r["context"], r["batch"], r["rounds"], r["threads"]) == ("5", "3", "3", "1")
        assert float(r["ratio_low"]) <= float(r["ratio"]) <= float(r["ratio_high"])
        assert 0 < float(r["best_ms"]) <= float(r["median_ms"])
        if r["form"] == "eager":
            assert float(r["ratio"]) == 1.0
    table = step_forms.forms_table(rows)
    assert table.splitlines()[0] == "| mixer | eager ms (best round) | blas / eager |"
    assert f"| mamba | {float(rows[0]['best_ms']):.2f} | {float(rows[1]['ratio']):.2f} |" in table


def test_forms_table_keeps_the_order_the_forms_ran_in():
    rows = [{"label": "gla", "form": f, "best_ms": ms, "ratio": r}
            for f, ms, r in (("eager", "5.0", "1.0"), ("compiled", "4.0", "0.812"), ("blas", "6", "1.125"))]
    assert step_forms.forms_table(rows) == ("| mixer | eager ms (best round) | compiled / eager | blas / eager |\n"
                                            "|---|---:|---:|---:|\n"
                                            "| gla | 5.00 | 0.81 | 1.12 |\n")


@pytest.mark.parametrize("argv, says", [
    (["--mixers", "attention", "--forms", "eager"], "no fixed-state step"),
    (["--mixers", "gla", "--forms", "eager,auto"], "name each form once"),
    (["--mixers", "gla", "--forms", "eager,eager"], "name each form once"),
    (["--mixers", "gla", "--steps", "0"], "--steps must be at least 1"),
])
def test_bad_arguments_give_one_line(argv, says, capsys):
    with pytest.raises(SystemExit):
        step_forms.main(argv)
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
