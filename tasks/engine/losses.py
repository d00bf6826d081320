"""The losses and scores a task trains and tests on: next-token cross-entropy over every
position, or over the labelled ones only (MQAR and MAD label a few positions per sequence)."""
from __future__ import annotations

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
    lm = getattr(model, "module", model)  # a zoo LM, or a zoo LM inside DDP
    if isinstance(lm, zoo.LM):
        # through the module's own forward, so that DDP and FSDP2 see the call
        return model(inputs, keep=keep).float()  # (N, V)
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
    the whole split: Zoology's test metric (MAD's is ``tasks.mad.task.mad_metrics``)."""
    correct = total = 0
    loss_sum = 0.0
    for _, picked, labels in labelled_batches(model, inputs, targets, batch_size):
        correct += (picked.argmax(-1) == labels).sum().item()
        total += len(labels)
        loss_sum += F.cross_entropy(picked, labels, reduction="sum").item()
    return {"accuracy": correct / total, "test_loss": loss_sum / total}
