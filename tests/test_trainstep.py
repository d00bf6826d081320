"""The CPU training-step benchmark: the config, the ratios to attention, rounds, failures
as rows, the CSV and the markdown table read back from it. Tiny points, one repeat."""
import csv

import torch

import pytest

import tasks.benchmarks.trainstep as ts
import zoo
from tasks.benchmarks.trainstep import TrainStepConfig, main, markdown_table, run

TINY = dict(points=((8, 16, 2),), warmup=0, repeats=1, isolate=False, against=())


def test_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match=r"unknown field.*'repeat'"):
        TrainStepConfig(repeat=3)
    with pytest.raises(ValueError, match="points: .*three positive ints"):
        TrainStepConfig(points=((8, 16),))
    with pytest.raises(ValueError, match="points: .*three positive ints"):
        TrainStepConfig(points=((8, 16, 0),))
    with pytest.raises(ValueError, match="mixers='nope' is not valid"):
        TrainStepConfig(mixers=(("nope", {}),))
    with pytest.raises(ValueError, match="mixers: sliding_window:windw=4 .*windw"):
        TrainStepConfig(mixers=(("sliding_window", {"windw": 4}),))
    with pytest.raises(ValueError, match="mixers: attention:n_heads=3 at d_model=16"):
        TrainStepConfig(mixers=(("attention", {"n_heads": 3}),), points=((8, 16, 2),))
    with pytest.raises(ValueError, match="mixers: duplicate labels"):
        TrainStepConfig(mixers=(("retnet", {}), ("retnet", {})))
    with pytest.raises(ValueError, match=r"precisions=\('fp16',\) must be distinct values of \('fp32', 'bf16'\)"):
        TrainStepConfig(precisions=("fp16",))
    for field, bad in (("rounds", 0), ("repeats", 0), ("threads", 0), ("warmup", -1), ("time_limit_s", -1.0)):
        with pytest.raises(ValueError, match=f"{field}="):
            TrainStepConfig(**{field: bad})
    # a JSON record's lists become the tuples the config uses
    cfg = TrainStepConfig.from_dict({"points": [[8, 16, 2]], "mixers": [["retnet", {}]]})
    assert cfg.points == ((8, 16, 2),) and cfg.entries() == [
        ("attention", {}), ("attention", {"n_heads": 1}), ("retnet", {})]
    with pytest.raises(ValueError, match="against: .*must be a \\(name, options\\) pair"):
        TrainStepConfig(against=("attention",))
    with pytest.raises(ValueError, match="against='nope' is not valid"):
        TrainStepConfig(against=("nope", {}))


def test_attention_is_measured_first_and_the_second_reference_next():
    one_head = ("attention", {"n_heads": 1})
    assert TrainStepConfig().entries() == [("attention", {}), one_head] + [
        (n, {}) for n in sorted(zoo.MIXERS) if n != "attention"]
    given = (("retnet", {}), ("attention", {"backend": "math"}), ("mamba2", {}))
    assert [ts.mixer_label(*e) for e in TrainStepConfig(mixers=given, against=()).entries()] == [
        "attention:backend=math", "retnet", "mamba2"]
    given = (("retnet", {}), one_head, ("attention", {}))  # already listed: moved, not added
    assert TrainStepConfig(mixers=given).entries() == [("attention", {}), one_head, ("retnet", {})]


def _fake_step(model, batch, seed, warmup, repeats, meter, deadline, medians, calls, profile=0, precision="fp32"):
    calls.append(model["mixer"])
    ms = medians[model["mixer"]][model["d_model"]].pop(0)
    if ms is None:
        raise RuntimeError("boom")
    yield {"median_ms": ms, "p20_ms": ms - 1, "p80_ms": ms + 1, "repeats": repeats, "backend": "fake",
           "faults_per_step": 0.0, "malloc_tuned": True}


