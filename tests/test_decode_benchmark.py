"""The decode benchmark: what a point measures (state bytes that follow the mixer's
state_size, a KV cache that grows and fixed states that do not), failures as rows, the
CSV with its command, the figures, and a state copied to the batch decoding as a
batch-prefilled one does."""
import csv

import pandas as pd
import pytest
import torch

import zoo
from results.plots import plot_decode
from results.records import records_frame
from tasks import TASKS
from tasks.benchmarks.decode import DecodeConfig, main, run, to_batch

TINY = dict(d_model=32, contexts=(0, 64, 160), new_tokens=3, warmup=1, device="cpu", isolate=False, bandwidth_mb=8)
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
    assert "ms_per_token" in capsys.readouterr().out


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
