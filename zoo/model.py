"""The causal LM backbone every mixer is compared in.

A block is ``x = x + drop(mixer(norm(x))); x = x + mlp(norm(x))`` (pre-LN, the default)
or the paper's post-LN block ``x = LN(x + drop(mixer(x))); x = LN(x + mlp(x))``, the
same for every mixer. A mixer and the MLP return their update only, so the identity
path never passes through dropout, a mixer or a norm other than the block's own
(tests/test_mixers.py holds every registered mixer to that).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import WHEN_SET, StrictConfig, check_bounds, check_choice
from .mixers import build_mixer, check_mixer, is_mixer, mixer_class

ACTIVATIONS = ("gelu", "relu", "swiglu")


@dataclass
class ModelConfig(StrictConfig):
    vocab_size: int = 8192
    d_model: int = 256
    n_layers: int = 4
    mixer: str = "attention"
    mixer_options: dict = field(default_factory=dict)
    # Per-layer overrides merged over mixer_options, e.g. the paper's 12-layer
    # Grassmann pattern [{"offsets": (1,)}, {"offsets": (1,)}, {"offsets": (2,)}, ...].
    layer_options: tuple = ()
    # A hybrid stack: the last layer of every group of `every` runs another mixer, e.g.
    # {"mixer": "attention", "every": 4, "options": {"n_heads": 4}} (3 of `mixer`, then
    # attention, repeated). {}: every layer runs `mixer`.
    hybrid: dict = field(default_factory=dict, metadata=WHEN_SET)
    d_ff: int | None = None  # None: the mixer's convention (4 * d_model, or none for Mamba); 0: no MLP
    activation: str = "gelu"
    norm: str = "layernorm"  # or "rmsnorm"
    block: str = "prenorm"  # or "postnorm" (the paper's)
    positions: str = "learned"  # or "none"
    max_len: int = 1024  # table size of learned positions
    tie_embeddings: bool = True
    dropout: float = 0.0
    # None: every nn.Linear keeps PyTorch's default init and every mixer its own. A float:
    # every nn.Linear weight (the mixers' and the MLPs') drawn from N(0, init_std) and its
    # bias zeroed, but for parameters a mixer marks _no_reinit: the "small init" of the
    # reproductions (youdie006/grassmann's N(0, 0.02) for Linear and Embedding; the
    # embeddings here are N(0, 0.02) either way).
    init_std: float | None = field(default=None, metadata=WHEN_SET)

    def __post_init__(self):
        own = "ModelConfig"
        check_mixer(own, "mixer", self.mixer)
        check_choice(own, "activation", self.activation, ACTIVATIONS)
        check_choice(own, "norm", self.norm, ("layernorm", "rmsnorm"))
        check_choice(own, "block", self.block, ("prenorm", "postnorm"))
        check_choice(own, "positions", self.positions, ("learned", "none"))
        # types are checked from the hints before this runs
        check_bounds(self, "vocab_size", "d_model", "n_layers", "max_len", gt=0)
        check_bounds(self, "d_ff", ge=0)  # None: the mixer's convention; 0: no MLP
        check_bounds(self, "dropout", ge=0, lt=1)
        check_bounds(self, "init_std", gt=0)  # None: the default init
        if self.layer_options and len(self.layer_options) != self.n_layers:
            raise ValueError(
                f"{own}: layer_options has {len(self.layer_options)} entries for n_layers={self.n_layers}"
            )
        _check_options(own, self.mixer, self.mixer_options, *self.layer_options)
        if self.hybrid:
            unknown = sorted(set(self.hybrid) - {"mixer", "every", "options"})
            if unknown or "mixer" not in self.hybrid or "every" not in self.hybrid:
                raise ValueError(f"{own}: hybrid={self.hybrid!r} needs 'mixer' and 'every' (and "
                                 f"optionally 'options'); unknown keys: {unknown}")
            check_mixer(own, "hybrid['mixer']", self.hybrid["mixer"])
            every = self.hybrid["every"]
            if not isinstance(every, int) or isinstance(every, bool) or not 1 <= every <= self.n_layers:
                raise ValueError(f"{own}: hybrid['every']={every!r} must be an integer from 1 to "
                                 f"n_layers={self.n_layers}")
            _check_options(own, self.hybrid["mixer"], self.hybrid.get("options", {}))

    @property
    def ffn_width(self) -> int:
        if self.d_ff is None:
            return 4 * self.d_model if mixer_class(self.mixer).uses_mlp else 0
        return self.d_ff

    def options_for_layer(self, i: int) -> dict:
        return {**self.mixer_options, **(self.layer_options[i] if self.layer_options else {})}

    def mixer_for_layer(self, i: int) -> tuple[str, dict]:
        """(mixer name, options) of layer i."""
        if self.hybrid and (i + 1) % self.hybrid["every"] == 0:
            return self.hybrid["mixer"], dict(self.hybrid.get("options", {}))
        return self.mixer, self.options_for_layer(i)

    @property
    def name(self) -> str:
        """The model's mixer as results name it: "gated_deltanet+attention" for a hybrid."""
        return f"{self.mixer}+{self.hybrid['mixer']}" if self.hybrid else self.mixer

    @property
    def layout(self) -> str:
        """The layer stack, runs compressed: "gated_deltanet*3+attention+gated_deltanet*3+attention"."""
        names = [self.mixer_for_layer(i)[0] for i in range(self.n_layers)]
        runs = []
        for name in names:
            if runs and runs[-1][0] == name:
                runs[-1][1] += 1
            else:
                runs.append([name, 1])
        return "+".join(name if n == 1 else f"{name}*{n}" for name, n in runs)


