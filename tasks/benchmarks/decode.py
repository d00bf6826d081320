"""The decode benchmark: what one generated token costs after a context of c tokens.

A linear-time mixer is chosen for inference: its state per sequence is fixed, so the
time and memory of a generated token do not grow with the context, where attention's
KV cache does. For each context c, a point prefills c tokens through the mixer's step
form (``prefill``, the parallel form), then times ``new_tokens`` decode steps one by one
(``step``, after ``warmup`` untimed ones; every step's input is made before the first,
so the timed region holds the steps alone). A step generates one token per sequence;
"per token" below is per step. It records the median time per token (p20/p80), the
mean and the slowest step (attention's cache regrows by a copy once every 64 tokens,
which the median hides and the mean and max show), tokens/s, the state's bytes, the
memory held while decoding, the process's minor page faults per step, and the fraction
of the machine's memory bandwidth the step reaches.

A decode step must at least read every weight and the whole state once, and write the
part of the state it changes, so (weights + state bytes + state bytes written) / step
time, over the read bandwidth of a large matrix-vector product, says how close to that
limit the step runs (above 1: weights or state served from cache). A step must also
multiply every weight with every sequence's input; from a batch of about 16 at float32
that arithmetic, at the rate of a (batch, d) x (d, 4d) product, takes longer than the
reads: ``compute_fraction`` says how close the step runs to that limit, and the larger of
the two fractions is the step's distance from the tighter one. Both rates are measured in
the point's own process, after each of LIMIT_ROUNDS rounds of steps, and each round's
step is read against the rates right after it (the median over rounds): on a shared
machine the rates move by a third between processes minutes apart.
The bytes written are counted the same way for every mixer, from values, not from a
list of state layouts: one more, untimed step from a copy of the first sequence's state
after the timed steps, and the bytes of the state elements whose value it changed, times
the batch (every sequence's state is its own rows). A recurrent state, a convolution's or
a shift's history change whole; a KV cache gains one key and one value row per layer
(a cache given room by the step is compared on the part both share, and of the room only
the values written count: reserved room is zeros). A write that leaves a value as it
was goes uncounted, so this is what the step writes at least.

Each point runs with glibc's mmap threshold raised (``engine.allocator.tune_malloc``;
``malloc_tuned`` says whether it took): glibc's defaults give a step's temporaries above
32 MiB fresh pages at every step (RetNet's, at d 1,024 and batch 16), page faults a
long-running server's allocator would not take. ``faults_per_token`` shows what is left.

Times taken minutes apart on a shared machine differ by more than the mixers do (on this
project's 2-core VM, attention's step moved between 0.23 and 0.42 ms from one round of 300
steps to the next in one process). With ``baseline`` set, a point also times that mixer (built,
stepped and prefilled the same way) in ``rounds`` interleaved rounds of ``new_tokens`` steps,
each round of each from a copy of its state after the context, the order alternating: the
median over rounds of the ratio of the two rounds' medians (``ratio_to_baseline``, its
lowest and highest round beside it) compares the two under the same conditions.

The context is prefilled for one sequence and copied to the batch: a step costs the
same whatever the values in its state, and prefilling a batch of 16k-token contexts
would cost the benchmark minutes per point; ``prefill_ms`` is that one sequence's.
An out-of-memory error or the time limit makes a row ("oom", "timeout"), and with
``stop_after_failure`` the longer contexts of that run are "skipped".

    python -m tasks.benchmarks.decode --mixers attention,mamba2,grassmann --batch 1 --out decode.csv
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import zoo
from zoo.config import WHEN_SET, check_bounds, check_choice
from zoo.mixers import check_mixer
from zoo.ops import blas as numpy_blas

from ..engine.cli import emit_points, format_table, parse_mixers
from ..engine.allocator import tune_malloc
from ..engine.runs import environment
from .bench import MixerBench, build, module_backend
from .timing import measure, run_point

CPU_CONTEXTS = (0, 1024, 2048, 4096, 8192, 16384)
CUDA_CONTEXTS = (*CPU_CONTEXTS, 32768, 65536)


@dataclass
class DecodeConfig(MixerBench):
    batch: int = 1
    contexts: tuple | None = None  # None: CPU_CONTEXTS on a CPU, CUDA_CONTEXTS on CUDA
    new_tokens: int = 64  # timed decode steps per point
    warmup: int = 8  # untimed decode steps first (they extend the context too)
    time_limit_s: float = 300.0  # per point, start-up excluded
    bandwidth_mb: int = 512  # the matrix that measures the read bandwidth
    step_impl: str = field(default="auto", metadata=WHEN_SET)  # a fixed-state mixer's step form, or the fastest (zoo.stepping)
    # a mixer timed in the same process, round by round with this one (see interleaved)
    baseline: str = field(default="", metadata=WHEN_SET)
    rounds: int = field(default=7, metadata=WHEN_SET)

    def __post_init__(self):
        super().__post_init__()
        own = "DecodeConfig"
        check_bounds(self, "batch", "new_tokens", "bandwidth_mb", gt=0)
        check_choice(own, "step_impl", self.step_impl, zoo.STEP_IMPLS)
        check_bounds(self, "rounds", gt=0)
        if self.baseline:
            check_mixer(own, "baseline", self.baseline)
            if not zoo.mixer_class(self.baseline).has_step_form():
                raise ValueError(f"{own}: baseline {self.baseline!r} has no step (decode) form")
        if self.contexts is not None and (not self.contexts or any(
                not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in self.contexts)):
            raise ValueError(f"{own}: contexts={self.contexts!r} must be whole numbers >= 0 (or None)")
        if not zoo.mixer_class(self.mixer).has_step_form():
            raise ValueError(f"{own}: mixer {self.mixer!r} has no step (decode) form")

    def context_list(self) -> list[int]:
        if self.contexts is not None:
            return sorted(self.contexts)
        return list(CUDA_CONTEXTS if self.resolve_device().type == "cuda" else CPU_CONTEXTS)


def state_bytes(state) -> int:
    """Bytes of every tensor in a mixer's or an LM's state (nested dicts and lists)."""
    if torch.is_tensor(state):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def _map(fn, state):
    """``fn`` applied to every tensor of a state (nested dicts and lists); the rest kept."""
    if torch.is_tensor(state):
        return fn(state)
    if isinstance(state, dict):
        return {k: _map(fn, v) for k, v in state.items()}
    if isinstance(state, list):
        return [_map(fn, v) for v in state]
    return state


def to_batch(state, batch: int):
    """A one-sequence state copied to ``batch`` sequences (every state tensor is batch-first)."""
    return _map(lambda t: t.expand(batch, *t.shape[1:]).contiguous(), state)


def written_bytes(before, after) -> int:
    """Bytes of the tensors of state ``after`` whose value differs from ``before``'s at the
    same place. A tensor that grew is compared on the part both have; of the rest only its
    nonzero values count (room a cache reserves is zeros until a step writes it)."""
    if torch.is_tensor(after):
        if not torch.is_tensor(before) or before.dim() != after.dim():
            return int((after != 0).sum()) * after.element_size()
        both = tuple(slice(0, min(m, n)) for m, n in zip(before.shape, after.shape))
        changed = (after[both] != before[both]).sum() + (after != 0).sum() - (after[both] != 0).sum()
        return int(changed) * after.element_size()
    if isinstance(after, dict):
        before = before if isinstance(before, dict) else {}
        return sum(written_bytes(before.get(k), v) for k, v in after.items())
    if isinstance(after, list):
        before = before if isinstance(before, list) else []
        return sum(written_bytes(before[i] if i < len(before) else None, v) for i, v in enumerate(after))
    return 0


def state_write_bytes(module, state, x: torch.Tensor) -> int:
    """Bytes a step from ``state`` writes at least, for the whole batch: one untimed step of
    the first sequence from a copy (attention writes its cache in place), times the batch.
    ``x`` is a step's input for the batch."""
    first = _map(lambda t: t[:1], state)  # views: the step below writes only the copy
    _, after = module.step(x[:1], _map(torch.clone, first))
    return written_bytes(first, after) * x.shape[0]


