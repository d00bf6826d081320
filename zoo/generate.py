"""Text generation through the step form: prefill the prompt once, then one decode step
per new token, each layer carrying its own state (a KV cache, a window, a fixed
recurrent state), so a fixed-state model's cost per token does not grow with what it
has generated."""
from __future__ import annotations

import torch

from .model import LM


@torch.inference_mode()
def generate(model: LM, prompt: torch.Tensor, new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, seed: int | None = None) -> torch.Tensor:
    """prompt (B, P) token ids, P >= 1 -> (B, P + new_tokens).

    ``temperature`` 0 is greedy (argmax); above 0 each token is drawn from
    softmax(logits / temperature), restricted to the ``top_k`` likeliest when given, from a
    generator seeded by ``seed`` (the same seed, the same text; the global RNG is not
    touched). The model is put in eval mode: dropout would make the step form disagree
    with the parallel one."""
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"generate: prompt must be (batch, length >= 1) token ids, got shape {tuple(prompt.shape)}")
    if new_tokens < 0 or temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(f"generate: new_tokens={new_tokens} and temperature={temperature} must be >= 0, "
                         f"top_k={top_k} None or >= 1")
    model.eval()
    param = next(model.parameters())
    gen = None
    if temperature > 0:
        gen = torch.Generator(device=prompt.device)
        gen.manual_seed(0 if seed is None else seed)
    state = model.init_state(prompt.shape[0], prompt.device, param.dtype)
    logits, state = model.prefill(prompt, state)
    logits = logits[:, -1]  # (B, V): the next token's
    out = [prompt]
    for i in range(new_tokens):
        token = pick(logits, temperature, top_k, gen)  # (B,)
        out.append(token[:, None])
        if i + 1 < new_tokens:  # the last token's logits are never read
            logits, state = model.step(token, state)
    return torch.cat(out, 1)


def pick(logits: torch.Tensor, temperature: float, top_k: int | None, gen: torch.Generator | None) -> torch.Tensor:
    """The next token of each sequence from its logits (B, V)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]
