"""The decode benchmark: what one generated token costs after a context of c tokens.

A linear-time mixer is chosen for inference: its state per sequence is fixed, so the
time and memory of a generated token do not grow with the context, where attention's
KV cache does. For each context c, a point prefills c tokens through the mixer's step
form (``prefill``, the parallel form), then times ``new_tokens`` decode steps one by one
(``step``), and records the median time per token (p20/p80), tokens/s, the state's bytes,
the memory held while decoding, and the fraction of the machine's memory bandwidth the
step reaches. A decode step must at least read every weight and the whole state once, so
(weights + state bytes) / step time, over the read bandwidth of a large matrix-vector
product measured in the same run, says how close to that limit the step runs (above 1:
weights or state served from cache).

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
from dataclasses import dataclass
from pathlib import Path

import torch

import zoo
from zoo.config import check_bounds

from ..engine.cli import emit_points, format_table, parse_mixers
from ..engine.runs import environment
from .scaling import MixerBench, build, module_backend
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

    def __post_init__(self):
        super().__post_init__()
        own = "DecodeConfig"
        check_bounds(self, "batch", "new_tokens", "bandwidth_mb", gt=0)
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


def to_batch(state, batch: int):
    """A one-sequence state copied to ``batch`` sequences (every state tensor is batch-first)."""
    if torch.is_tensor(state):
        return state.expand(batch, *state.shape[1:]).contiguous()
    if isinstance(state, dict):
        return {k: to_batch(v, batch) for k, v in state.items()}
    if isinstance(state, list):
        return [to_batch(v, batch) for v in state]
    return state


def measure_point(cfg: dict, context: int, meter, deadline):
    """One context (run by tasks.benchmarks.timing, usually in a child process): prefill,
    then the timed decode steps. Yields one row."""
    cfg = DecodeConfig.from_dict(cfg)
    device, dtype = cfg.resolve_device(), cfg.resolve_dtype()
    torch.manual_seed(cfg.seed)
    meter.start()  # weights, the prompt, the prefill and the state count; the runtime does not
    module = build(cfg, context + cfg.warmup + cfg.new_tokens).to(device=device, dtype=dtype).eval()
    lm = cfg.scope == "lm"
    with torch.inference_mode():
        prompt = (torch.randint(cfg.vocab_size, (1, context), device=device) if lm
                  else torch.randn(1, context, cfg.d_model, device=device, dtype=dtype))
        t0 = time.perf_counter()
        _, state = module.prefill(prompt, module.init_state(1, device, dtype))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        del prompt
        box = {"state": to_batch(state, cfg.batch)}
        del state
        meter.restart_peak()  # the decode's own peak: weights + state + a step's temporaries

        def step():
            x = (torch.randint(cfg.vocab_size, (cfg.batch,), device=device) if lm
                 else torch.randn(cfg.batch, cfg.d_model, device=device, dtype=dtype))
            _, box["state"] = module.step(x, box["state"])

        t = measure(step, cfg.warmup, cfg.new_tokens, device, deadline)
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    state_b = state_bytes(box["state"])  # after the last step: context + warmup + new_tokens
    yield {**t, "prefill_ms": prefill_ms, "state_bytes": state_b, "weight_bytes": weights,
           "decode_mem_mb": meter.peak_mb(), "backend": module_backend(module)}


def measure_bandwidth(device: torch.device, mb: int = 512, repeats: int = 5) -> float:
    """The machine's read bandwidth in GB/s at this process's thread count: the median of
    ``repeats`` matrix-vector products over an ``mb`` MiB matrix, far larger than any
    cache. A matrix-vector product reads each weight once, as a decode step does (on this
    project's CPUs it streams faster than a sum or a copy of the same bytes)."""
    weights = torch.ones(mb * 2 ** 8, 1024, device=device)  # float32: 4 KiB a row
    x = torch.ones(1024, device=device)
    t = measure(lambda: weights @ x, warmup=1, repeats=repeats, device=device)
    return weights.numel() * 4 / (t["median_ms"] / 1e3) / 1e9


def run(cfg: DecodeConfig, workdir: Path | None = None, progress: bool = True) -> dict:
    """Every context of one mixer; the points are under ``"points"``."""
    t0 = time.perf_counter()
    device = cfg.resolve_device()
    bandwidth = measure_bandwidth(device, cfg.bandwidth_mb)
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
        read = row.get("weight_bytes", 0) + row.get("state_bytes", 0)  # what a step must read at least
        points.append({
            "context": c, "batch": cfg.batch, "status": "ok" if ok else status,
            "prefill_ms": row.get("prefill_ms"), "ms_per_token": med, "p20_ms": row.get("p20_ms"),
            "p80_ms": row.get("p80_ms"), "steps": row.get("repeats"),
            "tokens_per_s": cfg.batch / (med / 1e3) if ok else None,
            "state_bytes": row.get("state_bytes"),
            "state_mb_per_seq": row["state_bytes"] / cfg.batch / 2 ** 20 if ok else None,
            "weight_bytes": row.get("weight_bytes"), "decode_mem_mb": row.get("decode_mem_mb"),
            "bandwidth_fraction": read / (med / 1e3) / 1e9 / bandwidth if ok else None,
            "backend": row.get("backend"), "error": "" if ok else error,
        })
        if progress:
            print(format_table([{"label": cfg.name(), **points[-1]}], TABLE), flush=True)
    return {
        "task": "decode", "status": "ok", "seed": cfg.seed, "label": cfg.name(), "mixer": cfg.mixer,
        "mixer_options": json.dumps(cfg.mixer_options, sort_keys=True), "scope": cfg.scope,
        "d_model": cfg.d_model, "batch": cfg.batch, "bandwidth_gb_s": bandwidth, "isolated": cfg.isolate,
        **{f"n_{s}": sum(p["status"] == s for p in points) for s in ("ok", "oom", "timeout", "skipped", "error")},
        **environment(device), "dtype": str(cfg.resolve_dtype()).replace("torch.", ""),
        "threads": torch.get_num_threads(), "wall_time": time.perf_counter() - t0, "resumed_from": None,
        "points": points,
    }


# --------------------------------------------------------------------------- CLI


TABLE = ["label", "context", "batch", "prefill_ms", "ms_per_token", "p20_ms", "p80_ms", "tokens_per_s",
         "state_mb_per_seq", "decode_mem_mb", "bandwidth_fraction", "backend", "status"]


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
                           isolate=not args.no_isolate)
        records.append(run(cfg))
    emit_points(records, TABLE, args.out, command)
    return records


if __name__ == "__main__":
    # as tasks.benchmarks.scaling: children unpickle measure_point by its module name
    from tasks.benchmarks.decode import main as _main

    _main()
