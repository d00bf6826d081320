"""tasks.benchmarks.gpu_check, the device script, exercised on CPU: its arguments, the tolerance rule,
the parity rows (with a toy mixer whose fast path we control), the benchmark plan and
budget, the CSVs written as points finish, the pytest child, and one end-to-end run."""
import csv
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zoo
from tasks.benchmarks import gpu_check as g
from zoo.ops import fastpath

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class Toy(zoo.Mixer):
    """y = tanh(W x + b); its "fast path" is the same times (1 + error), on CPU."""

    name = "toy"
    fast_path = "torch tanh"
    kernel = None  # set by the fixture

    def __init__(self, d_model: int, error: float = 0.0, explode: bool = False, drop_bias: bool = False):
        super().__init__()
        self.lin, self.error, self.explode = nn.Linear(d_model, d_model), error, explode
        self.drop_bias = drop_bias  # the fast path leaves the bias out of its graph

    def forward(self, x):
        if self.explode:
            raise RuntimeError("boom")
        y = self.lin(x)  # (B, L, D)
        if self.kernel.usable(y):
            self.backend = "toy_fast"
            if self.drop_bias:
                y = F.linear(x, self.lin.weight)
            return self.kernel(y) * (1 + self.error)
        self.backend = "toy_torch"
        return torch.tanh(y)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(fastpath, "KERNELS", list(fastpath.KERNELS))  # the toy kernel leaves no trace
    monkeypatch.setattr(Toy, "kernel", fastpath.Kernel("torch", "tanh", "torch", "0", "-", devices=("cpu",)))
    monkeypatch.setitem(zoo.MIXERS, "toy", Toy)


def test_arguments_and_defaults(tmp_path):
    args = g.parse_args(["--out", str(tmp_path)])
    assert args.out == tmp_path and args.budget_s == 480.0 and args.mixers is None
    assert not (args.quick or args.skip_tests or args.skip_parity or args.skip_bench or args.allow_cpu)
    args = g.parse_args(["--out", "x", "--quick", "--budget-s", "60", "--skip-bench", "--allow-cpu",
                         "--mixers", "attention,grassmann:impl=fused"])
    assert args.quick and args.budget_s == 60 and args.skip_bench and args.allow_cpu
    assert args.mixers == [("attention", {}), ("grassmann", {"impl": "fused"})]
    for bad in ([], ["--out", "x", "--budget-s", "0"], ["--out", "x", "--mixers", "atention"]):
        with pytest.raises(SystemExit):
            g.parse_args(bad)


def test_tolerance_rule():
    assert g.tolerance_ok(1e-3, 1e-3) and g.tolerance_ok(2e-3, 1e-3)  # up to twice torch's error
    assert g.tolerance_ok(0.0, 0.0) and g.tolerance_ok(9e-6, 0.0)  # exact paths: 1e-5 slack
    assert not g.tolerance_ok(2.1e-3, 1e-3) and not g.tolerance_ok(2e-5, 0.0)
    assert not g.tolerance_ok(float("nan"), 1e-3) and not g.tolerance_ok(1e-3, float("nan"))
    assert not g.tolerance_ok(float("inf"), 1e-3)


def test_parity_compares_the_fast_path_against_torch(toy):
    rows = g.parity_rows("toy", {}, (2, 9, 8), "cpu")
    names = [r["tensor"] for r in rows]
    assert names == ["out", "grad_x", "grad_lin.weight", "grad_lin.bias"]  # output, then every gradient
    for r in rows:  # the fast path is torch's own arithmetic: exactly torch's error
        assert (r["status"], r["backend_fast"], r["backend_torch"]) == ("ok", "toy_fast", "toy_torch")
        assert r["err_fast"] == r["err_torch"] > 0 and r["ratio"] == 1.0 and r["pass"] is True
    bad = g.parity_rows("toy", {"error": 0.5}, (2, 9, 8), "cpu")
    assert [r["pass"] for r in bad] == [False] * 4 and bad[0]["mixer"] == "toy:error=0.5"
    assert bad[0]["ratio"] > 2
    unused = {r["tensor"]: r for r in g.parity_rows("toy", {"drop_bias": True}, (2, 9, 8), "cpu")}
    assert unused["grad_lin.bias"]["err_fast"] > 0.1 and unused["grad_lin.bias"]["pass"] is False


