"""The registry of sequence mixers: a new mixer is one file and one line here."""
from __future__ import annotations

from .attention import Attention, SlidingWindowAttention
from .base import Mixer

MIXERS: dict[str, type[Mixer]] = {
    "attention": Attention,
    "sliding_window": SlidingWindowAttention,
}


def build_mixer(name: str, d_model: int, **options) -> Mixer:
    if name not in MIXERS:
        raise ValueError(f"unknown mixer {name!r}; valid mixers: {sorted(MIXERS)}")
    return MIXERS[name](d_model, **options)
