"""The registry of sequence mixers: a new mixer is one file and one line here."""
from __future__ import annotations

from .attention import Attention, SlidingWindowAttention
from .base import Mixer
from .gated_deltanet import GatedDeltaNet
from .gla import GLA
from .retnet import RetNet
from .rwkv6 import RWKV6
from .grassmann import Grassmann
from .mamba import Mamba
from .mamba2 import Mamba2

MIXERS: dict[str, type[Mixer]] = {
    "attention": Attention,
    "sliding_window": SlidingWindowAttention,
    "mamba": Mamba,
    "mamba2": Mamba2,
    "grassmann": Grassmann,
    "rwkv6": RWKV6,
    "retnet": RetNet,
    "gated_deltanet": GatedDeltaNet,
    "gla": GLA,
}


def build_mixer(name: str, d_model: int, **options) -> Mixer:
    if name not in MIXERS:
        raise ValueError(f"unknown mixer {name!r}; valid mixers: {sorted(MIXERS)}")
    return MIXERS[name](d_model, **options)
