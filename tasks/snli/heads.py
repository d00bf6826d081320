"""The paper's classification heads over frozen DistilBERT token features (Table 3), and
two controls that say what the heads add.

Both heads project the features to d_model, mix tokens with ``n_layers`` layers,
mean-pool the real tokens and classify with an MLP; only the mixing differs. The
controls: ``linear``, a linear probe on the mean-pooled frozen features (does a head
need to mix tokens at all?), and ``prior``, three learned logits that ignore the input
(it learns the training split's class frequencies: the majority-class floor).

The Grassmann-Plücker layer works on the token sequence, as the paper describes:
windows of ``window`` tokens every ``stride`` tokens; in each window every token pair
(i < j) spans a 2-plane in each head's d_proj / n_heads reduced dimensions, encoded by
its normalised Plücker coordinates and averaged over the window's pairs. A public
reproduction instead wedges the *pooled* sentence vector with itself: p(z, z) = 0
identically, so its "Grassmann head" is an MLP; ``plucker_features`` is exposed so a
test can check ours are not zero on real inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from zoo.config import StrictConfig, check_bounds, check_choice
from zoo.ops.grassmann import plucker


KINDS = ("grassmann", "transformer", "linear", "prior")


@dataclass
class HeadConfig(StrictConfig):
    kind: str = "grassmann"  # or "transformer"; controls: "linear" (probe), "prior" (majority class)
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512
    dropout: float = 0.1
    d_proj: int = 64  # Grassmann only: reduced dimensions, split across the heads
    window: int = 8
    stride: int = 8
    eps: float = 1e-6

    def __post_init__(self):
        check_choice("HeadConfig", "kind", self.kind, KINDS)
        check_bounds(self, "d_model", "n_layers", "n_heads", "d_ff", "d_proj", "eps", gt=0)  # n_heads divides below
        check_bounds(self, "dropout", ge=0, lt=1)
        if self.d_model % self.n_heads:
            raise ValueError(f"HeadConfig: d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.d_proj % self.n_heads or self.d_proj // self.n_heads < 2:
            raise ValueError(f"HeadConfig: d_proj={self.d_proj} must split into n_heads={self.n_heads} "
                             f"groups of at least 2 dimensions (a 2-plane needs 2)")
        if self.window < 2 or not 1 <= self.stride <= self.window:
            raise ValueError(f"HeadConfig: window={self.window} must be >= 2 (a pair) and "
                             f"1 <= stride={self.stride} <= window (every token in some window)")


class PluckerMixing(nn.Module):
    """One Grassmann-Plücker layer: window geometry g, the paper's gated blend
    LN(a*h + (1-a)*g), then LN(h + FFN(h)). As in the zoo's block, the blend is written
    h + (1-a)*(g - h) and dropout takes its update only, never the identity path."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        dh = cfg.d_proj // cfg.n_heads
        self.reduce = nn.Linear(cfg.d_model, cfg.d_proj)
        self.expand = nn.Linear(cfg.n_heads * dh * (dh - 1) // 2, cfg.d_model)
        self.gate = nn.Linear(2 * cfg.d_model, cfg.d_model)
        self.ffn = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Dropout(cfg.dropout),
                                 nn.Linear(cfg.d_ff, cfg.d_model))
        self.norm1, self.norm2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        i, j = torch.triu_indices(cfg.window, cfg.window, offset=1)  # the window's token pairs
        self.register_buffer("pair_i", i, persistent=False)
        self.register_buffer("pair_j", j, persistent=False)

    def n_windows(self, L: int) -> int:
        w, s = self.cfg.window, self.cfg.stride
        return 1 + max(0, -(-(L - w) // s))  # enough windows to cover all L tokens

    def plucker_features(self, h: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h: (B, L, D), mask: (B, L) real tokens -> per-window features (B, W, n_heads * C)
        (C = dh(dh-1)/2 coordinates per head) and (B, W) whether the window has a pair."""
        c = self.cfg
        B, L, _ = h.shape
        W = self.n_windows(L)
        span = (W - 1) * c.stride + c.window
        z = nn.functional.pad(self.reduce(h), (0, 0, 0, span - L))  # (B, span, d_proj)
        m = nn.functional.pad(mask, (0, span - L))  # padded positions are not tokens
        zw = z.unfold(1, c.window, c.stride).transpose(-1, -2)  # (B, W, window, d_proj)
        mw = m.unfold(1, c.window, c.stride)  # (B, W, window)
        zi = zw[:, :, self.pair_i].unflatten(-1, (c.n_heads, -1))  # (B, W, P, H, dh)
        zj = zw[:, :, self.pair_j].unflatten(-1, (c.n_heads, -1))
        p = plucker(zi, zj)  # (B, W, P, H, C)
        p = p / p.norm(dim=-1, keepdim=True).clamp_min(c.eps)
        real = (mw[..., self.pair_i] & mw[..., self.pair_j]).to(p.dtype)  # (B, W, P)
        n = real.sum(-1)  # (B, W)
        feats = (p * real[..., None, None]).sum(2) / n.clamp_min(1)[..., None, None]  # (B, W, H, C)
        return feats.flatten(-2), n > 0

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        feats, has_pair = self.plucker_features(h, mask)
        gw = self.expand(feats) * has_pair.unsqueeze(-1).to(h.dtype)  # (B, W, D)
        # Each token reads the mean geometry of the windows covering it (one when stride == window).
        t = torch.arange(h.shape[1], device=h.device)[:, None]  # (L, 1)
        start = torch.arange(gw.shape[1], device=h.device)[None] * c.stride  # (1, W)
        cover = ((t >= start) & (t < start + c.window)).to(h.dtype)  # (L, W)
        g = torch.einsum("lw,bwd->bld", cover / cover.sum(-1, keepdim=True), gw)  # (B, L, D)
        a = torch.sigmoid(self.gate(torch.cat([h, g], dim=-1)))
        h = self.norm1(h + self.drop((1 - a) * (g - h)))
        return self.norm2(h + self.drop(self.ffn(h)))


class Head(nn.Module):
    """Project, mix, mean-pool real tokens, classify. (B, L, d_in), (B, L) -> (B, 3)."""

    def __init__(self, cfg: HeadConfig, d_in: int):
        super().__init__()
        self.cfg = cfg
        if cfg.kind == "linear":  # no projection, no mixing, no MLP
            self.classify = nn.Linear(d_in, 3)
            return
        if cfg.kind == "prior":
            self.logits = nn.Parameter(torch.zeros(3))
            return
        self.proj = nn.Linear(d_in, cfg.d_model)
        if cfg.kind == "grassmann":
            self.layers = nn.ModuleList(PluckerMixing(cfg) for _ in range(cfg.n_layers))
        else:
            layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout,
                                               activation="gelu", batch_first=True)
            self.layers = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.classify = classifier_mlp(cfg.d_model, cfg.dropout)

    def forward(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.cfg.kind == "linear":
            return self.classify(pool_states(feats, mask, "mean"))
        if self.cfg.kind == "prior":
            return self.logits.expand(feats.shape[0], 3)
        h = self.proj(feats)  # (B, L, D)
        if self.cfg.kind == "grassmann":
            for layer in self.layers:
                h = layer(h, mask)
        else:
            h = self.layers(h, src_key_padding_mask=~mask)
        return self.classify(pool_states(h, mask, "mean"))


def pool_states(h: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """(B, L, D) -> (B, D): the last real token's state, or the mean over real tokens."""
    if how == "last":
        return h[torch.arange(h.shape[0], device=h.device), mask.sum(1) - 1]
    m = mask.unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1).clamp_min(1)


def classifier_mlp(d: int, dropout: float, n_classes: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Dropout(dropout), nn.Linear(d, n_classes))
