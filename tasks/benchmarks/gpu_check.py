"""The device check: the one script a GPU session runs to learn, within a fixed budget,
whether the CUDA fast paths import, agree with the torch paths, and how fast they are.

    python -m tasks.benchmarks.gpu_check --out DIR [--quick] [--budget-s 480] [--mixers SPEC]
        [--skip-tests] [--skip-parity] [--skip-bench] [--skip-decode] [--allow-cpu]

Everything goes under DIR, row by row as it finishes (a run cut short keeps its rows):
  environment.csv          torch, CUDA, the device, then zoo.ops.status(): every fast-path
                           kernel, its package, installed version, whether it imports, why not
  pytest_cuda.txt/.xml     the output and JUnit XML of `pytest -m cuda -q`
  parity.csv               per (mixer, tensor): fast path and torch path vs an fp32 reference
  bench.csv                tasks.benchmarks.scaling points in bf16 (fwd, fwd_bwd) until the budget ends
  decode_parity.csv        per mixer: its step form (prefill a quarter, step the rest) against
                           the parallel form, both in bf16, and both against an fp32 forward
  decode.csv               tasks.benchmarks.decode points in bf16, batch 1, after contexts up to 64k,
                           each mixer's step eager and under CUDA graphs (``step_impl``
                           "graphed": one replay a token, as mamba_ssm's cg=True decoding),
                           so that the launch cost shows as the gap between its two rows

Parity is FlashAttention's test rule. With a the fp32 torch-path result, b the fast path
under bf16 autocast and c the torch path under the same autocast, the fast path passes
where max|b - a| <= 2 max|c - a| + 1e-5: at most twice as far from the truth as torch
itself at that precision. It is checked for the output, dL/dx and every weight's gradient.
a and c run a copy with the same weights whose pinned implementation is reset to the
readable one (grassmann impl='eager', attention backend='auto'): torch_only() alone would
run grassmann's fused kernel as its factored form, not against the eager reference.

Decode parity is the same rule on the decode: with a the fp32 parallel forward, b the step
form in bf16 and c the parallel form in bf16, b passes where max|b - a| <= 2 max|c - a| +
1e-3 max|a| (the last term fla's 2e-3-style floor, so that an fp32 run on CPU, where c is
exact, still has a tolerance).

Exit status: 0 when every check ran and held; 1 when a parity row fails or errors, or the
CUDA tests fail or time out (the verdicts this script exists for; bench rows that are
oom or skipped are data); 2 when nothing can be checked (no CUDA without --allow-cpu).
--allow-cpu runs the same code on CPU at tiny sizes, which is how the tests exercise it;
grassmann:impl=fused then needs Triton's interpreter, TRITON_INTERPRET=1 in the environment
before Python starts (tests/conftest.py sets it), else its rows are errors that say so.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import inspect
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import zoo
from zoo.mixers import is_mixer
from zoo.mixers.attention import FLASH_ATTN
from zoo.ops.fastpath import installed_version

from . import decode, scaling
from ..engine.cli import format_table, mixer_label, parse_mixers
from ..engine.runs import REPO, environment

# Options that pin an implementation: the torch twin of a mixer has them reset to the
# readable reference (torch_only() would keep grassmann on its factored form).
TORCH_OPTIONS = {"impl": "eager", "backend": "auto"}
POINT_LIMIT_S = 60.0  # per bench point, so that one slow point cannot eat the budget
RESERVE_S = 5.0  # of the budget, kept for the summary after the bench
TESTS_SHARE = 0.3  # of the budget, at most, for `pytest -m cuda`

ENV_FIELDS = ["name", "package", "min_version", "installed", "importable", "why_not"]
PARITY_FIELDS = ["mixer", "tensor", "status", "backend_fast", "backend_torch", "err_fast",
                 "err_torch", "ratio", "pass", "why"]
DECODE_PARITY_FIELDS = ["mixer", "status", "backend_step", "err_step", "err_parallel", "ratio", "pass", "why"]
DECODE_FIELDS = ["label", "d_model", "dtype", "context", "batch", "status", "prefill_ms", "ms_per_token",
                 "mean_ms_per_token", "max_ms", "tokens_per_s", "state_mb_per_seq", "state_write_bytes",
                 "decode_mem_mb", "bandwidth_fraction", "backend", "step_impl", "error"]
DECODE_IMPLS = ("eager", "graphed")  # launch-bound, and one graph replay a token (zoo.stepping)
BENCH_FIELDS = ["label", "d_model", "dtype", "seq_len", "batch", "tokens", "pass", "status",
                "median_ms", "p20_ms", "p80_ms", "repeats", "tokens_per_s", "peak_mem_mb",
                "flops_per_s", "backend", "error"]


@dataclass(frozen=True)
class Sizes:
    parity: tuple[int, int, int]  # (B, L, d_model); L odd so that no kernel sees whole blocks
    d_models: tuple[int, ...]
    lengths: tuple[int, ...]
    tokens: int  # per bench batch: batch = tokens // L
    warmup: int
    repeats: int
    contexts: tuple[int, ...] = (0, 64)  # of the decode benchmark


def sizes(device_type: str, quick: bool) -> Sizes:
    if device_type == "cuda":
        if quick:  # a dry run: the shortest and the longest length, few repeats
            return Sizes((2, 515, 128), (256,), (1024, 16384), 16384, 1, 3, (0, 16384))
        return Sizes((2, 515, 128), (256, 1024), (1024, 2048, 4096, 8192, 16384), 16384, 2, 10,
                     (0, 1024, 4096, 16384, 65536))
    # --allow-cpu: the same code paths at sizes a 2-core test run affords
    if quick:
        return Sizes((2, 67, 64), (64,), (64, 128), 256, 1, 2, (0, 64))
    return Sizes((2, 131, 64), (64,), (64, 128, 256), 512, 1, 3, (0, 64, 256))


class CsvLog:
    """A CSV written as rows finish: the header at creation, each add() appended and
    closed (so flushed) at once, so a run killed mid-way keeps every finished row."""

    def __init__(self, path: Path, fields: list[str]):
        self.path, self.fields, self.rows = path, fields, []
        with open(path, "w", newline="") as f:
            csv.DictWriter(f, fields).writeheader()

    def add(self, rows: list[dict]) -> None:
        with open(self.path, "a", newline="") as f:  # extra keys of a row are not columns
            csv.DictWriter(f, self.fields, extrasaction="ignore").writerows(rows)
        self.rows += rows


def variants(kind: str, flash: bool = False) -> list[tuple[str, dict]]:
    """The (mixer, options) to check: every mixer with its defaults, then the fast paths
    that are options: for "parity" grassmann's fused kernels; for "bench" also its eager
    and compiled impls and, where flash-attn imports (so default attention takes it),
    attention pinned to SDPA beside it."""
    extra = [("grassmann", {"impl": "fused"})]
    if kind == "bench":
        extra = [("grassmann", {"impl": "eager"}), ("grassmann", {"impl": "compiled"}), *extra]
        if flash:
            extra.append(("attention", {"backend": "sdpa"}))
    defaults = [(name, {}) for name in zoo.MIXERS]
    return defaults + [(name, opts) for name, opts in extra if not _is_default(name, opts)]


def _is_default(mixer: str, options: dict) -> bool:
    """Whether these options are the mixer's defaults anyway (then it is not run twice)."""
    params = inspect.signature(zoo.mixer_class(mixer).__init__).parameters
    return all(params[k].default == v for k, v in options.items())