def _check_options(own: str, mixer: str, *option_dicts) -> None:
    valid = mixer_class(mixer).option_names
    for opts in option_dicts:
        unknown = sorted(set(opts) - set(valid))
        if unknown:
            raise ValueError(
                f"{own}: unknown option(s) {unknown} for mixer {mixer!r}; valid options: {sorted(valid)}"
            )


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        rms = x.float().pow(2).mean(-1, keepdim=True).add(self.eps).rsqrt()
        return (x.float() * rms).to(x.dtype) * self.weight


def make_norm(cfg: ModelConfig) -> nn.Module:
    return nn.LayerNorm(cfg.d_model) if cfg.norm == "layernorm" else RMSNorm(cfg.d_model)


class MLP(nn.Module):
    def __init__(self, d: int, width: int, activation: str, dropout: float):
        super().__init__()
        self.activation = activation
        self.up = nn.Linear(d, 2 * width if activation == "swiglu" else width)
        self.down = nn.Linear(width, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):  # (B, L, D)
        h = self.up(x)
        if self.activation == "swiglu":
            a, b = h.chunk(2, dim=-1)
            h = F.silu(a) * b
        else:
            h = F.gelu(h) if self.activation == "gelu" else F.relu(h)
        return self.drop(self.down(h))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.prenorm = cfg.block == "prenorm"
        self.norm1 = make_norm(cfg)
        name, options = cfg.mixer_for_layer(layer)
        self.mixer = build_mixer(name, cfg.d_model, **options)
        self.mlp = MLP(cfg.d_model, cfg.ffn_width, cfg.activation, cfg.dropout) if cfg.ffn_width else None
        self.norm2 = make_norm(cfg) if self.mlp is not None else None
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):  # (B, L, D)
        return self._residual(x, self.mixer)

    def prefill(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """The block over x (B, L, D), the tokens after ``state`` (its mixer's), in the
        mixer's step form: (output, the mixer's state after them)."""
        return self._stateful(x, state, self.mixer.prefill)

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token, x (B, D): norms and MLP act on the last axis alone, so the block's
        formula is the same on a token as on a sequence."""
        return self._stateful(x, state, self.mixer.step)

    def _stateful(self, x, state, mix):
        out = {}

        def mixer(h):
            y, out["state"] = mix(h, state)
            return y
        return self._residual(x, mixer), out["state"]

    def _residual(self, x, mixer):
        # the one place the block's formula is written: forward, prefill and step share it
        if self.prenorm:
            x = x + self.drop(mixer(self.norm1(x)))
            if self.mlp is not None:
                x = x + self.mlp(self.norm2(x))
            return x
        x = self.norm1(x + self.drop(mixer(x)))
        if self.mlp is not None:
            x = self.norm2(x + self.mlp(x))
        return x


class LM(nn.Module):
    """tokens (B, L) -> logits (B, L, V). ``embed`` and ``forward_embedded`` split
    the forward so that causality can be checked by gradients on the embeddings."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model) if cfg.positions == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm_f = make_norm(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok.weight
        self.apply(_init_weights)
        if cfg.init_std is not None:
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    _small_init(m, cfg.init_std)

    def embed(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """tokens (B, L) at positions start .. start + L - 1 -> (B, L, D)."""
        end = start + tokens.shape[1]
        h = self.tok(tokens)  # (B, L, D)
        if self.pos is not None:
            if end > self.cfg.max_len:
                raise ValueError(f"sequence length {end} exceeds max_len={self.cfg.max_len} of learned positions")
            h = h + self.pos(torch.arange(start, end, device=tokens.device))
        return self.drop(h)

    def forward_embedded(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.features_embedded(h))  # (B, L, V)

    def features_embedded(self, h: torch.Tensor) -> torch.Tensor:
        """The final normalised hidden states (B, L, D) the head reads."""
        for block in self.blocks:
            h = block(h)
        return self.norm_f(h)

    def forward(self, tokens: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, L, V); with ``keep`` (B, L) bool, those at the N kept positions only,
        (N, V): the head applied there alone (a task that scores few positions)."""
        if keep is None:
            return self.forward_embedded(self.embed(tokens))
        return self.head(self.features_embedded(self.embed(tokens))[keep])

    # ---- the step (decode) form: each layer's mixer state, and the position reached ----

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        """The state of an empty context: {"pos": 0, "layers": [each mixer's state]}."""
        return {"pos": 0, "layers": [b.mixer.init_state(batch, device, dtype) for b in self.blocks]}

    def prefill(self, tokens: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """tokens (B, L) that follow ``state`` -> (logits (B, L, V), the state after them)."""
        h = self.embed(tokens, state["pos"])  # (B, L, D)
        layers = []
        for block, layer in zip(self.blocks, state["layers"]):
            h, layer = block.prefill(h, layer)
            layers.append(layer)
        return self.head(self.norm_f(h)), {"pos": state["pos"] + tokens.shape[1], "layers": layers}

    def step(self, token: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token per sequence, (B,) -> (logits (B, V), the state after it)."""
        h = self.embed(token[:, None], state["pos"])[:, 0]  # (B, D)
        layers = []
        for block, layer in zip(self.blocks, state["layers"]):
            h, layer = block.step(h, layer)
            layers.append(layer)
        return self.head(self.norm_f(h)), {"pos": state["pos"] + 1, "layers": layers}

    def backends(self) -> dict[str, str]:
        """The implementation each layer's mixer ran in its last forward, e.g. {"0": "sdpa"}."""
        return {str(i): b.mixer.backend for i, b in enumerate(self.blocks)}

    def chunk_sizes(self) -> dict[str, int]:
        """The chunk size each chunked layer's mixer ran with in its last forward ({} for
        none): its option, or what "auto" measured (zoo.ops.chunk_tuning)."""
        return {str(i): b.mixer.chunk_size_used for i, b in enumerate(self.blocks)
                if b.mixer.chunk_size_used is not None}

    def state_size(self, seq_len: int) -> int:
        return sum(b.mixer.state_size(seq_len) for b in self.blocks)


def _init_weights(m: nn.Module) -> None:
    # Embeddings get GPT-2's N(0, 0.02) (PyTorch's N(0, 1) makes tied logits huge);
    # linear layers keep PyTorch's default and every mixer keeps its own init.
    if isinstance(m, nn.Embedding):
        nn.init.normal_(m.weight, std=0.02)


def _small_init(m: nn.Linear, std: float) -> None:
    with torch.no_grad():
        if not getattr(m.weight, "_no_reinit", False):
            m.weight.normal_(0.0, std)
        if m.bias is not None and not getattr(m.bias, "_no_reinit", False):
            m.bias.zero_()


def build_model(cfg: ModelConfig, seed: int | None = None) -> LM:
    """Build the LM; with ``seed`` the init is reproducible without touching the
    caller's global RNG state."""
    ctx = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    with ctx:
        if seed is not None:
            torch.manual_seed(seed)
        return LM(cfg)


def positions_for(mixer: str, options: dict | None = None) -> str:
    """Zoology's rule for ``ModelConfig.positions``: learned positions for the mixers that
    are blind to token order without them (softmax attention and its local form), none for
    the others, nor for attention with rotary positions. Asked of the mixer
    (``Mixer.needs_positions``), so a new mixer needs no entry here; an unknown name gets
    "none" here and is refused by ModelConfig, with the valid ones."""
    own = is_mixer(mixer) and mixer_class(mixer).needs_positions and not (options or {}).get("rotary")
    return "learned" if own else "none"