def test_parity_without_a_fast_path_says_why():
    rows = g.parity_rows("attention", {}, (1, 7, 16), "cpu")
    assert {r["status"] for r in rows} == {"no_fast_path"} and rows[0]["backend_fast"] == "sdpa"
    if zoo.mixers.attention.FLASH_ATTN.fn is None:
        assert rows[0]["why"].startswith("flash_attn.flash_attn_func: ")


def test_why_no_fast_path_names_the_kernels_of_the_package(toy, monkeypatch):
    assert g.why_no_fast_path("toy") == "its kernels import but did not run here; fast path: torch tanh"
    monkeypatch.setattr(Toy, "kernel", fastpath.Kernel("torch", "tanh", "torch", "999", "the future"))
    assert g.why_no_fast_path("toy").startswith("torch.tanh: torch ")
    assert g.why_no_fast_path("toy").endswith(" is older than 999 (the future); refused")


def test_torch_twin_runs_the_reference_impl():
    """impl= pins grassmann's implementation, which torch_only() cannot turn off: the
    torch run resets it to eager, so a factored fast run is compared against eager."""
    rows = g.parity_rows("grassmann", {"impl": "factored"}, (2, 19, 32), "cpu")
    assert {(r["status"], r["backend_fast"], r["backend_torch"]) for r in rows} == {
        ("ok", "factored", "eager")}
    assert all(r["pass"] for r in rows)


@cpu_only
def test_fused_grassmann_under_the_triton_interpreter():
    rows = g.parity_rows("grassmann", {"impl": "fused"}, (2, 37, 64), "cpu")
    assert {r["backend_fast"] for r in rows} == {"triton_interpret"} and all(r["pass"] for r in rows)


def test_broken_mixer_is_an_error_row_and_exit_1(toy, tmp_path, capsys):
    rc = g.main(["--out", str(tmp_path), "--allow-cpu", "--skip-tests", "--skip-bench",
                 "--mixers", "toy:explode=True,toy,toy:error=0.5"])
    rows = read(tmp_path / "parity.csv")
    assert rc == 1 and rows[0]["status"] == "error" and rows[0]["why"] == "RuntimeError: boom"
    assert [r["pass"] for r in rows[1:]] == ["True"] * 4 + ["False"] * 4  # the next mixers still ran
    assert ("parity: 4 pass, 4 fail, 0 no_fast_path, 1 error, 0 skipped; failed or broken: toy:error=0.5, "
            "toy:explode=True") in capsys.readouterr().out


def test_variants_and_plan():
    parity = g.variants("parity")
    assert parity == [(m, {}) for m in zoo.MIXERS] + [("grassmann", {"impl": "fused"})]
    bench = [g.mixer_label(m, o) for m, o in g.variants("bench", flash=True)]
    assert bench[:len(zoo.MIXERS)] == list(zoo.MIXERS)
    assert {"grassmann:impl=compiled", "grassmann:impl=fused", "attention:backend=sdpa"} <= set(bench)
    assert ("grassmann:impl=eager" in bench) != (zoo.MIXERS["grassmann"](64).impl == "eager")  # eager once
    assert "attention:backend=sdpa" not in [g.mixer_label(*v) for v in g.variants("bench", flash=False)]

    full, quick = g.sizes("cuda", quick=False), g.sizes("cuda", quick=True)
    assert full.d_models == (256, 1024) and full.lengths == (1024, 2048, 4096, 8192, 16384)
    assert full.tokens == 16384 and full.parity == (2, 515, 128)
    assert len(quick.lengths) < len(full.lengths) and quick.repeats < full.repeats
    todo = [("attention", {}), ("grassmann", {"impl": "fused"})]
    plan = g.bench_plan(todo, full)
    assert len(plan) == 2 * 2 * 5 and plan[0] == ("attention", {}, 256, 1024)
    assert [p[2] for p in plan] == [256] * 10 + [1024] * 10  # the smaller width first