def measure_point(cfg: dict, context: int, meter, deadline):
    """One context (run by tasks.benchmarks.timing, usually in a child process): prefill,
    then the timed decode steps. Yields one row."""
    cfg = DecodeConfig.from_dict(cfg)
    device, dtype = cfg.resolve_device(), cfg.resolve_dtype()
    torch.manual_seed(cfg.seed)
    malloc_tuned = tune_malloc()  # for this process: the point's child, or the caller inline
    meter.start()  # weights, the prompt, the prefill and the state count; the runtime does not
    module = build(cfg, context + cfg.warmup + cfg.new_tokens).to(device=device, dtype=dtype).eval()
    step_impls = zoo.fast_steps(module, cfg.batch, cfg.step_impl)  # compiles outside the timed region
    lm = cfg.scope == "lm"
    n = cfg.warmup + cfg.new_tokens

    def context_input():  # (1, context) ids or (1, context, D): the same draw for the mixer and the baseline
        g = torch.Generator(device=device).manual_seed(cfg.seed)
        return (torch.randint(cfg.vocab_size, (1, context), generator=g, device=device) if lm
                else torch.randn(1, context, cfg.d_model, generator=g, device=device, dtype=dtype))

    with torch.inference_mode():
        prompt = context_input()
        t0 = time.perf_counter()
        _, state = module.prefill(prompt, module.init_state(1, device, dtype))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        del prompt
        box = {"state": to_batch(state, cfg.batch)}
        del state
        # every step's input, made before the first step: step i takes the i-th, (B,) or (B, D)
        inputs = (torch.randint(cfg.vocab_size, (n, cfg.batch), device=device) if lm
                  else torch.randn(n, cfg.batch, cfg.d_model, device=device, dtype=dtype)).unbind(0)
        feed = iter(inputs)
        # after the context, where the interleaved rounds start (held while decoding: a
        # fixed-state mixer's state, kilobytes at d 256)
        start = _map(torch.clone, box["state"]) if cfg.baseline else None
        meter.restart_peak()  # the decode's own peak: weights + state + a step's temporaries

        def step(x):
            _, box["state"] = module.step(x, box["state"])

        t = measure(lambda: step(next(feed)), cfg.warmup, cfg.new_tokens, device, deadline)
        decode_mem = meter.peak_mb()  # before the copy that counts the writes
        state_b = state_bytes(box["state"])  # after the last step: context + warmup + new_tokens
        writes = state_write_bytes(module, box["state"], inputs[0])
        side = limit_rounds(step, inputs[cfg.warmup:], cfg, device, deadline)
        if cfg.baseline and cfg.baseline != cfg.mixer:
            base = build(cfg.replace(mixer=cfg.baseline, mixer_options={}), context + cfg.warmup + cfg.new_tokens)
            base = base.to(device=device, dtype=dtype).eval()
            zoo.fast_steps(base, cfg.batch, cfg.step_impl)
            _, base_state = base.prefill(context_input(), base.init_state(1, device, dtype))
            side |= interleaved(module, start, base, to_batch(base_state, cfg.batch), inputs[cfg.warmup:],
                               cfg.rounds, device, deadline)
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    yield {**t, **side, "prefill_ms": prefill_ms, "state_bytes": state_b, "state_write_bytes": writes,
           "weight_bytes": weights, "decode_mem_mb": decode_mem, "faults_per_token": t["minor_faults"] / t["repeats"],
           "malloc_tuned": malloc_tuned, "backend": module_backend(module),
           "step_impl": ",".join(sorted(set(step_impls.values()))) or "eager"}