def test_ratios_are_medians_over_rounds_and_a_failure_is_not_retried(monkeypatch):
    # medians per mixer, per point (keyed by d_model), per round
    medians = {"attention": {16: [10.0, 30.0, 20.0], 32: [5.0, 5.0, 5.0]},
               "retnet": {16: [40.0, 10.0, 50.0], 32: [15.0, 20.0, 10.0]},
               "mamba2": {16: [None], 32: [1.0, 2.0, 3.0]}}
    calls = []
    monkeypatch.setattr(ts, "measure_step", lambda **kw: _fake_step(**kw, medians=medians, calls=calls))
    cfg = TrainStepConfig(**{**TINY, "points": ((8, 16, 2), (8, 32, 2))}, rounds=3,
                          mixers=(("retnet", {}), ("mamba2", {})))
    rows = {(r["d_model"], r["label"]): r for r in run(cfg, progress=False)}
    assert calls.count("mamba2") == 1 + 3 and calls.count("attention") == 6  # the failure ran once
    assert rows[16, "attention"]["median_ms"] == 20.0 and rows[16, "attention"]["ratio"] == 1.0
    assert rows[16, "retnet"]["median_ms"] == 40.0 and rows[16, "retnet"]["ratio"] == 2.0
    assert rows[16, "retnet"]["p20_ms"] == 39.0 and rows[16, "retnet"]["p80_ms"] == 41.0
    failed = rows[16, "mamba2"]
    assert failed["status"] == "error" and "boom" in failed["error"]
    assert failed["median_ms"] is None and failed["ratio"] is None and failed["params"] > 0
    assert rows[32, "mamba2"]["ratio"] == 2.0 / 5.0 and rows[32, "retnet"]["ratio"] == 3.0  # the run went on


def test_a_failing_mixer_is_a_row_and_the_run_goes_on(monkeypatch, capsys):
    def boom(self, x):
        raise RuntimeError("retnet exploded")

    monkeypatch.setattr(zoo.MIXERS["retnet"], "forward", boom)
    rows = run(TrainStepConfig(**TINY, mixers=(("retnet", {}), ("mamba2", {}))))
    assert [(r["label"], r["status"]) for r in rows] == [("attention", "ok"), ("retnet", "error"),
                                                          ("mamba2", "ok")]
    assert "retnet exploded" in rows[1]["error"] and rows[1]["ratio"] is None
    assert rows[2]["ratio"] == rows[2]["median_ms"] / rows[0]["median_ms"] and rows[2]["backend"]
    assert "retnet exploded" in capsys.readouterr().out  # the progress line says why
    assert "| retnet | error |" in markdown_table(rows)


def test_time_limit_zero_is_a_timeout_row():
    rows = run(TrainStepConfig(**TINY, mixers=(("retnet", {}),), time_limit_s=0.0), progress=False)
    assert [r["status"] for r in rows] == ["timeout", "timeout"]
    assert all(r["ratio"] is None and r["median_ms"] is None for r in rows)


def test_cli_isolated_writes_csv_and_table_from_reproduces_the_table(tmp_path, capsys):
    out = tmp_path / "trainstep.csv"
    argv = ["--points", "8x16x2", "--mixers", "retnet", "--warmup", "0", "--repeats", "1", "--out", str(out)]
    rows = main(argv)  # the real path: each measurement in a child process
    printed = capsys.readouterr().out
    saved = list(csv.DictReader(out.open()))
    # attention added, first, then the second reference: one-head attention
    assert [r["label"] for r in saved] == ["attention", "attention:n_heads=1", "retnet"]
    for col in ("seq_len", "d_model", "batch", "tokens", "label", "mixer", "mixer_options", "backend", "params",
                "median_ms", "p20_ms", "p80_ms", "ratio", "status", "error", "device", "dtype", "torch",
                "threads", "command"):
        assert col in saved[0]
    att, one, ret = saved
    assert att["status"] == ret["status"] == "ok" and att["backend"] == "sdpa" and ret["backend"]
    assert ret["against"] == "attention:n_heads=1" and float(one["ratio_against"]) == 1.0
    assert float(ret["ratio_against"]) == pytest.approx(float(ret["median_ms"]) / float(one["median_ms"]))
    assert att["tokens"] == "16" and att["threads"] == "1" and int(ret["params"]) > 0
    assert float(att["ratio"]) == 1.0
    assert float(ret["ratio"]) == pytest.approx(float(ret["median_ms"]) / float(att["median_ms"]))
    assert att["command"] == "python -m tasks.benchmarks.trainstep " + " ".join(argv)
    table = markdown_table(rows)
    assert table in printed and "| retnet | " in table and "x) |" in table
    assert "Each step's median over attention:n_heads=1's at the same point" in table
    main(["--table-from", str(out)])
    assert capsys.readouterr().out.strip() == table  # the README's table, from the CSV alone