def test_csv_log_appends_as_rows_finish(tmp_path):
    log = g.CsvLog(tmp_path / "x.csv", ["a", "b"])
    assert (tmp_path / "x.csv").read_text().splitlines() == ["a,b"]
    log.add([{"a": 1, "b": 2}])
    assert read(log.path) == [{"a": "1", "b": "2"}]
    log.add([{"a": 3, "extra": "not a column"}, {"b": 4}])
    assert read(log.path) == [{"a": "1", "b": "2"}, {"a": "3", "b": ""}, {"a": "", "b": "4"}]
    assert len(log.rows) == 3


def test_bench_budget_spent_gives_skipped_rows(tmp_path):
    sz = g.Sizes((1, 5, 8), (64,), (16, 32), 64, 1, 1)
    log = g.CsvLog(tmp_path / "bench.csv", g.BENCH_FIELDS)
    plan = g.bench_plan([("attention", {}), ("mamba", {})], sz)
    g.run_bench(plan, sz, "cpu", time.monotonic() - 1, log)
    rows = read(log.path)
    assert len(rows) == 2 * len(plan) and {r["status"] for r in rows} == {"skipped"}
    assert {r["error"] for r in rows} == {"time budget spent"}
    assert [(r["label"], r["seq_len"], r["batch"], r["pass"]) for r in rows[:2]] == [
        ("attention", "16", "4", "fwd"), ("attention", "16", "4", "fwd_bwd")]


def test_bench_writes_each_point_before_the_next_and_skips_after_oom(tmp_path, monkeypatch):
    sz = g.Sizes((1, 5, 8), (64,), (32, 64, 128), 128, 1, 1)
    log = g.CsvLog(tmp_path / "bench.csv", g.BENCH_FIELDS)
    seen = []

    def fake_run(cfg, progress=True):  # oom from L = 64 on
        seen.append((cfg.min_len, cfg.max_len, cfg.isolate, cfg.dtype, len(read(log.path))))
        status = "oom" if cfg.min_len >= 64 else "ok"
        return {"points": [{"seq_len": cfg.min_len, "pass": p, "status": status, "median_ms": 1.0,
                            "backend": "sdpa"} for p in cfg.passes]}

    monkeypatch.setattr(g.scaling, "run", fake_run)
    g.run_bench(g.bench_plan([("attention", {})], sz), sz, "cpu", time.monotonic() + 60, log)
    # one length per call, in-process, bf16; the rows of a point are on disk before the next
    assert seen == [(32, 32, False, "bfloat16", 0), (64, 64, False, "bfloat16", 2)]
    rows = read(log.path)
    assert [r["status"] for r in rows] == ["ok", "ok", "oom", "oom", "skipped", "skipped"]
    assert rows[-1]["error"] == "after oom at L=64"


