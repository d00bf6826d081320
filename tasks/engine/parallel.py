"""One run on many processes: data parallel (DDP) or sharded (FSDP2's ``fully_shard``).

A run's processes are started by torchrun, by Slurm through submitit (one task per GPU;
``sweeps.jobs`` exports the rendezvous with submitit's ``TorchDistributedEnvironment``) or
by a test; each finds RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in its
environment and ``init_from_env`` joins the group (NCCL on CUDA, gloo on a CPU). The
training loop then asks ``world()`` and, with more than one process:

- every rank draws the same global batch (``batch_fn(step)``, a pure function of the step)
  and trains on its own contiguous slice of it, in micro-batches when the config asks for
  gradient accumulation, so the data order is that of one process with the same global
  batch and the averaged gradient is the same mean (exactly so where every micro-batch
  has the same number of loss terms, as in the LM tasks: the mean of equal-sized means);
- the model is wrapped once (``wrap``): DDP replicates it and all-reduces gradients during
  the backward pass; FSDP2 shards every block and the rest (embeddings, final norm, head)
  and gathers each unit's parameters around its forward and backward;
- checkpoints and best weights hold the full (unsharded) state, gathered by
  torch.distributed.checkpoint's state-dict helpers, so a checkpoint written by 2 ranks
  resumes on 1 or 4, and rank 0 alone writes files, records and progress.
"""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

STRATEGIES = ("ddp", "fsdp")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Whether this process writes files, records and progress (rank 0)."""
        return self.rank == 0


def world() -> World:
    """The process group this process trains in; one process when there is none."""
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))


def init_from_env(device_type: str = "cpu") -> World:
    """Join the process group described by the environment (RANK, WORLD_SIZE, ...), once;
    a process started without WORLD_SIZE > 1 trains alone. On CUDA each process takes the
    GPU of its LOCAL_RANK."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size > 1 and dist.is_available() and not dist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                                timeout=datetime.timedelta(minutes=30))
    return world()


def wrap(model: nn.Module, strategy: str, device: torch.device) -> nn.Module:
    """The module the loop calls: ``model`` itself for one process, else DDP around it or
    the model sharded in place by FSDP2 (each block a unit, the root holding the rest)."""
    if world().size == 1:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard
    for block in getattr(model, "blocks", ()):
        fully_shard(block)
    fully_shard(model)
    return model


def full_state(model: nn.Module) -> dict:
    """The model's whole state dict on the CPU: on rank 0, and {} on the others (a
    collective with more than one process)."""
    if world().size == 1:
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(model: nn.Module, state: dict) -> None:
    """Load a whole state dict (``full_state``'s, or a checkpoint's) into ``model``, sharded
    or not; with more than one process rank 0's is sent to all (the others' may be {})."""
    if world().size == 1:
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    # a copy: the helper replaces the values of the dict it is given by its shards
    set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True,
                                                                      broadcast_from_rank0=True))


def optimizer_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """The optimizer's whole state (rank 0; {} on the others), as ``full_state``."""
    if world().size == 1:
        return opt.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    return get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
    if world().size == 1:
        opt.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    set_optimizer_state_dict(model, opt, state, options=StateDictOptions(full_state_dict=True,
                                                                         broadcast_from_rank0=True))


def mean(value: float, device: torch.device) -> float:
    """The mean of ``value`` over the ranks (itself for one process)."""
    if world().size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / world().size


def any_rank(flags: list[bool], device: torch.device) -> list[bool]:
    """Each flag true on any rank: decisions every rank must take together (checkpoint
    now, stop now) although a signal or a clock reached them at different steps."""
    if world().size == 1:
        return flags
    t = torch.tensor([int(f) for f in flags], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def from_main(obj):
    """Rank 0's ``obj`` on every rank."""
    if world().size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def micro_batches(batch: tuple, micro_batch_size: int) -> list[tuple]:
    """This rank's slice of the global ``batch`` (every tensor's first axis), in
    micro-batches of ``micro_batch_size``."""
    w = world()
    if not batch or (w.size == 1 and micro_batch_size >= batch[0].shape[0]):
        return [batch]  # one process, one micro-batch: the batch as it is
    n = batch[0].shape[0]
    per_rank = n // w.size
    mine = tuple(t[w.rank * per_rank:(w.rank + 1) * per_rank] for t in batch)
    return [tuple(t[s:s + micro_batch_size] for t in mine) for s in range(0, per_rank, micro_batch_size)]


def no_sync(net: nn.Module, last: bool):
    """Skip the gradient all-reduce (DDP) or reduce-scatter (FSDP2) on every micro-batch
    but the last of a step."""
    if world().size == 1 or last:
        if hasattr(net, "set_requires_gradient_sync"):
            net.set_requires_gradient_sync(True)
        return contextlib.nullcontext()
    if hasattr(net, "no_sync"):
        return net.no_sync()
    net.set_requires_gradient_sync(False)  # FSDP2: a flag, no context manager
    return contextlib.nullcontext()
