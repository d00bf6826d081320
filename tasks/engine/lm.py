"""A language model trained on token streams: what every LM task shares (Wikitext-2, any
corpus). The training stream is cut into contiguous chunks of L tokens, visited in a
fresh seeded order each epoch; evaluation scores the contiguous chunks of a split, and
the test perplexity is measured with the weights of the best validation evaluation,
which the run then leaves in its workdir (``weights.pt``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import zoo
from zoo.flops import flops

from .batches import epoch_indices
from .losses import lm_loss
from .runs import checkpoint_path, model_metadata, run_fields, save_weights, score_best
from .train import TrainConfig, TrainResult, train


class Chunks:
    """Contiguous (input, target) chunks of L tokens of one stream: chunk i holds
    tokens [iL, iL + L) and their successors."""

    def __init__(self, ids: torch.Tensor, seq_len: int, max_tokens: int | None = None):
        n = (len(ids) - 1) // seq_len
        if max_tokens is not None:
            n = min(n, math.ceil(max_tokens / seq_len))
        if n < 1:
            raise ValueError(f"a stream of {len(ids)} tokens has no chunk of {seq_len}")
        self.ids, self.L, self.n = ids, seq_len, n

    def get(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = idx[:, None] * self.L + torch.arange(self.L + 1)  # (B, L+1)
        x = self.ids[pos].long()
        return x[:, :-1], x[:, 1:]


def train_batches(chunks: Chunks, batch_size: int, seed: int):
    """``batch_fn(step)``: batch ``step`` of an endless run of epochs over the chunks, each
    a fresh seeded order (``epoch_indices``)."""
    pick = epoch_indices(chunks.n, batch_size, seed)
    return lambda step: chunks.get(pick(step))


@torch.no_grad()
def perplexity(model, chunks: Chunks, batch_size: int) -> float:
    """exp of the mean next-token loss over every scored token of the chunks."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, chunks.n, batch_size):
        x, y = chunks.get(torch.arange(start, min(start + batch_size, chunks.n)))
        logits = model(x.to(device))  # (B, L, V)
        total += F.cross_entropy(logits.flatten(0, 1).float(), y.to(device).flatten(), reduction="sum").item()
        count += y.numel()
    return math.exp(total / count)



@dataclass
class Fit:
    result: TrainResult
    train: TrainConfig  # the loop's config: steps, evaluation cadence and warm-up from the budget
    record: dict  # the record fields every LM task reports


def fit_lm(model: zoo.LM, streams: dict, seq_len: int, tcfg: TrainConfig, seed: int,
           budget_tokens: int | None, epochs: float, eval_every_tokens: int | None, eval_tokens: int | None,
           workdir: Path | None, progress: bool, desc: str) -> Fit:
    """Train ``model`` on ``streams["train"]`` (a 1-D tensor of token ids) for
    ``budget_tokens`` (else ``epochs`` passes), evaluating validation perplexity every
    ``eval_every_tokens`` (else once per epoch) on at most ``eval_tokens`` of
    ``streams["valid"]``; then the test perplexity with the best weights, which stay
    loaded and are saved to ``workdir``."""
    mcfg = model.cfg
    L, B = seq_len, tcfg.batch_size
    train_chunks = Chunks(streams["train"], L)
    valid, test = (Chunks(streams[s], L, eval_tokens) for s in ("valid", "test"))
    tokens_per_step = B * L
    steps_per_epoch = math.ceil(train_chunks.n / B)
    budget = budget_tokens or epochs * train_chunks.n * L
    steps = max(1, math.ceil(budget / tokens_per_step))
    every = math.ceil(eval_every_tokens / tokens_per_step) if eval_every_tokens else steps_per_epoch
    # A short run of a long preset keeps its shape: warm-up is capped at a tenth of the run.
    tcfg = tcfg.replace(steps=steps, eval_every=min(every, steps),
                        warmup_steps=min(tcfg.warmup_steps, max(1, steps // 10)))

    torch.manual_seed(seed)  # dropout: a rerun of the same config is the same run
    result = train(model, tcfg, train_batches(train_chunks, B, seed), loss_fn=lm_loss,
                   eval_fn=lambda m: {"val_ppl": perplexity(m, valid, B)}, metric="val_ppl",
                   checkpoint=checkpoint_path(workdir), progress=progress, tokens_per_step=tokens_per_step,
                   desc=desc)
    test_ppl = score_best(model, result, tcfg, lambda m: perplexity(m, test, B))
    if result.best_state is not None:
        save_weights(workdir, model)  # the best weights, which score_best has loaded
    cost = flops(model, B, L)  # the training step's estimate, for curves at equal compute
    record = {
        "mixer": mcfg.name, "layout": mcfg.layout,
        "mixer_options": json.dumps(mcfg.mixer_options, sort_keys=True),
        "d_model": mcfg.d_model, "n_layers": mcfg.n_layers, **run_fields(result, tcfg, seed),
        "seq_len": L, "batch_size": B,
        "train_tokens": len(streams["train"]), "budget_tokens": budget_tokens,
        "warmup_steps": tcfg.warmup_steps,
        "tokens_seen": result.steps * tokens_per_step, "epochs_seen": result.steps / steps_per_epoch,
        "val_tokens_scored": valid.n * L, "test_tokens_scored": test.n * L,
        "eval_steps": [h["step"] for h in result.history],
        "val_ppl_history": [h.get("val_ppl") for h in result.history],
        "train_loss_history": [h.get("train_loss") for h in result.history],
        "train_flops_per_token": cost["fwd_bwd"] / (B * L) if cost else None,
        "best_val_ppl": result.best, "test_ppl": test_ppl, "final_train_loss": result.final_loss,
        **model_metadata(model, L),
    }
    return Fit(result, tcfg, record)