def round_medians(contenders: dict, inputs, rounds: int, device, deadline=None) -> dict[str, list[float]]:
    """``rounds`` rounds of ``len(inputs)`` steps of each contender ({name: (step, start
    state)}), the order reversed every other round, each round of each from a copy of its
    start state (made untimed). Returns each contender's round medians (ms), in round order."""
    names = list(contenders)
    out = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            fn, s0 = contenders[name]
            box = {"state": _map(torch.clone, s0)}
            feed = iter(inputs)

            def step():
                _, box["state"] = fn(next(feed), box["state"])

            out[name].append(measure(step, 0, len(inputs), device, deadline)["median_ms"])
    return out


def ratio_summary(ms: list[float], base_ms: list[float]) -> dict:
    """The median, lowest and highest over rounds of one contender's round against the other's."""
    ratios = sorted(a / b for a, b in zip(ms, base_ms))
    return {"ratio": float(np.median(ratios)), "ratio_low": ratios[0], "ratio_high": ratios[-1]}


def interleaved(module, state, base, base_state, inputs, rounds: int, device, deadline=None) -> dict:
    """``module``'s step against ``base``'s in interleaved rounds (round_medians). Returns the
    baseline's median step (ms, the median over rounds) and the median, lowest and highest
    over rounds of the ratio of the two rounds' median steps."""
    ms = round_medians({"mixer": (module.step, state), "base": (base.step, base_state)}, inputs, rounds,
                       device, deadline)
    r = ratio_summary(ms["mixer"], ms["base"])
    return {"baseline_ms": float(np.median(ms["base"])), "ratio_to_baseline": r["ratio"],
            "ratio_low": r["ratio_low"], "ratio_high": r["ratio_high"], "ratio_rounds": rounds}


