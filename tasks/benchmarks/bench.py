"""What a benchmark of one mixer at a list of points shares (scaling, decode, the
training step): its config base, the module a point times, and what that module ran on."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

import zoo
from zoo.config import StrictConfig, check_bounds, check_choice
from zoo.mixers import check_mixer

from ..engine.cli import mixer_label
from ..engine.train import device_named


@dataclass
class MixerBench(StrictConfig):
    """What a benchmark of one mixer at a list of points shares (scaling, decode): the
    mixer alone or in a whole LM, where and in what dtype it runs, and how each point
    is isolated and bounded. A benchmark config derives from it with its own points."""
    seed: int = 0
    mixer: str = "attention"
    mixer_options: dict = field(default_factory=dict)
    label: str = ""  # the name in tables and CSV; default "mixer[:option=value...]"
    d_model: int = 256
    scope: str = "mixer"  # "mixer" alone, or "lm": a whole LM of n_layers blocks + head
    n_layers: int = 2  # scope="lm" only
    vocab_size: int = 8192  # scope="lm" only
    device: str = "auto"
    dtype: str = "auto"  # "auto": bfloat16 on CUDA, float32 on CPU
    warmup: int = 2
    time_limit_s: float = 600.0  # per point, start-up excluded
    mem_cap_mb: float | None = None  # per point, on top of the runtime's own footprint
    isolate: bool = True  # each point in a fresh child process (needed for CPU memory)
    stop_after_failure: bool = True  # after oom/timeout at a point, the larger ones are "skipped"

    def __post_init__(self):
        own = type(self).__name__
        check_mixer(own, "mixer", self.mixer)
        check_choice(own, "scope", self.scope, ("mixer", "lm"))
        check_choice(own, "device", self.device, ("auto", "cpu", "cuda"))
        check_choice(own, "dtype", self.dtype, ("auto", "float32", "bfloat16", "float16"))
        check_bounds(self, "d_model", "n_layers", "vocab_size", "mem_cap_mb", gt=0)
        check_bounds(self, "seed", "warmup", "time_limit_s", ge=0)  # a 0 s limit: every point times out
        with torch.device("meta"):  # refuse bad options now, not in a child process later
            zoo.build_mixer(self.mixer, self.d_model, **self.mixer_options)

    def resolve_device(self) -> torch.device:
        return device_named(self.device)

    def resolve_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.resolve_device().type == "cuda" else torch.float32
        return getattr(torch, self.dtype)

    def name(self) -> str:
        return self.label or mixer_label(self.mixer, self.mixer_options)



def build(cfg: MixerBench, seq_len: int) -> nn.Module:
    """The module a point times: the mixer alone, or an LM around it (``scope``)."""
    if cfg.scope == "mixer":
        return zoo.build_mixer(cfg.mixer, cfg.d_model, **cfg.mixer_options)
    model_cfg = zoo.ModelConfig(vocab_size=cfg.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers,
                                mixer=cfg.mixer, mixer_options=cfg.mixer_options, positions="none",
                                max_len=seq_len)
    return zoo.build_model(model_cfg)


def module_backend(module: nn.Module) -> str:
    """The backends the module's mixers ran on, joined by "+"."""
    names = sorted({m.backend for m in module.modules() if isinstance(m, zoo.Mixer)})
    return "+".join(names)


def module_chunk_size(module: nn.Module) -> str:
    """The chunk size(s) the module's chunked mixers ran with ("" for none)."""
    return "+".join(str(s) for s in sorted({s for s in zoo.chunk_sizes(module) if s is not None}))
