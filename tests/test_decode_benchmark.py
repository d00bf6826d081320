"""The decode benchmark: what a point measures (state bytes that follow the mixer's
state_size, a KV cache that grows and fixed states that do not, the bytes a step writes,
no input made in the timed region, the mean and slowest step beside the median, page
faults and glibc's tuned allocator), failures as rows, the CSV with its command, the
figures, and a state copied to the batch decoding as a batch-prefilled one does."""
import csv
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch

import zoo
from results.plots import plot_decode
from results.records import records_frame
from tasks import TASKS
from tasks.benchmarks import decode
from tasks.benchmarks.bench import build
from tasks.benchmarks.decode import DecodeConfig, main, run, to_batch, written_bytes
from tasks.benchmarks.timing import measure

# one step form, compiled: the forms and auto's choice among them are tests/test_stepping.py's
TINY = dict(d_model=32, contexts=(0, 64, 160), new_tokens=3, warmup=1, device="cpu", isolate=False, bandwidth_mb=8,
            step_impl="compiled")
OPTIONS = {"attention": {"n_heads": 2}, "sliding_window": {"n_heads": 2, "window": 8},
           "grassmann": {"r": 4, "offsets": (1, 2)}, "mamba2": {"headdim": 16}}


@pytest.fixture(scope="module")
def records():
    # attention's points in child processes, where the memory held while decoding is measured
    return {name: run(DecodeConfig(mixer=name, mixer_options=opts, batch=2, **{**TINY, "isolate": name == "attention"}),
                      progress=False) for name, opts in OPTIONS.items()}


def test_config_checks():
    assert TASKS["decode"][0] is DecodeConfig
    with pytest.raises(ValueError, match="unknown field.*context"):
        DecodeConfig(context=(1,))
    with pytest.raises(ValueError, match="contexts=.*whole numbers"):
        DecodeConfig(contexts=(16, -1))
    with pytest.raises(ValueError, match="no step"):
        DecodeConfig(mixer="outside_mixers.shift:ShiftMix")  # defines no step form
    assert DecodeConfig(device="cpu").context_list() == [0, 1024, 2048, 4096, 8192, 16384]
    with pytest.raises(ValueError, match="baseline.*no step"):
        DecodeConfig(baseline="outside_mixers.shift:ShiftMix")
    with pytest.raises(ValueError, match="baseline"):
        DecodeConfig(baseline="attentoin")
    with pytest.raises(ValueError, match="rounds"):
        DecodeConfig(rounds=0)


class _Sleeper(torch.nn.Module):
    """A step that takes ``ms`` and counts its steps in its state, in place (as a KV cache is written)."""

    def __init__(self, ms, log):
        super().__init__()
        self.ms, self.log = ms, log

    def step(self, x, state):
        self.log.append((self.ms, int(state["n"])))
        until = time.perf_counter() + self.ms / 1e3
        while time.perf_counter() < until:
            pass
        state["n"] += 1
        return x, state


def test_interleaved_rounds_time_both_from_their_start_in_alternating_order():
    log = []
    slow, fast = _Sleeper(2.0, log), _Sleeper(1.0, log)
    start = {"n": torch.tensor(5)}
    out = decode.interleaved(slow, start, fast, {"n": torch.tensor(0)}, [torch.zeros(1)] * 7, rounds=3,
                             device=torch.device("cpu"))
    assert 1.6 < out["ratio_low"] <= out["ratio_to_baseline"] <= out["ratio_high"] < 2.6
    assert 0.9 < out["baseline_ms"] < 1.6 and out["ratio_rounds"] == 3
    firsts = [(ms, n) for i, (ms, n) in enumerate(log) if i % 7 == 0]  # each run of 7 steps' first
    assert firsts == [(2.0, 5), (1.0, 0), (1.0, 0), (2.0, 5), (2.0, 5), (1.0, 0)]  # from the start, order swapped
    assert int(start["n"]) == 5


def test_a_point_with_a_baseline_records_the_interleaved_ratio():
    rec = run(DecodeConfig(mixer="gla", mixer_options={"n_heads": 2}, batch=1, baseline="attention", rounds=2,
                           **{**TINY, "contexts": (0, 64)}), progress=False)
    for p in rec["points"]:
        assert p["baseline"] == "attention" and p["ratio_rounds"] == 2 and p["baseline_ms"] > 0
        assert p["ratio_low"] <= p["ratio_to_baseline"] <= p["ratio_high"]
    assert "ratio_to_baseline" not in run(DecodeConfig(mixer="gla", **{**TINY, "contexts": (0,)}),
                                          progress=False)["points"][0]