LIMIT_ROUNDS = 5  # rounds of decode steps, each followed by the two probes
LIMIT_STEPS = 16


def limit_rounds(step, inputs, cfg: DecodeConfig, device, deadline=None) -> dict:
    """LIMIT_ROUNDS rounds of LIMIT_STEPS steps (``step(x)`` on from the point's state),
    each followed by the bandwidth and the matmul-rate probes: per round, the median step
    (ms) and the two rates measured right after it, so that a fraction reads a step against
    the machine as it ran then (the rates moved by a third between runs of one sweep)."""
    out = {"round_ms": [], "round_gb_s": [], "round_gflop_s": []}
    n = min(LIMIT_STEPS, len(inputs))
    for _ in range(LIMIT_ROUNDS):
        feed = iter(inputs[:n])
        out["round_ms"].append(measure(lambda: step(next(feed)), 0, n, device, deadline)["median_ms"])
        out["round_gb_s"].append(measure_bandwidth(device, cfg.bandwidth_mb, repeats=3))
        out["round_gflop_s"].append(measure_matmul_rate(device, cfg.batch, cfg.d_model, cfg.resolve_dtype(), 3))
    return out


def measure_bandwidth(device: torch.device, mb: int = 512, repeats: int = 5) -> float:
    """The machine's read bandwidth in GB/s at this process's thread count: the median of
    ``repeats`` matrix-vector products over an ``mb`` MiB matrix, far larger than any
    cache. A matrix-vector product reads each weight once, as a decode step does (on this
    project's CPUs it streams faster than a sum or a copy of the same bytes)."""
    weights = torch.ones(mb * 2 ** 8, 1024, device=device)  # float32: 4 KiB a row
    x = torch.ones(1024, device=device)
    t = measure(lambda: weights @ x, warmup=1, repeats=repeats, device=device)
    return weights.numel() * 4 / (t["median_ms"] / 1e3) / 1e9


def measure_matmul_rate(device: torch.device, batch: int, d_model: int, dtype: torch.dtype,
                        repeats: int = 5) -> float:
    """GFLOP/s of the step's kind of product at this process's thread count: ``batch``
    rows of width ``d_model`` through a (4 d_model, d_model) weight in ``dtype``, the
    median of ``repeats``. At a small batch a product reads its weight faster than it
    multiplies it (on this project's CPUs from batch 16 at float32): then arithmetic, not
    memory, bounds the step. The faster of torch's product and numpy's BLAS on the weight's
    transposed copy where a step may use that (``zoo.ops.blas``, the "blas" step form): the
    limit is the best product here."""
    x = torch.randn(batch, d_model, device=device, dtype=dtype)
    w = torch.randn(4 * d_model, d_model, device=device, dtype=dtype)
    products = [lambda: F.linear(x, w)]
    if device.type == "cpu" and dtype in numpy_blas.DTYPES and numpy_blas.available():
        w_t = w.t().contiguous()  # as the "blas" step holds its weights
        products.append(lambda: numpy_blas.linear(x, w, None, w_t))
    best = min(measure(product, warmup=2, repeats=repeats, device=device)["median_ms"] for product in products)
    return 2 * batch * w.numel() / (best / 1e3) / 1e9


