"""Long-context scaling, the mixer benchmark: how latency and memory grow with L.

For L = min_len, 2 min_len, ... max_len at a fixed number of tokens per batch
(batch = tokens // L, so every point does the same number of token-mixings and a
linear-time mixer should show a flat time), each point times the forward (under
``torch.no_grad``) and the forward+backward (gradients of the input and of every
weight) of one mixer -- or, with ``scope="lm"``, of a whole LM -- and records median
and p20/p80 latency, tokens/s, peak memory, the backend that actually ran, a FLOP
estimate and the achieved FLOP/s. An out-of-memory error, the memory cap or the time
limit makes a row with status "oom" / "timeout" (tasks.benchmarks.timing), and the sweep goes on.

    python -m tasks.benchmarks.scaling --mixers attention,mamba,grassmann:impl=fused --out bench.csv
"""
from __future__ import annotations

import argparse
import sys
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from zoo.config import check_bounds, check_choice
from zoo.flops import flops

from ..engine.cli import emit_points, format_table, parse_mixers
from ..engine.runs import environment
from .bench import MixerBench, build, module_backend
from .timing import measure, run_point

PASSES = ("fwd", "fwd_bwd")


@dataclass
class ScalingConfig(MixerBench):
    min_len: int = 256
    max_len: int | None = None  # None: 16384 on CUDA, 4096 on CPU
    tokens: int = 16384  # per batch: batch = max(1, tokens // L)
    passes: tuple = PASSES
    repeats: int = 10

    def __post_init__(self):
        super().__post_init__()
        for p in self.passes:
            check_choice("ScalingConfig", "passes", p, PASSES)
        check_bounds(self, "min_len", "tokens", "repeats", gt=0)
        if self.max_len is not None and self.max_len < self.min_len:
            raise ValueError(f"ScalingConfig: max_len={self.max_len} < min_len={self.min_len}")

    def lengths(self) -> list[int]:
        top = self.max_len or (16384 if self.resolve_device().type == "cuda" else 4096)
        out, L = [], self.min_len
        while L <= top:
            out.append(L)
            L *= 2
        return out


def make_steps(cfg: ScalingConfig, seq_len: int) -> tuple[nn.Module, dict]:
    """The module of one point on its device and dtype, and ``{"fwd": f, "fwd_bwd": g}``:
    the calls that are timed (also by the pytest-benchmark tests). ``f`` returns the
    output and ``g`` the gradients, so a test can check what a timed call computed."""
    device, dtype = cfg.resolve_device(), cfg.resolve_dtype()
    torch.manual_seed(cfg.seed)
    B = max(1, cfg.tokens // seq_len)
    module = build(cfg, seq_len).to(device=device, dtype=dtype)
    params = [p for p in module.parameters() if p.requires_grad]
    if cfg.scope == "mixer":
        x = torch.randn(B, seq_len, cfg.d_model, device=device, dtype=dtype, requires_grad=True)
        grad_out = torch.randn_like(x)

        def fwd_bwd():  # gradients of the input and of every weight, none accumulated
            return torch.autograd.grad(module(x), [x, *params], grad_out)
    else:
        x = torch.randint(cfg.vocab_size, (B, seq_len), device=device)
        targets = torch.randint(cfg.vocab_size, (B, seq_len), device=device)

        def fwd_bwd():
            logits = module(x)  # (B, L, V)
            return torch.autograd.grad(F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()), params)

    def fwd():
        with torch.no_grad():
            return module(x)

    return module, {"fwd": fwd, "fwd_bwd": fwd_bwd}


def measure_point(cfg: dict, seq_len: int, meter, deadline):
    """The measurement of one length (run by tasks.benchmarks.timing, usually in a child process).
    Yields one row per pass."""
    cfg = ScalingConfig.from_dict(cfg)
    meter.start()  # weights, inputs and activations count; the runtime does not
    module, steps = make_steps(cfg, seq_len)
    for name in cfg.passes:
        t = measure(steps[name], cfg.warmup, cfg.repeats, cfg.resolve_device(), deadline)
        yield {"pass": name, **t, "peak_mem_mb": meter.peak_mb(), "backend": module_backend(module)}


