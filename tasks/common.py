"""What every task shares: the LM loss, and the metadata every record carries."""
from __future__ import annotations

import platform

import torch
import torch.nn.functional as F

import zoo


def lm_loss(model, batch) -> torch.Tensor:
    """Next-token cross-entropy; targets of -100 are ignored (MQAR's unlabelled slots)."""
    inputs, targets = batch
    logits = model(inputs)  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


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