def run(cfg: DecodeConfig, workdir: Path | None = None, progress: bool = True) -> dict:
    """Every context of one mixer; the points are under ``"points"``."""
    t0 = time.perf_counter()
    device = cfg.resolve_device()
    points, failed = [], None
    for c in cfg.context_list():
        if failed is not None:
            rows, status, error = [], "skipped", f"after {failed[1]} at context {failed[0]}"
        else:
            rows, status, error = run_point(measure_point, {"cfg": cfg.to_dict(), "context": c}, device=device,
                                            isolate=cfg.isolate, time_limit_s=cfg.time_limit_s,
                                            mem_cap_mb=cfg.mem_cap_mb)
            if status in ("oom", "timeout") and cfg.stop_after_failure:
                failed = (c, status)
        row = rows[0] if rows else {}
        ok = status == "ok" and bool(rows)
        med = row.get("median_ms")
        # what a step must move at least: read every weight and the state, write what it changes
        moved = row.get("weight_bytes", 0) + row.get("state_bytes", 0) + row.get("state_write_bytes", 0)
        # and multiply every weight with every sequence's input: 2 FLOPs a weight a sequence
        flops = 2 * cfg.batch * row.get("weight_bytes", 0) / cfg.resolve_dtype().itemsize
        # each round's step against the probes run right after it; the median over rounds
        rounds = list(zip(row.get("round_ms", ()), row.get("round_gb_s", ()), row.get("round_gflop_s", ())))
        bw_fraction = float(np.median([moved / (ms / 1e3) / 1e9 / gb for ms, gb, _ in rounds])) if ok else None
        compute_fraction = float(np.median([flops / (ms / 1e3) / 1e9 / gf for ms, _, gf in rounds])) if ok else None
        points.append({
            "context": c, "batch": cfg.batch, "status": "ok" if ok else status,
            "prefill_ms": row.get("prefill_ms"), "ms_per_token": med, "p20_ms": row.get("p20_ms"),
            "p80_ms": row.get("p80_ms"), "mean_ms_per_token": row.get("mean_ms"), "max_ms": row.get("max_ms"),
            "steps": row.get("repeats"), "tokens_per_s": cfg.batch / (med / 1e3) if ok else None,
            "state_bytes": row.get("state_bytes"),
            "state_mb_per_seq": row["state_bytes"] / cfg.batch / 2 ** 20 if ok else None,
            "state_write_bytes": row.get("state_write_bytes"),
            "weight_bytes": row.get("weight_bytes"), "decode_mem_mb": row.get("decode_mem_mb"),
            "bandwidth_fraction": bw_fraction, "compute_fraction": compute_fraction,
            "probe_gb_s": float(np.median(row["round_gb_s"])) if ok else None,
            "probe_gflop_s": float(np.median(row["round_gflop_s"])) if ok else None,
            "limit_rounds": len(rounds) if ok else None,
            **{k: row.get(k) for k in ("round_ms", "round_gb_s", "round_gflop_s")},
            "faults_per_token": row.get("faults_per_token"), "malloc_tuned": row.get("malloc_tuned"),
            "backend": row.get("backend"), "step_impl": row.get("step_impl"), "error": "" if ok else error,
            **({"baseline": cfg.baseline, **{k: row.get(k) for k in RATIO}} if cfg.baseline else {}),
        })
        if progress:
            print(format_table([{"label": cfg.name(), **points[-1]}], TABLE), flush=True)
    probed = [p for p in points if p["status"] == "ok"]  # the machine's rates over the run: the points' median
    bandwidth = float(np.median([p["probe_gb_s"] for p in probed])) if probed else None
    matmul_rate = float(np.median([p["probe_gflop_s"] for p in probed])) if probed else None
    return {
        "task": "decode", "status": "ok", "seed": cfg.seed, "label": cfg.name(), "mixer": cfg.mixer,
        "mixer_options": json.dumps(cfg.mixer_options, sort_keys=True), "scope": cfg.scope,
        "d_model": cfg.d_model, "batch": cfg.batch, "bandwidth_gb_s": bandwidth, "matmul_gflop_s": matmul_rate,
        "isolated": cfg.isolate,
        **{f"n_{s}": sum(p["status"] == s for p in points) for s in ("ok", "oom", "timeout", "skipped", "error")},
        **environment(device), "dtype": str(cfg.resolve_dtype()).replace("torch.", ""),
        "threads": torch.get_num_threads(), "wall_time": time.perf_counter() - t0, "resumed_from": None,
        "points": points,
    }