def run(cfg: ScalingConfig, workdir: Path | None = None, progress: bool = True) -> dict:
    """Every (length, pass) point of one mixer; the points are under ``"points"``."""
    t0 = time.perf_counter()
    device = cfg.resolve_device()
    with torch.device("meta"):
        meta = build(cfg, cfg.min_len)
    points, failed = [], None
    for L in cfg.lengths():
        B = max(1, cfg.tokens // L)
        if failed is not None:
            rows, status, error = [], "skipped", f"after {failed[1]} at L={failed[0]}"
        else:
            rows, status, error = run_point(measure_point, {"cfg": cfg.to_dict(), "seq_len": L},
                                            device=device, isolate=cfg.isolate,
                                            time_limit_s=cfg.time_limit_s, mem_cap_mb=cfg.mem_cap_mb)
            if status in ("oom", "timeout") and cfg.stop_after_failure:
                failed = (L, status)
        done = {r["pass"]: r for r in rows}
        est = flops(meta, B, L)
        for name in cfg.passes:
            row = done.get(name, {"pass": name})
            ok = name in done
            med = row.get("median_ms")
            fl = est[name] if est else None
            points.append({
                "seq_len": L, "batch": B, "tokens": B * L, "pass": name,
                "status": "ok" if ok else status, "median_ms": med, "p20_ms": row.get("p20_ms"),
                "p80_ms": row.get("p80_ms"), "repeats": row.get("repeats"),
                "tokens_per_s": B * L / (med / 1e3) if ok else None,
                "peak_mem_mb": row.get("peak_mem_mb"), "flops": fl,
                "flops_per_s": fl / (med / 1e3) if ok and fl else None,
                "backend": row.get("backend"), "state_size": meta.state_size(L),
                "error": "" if ok else error,
            })
        if progress:
            print(format_table([{"label": cfg.name(), **p} for p in points[-len(cfg.passes):]], TABLE),
                  flush=True)
    return {
        "task": "scaling", "status": "ok", "seed": cfg.seed, "label": cfg.name(), "mixer": cfg.mixer,
        "mixer_options": json.dumps(cfg.mixer_options, sort_keys=True), "scope": cfg.scope,
        "d_model": cfg.d_model, "params": sum(p.numel() for p in meta.parameters()),
        "tokens_per_batch": cfg.tokens, "isolated": cfg.isolate,
        **{f"n_{s}": sum(p["status"] == s for p in points) for s in ("ok", "oom", "timeout", "skipped", "error")},
        **environment(device), "dtype": str(cfg.resolve_dtype()).replace("torch.", ""),
        "wall_time": time.perf_counter() - t0, "resumed_from": None, "points": points,
    }


# --------------------------------------------------------------------------- CLI


TABLE = ["label", "seq_len", "batch", "pass", "median_ms", "p20_ms", "p80_ms", "tokens_per_s",
         "peak_mem_mb", "flops_per_s", "backend", "status"]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description="Mixer latency/memory vs sequence length at fixed tokens per batch.")
    p.add_argument("--mixers", default="attention,sliding_window",
                   help="comma-separated name[:option=value...], e.g. grassmann:impl=fused")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--min-len", type=int, default=256)
    p.add_argument("--max-len", type=int, default=None, help="default 4096 on CPU, 16384 on CUDA")
    p.add_argument("--tokens", type=int, default=16384, help="tokens per batch")
    p.add_argument("--scope", default="mixer", choices=["mixer", "lm"])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds per point")
    p.add_argument("--mem-cap-mb", type=float, default=None)
    p.add_argument("--no-isolate", action="store_true", help="run points in this process (no CPU memory)")
    p.add_argument("--out", type=Path, default=None, help="CSV file, one row per point")
    args = p.parse_args(argv)
    records = []
    for name, options in parse_mixers(args.mixers):
        cfg = ScalingConfig(mixer=name, mixer_options=options, d_model=args.d_model, min_len=args.min_len,
                            max_len=args.max_len, tokens=args.tokens, scope=args.scope, device=args.device,
                            dtype=args.dtype, warmup=args.warmup, repeats=args.repeats,
                            time_limit_s=args.time_limit, mem_cap_mb=args.mem_cap_mb,
                            isolate=not args.no_isolate)
        records.append(run(cfg))
    emit_points(records, TABLE, args.out)
    return records


if __name__ == "__main__":
    # Run as tasks.benchmarks.scaling, not __main__: the child processes unpickle measure_point by
    # its module name, which a forkserver child cannot resolve for __main__.
    from tasks.benchmarks.scaling import main as _main

    sys.argv[0] = "python -m tasks.benchmarks.scaling"  # the usage line names the command, not the file
    _main()