def test_profile_prints_the_top_ops_of_each_measurement(capsys):
    rows = run(TrainStepConfig(**TINY, mixers=(("retnet", {}),), profile=4))
    out = capsys.readouterr().out
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert out.count("Self CPU time total") == 2 and "--- L=8 d=16 B=2 fp32 retnet" in out


def test_both_precisions_side_by_side_with_a_speedup_table(monkeypatch):
    seen = []

    def fake(model, batch, seed, warmup, repeats, meter, deadline, profile=0, precision="fp32"):
        seen.append((model["mixer"], precision))
        ms = {"attention": 10.0, "retnet": 30.0}[model["mixer"]] / (4.0 if precision == "bf16" else 1.0)
        yield {"median_ms": ms, "p20_ms": ms, "p80_ms": ms, "repeats": repeats, "backend": "fake"}

    monkeypatch.setattr(ts, "measure_step", fake)
    rows = run(TrainStepConfig(**TINY, mixers=(("retnet", {}),), precisions=("fp32", "bf16")), progress=False)
    # side by side: both precisions of a point, attention first in each
    assert seen == [("attention", "fp32"), ("retnet", "fp32"), ("attention", "bf16"), ("retnet", "bf16")]
    assert [(r["label"], r["precision"], r["dtype"], r["ratio"]) for r in rows] == [
        ("attention", "fp32", "float32", 1.0), ("retnet", "fp32", "float32", 3.0),
        ("attention", "bf16", "bfloat16", 1.0), ("retnet", "bf16", "bfloat16", 3.0)]
    table = markdown_table(rows)
    assert "| retnet (bf16) | 7.5 ms (3.0x) |" in table and "| retnet | 4.00x |" in table


def test_measure_step_runs_the_step_under_autocast_for_bf16(monkeypatch):
    dtypes = []
    real = ts.F.cross_entropy
    monkeypatch.setattr(ts.F, "cross_entropy", lambda logits, t: dtypes.append(logits.dtype) or real(logits, t))
    model = TrainStepConfig().model("attention", {}, 8, 16).to_dict()
    for precision in ("fp32", "bf16"):
        rows = list(ts.measure_step(model, 2, 0, 0, 1, None, None, precision=precision))
        assert rows[0]["median_ms"] > 0
    assert dtypes[0] == torch.float32 and dtypes[-1] == torch.bfloat16


def test_rows_carry_page_faults_the_allocator_and_the_work_against_attention():
    """A real step each: minor faults per step, whether the allocator kept large blocks
    (it does on glibc), the FLOPs by zoo.flops' conventions, their ratio to attention's
    and the rate they ran at."""
    import os
    rows = {r["label"]: r for r in run(TrainStepConfig(**TINY, mixers=(("gla", {}),)), progress=False)}
    glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    for r in rows.values():
        assert r["status"] == "ok" and r["faults_per_step"] >= 0 and r["malloc_tuned"] is glibc
        assert r["gflop_per_step"] > 0 and r["gflop_s"] == pytest.approx(r["gflop_per_step"] / (r["median_ms"] / 1e3))
    assert rows["attention"]["flop_ratio"] == 1.0
    assert rows["gla"]["flop_ratio"] == pytest.approx(rows["gla"]["gflop_per_step"] / rows["attention"]["gflop_per_step"])
