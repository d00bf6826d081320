"""Long-context scaling / the mixer benchmark: the timing helper, FLOP estimates,
failed points as rows (oom, timeout), the CLI's CSV, and quick pytest-benchmark cases."""
import csv
import os
import subprocess
import sys
import time

import pytest
import torch

import zoo
from tasks import TASKS
from zoo.flops import flops
from tasks.benchmarks.scaling import ScalingConfig, build, main, make_steps, run
from tasks.engine.cli import parse_mixers
from tasks.benchmarks.timing import MemoryMeter, PointTimeout, is_oom, measure, run_point


def test_measure_skips_warmup_and_reports_percentiles():
    durations = iter([0.2, 0.2] + [0.01, 0.02, 0.03, 0.04, 0.05])  # two slow warm-up calls
    calls = []

    def fn():
        calls.append(1)
        time.sleep(next(durations))

    t = measure(fn, warmup=2, repeats=5)
    assert len(calls) == 7 and t["repeats"] == 5
    assert t["p20_ms"] <= t["median_ms"] <= t["p80_ms"] < 150  # warm-up not counted
    assert 29 <= t["median_ms"] < 60  # the middle of 10..50 ms, plus scheduling noise


def test_measure_counts_page_faults_in_all_and_for_the_median_call():
    import mmap
    kept = []

    def fn():  # the second timed call alone touches 8 MiB of fresh pages
        if len(kept) == 2:
            m = mmap.mmap(-1, 8 << 20)
            m.write(b"x" * (8 << 20))
            kept.append(m)
        else:
            kept.append(None)

    t = measure(fn, warmup=1, repeats=5)
    assert t["minor_faults"] >= (8 << 20) // 4096 // 2  # huge pages or not: most of 2,048
    assert t["median_faults"] < 64  # the other calls take (next to) none


def test_the_warm_up_lasts_until_a_call_leaves_the_heap_as_it_found_it():
    import mmap

    from tasks.benchmarks.timing import SETTLE_CALLS
    kept = []

    def growing(n):  # the first n calls each touch 4 MiB of fresh pages, as a heap still growing
        def fn():
            if len(kept) < n:
                m = mmap.mmap(-1, 4 << 20)
                m.write(b"x" * (4 << 20))
                kept.append(m)
            else:
                kept.append(None)
        return fn

    t = measure(growing(3), warmup=1, repeats=3, settle=True)
    assert t["warmup_calls"] == 4 and t["minor_faults"] < 64  # 3 growing calls, then a quiet one
    kept.clear()
    t = measure(growing(100), warmup=2, repeats=3, settle=True)  # never settles: the warm-up stops anyway
    assert t["warmup_calls"] == 2 + SETTLE_CALLS and t["median_faults"] >= (4 << 20) // 4096 // 2
    kept.clear()
    t = measure(growing(3), warmup=1, repeats=3)  # without settle: the calls asked for, no more
    assert t["warmup_calls"] == 1 and t["minor_faults"] >= 2 * (4 << 20) // 4096 // 2


