"""The one training loop every task uses.

AdamW, linear warm-up then cosine decay, gradient clipping, bf16 autocast (``precision``),
gradient accumulation and one run over many processes (DDP or FSDP2, tasks.engine.parallel),
evaluation every N steps with early stop at a target, a tqdm bar (plain log lines and a
``progress.json`` heartbeat, see tasks.engine.progress), checkpoints every few minutes (and/or
every N steps) and on SIGTERM/SIGUSR1, and resume from the checkpoint. Batches are a pure
function of the step (``batch_fn(step)``), so a resumed run sees exactly the batches
an uninterrupted one would and ends with the same loss.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from zoo import chunk_sizes, pin_chunk_sizes
from zoo.config import NOT_IN_ID, StrictConfig, check_bounds, check_choice, id_as, renamed_from

from . import parallel, tracking
from .allocator import tune_malloc
from .progress import PROGRESS_FILE, Heartbeat


PRECISIONS = ("auto", "fp32", "bf16")


def device_named(name: str) -> torch.device:
    """"auto" is CUDA where there is one, else the CPU; any other name as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclass
class TrainConfig(StrictConfig):
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    grad_clip: float = 1.0  # 0 disables clipping
    eval_every: int = 100
    checkpoint_every: int = field(default=0, metadata=id_as(lambda v: {"checkpoint_every": 0}))  # steps; 0: off; hashed as 0
    # minutes of training between checkpoints; 0: off (signals always save)
    checkpoint_minutes: float = field(default=5.0, metadata=NOT_IN_ID)
    log_every_s: float = field(default=30.0, metadata=NOT_IN_ID)  # seconds between progress.json beats and log lines
    target: float | None = None  # stop once the eval metric reaches it
    device: str = "auto"  # "auto" (cuda when available), "cpu", "cuda"
    # "auto": bf16 autocast on CUDA, fp32 on a CPU (what every committed record ran with);
    # "fp32": fp32 everywhere; "bf16": bf16 autocast on either (CPUs with AMX run bf16
    # matmuls several times faster). Parameters and optimizer state stay fp32 in all three.
    # "auto" hashes as the flag it replaced, amp: True
    precision: str = field(default="auto", metadata={**id_as(lambda v: {"amp": True} if v == "auto" else {"precision": v}),
                                                     **renamed_from("amp", {True: "auto"})})
    # Over many processes (WORLD_SIZE > 1, see tasks.engine.parallel): "ddp" replicates the
    # model, "fsdp" shards it (FSDP2). batch_size stays the global batch; each process trains
    # on its share in micro-batches of micro_batch_size (0: the whole share at once).
    # Neither changes what a run computes, so neither is part of a run's identity.
    strategy: str = field(default="ddp", metadata=NOT_IN_ID)
    micro_batch_size: int = field(default=0, metadata=NOT_IN_ID)

    def __post_init__(self):
        check_choice("TrainConfig", "device", self.device, ("auto", "cpu", "cuda"))
        check_choice("TrainConfig", "precision", self.precision, PRECISIONS)
        check_choice("TrainConfig", "strategy", self.strategy, parallel.STRATEGIES)
        check_bounds(self, "micro_batch_size", ge=0)
        # types (and a finite lr) are checked from the hints before this runs
        check_bounds(self, "steps", "batch_size", "eval_every", "lr", gt=0)
        check_bounds(self, "warmup_steps", "checkpoint_every", "weight_decay", "grad_clip", ge=0)
        check_bounds(self, "min_lr_ratio", ge=0, le=1)
        if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas):
            raise ValueError(f"TrainConfig: betas={self.betas!r} must be two numbers in [0, 1)")
        check_bounds(self, "checkpoint_minutes", ge=0)  # finite: its float hint
        check_bounds(self, "log_every_s", gt=0)

    def resolve_device(self) -> torch.device:
        return device_named(self.device)

    def micro_batch(self, world_size: int) -> int:
        """Sequences per micro-batch on each of ``world_size`` processes; raises naming the
        field when the global batch does not split evenly."""
        share, left = divmod(self.batch_size, world_size)
        if left:
            raise ValueError(f"TrainConfig: batch_size={self.batch_size} does not split over "
                             f"{world_size} processes; make it a multiple of {world_size}")
        micro = self.micro_batch_size or share
        if share % micro:
            raise ValueError(f"TrainConfig: micro_batch_size={self.micro_batch_size} must divide the "
                             f"{share} sequences each of {world_size} processes trains on per step")
        return micro

    def bf16(self, device: torch.device) -> bool:
        """Whether this run computes under bf16 autocast on ``device``."""
        return self.precision == "bf16" or (self.precision == "auto" and device.type == "cuda")

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)