def test_the_baseline_prefills_the_same_context_as_the_mixer(monkeypatch):
    seen = {}

    def recording_build(cfg, max_len):
        module = build(cfg, max_len)
        prefill = module.prefill

        def spy(x, state):
            seen.setdefault(cfg.mixer, x.clone())  # the context's (attention's step is a 1-token prefill)
            return prefill(x, state)

        module.prefill = spy
        return module

    monkeypatch.setattr(decode, "build", recording_build)
    run(DecodeConfig(mixer="gla", mixer_options={"n_heads": 2}, batch=1, baseline="attention", rounds=1,
                     **{**TINY, "contexts": (16,)}), progress=False)
    assert seen["gla"].shape == (1, 16, 32) and torch.equal(seen["gla"], seen["attention"])


def test_state_bytes_follow_state_size_and_only_the_cache_grows(records):
    for name, rec in records.items():
        m = zoo.build_mixer(name, 32, **OPTIONS[name])
        pts = rec["points"]
        assert [p["status"] for p in pts] == ["ok"] * 3 and rec["n_ok"] == 3
        for p in pts:  # the state after the prefill, the warm-up step and the timed steps
            assert p["state_bytes"] == 2 * 4 * m.state_size(p["context"] + 1 + 3)
            assert p["ms_per_token"] > 0 and p["tokens_per_s"] == pytest.approx(2e3 / p["ms_per_token"])
            assert p["bandwidth_fraction"] > 0 and p["steps"] == 3
        sizes = [p["state_mb_per_seq"] for p in pts]
        if name == "attention":
            assert sizes[2] > sizes[1] > sizes[0]
        else:
            assert sizes[1] == sizes[2]  # fixed once the context exceeds the window / offsets
    assert records["attention"]["bandwidth_gb_s"] > 0
    assert all(p["decode_mem_mb"] > 0 for p in records["attention"]["points"])
    assert records["mamba2"]["points"][0]["decode_mem_mb"] is None  # in-process: not measurable on CPU


def test_a_time_limit_is_a_timeout_row_and_later_contexts_are_skipped():
    rec = run(DecodeConfig(mixer="attention", **{**TINY, "time_limit_s": 0.0}), progress=False)
    assert [p["status"] for p in rec["points"]] == ["timeout", "skipped", "skipped"]
    assert "after timeout at context 0" in rec["points"][1]["error"]


def test_a_copied_state_decodes_as_a_batch_prefilled_one():
    torch.manual_seed(0)
    m = zoo.build_mixer("gated_deltanet", 32, n_heads=2).eval()
    x = torch.randn(1, 10, 32)
    with torch.no_grad():
        _, one = m.prefill(x, m.init_state(1))
        _, three = m.prefill(x.expand(3, -1, -1), m.init_state(3))
        step = torch.randn(3, 32)
        torch.testing.assert_close(m.step(step, to_batch(one, 3))[0], m.step(step, three)[0])


def test_cli_writes_csv_with_its_command(tmp_path, capsys):
    out = tmp_path / "decode.csv"
    main(["--mixers", "mamba,sliding_window:window=4", "--d-model", "32", "--contexts", "0,8", "--new-tokens", "2",
          "--no-isolate", "--device", "cpu", "--out", str(out)])
    rows = list(csv.DictReader(out.open()))
    assert [(r["label"], r["context"], r["status"]) for r in rows] == [
        ("mamba", "0", "ok"), ("mamba", "8", "ok"), ("sliding_window:window=4", "0", "ok"),
        ("sliding_window:window=4", "8", "ok")]
    assert rows[0]["command"].startswith("python -m tasks.benchmarks.decode --mixers mamba,")
    new = ("mean_ms_per_token", "max_ms", "state_write_bytes", "faults_per_token", "malloc_tuned")
    assert all(r[k] != "" for r in rows for k in new)
    header = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["label"]][-1]
    assert set(new) <= set(header)


