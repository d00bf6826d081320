"""The mixer contract every member of the zoo follows.

A mixer is an ``nn.Module`` built as ``Mixer(d_model, **options)`` that maps
``x: (B, L, D) -> (B, L, D)`` causally: output t may depend on inputs 0..t only.
Options are the keyword arguments of the subclass's ``__init__``; anything else is
refused with a ValueError that lists the valid names, so a typo in a sweep file
fails at construction instead of silently running the default.
"""
from __future__ import annotations

import functools
import inspect

import torch.nn as nn

from ..config import check_choice  # noqa: F401  (re-exported for the mixers)


class Mixer(nn.Module):
    name: str = "mixer"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            return
        init = cls.__init__
        params = list(inspect.signature(init).parameters)[2:]  # drop self, d_model
        valid = tuple(p for p in params if p != "kwargs")

        @functools.wraps(init)
        def checked_init(self, d_model: int, **options):
            unknown = sorted(set(options) - set(valid))
            if unknown and "kwargs" not in params:
                raise ValueError(
                    f"{cls.name}: unknown option(s) {unknown}; valid options: {sorted(valid)}"
                )
            init(self, d_model, **options)
            self.d_model = d_model

        cls.__init__ = checked_init
        cls.option_names = valid

    # The implementation the last forward actually ran ("sdpa", "flash_attn",
    # "torch_chunked", "mamba_ssm", ...). Recorded with every result.
    backend: str = "torch"

    # Where the fast path comes from, for the README's table and the records.
    fast_path: str = "none (pure PyTorch)"

    # True when the output already contains the input (the Grassmann blend
    # a*h + (1-a)*g): the post-LN block then adds no second residual.
    includes_residual: bool = False

    # Whether a block of this mixer has an MLP when ModelConfig.d_ff is left unset
    # (Mamba's blocks conventionally have none).
    uses_mlp: bool = True

    def state_size(self, seq_len: int) -> int:
        """Floats of recurrent/cache state one sequence needs at inference after
        ``seq_len`` tokens (zoology's convention: KV cache for attention, the
        fixed recurrent state for SSMs / linear attention)."""
        raise NotImplementedError


def check_positive(name: str, value: int, what: str) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: {what} must be a positive integer, got {value!r}")


def check_divisible(name: str, d_model: int, n_heads: int) -> None:
    check_positive(name, n_heads, "n_heads")
    if d_model % n_heads:
        raise ValueError(
            f"{name}: d_model={d_model} is not divisible by n_heads={n_heads}"
        )
