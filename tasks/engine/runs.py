"""What every run shares around its training loop: the checkpoint path, the refusal to
train a non-causal model, the test score with the best validation weights, and the fields
every record carries (model size, device, and where and with what code it ran)."""
from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

import zoo

from . import parallel
from .allocator import malloc_tuned
from .train import save_atomic

REPO = Path(__file__).resolve().parents[2]  # the checkout: its git commit goes in every record
PACKAGES = ("torch", "numpy", "triton", "mamba-ssm", "causal-conv1d", "flash-attn", "submitit", "linbench")


def checkpoint_path(workdir: Path | None) -> Path | None:
    """Where a run checkpoints (and a requeued or rerun job resumes): ``workdir/checkpoint.pt``."""
    if workdir is None:
        return None
    Path(workdir).mkdir(parents=True, exist_ok=True)
    return Path(workdir) / "checkpoint.pt"



def weights_path(workdir: str | Path) -> Path:
    """Where a finished run leaves its model: ``workdir/weights.pt`` (the best validation
    weights and the config that builds them), which ``linbench sample`` reads."""
    return Path(workdir) / "weights.pt"


def save_weights(workdir: str | Path | None, model: zoo.LM) -> None:
    """Write ``weights_path``: the model's whole state, gathered over the ranks of a
    sharded run (every rank calls this), written by rank 0."""
    if workdir is None:
        return
    state = parallel.full_state(model)
    if not parallel.world().main:
        return
    path = weights_path(workdir)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomic(path, {"model_config": model.cfg.to_dict(), "model": state})


def load_weights(path: str | Path) -> zoo.LM:
    """The model ``save_weights`` left, in eval mode on the CPU."""
    saved = torch.load(path, map_location="cpu", weights_only=False)
    model = zoo.build_model(zoo.ModelConfig.from_dict(saved["model_config"]))
    model.load_state_dict(saved["model"])
    return model.eval()


def refuse_non_causal(model: zoo.LM, task: str) -> None:
    """A causal task's model that sees the tokens after t measures nothing: refuse it."""
    try:
        zoo.assert_causal(model)
    except zoo.CausalityError as e:
        cfg = model.cfg
        raise ValueError(f"{task}: refusing to train a non-causal model: mixer {cfg.mixer!r} with options "
                         f"{cfg.mixer_options} (layer options {cfg.layer_options}, hybrid {cfg.hybrid or None}) "
                         f"fails zoo.assert_causal: {e}") from e



def score_best(model: torch.nn.Module, result, tcfg, score):
    """``score(model)`` with the weights of the best validation evaluation (the test
    number a run reports), or None when no evaluation ran (a run that diverged first)."""
    if result.best_state is None:
        return None
    parallel.load_full_state(model, result.best_state)
    model.eval()
    device = tcfg.resolve_device()
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=tcfg.bf16(device)):
        return score(model)



def run_fields(result, tcfg, seed: int) -> dict:
    """The record fields of every run: how it ended, how long it took, where it ran, on how
    many processes and in what precision ("bf16": autocast; ``dtype`` says the same as a
    torch dtype's name), and whether the allocator kept large blocks (engine.allocator)."""
    device = tcfg.resolve_device()
    bf16 = tcfg.bf16(device)
    w = parallel.world()
    return {"seed": seed, "status": result.status, "steps": result.steps, "wall_time": result.wall_time,
            "resumed_from": result.resumed_from, **environment(device), "malloc_tuned": malloc_tuned(),
            "dtype": "bfloat16" if bf16 else "float32", "precision": "bf16" if bf16 else "fp32",
            # how many processes trained it, and how (one: no strategy)
            "world_size": w.size, "strategy": tcfg.strategy if w.size > 1 else None,
            "micro_batch_size": tcfg.micro_batch(w.size)}



def model_metadata(model: zoo.LM, seq_len: int) -> dict:
    """Size and state of a built model: the fields every record reports."""
    return {
        "params": zoo.count_params(model),
        "params_no_embeddings": zoo.count_params(model, include_embeddings=False),
        "state_size": model.state_size(seq_len),
        "backends": model.backends(),
        "chunk_sizes": model.chunk_sizes(),
    }



def environment(device: torch.device) -> dict:
    """Where a run computed (a benchmark adds the dtype it measured in)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {"device": device.type, "device_name": name, "torch": torch.__version__}


def cpu_name() -> str:
    """The CPU's model name and the wide-vector features that change CPU timings several
    fold (bf16 matmuls on AMX), e.g. "Intel(R) Xeon(R) Processor [avx512f, amx_bf16]":
    CPU times compare only within one machine, so every record says which it was."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "cpu"
    fields = dict(line.split(":", 1) for line in info.splitlines()[:40] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    features = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in fields.get("flags", "").split()]
    return f"{fields.get('model name', platform.processor() or 'cpu')} [{', '.join(features) or 'no avx2'}]"


def _git(*args) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def provenance() -> dict:
    """Where and with what a run ran; the task's record adds device, dtype and backends."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    status = _git("status", "--porcelain", "--untracked-files=no")
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "packages": versions,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "slurm_job_id": f"{job}_{task}" if job and task else job,
    }


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