@pytest.mark.skipif(not (sys.platform == "linux" and (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")),
                    reason="glibc's allocator only")
def test_a_reserved_heap_serves_later_growth_without_page_faults():
    """In a fresh process: 64 MiB of new tensors fault in their 16,384 pages, unless the heap
    was reserved first (and reserving needs the tuned allocator)."""
    code = ("import resource, torch; from tasks.engine.allocator import reserve_heap, tune_malloc\n"
            "import sys; reserved = reserve_heap(1 << 27)\n"
            "tuned = tune_malloc(); reserved = reserve_heap(1 << 27) if sys.argv[1] == 'reserve' else reserved\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "kept = [torch.empty(2 ** 22).fill_(1.0) for _ in range(4)]\n"
            "print(tuned, reserved, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)")
    runs = {way: subprocess.run([sys.executable, "-c", code, way], capture_output=True, text=True, check=True).stdout.split()
            for way in ("reserve", "grow")}
    assert runs["reserve"][:2] == ["True", "True"] and int(runs["reserve"][2]) < 1000
    assert runs["grow"][:2] == ["True", "False"] and int(runs["grow"][2]) > 15000


def test_measure_stops_at_the_deadline():
    with pytest.raises(PointTimeout):
        measure(lambda: time.sleep(0.01), warmup=1, repeats=100, deadline=time.monotonic())


def test_oom_recognised():
    assert is_oom(MemoryError()) and is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory."))
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate"))
    assert not is_oom(RuntimeError("shape mismatch"))


def test_config_checks():
    with pytest.raises(ValueError, match="unknown field.*max_length"):
        ScalingConfig(max_length=10)
    with pytest.raises(ValueError, match="unknown option.*windw"):
        ScalingConfig(mixer="sliding_window", mixer_options={"windw": 4})
    with pytest.raises(ValueError, match="passes"):
        ScalingConfig(passes=("bwd",))
    assert ScalingConfig(device="cpu").lengths() == [256, 512, 1024, 2048, 4096]  # CPU default
    assert ScalingConfig(min_len=64, max_len=300).lengths() == [64, 128, 256]
    assert TASKS["scaling"][0] is ScalingConfig


def test_attention_flops_follow_flash_attention():
    # FlashAttention's benchmark: 4 * B * L^2 * d for the core, halved when causal;
    # backward 2.5x. Projections: qkv (d -> 3d) and out (d -> d), 2 FLOPs per MAC.
    B, L, d = 3, 128, 64
    m = zoo.build_mixer("attention", d)
    core, dense = 4 * B * L * L * d / 2, 2 * B * L * (3 * d * d + d * d)
    assert flops(m, B, L) == {"fwd": dense + core, "fwd_bwd": 3 * dense + 3.5 * core}
    w = zoo.build_mixer("sliding_window", d, window=15)
    assert flops(w, B, L)["fwd"] == dense + 4 * B * L * 16 * d  # 16 keys per query


def test_every_registered_mixer_has_a_flop_estimate():
    class Unknown(zoo.Mixer):
        name = "unknown"

    with pytest.warns(UserWarning, match="no FLOP estimate"):
        assert flops(Unknown(), 1, 8) is None  # no forward to count: no estimate, not a wrong one
    for name in zoo.MIXERS:
        with torch.device("meta"):
            m = zoo.build_mixer(name, 64)
        core = m.core_flops(2, 256)
        assert core is not None and core > 0, f"{name}: core_flops gives {core}"
        f1, f2 = flops(m, 2, 256), flops(m, 2, 512)
        assert 0 < f1["fwd"] < f1["fwd_bwd"] and f2["fwd"] > f1["fwd"]


def test_default_core_flops_counts_the_forward_on_meta_tensors():
    # The base default (FlopCounterMode) against a mixer whose matmuls are known: a bmm of
    # (L x L) scores and their values per head, nothing elementwise, the Linear left out.
    class Scores(zoo.Mixer):
        name = "scores"

        def __init__(self, d_model: int, n_heads: int = 2):
            super().__init__()
            self.n_heads, self.proj = n_heads, torch.nn.Linear(d_model, d_model)

        def forward(self, x):
            B, L, D = x.shape
            h = self.proj(x).view(B, L, self.n_heads, -1).transpose(1, 2)  # (B, H, L, D/H)
            return ((h @ h.transpose(-1, -2)).tril().softmax(-1) @ h).transpose(1, 2).reshape(B, L, D)

    m = Scores(32)  # a real CPU module: counted on meta stand-ins of its weights
    assert m.core_flops(3, 16) == 2 * (2 * 3 * 2 * 16 * 16 * 16)  # two bmm: 2 B H L^2 (D/H)
    assert flops(m, 3, 16)["fwd"] == 2 * 3 * 16 * 32 * 32 + m.core_flops(3, 16)
    assert m.backend == "torch" and "backend" not in vars(m)  # counting ran nothing it reports
    assert m.proj.weight.device.type == "cpu"


def test_lm_scope_counts_the_head_and_every_layer():
    cfg = ScalingConfig(scope="lm", d_model=32, n_layers=3, vocab_size=100, mixer_options={"n_heads": 2})
    lm = build(cfg, 64)
    one = flops(zoo.build_mixer("attention", 32, n_heads=2), 2, 64)["fwd"]
    mlp = 2 * 2 * 64 * (2 * 32 * 128)
    head = 2 * 2 * 64 * 32 * 100
    assert flops(lm, 2, 64)["fwd"] == 3 * (one + mlp) + head


def test_parse_mixers():
    assert parse_mixers("attention, sliding_window:window=64:n_heads=2,grassmann:impl=fused:offsets=(1,2)") == [
        ("attention", {}), ("sliding_window", {"window": 64, "n_heads": 2}),
        ("grassmann", {"impl": "fused", "offsets": (1, 2)})]
    with pytest.raises(ValueError, match="key=value"):
        parse_mixers("attention:fast")
    # a mixer named by its import path keeps its colon, and options may follow it
    assert parse_mixers("my_pkg.mixers:Mine:width=3,mine:Shift") == [
        ("my_pkg.mixers:Mine", {"width": 3}), ("mine:Shift", {})]


def _small(**kw):
    base = dict(mixer="attention", d_model=32, min_len=16, max_len=64, tokens=128, warmup=1,
                repeats=2, device="cpu")
    return ScalingConfig(**{**base, **kw})


def test_in_process_run_points():
    rec = run(_small(isolate=False), progress=False)
    pts = rec["points"]
    assert [(p["seq_len"], p["pass"]) for p in pts] == [(L, s) for L in (16, 32, 64) for s in ("fwd", "fwd_bwd")]
    assert all(p["status"] == "ok" and p["backend"] == "sdpa" for p in pts)
    assert [p["batch"] for p in pts[::2]] == [8, 4, 2]  # fixed tokens per batch
    for p in pts:
        assert p["tokens_per_s"] == pytest.approx(p["tokens"] / (p["median_ms"] / 1e3))
        assert p["flops_per_s"] == pytest.approx(p["flops"] / (p["median_ms"] / 1e3))
        # the KV cache, allocated in blocks of 64 positions; CPU memory needs a child process
        assert p["state_size"] == 2 * 32 * 64 * -(-p["seq_len"] // 64) and p["peak_mem_mb"] is None
    assert rec["n_ok"] == 6 and rec["status"] == "ok" and rec["dtype"] == "float32"


def test_isolated_run_measures_memory_and_turns_a_cap_into_oom_rows():
    # Materialised attention scores grow like L^2 at fixed tokens: under a 150 MiB cap
    # the short lengths fit, L=4096 cannot allocate its (1, 4, 4096, 4096) fp32 scores.
    cfg = _small(mixer_options={"backend": "math"}, d_model=64, min_len=256, max_len=4096, tokens=4096,
                 mem_cap_mb=150, passes=("fwd",), stop_after_failure=False)
    rec = run(cfg, progress=False)
    pts = {p["seq_len"]: p for p in rec["points"]}
    assert pts[256]["status"] == "ok" and 1 < pts[256]["peak_mem_mb"] < 150
    assert pts[4096]["status"] == "oom" and "can't allocate memory" in pts[4096]["error"]
    assert pts[4096]["median_ms"] is None and rec["n_oom"] >= 1  # a row, and the run returned


def test_time_limit_is_a_timeout_row():
    rec = run(_small(time_limit_s=0.0, max_len=32), progress=False)
    assert [p["status"] for p in rec["points"]] == ["timeout", "timeout", "skipped", "skipped"]
    rec = run(_small(time_limit_s=0.0, max_len=32, isolate=False, stop_after_failure=False), progress=False)
    assert [p["status"] for p in rec["points"]] == ["timeout"] * 4


def _sleeper(meter, deadline, seconds):
    time.sleep(seconds)
    yield {"pass": "fwd"}


def test_a_hung_child_is_killed_at_the_limit():
    t0 = time.monotonic()
    rows, status, error = run_point(_sleeper, {"seconds": 60}, device=torch.device("cpu"), time_limit_s=0.5)
    assert status == "timeout" and rows == [] and time.monotonic() - t0 < 30


def test_cli_writes_csv(tmp_path, capsys):
    out = tmp_path / "bench.csv"
    main(["--mixers", "attention,sliding_window:window=8", "--d-model", "32", "--min-len", "16",
          "--max-len", "32", "--tokens", "64", "--repeats", "2", "--warmup", "1", "--device", "cpu",
          "--no-isolate", "--out", str(out)])
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 * 2 * 2  # mixers x lengths x passes
    assert {r["label"] for r in rows} == {"attention", "sliding_window:window=8"}
    for col in ("seq_len", "batch", "pass", "median_ms", "p20_ms", "p80_ms", "tokens_per_s", "peak_mem_mb",
                "flops", "flops_per_s", "backend", "status", "device", "dtype"):
        assert col in rows[0]
    printed = capsys.readouterr().out
    assert "sliding_window:window=8" in printed and "wrote 8 rows" in printed


def test_memory_meter_sees_an_allocation_in_a_fresh_process():
    rows, status, _ = run_point(_allocate, {"mb": 64}, device=torch.device("cpu"))
    assert status == "ok" and 60 <= rows[0]["peak_mb"] < 120


def _allocate(meter: MemoryMeter, deadline, mb):
    meter.start()
    x = torch.ones(mb * 2 ** 18)  # float32: mb MiB, touched
    yield {"peak_mb": meter.peak_mb(), "sum": float(x.sum())}


# ------------------------------------------------------- pytest-benchmark, tiny cases


@pytest.mark.benchmark(group="mixer fwd+bwd, L=64, d=64", min_rounds=3, warmup=True)
@pytest.mark.parametrize("name", sorted(zoo.MIXERS))
def test_benchmark_tiny_fwd_bwd(benchmark, name):
    cfg = ScalingConfig(mixer=name, d_model=64, min_len=64, max_len=64, tokens=128, device="cpu")
    module, steps = make_steps(cfg, 64)
    grads = benchmark.pedantic(steps["fwd_bwd"], rounds=3, warmup_rounds=1)
    # the timed call computed what it claims: the input's and every weight's gradient
    params = [p for p in module.parameters() if p.requires_grad]
    assert len(grads) == 1 + len(params) and grads[0].shape == (2, 64, 64)
    assert all(torch.isfinite(g).all() for g in grads) and grads[0].abs().sum() > 0


@pytest.mark.benchmark(group="attention fwd, d=64", min_rounds=3)
@pytest.mark.parametrize("L", [64, 256])
def test_benchmark_tiny_attention_fwd(benchmark, L):
    cfg = ScalingConfig(d_model=64, min_len=L, max_len=L, tokens=256, device="cpu")
    module, steps = make_steps(cfg, L)
    y = benchmark.pedantic(steps["fwd"], rounds=3, warmup_rounds=1)
    assert y.shape == (256 // L, L, 64) and torch.isfinite(y).all() and module.backend == "sdpa"
