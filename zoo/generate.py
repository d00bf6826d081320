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
    generator of its own (the global RNG is not touched): seeded by ``seed`` (the same
    seed, the same text), else from fresh randomness (every call different). The model
    runs in eval mode, as dropout would make the step form disagree with the parallel
    one, and is left in the mode it came in."""
    check_sampling(prompt, new_tokens, temperature, top_k, seed)
    was_training = model.training
    model.eval()
    try:
        gen = None
        if temperature > 0:
            gen = torch.Generator(device=prompt.device)
            if seed is None:
                gen.seed()  # nondeterministic
            else:
                gen.manual_seed(seed)
        param = next(model.parameters())
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
    finally:
        model.train(was_training)


def check_sampling(prompt: torch.Tensor, new_tokens, temperature, top_k, seed) -> None:
    """generate's arguments, each refused in one line naming it and what it must be."""
    def whole(v):
        return isinstance(v, int) and not isinstance(v, bool)
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"generate: prompt must be (batch, length >= 1) token ids, got shape {tuple(prompt.shape)}")
    if not whole(new_tokens) or new_tokens < 0:
        raise ValueError(f"generate: new_tokens={new_tokens!r} must be a whole number >= 0")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            0 <= temperature < float("inf")):
        raise ValueError(f"generate: temperature={temperature!r} must be a finite number >= 0 (0: greedy)")
    if top_k is not None and (not whole(top_k) or top_k < 1):
        raise ValueError(f"generate: top_k={top_k!r} must be None or a whole number >= 1")
    if seed is not None and not whole(seed):
        raise ValueError(f"generate: seed={seed!r} must be None (fresh randomness) or a whole number")


def pick(logits: torch.Tensor, temperature: float, top_k: int | None, gen: torch.Generator | None) -> torch.Tensor:
    """The next token of each sequence from its logits (B, V)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float()
    if top_k is not None and top_k < logits.shape[-1]:
        # exactly k candidates: a threshold at the k-th value would also keep every tie with it
        values, index = logits.topk(top_k, dim=-1)  # (B, k)
        logits = torch.full_like(logits, float("-inf")).scatter(-1, index, values)
    # shifted first, so that a tiny temperature gives 0 for the best and -inf for the rest
    # rather than inf - inf
    scaled = (logits - logits.amax(-1, keepdim=True)) / temperature
    return torch.multinomial(scaled.softmax(-1), 1, generator=gen)[:, 0]
