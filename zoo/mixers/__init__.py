"""The registry of sequence mixers: a new mixer is one file and one line here.

A mixer that lives outside this repository needs no line: name it by its import path,
``"package.module:ClassName"`` (as Zoology's configs do), wherever a mixer name goes
(``ModelConfig.mixer``, a hybrid's mixer, ``--mixers``). Every process that builds it,
the child processes of isolated timings and the submitit jobs of local and Slurm sweeps
included, imports it by that path, so it only has to be importable there (installed,
or its folder on ``PYTHONPATH``)."""
from __future__ import annotations

import importlib

from .attention import Attention, SlidingWindowAttention
from .base import Mixer, chunk_sizes, pin_chunk_sizes
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


_IMPORTED: dict[str, type[Mixer]] = {}  # import path -> class, once imported


def mixer_class(name: str, field: str = "mixer") -> type[Mixer]:
    """The class of a registered mixer, or of one named by ``"package.module:ClassName"``.
    An unknown name, an import that fails or a class that is not a ``Mixer`` is refused
    with the reason and the registered names (``field`` names the value in the message)."""
    if isinstance(name, str) and name in MIXERS:
        return MIXERS[name]
    if name in _IMPORTED:
        return _IMPORTED[name]
    module, sep, attr = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not (sep and module and attr):
        raise ValueError(f"{field}={name!r} is not valid; choose one of {sorted(MIXERS)}, "
                         f"or an import path 'package.module:ClassName'")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{field}={name!r}: cannot import it ({type(exc).__name__}: {exc}); the module must "
                         f"be importable in every process that builds the model (installed, or on PYTHONPATH)"
                         ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Mixer)):
        raise ValueError(f"{field}={name!r} is {cls!r}, not a subclass of zoo.Mixer")
    _IMPORTED[name] = cls
    return cls


def is_mixer(name) -> bool:
    """Whether ``mixer_class(name)`` finds a mixer (registered or importable)."""
    try:
        mixer_class(name)
    except ValueError:
        return False
    return True


def check_mixer(owner: str, field: str, name) -> None:
    """A config's check of a mixer field: ``mixer_class``'s refusal, naming the field."""
    try:
        mixer_class(name, field)
    except ValueError as exc:
        raise ValueError(f"{owner}: {exc}") from None


def build_mixer(name: str, d_model: int, **options) -> Mixer:
    return mixer_class(name)(d_model, **options)