def test_cuda_tests_child(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert 0\n")
    res = g.run_cuda_tests(tmp_path, 60, select=(str(tmp_path / "test_x.py"),))
    assert res["status"] == "failed" and "1 failed, 1 passed" in res["summary"]
    assert "test_bad" in (tmp_path / "pytest_cuda.txt").read_text()
    assert "testsuite" in (tmp_path / "pytest_cuda.xml").read_text()
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_slow():\n    time.sleep(60)\n")
    res = g.run_cuda_tests(tmp_path, 2, select=(str(tmp_path / "test_slow.py"),))
    assert res["status"] == "timeout" and "timed out after 2 s" in (tmp_path / "pytest_cuda.txt").read_text()


@cpu_only
def test_without_cuda_it_refuses_unless_allowed(tmp_path, capsys):
    assert g.main(["--out", str(tmp_path / "o")]) == 2
    assert "no CUDA device: nothing to check on GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@cpu_only
def test_end_to_end_on_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(g, "sizes", lambda device, quick: g.Sizes((2, 37, 64), (64,), (16, 32), 64, 1, 1))
    rc = g.main(["--out", str(tmp_path), "--allow-cpu", "--quick", "--skip-tests",
                 "--mixers", ",".join(zoo.MIXERS)])
    assert rc == 0
    env = read(tmp_path / "environment.csv")
    assert env[0]["name"] == "torch" and env[0]["installed"] == torch.__version__
    assert {k.name for k in fastpath.KERNELS} <= {r["name"] for r in env}
    parity = read(tmp_path / "parity.csv")
    assert list(parity[0]) == g.PARITY_FIELDS
    n_fused = 0
    # on CPU the fast paths are the fused C++ scans (Mamba's selective scan, the matrix-state
    # recurrences); the rest say why not
    fused_on_cpu = {"mamba", "rwkv6", "gla", "retnet", "gated_deltanet"}
    for name in zoo.MIXERS:
        rows = [r for r in parity if r["mixer"] == name]
        n_params = len(list(zoo.build_mixer(name, 64).parameters()))
        assert len(rows) == 2 + n_params  # the output, dL/dx, every weight
        for r in rows:
            if name in fused_on_cpu:
                assert (r["status"], r["backend_fast"], r["backend_torch"]) == ("ok", "cpu_fused", "torch_chunked")
                assert r["pass"] == "True"
                n_fused += 1
                continue
            assert r["status"] == "no_fast_path" and r["backend_fast"] == r["backend_torch"] != ""
            assert r["why"] and r["pass"] == "True"
            if not hasattr(zoo.build_mixer(name, 64), "conv1d"):
                # the same path twice; a mixer with a causal conv runs its C++ kernel (bf16 in,
                # float32 inside) outside torch_only() only, so its two errors differ a little
                assert float(r["err_fast"]) == float(r["err_torch"])
    bench = read(tmp_path / "bench.csv")
    assert list(bench[0]) == g.BENCH_FIELDS and len(bench) == len(zoo.MIXERS) * 2 * 2
    assert {r["status"] for r in bench} == {"ok"} and all(float(r["tokens_per_s"]) > 0 for r in bench)
    assert {(r["seq_len"], r["batch"]) for r in bench} == {("16", "4"), ("32", "2")}
    out = capsys.readouterr().out
    assert f"parity: {n_fused} pass, 0 fail, {len(parity) - n_fused} no_fast_path, 0 error, 0 skipped" in out
    assert f"bench rows: {len(bench)} ok, 0 oom, 0 timeout, 0 error, 0 skipped" in out
    # the decode: every mixer's step form against its parallel form, and a decode point per context
    dparity = read(tmp_path / "decode_parity.csv")
    assert list(dparity[0]) == g.DECODE_PARITY_FIELDS and [r["mixer"] for r in dparity] == list(zoo.MIXERS)
    assert all(r["status"] == "ok" and r["pass"] == "True" for r in dparity), dparity
    assert {r["backend_step"] for r in dparity} >= {"sdpa", "torch_step", "plucker_step"}
    dec = read(tmp_path / "decode.csv")
    assert list(dec[0]) == g.DECODE_FIELDS and len(dec) == len(zoo.MIXERS) * 2 * len(g.DECODE_IMPLS)
    assert {r["status"] for r in dec} == {"ok"} and {r["context"] for r in dec} == {"0", "64"}
    # each fixed-state mixer's step ran eager and graphed; attention's growing cache stays eager
    ran = {(r["label"], r["step_impl"]) for r in dec}
    assert ("gla", "graphed") in ran and ("gla", "eager") in ran and ("attention", "graphed") not in ran
    assert f"decode parity: {len(zoo.MIXERS)} pass, 0 fail, 0 error, 0 skipped" in out
    assert f"decode rows: {len(dec)} ok, 0 oom, 0 timeout, 0 error, 0 skipped" in out


@cpu_only
def test_a_step_form_that_drifts_fails_decode_parity(monkeypatch):
    """The decode rule catches a step that is not the parallel form: a GLA step 1 % off."""
    from zoo.mixers.gla import GLA
    assert g.decode_parity_row("gla", {}, (2, 37, 32), torch.device("cpu"))["pass"]
    real = GLA.step
    monkeypatch.setattr(GLA, "step", lambda self, x, state: (lambda y, s: (1.01 * y, s))(*real(self, x, state)))
    row = g.decode_parity_row("gla", {}, (2, 37, 32), torch.device("cpu"))
    assert not row["pass"] and row["ratio"] > 100