# ---------------------------------------------------------------------- parity


def tolerance_ok(err_fast: float, err_torch: float) -> bool:
    """FlashAttention's rule: the fast path may be at most twice as far from the fp32
    reference as the torch path at the same precision (+1e-5 for exact paths). NaN fails."""
    return bool(err_fast <= 2 * err_torch + 1e-5)


def forward_backward(mixer, x, grad_out, autocast: bool, torch_path: bool):
    """({"out": y, "grad_x": dL/dx, "grad_<param>": ...} in fp32, the backend that ran),
    for L = <y, grad_out>. x, grad_out: (B, L, D) fp32."""
    x = x.detach().requires_grad_(True)
    names, params = zip(*mixer.named_parameters())
    with zoo.ops.torch_only() if torch_path else contextlib.nullcontext():
        with torch.autocast(x.device.type, torch.bfloat16, enabled=autocast):
            y = mixer(x)  # (B, L, D), bf16 under autocast
        # A weight that one path leaves out of the graph gets a zero gradient, so that its
        # row fails by name instead of an error that hides the mixer's other rows.
        grads = torch.autograd.grad(y, [x, *params], grad_out.to(y.dtype), allow_unused=True,
                                    materialize_grads=True)
    tensors = {"out": y, "grad_x": grads[0], **{f"grad_{n}": g for n, g in zip(names, grads[1:])}}
    return {k: t.float() for k, t in tensors.items()}, mixer.backend


