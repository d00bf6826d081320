"""What every task's ``run`` shares, so that a task is one file (its config, data, metric
and ``run``): the LM losses, the seeded epoch order, the checkpoint path, the refusal to
train a non-causal model, the test score with the best validation weights, and the
fields every record carries. The data cache location is ``tasks.data.cache_root``."""
from __future__ import annotations

import argparse
import csv
import functools
import json
import platform
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import zoo


def lm_loss(model, batch) -> torch.Tensor:
    """Next-token cross-entropy; targets of -100 are ignored (MQAR's unlabelled slots)."""
    inputs, targets = batch
    logits = model(inputs)  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def labelled_logits(model, inputs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(N, V) float32 logits at the N positions where ``keep`` (B, L) is True. A zoo LM
    applies its head there alone: a task that labels few positions (MQAR labels the
    queried values, kv of L) would otherwise spend most of a CPU step on (B, L, V)
    logits. Any other module is called whole."""
    if isinstance(model, zoo.LM):
        return model.head(model.features_embedded(model.embed(inputs))[keep]).float()  # (N, V)
    return model(inputs)[keep].float()


def labelled_lm_loss(model, batch) -> torch.Tensor:
    """``lm_loss`` computed from the labelled positions' logits only: the same loss."""
    inputs, targets = batch
    keep = targets != -100
    return F.cross_entropy(labelled_logits(model, inputs, keep), targets[keep])


def labelled_batches(model, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int):
    """Per batch of ``batch_size`` sequences: (its sequence count, the (N, V) float32 logits
    at its N labelled positions, their (N,) labels). Call under torch.no_grad()."""
    device = next(model.parameters()).device
    for s in range(0, len(inputs), batch_size):
        x, y = inputs[s:s + batch_size].to(device), targets[s:s + batch_size].to(device)
        keep = y != -100
        yield len(x), labelled_logits(model, x, keep), y[keep]


@torch.no_grad()
def labelled_accuracy(model, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int) -> dict:
    """Accuracy and mean loss over the labelled positions (targets not -100), pooled over
    the whole split: Zoology's test metric (MAD's is ``tasks.mad.mad_metrics``)."""
    correct = total = 0
    loss_sum = 0.0
    for _, picked, labels in labelled_batches(model, inputs, targets, batch_size):
        correct += (picked.argmax(-1) == labels).sum().item()
        total += len(labels)
        loss_sum += F.cross_entropy(picked, labels, reduction="sum").item()
    return {"accuracy": correct / total, "test_loss": loss_sum / total}


def epoch_indices(n: int, batch_size: int, seed: int):
    """``indices(step)``: the example indices of batch ``step`` in an endless run of
    epochs over ``n`` examples, each epoch a fresh permutation seeded by (seed, epoch).
    A pure function of the step: the training loop resumes exactly on it."""

    @functools.lru_cache(maxsize=2)
    def order(epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0]))
        return torch.randperm(n, generator=g)

    def indices(step: int) -> torch.Tensor:
        flat = torch.arange(step * batch_size, (step + 1) * batch_size)
        epochs, out = flat // n, torch.empty(batch_size, dtype=torch.long)
        for e in epochs.unique().tolist():  # a batch may straddle two epochs
            sel = epochs == e
            out[sel] = order(e)[flat[sel] % n]
        return out
    return indices


def checkpoint_path(workdir: Path | None) -> Path | None:
    """Where a run checkpoints (and a requeued or rerun job resumes): ``workdir/checkpoint.pt``."""
    if workdir is None:
        return None
    Path(workdir).mkdir(parents=True, exist_ok=True)
    return Path(workdir) / "checkpoint.pt"


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
    model.load_state_dict(result.best_state)
    model.eval()
    device = tcfg.resolve_device()
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda" and tcfg.amp):
        return score(model)


def run_fields(result, tcfg, seed: int) -> dict:
    """The record fields of every run: how it ended, how long it took, where it ran."""
    return {"seed": seed, "status": result.status, "steps": result.steps, "wall_time": result.wall_time,
            "resumed_from": result.resumed_from, **environment(tcfg.resolve_device(), tcfg.amp)}


def model_metadata(model: zoo.LM, seq_len: int) -> dict:
    """Size and state of a built model: the fields every record reports."""
    return {
        "params": zoo.count_params(model),
        "params_no_embeddings": zoo.count_params(model, include_embeddings=False),
        "state_size": model.state_size(seq_len),
        "backends": model.backends(),
    }


def environment(device: torch.device, amp: bool) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    bf16 = device.type == "cuda" and amp
    return {"device": device.type, "device_name": name, "dtype": "bfloat16" if bf16 else "float32",
            "torch": torch.__version__}


def apply_sets(cfg, sets: list[str]):
    """A config with ``a.b=value`` overrides applied (values parsed as JSON, else kept
    as strings); unknown keys fail in the config's own from_dict."""
    data = cfg.to_dict()
    for item in sets:
        key, _, text = item.partition("=")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        *path, last = key.split(".")
        node = data
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return type(cfg).from_dict(data)


def add_run_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags every task CLI shares: seed, device, checkpoint folder, record file, overrides."""
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--workdir", type=Path, default=None, help="checkpoint.pt lives here (resume)")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON record here")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override any config field, e.g. model.n_layers=2 or train.lr=3e-4")


def run_from_cli(cfg, args: argparse.Namespace, run, show) -> dict:
    """Apply --device and --set, run, write --out, print ``show(record)``."""
    # a training task's device is its train.device; a measuring task (scaling) has its own
    cfg = cfg.replace(train=cfg.train.replace(device=args.device)) if hasattr(cfg, "train") \
        else cfg.replace(device=args.device)
    cfg = apply_sets(cfg, args.set)
    record = run(cfg, args.workdir)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))
    print(show(record))
    return record


def write_csv(rows: list[dict], path: Path) -> None:
    """``rows`` (dicts with the first row's keys) to a CSV at ``path``, folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {path}")


def zoo_positions(mixer: str, options: dict | None = None) -> str:
    """Zoology's rule: learned positions for the mixers that are blind to token order
    without them (softmax attention and its local form), none for the others, nor for
    attention with rotary positions. Asked of the mixer (``Mixer.needs_positions``), so
    a new mixer needs no entry here."""
    cls = zoo.MIXERS.get(mixer)  # an unknown name is refused by ModelConfig, with the valid ones
    own = cls is not None and cls.needs_positions and not (options or {}).get("rotary")
    return "learned" if own else "none"