@dataclass
class TrainResult:
    status: str  # "ok", "diverged", or "interrupted" (a signal that did not end the process)
    steps: int  # optimizer steps taken in total (across resumes)
    final_loss: float
    best: float | None  # best value of the eval metric
    history: list = field(default_factory=list)  # one dict per evaluation
    resumed_from: int | None = None  # step the run continued from, if it did
    stopped_early: bool = False
    wall_time: float = 0.0  # seconds across all segments of the run
    best_state: dict | None = None  # weights at the best evaluation (CPU)


class _SignalFlag:
    """SIGTERM/SIGUSR1 only set a flag: the loop checkpoints at the next step boundary,
    then hands the signal to the handler that was there before (submitit's requeue,
    or the default termination), so preemption keeps its usual meaning."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.caught: int | None = None
        self.previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._catch)
        return self

    def _catch(self, signum, frame):
        self.caught = signum

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            if handler is not None:  # None: installed outside Python, cannot be restored
                signal.signal(sig, handler)
        self.previous = {}

    def forward_signal(self):
        self.__exit__()
        signal.raise_signal(self.caught)


def decays(p: nn.Parameter) -> bool:
    """Whether weight decay applies: to matrices (nanoGPT's rule: norms, biases and scalar
    gains are left alone), except those a mixer marks ``_no_weight_decay`` (Mamba's A_log,
    RWKV's decay and mixing coefficients: mamba_ssm and fla never decay them)."""
    return p.dim() >= 2 and not getattr(p, "_no_weight_decay", False)


def no_decay_names(model: nn.Module) -> set[str]:
    """The names of the parameters ``decays`` exempts."""
    return {n for n, p in model.named_parameters() if not decays(p)}


def _optimizer(model: nn.Module, cfg: TrainConfig, no_decay: set[str]) -> torch.optim.Optimizer:
    """AdamW over the model's parameters; ``no_decay`` names those ``decays`` exempts, read
    before FSDP2 replaced the parameters (and their marks) with sharded ones."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n not in no_decay], "weight_decay": cfg.weight_decay},
              {"params": [p for n, p in named if n in no_decay], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))


def save_atomic(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-write never leaves a torn checkpoint


def _resume(ckpt: Path | None, model: nn.Module, opt: torch.optim.Optimizer, device: torch.device) -> TrainResult:
    """The result so far: from the checkpoint (model, optimizer and RNG restored) when there
    is one, else a fresh one. Every rank reads the same file (a shared file system)."""
    if ckpt is None or not ckpt.exists():
        return TrainResult(status="ok", steps=0, final_loss=float("nan"), best=None)
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    parallel.load_full_state(model, state["model"])
    parallel.load_optimizer_state(model, opt, state["optimizer"])
    torch.set_rng_state(state["rng"])
    pin_chunk_sizes(model, state.get("chunk_sizes", []))  # "auto" measures no other size than before
    if state.get("cuda_rng") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"], device)  # dropout on the GPU draws from it
    result = state["result"]
    result.resumed_from = result.steps
    return result


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer, result: TrainResult, device: torch.device) -> dict:
    """What a checkpoint holds: enough to continue bit for bit (``_resume``); the whole
    state, whatever the sharding (a collective over the ranks)."""
    return {"model": parallel.full_state(model), "optimizer": parallel.optimizer_state(model, opt),
            "rng": torch.get_rng_state(), "result": result, "chunk_sizes": chunk_sizes(model),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def _evaluate(model: nn.Module, result: TrainResult, eval_fn, metric: str, better, autocast: bool,
              device: torch.device) -> float | None:
    """Run ``eval_fn`` (on every rank: a sharded model's forward is a collective), append
    rank 0's metrics to the history, keep the best weights; the metric's value."""
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=autocast):
        metrics = eval_fn(model) if eval_fn else {}
    model.train()
    metrics = parallel.from_main({"step": result.steps, "train_loss": result.final_loss, **metrics})
    result.history.append(metrics)
    value = metrics.get(metric)
    if value is not None and (result.best is None or better(value, result.best)):
        result.best = value
        result.best_state = parallel.full_state(model)
    return value


def _step(model: nn.Module, opt: torch.optim.Optimizer, cfg: TrainConfig, batch: tuple, loss_fn,
          step: int, micro: int, autocast: bool, device: torch.device) -> float:
    """Optimiser step ``step`` on the global ``batch``: this rank's share in micro-batches of
    ``micro``, each loss weighted by its share of the step, gradients averaged over the
    ranks, the schedule's lr, clipping when asked. The step's loss (the mean over ranks),
    or a non-finite loss, before any update."""
    for group in opt.param_groups:
        group["lr"] = cfg.lr_at(step)
    opt.zero_grad(set_to_none=True)
    parts = parallel.micro_batches(batch, micro)
    alone = parallel.world().size == 1
    total = 0.0
    for i, part in enumerate(parts):
        with parallel.no_sync(model, last=i == len(parts) - 1):
            with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
                loss = loss_fn(model, part) / len(parts)
            total += loss.item()
            if alone and not math.isfinite(total):
                break  # diverged: nothing else to compute
            # With other ranks, a rank whose loss is NaN still runs every backward: each
            # one is a collective (DDP's all-reduce, FSDP2's gathers), and a rank that left
            # early would leave the others waiting forever. The decision comes below.
            loss.backward()
    loss = parallel.mean(total, device)  # NaN on any rank is NaN on all: every rank stops
    if not math.isfinite(loss):
        return loss
    if cfg.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    return loss


def _place(cfg: TrainConfig) -> tuple[torch.device, parallel.World]:
    """The device this process trains on (its rank's GPU in a multi-process job) and the
    process group it belongs to."""
    device = cfg.resolve_device()
    world = parallel.init_from_env(device.type)
    if device.type == "cuda" and world.size > 1:
        device = torch.device("cuda", torch.cuda.current_device())  # this rank's GPU
    return device, world


def _save_due(cfg: TrainConfig, result: TrainResult, last_save: float) -> bool:
    """Whether this step saves: every ``checkpoint_every`` steps, or ``checkpoint_minutes`` after the last save."""
    return bool((cfg.checkpoint_every and result.steps % cfg.checkpoint_every == 0)
                or (cfg.checkpoint_minutes and time.monotonic() - last_save >= 60 * cfg.checkpoint_minutes))


def _interrupted(result: TrainResult, beats, bar, flag) -> None:
    """A signal stops the run after its checkpoint: said in the heartbeat, then passed on."""
    result.status = "interrupted"  # stays so only if the signal is ignored
    beats.finish("interrupted")
    bar.close()
    if flag.caught is not None:
        flag.forward_signal()  # usually does not return


def _log_step(result: TrainResult, cfg: TrainConfig, step: int, loss: float, tokens_per_step: int | None,
              t_step: float) -> float:
    """The step's loss, rate and tokens/s to the tracker; returns the time it was logged."""
    now = time.perf_counter()
    tracking.log(result.steps, {"train/loss": loss, "train/lr": cfg.lr_at(step),
                             "train/tokens_per_s": (tokens_per_step or 0) / max(now - t_step, 1e-9)})
    return now


def _evaluate_and_log(model: nn.Module, result: TrainResult, cfg: TrainConfig, eval_fn, metric: str, better,
                      autocast: bool, device: torch.device, main: bool, bar) -> None:
    """An evaluation (``_evaluate``), sent to the tracker, and the early stop at ``cfg.target``."""
    value = _evaluate(model, result, eval_fn, metric, better, autocast, device)
    if main and tracking.active():
        tracking.log(result.steps, {f"eval/{k}": v for k, v in result.history[-1].items() if k != "step"})
        if hasattr(model, "backends"):
            tracking.text("backends", json.dumps(model.backends()), result.steps)
        tracking.flush()
    result.stopped_early = cfg.target is not None and value is not None and not better(cfg.target, value)
    if result.best is not None:
        bar.set_postfix(loss=f"{result.final_loss:.4f}", best=f"{result.best:.4g}")


def _save(ckpt: Path, model: nn.Module, opt, result: TrainResult, device: torch.device, main: bool, beats) -> None:
    """A checkpoint: every rank takes part in the snapshot (a collective), rank 0 writes it."""
    snapshot = _snapshot(model, opt, result, device)
    if main:
        save_atomic(ckpt, snapshot)
        beats.saved()


def train(model: nn.Module, cfg: TrainConfig, batch_fn: Callable[[int], tuple],
          loss_fn: Callable[[nn.Module, tuple], torch.Tensor],
          eval_fn: Callable[[nn.Module], dict] | None = None, metric: str = "loss",
          higher_is_better: bool = False, checkpoint: str | Path | None = None,
          progress: bool = True, desc: str = "train", tokens_per_step: int | None = None) -> TrainResult:
    """Train ``model`` in place. ``batch_fn(step)`` gives the step's batch (tensors),
    ``loss_fn(model, batch)`` its loss, ``eval_fn(model)`` a dict holding ``metric``.
    Progress goes to ``progress.json`` beside the checkpoint and, when the bar is off or
    stderr is no terminal, to stdout as plain lines (tokens/s when ``tokens_per_step`` is known)."""
    tune_malloc()  # a step's large temporaries keep their pages (engine.allocator)
    device, world = _place(cfg)
    micro = cfg.micro_batch(world.size)
    model.to(device)
    no_decay = no_decay_names(model)  # before the wrap: FSDP2 replaces the parameters
    wrapped = parallel.wrap(model, cfg.strategy, device)  # what the steps call: the model, DDP or FSDP2
    opt = _optimizer(model, cfg, no_decay)
    ckpt = Path(checkpoint) if checkpoint else None
    result = _resume(ckpt, model, opt, device)
    better = (lambda a, b: a > b) if higher_is_better else (lambda a, b: a < b)
    autocast, progress = cfg.bf16(device), progress and world.main

    start = time.perf_counter() - result.wall_time
    model.train()
    bar = tqdm(total=cfg.steps, initial=result.steps, desc=desc, disable=not progress, leave=False)
    beats = Heartbeat(result, cfg.steps, ckpt.with_name(PROGRESS_FILE) if ckpt and world.main else None, cfg.log_every_s,
                      tokens_per_step, metric, lines=world.main and (not progress or not sys.stderr.isatty()))
    last_save = time.monotonic()
    t_step = time.perf_counter()
    with _SignalFlag() as flag, beats:
        while result.steps < cfg.steps and not result.stopped_early:
            step = result.steps
            batch = tuple(t.to(device, non_blocking=True) for t in batch_fn(step))
            loss = _step(wrapped, opt, cfg, batch, loss_fn, step, micro, autocast, device)
            if not math.isfinite(loss):
                result.status, result.final_loss = "diverged", loss
                break
            result.steps, result.final_loss = step + 1, loss
            if world.main and tracking.active():
                t_step = _log_step(result, cfg, step, loss, tokens_per_step, t_step)
            bar.update(1)
            bar.set_postfix(loss=f"{result.final_loss:.4f}", refresh=False)
            if result.steps % cfg.eval_every == 0 or result.steps == cfg.steps:
                _evaluate_and_log(model, result, cfg, eval_fn, metric, better, autocast, device, world.main, bar)
            result.wall_time = time.perf_counter() - start
            # every rank saves (a collective) and stops at the same step, whichever rank's
            # clock or signal came first
            periodic, caught = parallel.any_rank([_save_due(cfg, result, last_save), flag.caught is not None], device)
            if ckpt is not None and (periodic or caught):
                _save(ckpt, model, opt, result, device, world.main, beats)
                last_save = time.monotonic()
            if beats.due():
                beats.beat()
                tracking.flush()
            if caught:
                _interrupted(result, beats, bar, flag)
                break
    bar.close()
    result.wall_time = time.perf_counter() - start
    beats.finish({"ok": "done"}.get(result.status, result.status))
    return result