def why_no_fast_path(mixer: str) -> str:
    """Why a mixer ran its torch path: the why_not of every kernel of a package that its
    ``fast_path`` names (e.g. "mamba_ssm"), else that description itself."""
    text = zoo.mixer_class(mixer).fast_path
    why = [f"{r['kernel']}: {r['why_not']}" for r in zoo.ops.status()
           if r["why_not"] and re.search(rf"\b{r['kernel'].split('.')[0]}\b", text)]
    return "; ".join(why) or f"its kernels import but did not run here; fast path: {text}"


def parity_rows(mixer: str, options: dict, size: tuple[int, int, int], device, seed: int = 0):
    """One row per tensor (output and every gradient) of one mixer; see the module doc."""
    B, L, D = size
    torch.manual_seed(seed)
    fast = zoo.build_mixer(mixer, D, **options).to(device)
    with torch.no_grad():  # off the init: zero-initialised weights would hide gradient errors
        for p in fast.parameters():
            p.add_(0.02 * torch.randn_like(p))
    twin = zoo.build_mixer(mixer, D, **{k: TORCH_OPTIONS.get(k, v) for k, v in options.items()})
    twin = twin.to(device)
    twin.load_state_dict(fast.state_dict())
    x = torch.randn(B, L, D, device=device)
    grad_out = torch.randn(B, L, D, device=device)  # the fixed upstream gradient
    ref, _ = forward_backward(twin, x, grad_out, autocast=False, torch_path=True)
    got_fast, backend_fast = forward_backward(fast, x, grad_out, autocast=True, torch_path=False)
    got_torch, backend_torch = forward_backward(twin, x, grad_out, autocast=True, torch_path=True)
    took_fast = backend_fast != backend_torch
    why = "" if took_fast else why_no_fast_path(mixer)
    rows = []
    for key, a in ref.items():
        err_fast = (got_fast[key] - a).abs().max().item()
        err_torch = (got_torch[key] - a).abs().max().item()
        rows.append({"mixer": mixer_label(mixer, options), "tensor": key,
                     "status": "ok" if took_fast else "no_fast_path",
                     "backend_fast": backend_fast, "backend_torch": backend_torch,
                     "err_fast": err_fast, "err_torch": err_torch,
                     "ratio": err_fast / err_torch if err_torch else float("inf") if err_fast else 1.0,
                     "pass": tolerance_ok(err_fast, err_torch),
                     "why": why})
    return rows


def run_parity(todo, size, device, deadline: float, log: CsvLog) -> None:
    # The reference must be true fp32: no TF32 in matmuls or cuDNN convolutions (the
    # bf16 runs and the bench are unaffected).
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    for mixer, options in todo:
        name = mixer_label(mixer, options)
        if time.monotonic() > deadline:
            rows = [{"mixer": name, "status": "skipped", "why": "time budget spent"}]
        else:
            try:
                rows = parity_rows(mixer, options, size, device)
            except Exception as err:  # a broken mixer is a row, never the end of the check
                rows = [{"mixer": name, "status": "error", "why": f"{type(err).__name__}: {err}"}]
        log.add(rows)
        bad = [r["tensor"] for r in rows if r.get("pass") is False]
        ran = f" {rows[0]['backend_fast']} vs {rows[0]['backend_torch']}" if "pass" in rows[0] else ""
        print(f"parity {name}: {rows[0]['status']}{ran}" + (f", FAILED {bad}" if bad else "")
              + (f" ({rows[0]['why']})" if rows[0]["why"] else ""), flush=True)


# ---------------------------------------------------------------------- decode