def test_figures_from_the_records_mark_a_failed_context(records, tmp_path):
    recs = [{"run_id": n, "task": "decode", "status": "ok", "label": n, "metrics": r} for n, r in records.items()]
    failed = run(DecodeConfig(mixer="mamba", **{**TINY, "time_limit_s": 0.0}), progress=False)
    recs.append({"run_id": "m", "task": "decode", "status": "ok", "label": "mamba", "metrics": failed})
    frame = records_frame(recs)
    assert set(frame["status"]) == {"ok", "timeout", "skipped"}
    paths = plot_decode(frame, tmp_path)
    assert [p.name for p in paths] == ["decode_time_vs_context.png", "decode_memory_vs_context.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)
    assert plot_decode(pd.DataFrame({"task": ["mqar"]}), tmp_path) == []


def test_no_step_input_is_made_in_the_timed_region(monkeypatch):
    """Every step's input exists before the first timed step: a torch.randn or torch.randint
    call while timing would be counted in the time per token."""
    timing, made = [], []

    def timed(*args, **kwargs):
        timing.append(True)
        try:
            return measure(*args, **kwargs)
        finally:
            timing.pop()

    def counted(real):
        def make(*args, **kwargs):
            if timing:
                made.append(real.__name__)
            return real(*args, **kwargs)
        return make

    monkeypatch.setattr(decode, "measure", timed)
    monkeypatch.setattr(torch, "randn", counted(torch.randn))
    monkeypatch.setattr(torch, "randint", counted(torch.randint))
    for scope in ("mixer", "lm"):  # a mixer steps on vectors (randn), a model on tokens (randint)
        rec = run(DecodeConfig(mixer="gla", scope=scope, n_layers=1, **TINY), progress=False)
        assert rec["n_ok"] == 3
    assert made == []


def test_the_bytes_a_step_writes_count_in_the_bandwidth(records):
    """A fixed state is rewritten whole at every step (the window's and the offsets' history
    shift once full); attention writes one key and one value row per sequence."""
    for name, rec in records.items():
        for p in rec["points"][1:]:  # contexts 64 and 160: past the window and the offsets
            row = 2 * 2 * 32 * 4  # a key and a value row, 2 sequences, d 32, float32
            assert p["state_write_bytes"] == (row if name == "attention" else p["state_bytes"])
            moved = p["weight_bytes"] + p["state_bytes"] + p["state_write_bytes"]
            # each round's step against the probes run right after it, the median over rounds
            assert p["limit_rounds"] == len(p["round_ms"]) == decode.LIMIT_ROUNDS
            assert p["bandwidth_fraction"] == pytest.approx(np.median(
                [moved / (ms / 1e3) / 1e9 / gb for ms, gb in zip(p["round_ms"], p["round_gb_s"])]))
            assert p["probe_gb_s"] == pytest.approx(np.median(p["round_gb_s"]))
            # and the arithmetic: every float32 weight times every sequence's input, 2 FLOPs each
            flops = 2 * p["batch"] * p["weight_bytes"] / 4
            assert rec["matmul_gflop_s"] > 0 and p["compute_fraction"] == pytest.approx(np.median(
                [flops / (ms / 1e3) / 1e9 / gf for ms, gf in zip(p["round_ms"], p["round_gflop_s"])]))


def test_attention_writes_one_row_per_layer_even_when_its_cache_grows():
    rec = run(DecodeConfig(mixer="attention", mixer_options={"n_heads": 2}, scope="lm", n_layers=2, **TINY),
              progress=False)
    assert [p["state_write_bytes"] for p in rec["points"]] == [2 * 2 * 32 * 4] * 3  # 2 layers, k and v
    # a cache given room by the step: the shared part unchanged, one new row, the zeroed rest not written
    k = torch.randn(1, 2, 3, 4)
    grown = torch.cat([k, torch.randn(1, 2, 1, 4), torch.zeros(1, 2, 60, 4)], 2)
    assert written_bytes({"k": k, "seen": 3}, {"k": grown, "seen": 4}) == 2 * 4 * 4


def test_the_mean_and_the_slowest_step_show_what_the_median_hides(records):
    calls = []

    def step():  # one slow step in ten, as a cache that regrows
        calls.append(1)
        time.sleep(0.03 if len(calls) == 5 else 0.001)

    t = measure(step, warmup=0, repeats=10)
    assert t["median_ms"] < 10 and t["mean_ms"] >= 3 and t["max_ms"] >= 30  # the mean: at least 30 ms / 10
    for p in (p for rec in records.values() for p in rec["points"]):
        assert p["p20_ms"] <= p["ms_per_token"] <= p["p80_ms"] <= p["max_ms"]
        assert p["mean_ms_per_token"] <= p["max_ms"] and p["mean_ms_per_token"] > 0


GLIBC = sys.platform == "linux" and (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")


def test_page_faults_are_recorded_and_glibc_keeps_a_steps_large_temporaries(records):
    for p in (p for rec in records.values() for p in rec["points"]):
        assert p["faults_per_token"] >= 0 and p["malloc_tuned"] is GLIBC
    if not GLIBC:
        return
    # a fresh process (this one may be tuned already): a 64 MiB temporary per call, above
    # glibc's largest mmap threshold, faults in all its 16,384 pages again unless tuned
    code = ("import torch; from tasks.benchmarks.timing import measure\n"
            "from tasks.engine.allocator import tune_malloc\n"
            "step = lambda: torch.empty(2 ** 24).fill_(1.0)\n"
            "print(measure(step, 10, 5)['minor_faults'] / 5, tune_malloc(), measure(step, 10, 5)['minor_faults'] / 5)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert float(out[0]) > 16000 and out[1] == "True" and float(out[2]) < 100


def test_the_targets_table_reads_each_fixed_state_mixer_against_attention_and_its_limits():
    import pandas as pd

    from results.paper.decoding import decode_targets
    rows = []
    for label, ms, state in (("attention", 0.2, None), ("gla", 0.1, 8), ("retnet", 0.3, 8)):
        for c in (1024, 4096):
            rows.append({"label": label, "d_model": 256, "batch": 1, "context": c, "ms_per_token": ms,
                         "state_bytes": state or c, "bandwidth_fraction": 1.0, "compute_fraction": 0.1})
            rows.append({"label": label, "d_model": 1024, "batch": 16, "context": c, "ms_per_token": 1.0,
                         "state_bytes": state or c, "bandwidth_fraction": 0.6 if label == "gla" else 0.3,
                         "compute_fraction": 0.4 if label == "gla" else 0.45})
    text = decode_targets(pd.DataFrame(rows))
    assert "| gla | 0.100 ms, 0.50x | – | yes | 0.60 | 0.40 | 0.60 | yes |" in text
    assert "| retnet | 0.300 ms, 1.50x | – | no | 0.30 | 0.45 | 0.45 | no |" in text
    assert "attention |" not in text  # the control is the yardstick, not a row
    assert text.endswith("1 of 2 at most attention's; 1 of 2 at 0.5 of the tighter limit or more "
                         "(1 of 2 at 0.5 of the bandwidth limit alone).")
    rows = [{**r, "compute_fraction": 0.7} if r["batch"] == 16 and r["label"] == "retnet" else r for r in rows]
    text = decode_targets(pd.DataFrame(rows))  # arithmetic-bound: the tighter limit is the arithmetic one
    assert "| retnet | 0.300 ms, 1.50x | – | no | 0.30 | 0.70 | 0.70 | yes |" in text
    assert text.endswith("2 of 2 at 0.5 of the tighter limit or more (1 of 2 at 0.5 of the bandwidth limit alone).")
    # timed side by side with attention in one process, the interleaved ratio decides
    side = {"baseline": "attention", "ratio_to_baseline": 0.9, "ratio_low": 0.8, "ratio_high": 1.1}
    rows = [{**r, **side} if (r["label"], r["batch"], r["context"]) == ("retnet", 1, 1024) else r for r in rows]
    text = decode_targets(pd.DataFrame(rows))
    assert "| retnet | 0.300 ms, 1.50x | 0.90x [0.80, 1.10] | yes |" in text
    assert "| gla | 0.100 ms, 0.50x | – | yes |" in text
    assert "2 of 2 at most attention's (read from the interleaved ratio" in text


def test_the_decode_readings_are_read_from_the_points():
    import pandas as pd

    from results.paper.decoding import decode_readings
    rows = []
    for label, faults, state in (("attention", 300.0, None), ("gla", 0.01, 8)):
        for c in (0, 1024, 4096):
            rows.append({"label": label, "d_model": 1024, "batch": 16, "context": c, "ms_per_token": 10.0,
                         "mean_ms_per_token": 11.0, "max_ms": 60.0 if label == "attention" else 12.0,
                         "faults_per_token": faults * (40 if c == 0 else 1), "state_bytes": state or c + 1,
                         "matmul_gflop_s": 48.0 if label == "gla" else 56.0, "bandwidth_gb_s": 17.0,
                         "bandwidth_fraction": 0.5, "malloc_tuned": True})
            rows.append({**rows[-1], "batch": 1, "bandwidth_fraction": 1.3 if label == "gla" else 0.8})
    text = decode_readings(pd.DataFrame(rows))
    assert "ran at 48 to 56 GFLOP/s" in text and "weight at 6.0 to 7.0 GB/s, against 17 to 17 GB/s" in text
    assert "so arithmetic, not memory, bounds such a step" in text
    assert "1 of 2 mixers read above the bandwidth limit at some context" in text and ": gla." in text
    assert "slowest step takes 60.0 ms against a median of 10.0 (mean 11.0), with 300 page faults" in text
    assert "the fixed-state steps take at most 0.01 a token" in text  # context 0 (a state filling) left out
    assert "raised in 12 of 12 points' processes" in text