def step_impl_table(pairs: list[tuple[str, list[dict], list[dict]]]) -> str:
    """Markdown: the same points run with --step-impl eager and auto, side by side, per
    (setting, eager CSV rows, auto CSV rows); docs/performance.md shows the committed ones."""
    lines = ["| mixer | setting | eager ms/token | auto ms/token | speed-up | bandwidth fraction, eager → auto "
             "| auto chose |", "|---|---|---:|---:|---:|---:|---|"]
    for setting, eager, auto in pairs:
        by_label = {r["label"]: r for r in auto}
        for e in eager:
            a = by_label[e["label"]]
            te, ta = float(e["ms_per_token"]), float(a["ms_per_token"])
            lines.append(f"| {e['label']} | {setting} | {te:.3f} | {ta:.3f} | {te / ta:.2f}x | "
                         f"{float(e['bandwidth_fraction']):.2f} → {float(a['bandwidth_fraction']):.2f} "
                         f"| {a['step_impl']} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI


RATIO = ("baseline_ms", "ratio_to_baseline", "ratio_low", "ratio_high", "ratio_rounds")
TABLE = ["label", "context", "batch", "prefill_ms", "ms_per_token", "p20_ms", "p80_ms", "mean_ms_per_token",
         "max_ms", "tokens_per_s", "state_mb_per_seq", "state_write_bytes", "decode_mem_mb", "bandwidth_fraction",
         "compute_fraction", "faults_per_token", "malloc_tuned", "backend", "step_impl", "ratio_to_baseline", "status"]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description="Time per generated token against the context, per mixer.")
    p.add_argument("--mixers", default="attention,mamba2,grassmann",
                   help="comma-separated name[:option=value...], e.g. sliding_window:window=256")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--contexts", default=None,
                   help="comma-separated context lengths; default 0,1k,...,16k on CPU (to 64k on CUDA)")
    p.add_argument("--new-tokens", type=int, default=64, help="timed decode steps per point")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--scope", default="mixer", choices=["mixer", "lm"])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds per point")
    p.add_argument("--mem-cap-mb", type=float, default=None)
    p.add_argument("--step-impl", default="auto", choices=zoo.STEP_IMPLS,
                   help="a fixed-state mixer's step form (zoo.stepping): eager, compiled, compiled_torch, "
                        "frozen (weights as constants, C++ GEMMs), graphed (CUDA graphs), "
                        "blas (the products through numpy's OpenBLAS), compiled_blas (compiled around those), "
                        "or the fastest measured (default)")
    p.add_argument("--baseline", default="",
                   help="a mixer timed in the same process, interleaved round by round (ratio_to_baseline)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds with --baseline")
    p.add_argument("--no-isolate", action="store_true", help="run points in this process (no CPU memory)")
    p.add_argument("--out", type=Path, default=None, help="CSV file, one row per point")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    command = shlex.join(["python", "-m", "tasks.benchmarks.decode", *argv])  # how the CSV was made
    contexts = tuple(int(c) for c in args.contexts.split(",")) if args.contexts else None
    if args.threads:
        torch.set_num_threads(args.threads)  # the points' child processes take the parent's count
    records = []
    for name, options in parse_mixers(args.mixers):
        cfg = DecodeConfig(mixer=name, mixer_options=options, d_model=args.d_model, batch=args.batch,
                           contexts=contexts, new_tokens=args.new_tokens, scope=args.scope, device=args.device,
                           dtype=args.dtype, time_limit_s=args.time_limit, mem_cap_mb=args.mem_cap_mb,
                           isolate=not args.no_isolate, step_impl=args.step_impl, baseline=args.baseline,
                           rounds=args.rounds)
        records.append(run(cfg))
    emit_points(records, TABLE, args.out, command)
    return records


if __name__ == "__main__":
    # as tasks.benchmarks.scaling: children unpickle measure_point by its module name
    from tasks.benchmarks.decode import main as _main

    sys.argv[0] = "python -m tasks.benchmarks.decode"  # the usage line names the command, not the file
    _main()