def decode_parity_row(mixer: str, options: dict, size: tuple[int, int, int], device, seed: int = 0) -> dict:
    """One mixer's step form against its parallel form (see the module doc)."""
    B, L, D = size
    low = torch.bfloat16 if device.type == "cuda" else torch.float32
    high = torch.float32 if device.type == "cuda" else torch.float64
    torch.manual_seed(seed)
    m = zoo.build_mixer(mixer, D, **options).to(device).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.02 * torch.randn_like(p))
    x = torch.randn(B, L, D, device=device)
    with torch.no_grad():
        a = m.to(high)(x.to(high)).float()
        m = m.to(low)
        c = m(x.to(low)).float()
        state = m.init_state(B, device, low)
        y, state = m.prefill(x[:, :L // 4].to(low), state)
        steps = [y]
        for t in range(L // 4, L):
            y_t, state = m.step(x[:, t].to(low), state)
            steps.append(y_t[:, None])
        b = torch.cat(steps, 1).float()
    err_step, err_parallel = (b - a).abs().max().item(), (c - a).abs().max().item()
    return {"mixer": mixer_label(mixer, options), "status": "ok", "backend_step": m.backend, "err_step": err_step,
            "err_parallel": err_parallel, "ratio": err_step / err_parallel if err_parallel else float("inf"),
            "pass": err_step <= 2 * err_parallel + 1e-3 * a.abs().max().item(), "why": ""}


def run_decode_parity(todo, size, device, deadline: float, log: CsvLog) -> None:
    for mixer, options in todo:
        name = mixer_label(mixer, options)
        if time.monotonic() > deadline:
            row = {"mixer": name, "status": "skipped", "why": "time budget spent"}
        else:
            try:
                row = decode_parity_row(mixer, options, size, device)
            except Exception as err:  # a broken step form is a row, never the end of the check
                row = {"mixer": name, "status": "error", "why": f"{type(err).__name__}: {err}"}
        log.add([row])
        print(f"decode parity {name}: {row['status']}" + (f" {row['backend_step']}, ratio {row['ratio']:.3g}"
              + ("" if row["pass"] else ", FAILED") if row["status"] == "ok" else f" ({row['why']})"), flush=True)


def run_decode_bench(todo, sz: Sizes, device: str, deadline: float, log: CsvLog) -> None:
    """Every mixer through tasks.benchmarks.decode at the smaller width, batch 1, bf16 (fp32
    on CPU), in this process, once per step form of DECODE_IMPLS; a mixer's longer contexts
    are skipped after an oom or timeout."""
    for mixer, options in todo:
        for impl in DECODE_IMPLS:
            points = decode_points(mixer, options, impl, sz, device, deadline)
            log.add([{"label": mixer_label(mixer, options), "d_model": sz.d_models[0], "dtype": _decode_dtype(device),
                      "step_impl": impl, **p} for p in points])
            print(f"decode {mixer_label(mixer, options)} d={sz.d_models[0]} {impl}: " + ", ".join(
                f"{p['context']}: {p['ms_per_token']:.3g} ms" if p["status"] == "ok" else f"{p['context']}: {p['status']}"
                for p in points), flush=True)


def _decode_dtype(device: str) -> str:
    return "bfloat16" if device == "cuda" else "float32"


def decode_points(mixer: str, options: dict, impl: str, sz: Sizes, device: str, deadline: float) -> list[dict]:
    """One mixer's decode points with step form ``impl``; a failure is a row per context."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return [{"context": c, "batch": 1, "status": "skipped", "error": "time budget spent"} for c in sz.contexts]
    try:
        cfg = decode.DecodeConfig(mixer=mixer, mixer_options=options, label=mixer_label(mixer, options),
                                  d_model=sz.d_models[0], contexts=sz.contexts, device=device,
                                  dtype=_decode_dtype(device), new_tokens=sz.repeats * 4, warmup=sz.warmup,
                                  isolate=False, time_limit_s=min(POINT_LIMIT_S, remaining), bandwidth_mb=64,
                                  step_impl=impl)
        return decode.run(cfg, progress=False)["points"]
    except Exception as err:
        return [{"context": c, "batch": 1, "status": "error", "error": f"{type(err).__name__}: {err}"}
                for c in sz.contexts]


# ---------------------------------------------------------------------- benchmark


def bench_plan(todo, sz: Sizes) -> list[tuple[str, dict, int, int]]:
    """(mixer, options, d_model, L) in running order: every mixer at the smaller width
    first, so that a budget that runs out costs the larger width of the last ones."""
    return [(m, o, d, L) for d in sz.d_models for m, o in todo for L in sz.lengths]


def run_bench(plan, sz: Sizes, device: str, deadline: float, log: CsvLog) -> None:
    """Each point through tasks.benchmarks.scaling.run (isolate=False: CUDA memory is measured in
    this process), one length at a time so the deadline is checked between points."""
    failed = {}  # (label, d_model) -> "oom at L=...": longer L are skipped, as in tasks.benchmarks.scaling
    for mixer, options, d, L in plan:
        name, remaining = mixer_label(mixer, options), deadline - time.monotonic()
        why = failed.get((name, d)) or ("time budget spent" if remaining <= 0 else None)
        if why is None:
            try:
                cfg = scaling.ScalingConfig(
                    mixer=mixer, mixer_options=options, label=name, d_model=d, min_len=L, max_len=L,
                    tokens=sz.tokens, device=device, dtype="bfloat16", warmup=sz.warmup,
                    repeats=sz.repeats, time_limit_s=min(POINT_LIMIT_S, remaining), isolate=False)
                points = scaling.run(cfg, progress=False)["points"]
            except Exception as err:  # e.g. an option this install cannot build
                points = [{"seq_len": L, "pass": p, "status": "error",
                           "error": f"{type(err).__name__}: {err}"} for p in scaling.PASSES]
            lost = [p["status"] for p in points if p["status"] in ("oom", "timeout")]
            if lost:
                failed[(name, d)] = f"after {lost[0]} at L={L}"
        else:
            points = [{"seq_len": L, "batch": max(1, sz.tokens // L), "pass": p, "status": "skipped",
                       "error": why} for p in scaling.PASSES]
        log.add([{"label": name, "d_model": d, "dtype": "bfloat16", **p} for p in points])
        # One short line per point: the device's output tail must still hold the summary.
        print(f"bench {name} d={d} L={L}: " + ", ".join(
            f"{p['pass']} {p['median_ms']:.3g} ms {p['backend']}" if p["status"] == "ok"
            else f"{p['pass']} {p['status']}" for p in points), flush=True)


# ---------------------------------------------------------------------- tests, environment


def run_cuda_tests(out: Path, timeout_s: float, select=("-m", "cuda")) -> dict:
    """`pytest <select> -q` in a child process: output to pytest_cuda.txt, JUnit XML to
    pytest_cuda.xml. Returns the status ("passed", "failed", "no tests", "timeout") and
    pytest's summary line."""
    cmd = [sys.executable, "-m", "pytest", *select, "-q", f"--junitxml={out / 'pytest_cuda.xml'}"]
    try:
        proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout_s)
        text, status = proc.stdout, {0: "passed", 5: "no tests"}.get(proc.returncode, "failed")
    except subprocess.TimeoutExpired as err:  # its output is bytes whatever text= says
        text = (err.output or b"").decode(errors="replace") + f"\ntimed out after {timeout_s:.0f} s\n"
        status = "timeout"
    (out / "pytest_cuda.txt").write_text(text)
    lines = [line for line in text.splitlines() if line.strip()]
    return {"status": status, "summary": lines[-1] if lines else ""}


def environment_rows(device: torch.device) -> list[dict]:
    head = [{"name": "torch", "installed": torch.__version__},
            {"name": "cuda", "installed": torch.version.cuda or "", "why_not": "" if
             torch.cuda.is_available() else "torch.cuda.is_available() is False"},
            {"name": "device", "installed": environment(device)["device_name"]},
            {"name": "triton", "package": "triton", "installed": installed_version("triton", "triton"),
             "importable": zoo.ops.grassmann.triton is not None}]  # grassmann impl='fused'
    return head + [{"name": r["kernel"], **r} for r in zoo.ops.status()]


# ---------------------------------------------------------------------- CLI


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for every file written")
    p.add_argument("--quick", action="store_true", help="a dry run: fewer lengths, fewer repeats")
    p.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget, all stages")
    p.add_argument("--mixers", default=None, help="only these, as tasks.benchmarks.scaling --mixers, "
                   "e.g. attention,grassmann:impl=fused (default: every mixer and fast option)")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--skip-parity", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--skip-decode", action="store_true", help="no decode parity, no decode benchmark")
    p.add_argument("--allow-cpu", action="store_true", help="without CUDA, run on CPU at tiny sizes")
    args = p.parse_args(argv)
    if args.budget_s <= 0:
        p.error(f"--budget-s must be positive, got {args.budget_s}")
    args.mixers = parse_mixers(args.mixers) if args.mixers else None
    unknown = sorted({m for m, _ in args.mixers or [] if not is_mixer(m)})
    if unknown:
        p.error(f"--mixers: unknown mixer(s) {unknown}; valid mixers: {sorted(zoo.MIXERS)}, "
                "or an import path 'package.module:ClassName'")
    return args


def tally(rows: list[dict], statuses) -> str:
    return ", ".join(f"{sum(r['status'] == s for r in rows)} {s}" for s in statuses)


def main(argv=None) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    if not torch.cuda.is_available():
        if not args.allow_cpu:
            print("no CUDA device: nothing to check on GPU (--allow-cpu runs it on CPU)", file=sys.stderr)
            return 2
        print("no CUDA device: running on CPU at tiny sizes (--allow-cpu)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sz = sizes(device.type, args.quick)
    args.out.mkdir(parents=True, exist_ok=True)

    env = CsvLog(args.out / "environment.csv", ENV_FIELDS)
    env.add(environment_rows(device))
    print(format_table(env.rows, ["name", "installed", "importable", "why_not"]), flush=True)
    written, verdicts_failed, summary = [env.path], False, []

    if not args.skip_tests:
        timeout = max(1.0, min(TESTS_SHARE * args.budget_s, deadline - time.monotonic()))
        tests = run_cuda_tests(args.out, timeout)
        summary.append(f"pytest -m cuda: {tests['status']}: {tests['summary']}")
        print(summary[-1], flush=True)
        verdicts_failed |= tests["status"] in ("failed", "timeout")
        written += [args.out / "pytest_cuda.txt", args.out / "pytest_cuda.xml"]

    if not args.skip_parity:
        lines, failed, paths = _parity_stage(args, sz, device, deadline)
        summary, verdicts_failed, written = summary + lines, verdicts_failed or failed, written + paths

    if not args.skip_bench:
        bench = CsvLog(args.out / "bench.csv", BENCH_FIELDS)
        todo = args.mixers or variants("bench", FLASH_ATTN.fn is not None)
        run_bench(bench_plan(todo, sz), sz, device.type, deadline - RESERVE_S, bench)
        summary.append("bench rows: " + tally(bench.rows, ("ok", "oom", "timeout", "error", "skipped")))
        written.append(bench.path)

    if not args.skip_decode:
        lines, failed, paths = _decode_stage(args, sz, device, deadline)
        summary, verdicts_failed, written = summary + lines, verdicts_failed or failed, written + paths

    print("\n".join(["", *summary, "wrote: " + ", ".join(str(p) for p in written if p.exists())]))
    return 1 if verdicts_failed else 0



def _parity_stage(args, sz, device: torch.device, deadline: float) -> tuple[list[str], bool, list[Path]]:
    """Each fast path against its reference on this device: the summary lines, whether a
    verdict failed, the CSV written."""
    parity = CsvLog(args.out / "parity.csv", PARITY_FIELDS)
    run_parity(args.mixers or variants("parity"), sz.parity, device, deadline - RESERVE_S, parity)
    n_pass = sum(r.get("pass") is True and r["status"] == "ok" for r in parity.rows)
    n_fail = sum(r.get("pass") is False for r in parity.rows)
    bad = sorted({r["mixer"] for r in parity.rows if r.get("pass") is False or r["status"] == "error"})
    lines = [f"parity: {n_pass} pass, {n_fail} fail, " + tally(parity.rows, ("no_fast_path", "error", "skipped"))
             + (f"; failed or broken: {', '.join(bad)}" if bad else "")]
    # On a GPU, an installed kernel that its mixer did not take is a failure too.
    skipped = sorted({r["mixer"] for r in parity.rows if r["status"] == "no_fast_path"
                      and device.type == "cuda" and "is not installed" not in r["why"]})
    if skipped:
        lines.append(f"installed but not taken: {', '.join(skipped)}")
    return lines, bool(bad) or bool(skipped), [parity.path]


def _decode_stage(args, sz, device: torch.device, deadline: float) -> tuple[list[str], bool, list[Path]]:
    """Each step form against its parallel form on this device, then the decode timings:
    the summary lines, whether a verdict failed, the CSVs written."""
    dparity = CsvLog(args.out / "decode_parity.csv", DECODE_PARITY_FIELDS)
    run_decode_parity(args.mixers or variants("parity"), sz.parity, device, deadline - RESERVE_S, dparity)
    bad = sorted({r["mixer"] for r in dparity.rows if r.get("pass") is False or r["status"] == "error"})
    lines = [f"decode parity: {sum(r.get('pass') is True for r in dparity.rows)} pass, "
             f"{sum(r.get('pass') is False for r in dparity.rows)} fail, "
             + tally(dparity.rows, ("error", "skipped")) + (f"; failed or broken: {', '.join(bad)}" if bad else "")]
    dbench = CsvLog(args.out / "decode.csv", DECODE_FIELDS)
    run_decode_bench(args.mixers or variants("parity"), sz, device.type, deadline - RESERVE_S, dbench)
    lines.append("decode rows: " + tally(dbench.rows, ("ok", "oom", "timeout", "error", "skipped")))
    return lines, bool(bad), [dparity.path, dbench.path]


if __name__ == "__main__":
    sys.argv[0] = "python -m tasks.benchmarks.gpu_check"  # the usage line names the command, not the file
    sys.exit(main())
