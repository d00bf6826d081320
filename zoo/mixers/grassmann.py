"""The Grassmann mixer of "Attention Is Not What You Need: Grassmann Flows as an
Attention-Free Alternative for Sequence Modeling" (Zhang Chong, arXiv 2512.19428).

The formula, for hidden states h_t in R^d and a set of offsets Δ (default 1, 2, 4, 8, 12, 16):

    z_t    = W_red h_t + b_red                         reduce to r dims (r = 32)
    p^Δ_t  = z_t ∧ z_{t-Δ},  p_ij = z_i w_j - z_j w_i  Plücker coordinates of span(z_t, w),
                                                       i < j, so r(r-1)/2 = 496 numbers
    p̂^Δ_t  = p^Δ_t / max(|p^Δ_t|, eps)                 optional L2 normalisation
    g_t    = mean over the Δ with t-Δ >= 0 of (W_plü p̂^Δ_t + b_plü)   one W_plü for all Δ
    a_t    = sigmoid(W_gate [h_t; g_t] + b_gate)
    h'_t   = a_t * h_t + (1 - a_t) * g_t               the paper's blend
           = h_t + (1 - a_t) * (g_t - h_t)             what the mixer returns: the update

A position with no partner at any offset (t = 0 always) gets g_t = 0 exactly. Cost
and state are O(L): the layer sees the last max(Δ) tokens, each through a 2-plane.

Like every mixer, this one returns its update, ``(1 - a) * (g - h)``, and the block adds
h back: the paper's post-LN block h = LN(blend(h)); h = LN(h + FFN(h)) is then exactly
the zoo's post-LN block LN(h + mixer(h)), with dropout on the update alone, as every
public reproduction places it (kanenorman's LN(x + drop(gate * g)), the others'
h + drop(...)). ``revision`` 2 is this form (CHANGELOG.md says what revision 1 did).

Readings, each an explicit option:
* ``pairing``: the paper writes the pair as (z_t, z_{t+Δ}) while calling the model
  causal. Taken literally ("future") position t reads tokens t+1 .. t+max(Δ), which
  leaks the very tokens a language model must predict; it exists only to show that
  leak (``causal = False``). "past" (z_t, z_{t-Δ}) is what the public reproductions
  run and what a causal LM needs.
* ``aggregate``: "mean" over the offsets that exist at t, as the public
  reproductions do; "sum" keeps them unscaled (each valid offset adds b_plü once).
* ``mixing``: "blend" is the paper's gate (update (1-a)*(g-h)); "gated_residual"
  (h + a*g, update a*g) adds a gated branch without the gate's (1-a)*h pull toward 0.
* ``normalize``/``eps``: the reproductions normalise with eps = 1e-8. We default to
  1e-6: it only differs on near-degenerate pairs (|p| < 1e-6, z_t almost parallel to
  its partner) and caps the 1/|p| gradient of the normalisation at 1e6 instead of 1e8.
``impl`` picks how g is computed; all compute the same function: "eager" is the
readable reference below; "factored", the default, is 4-7x faster than it in a CPU
training step (results/reference/trainstep_cpu*.csv); "factored" (plain torch),
"compiled" (the same under torch.compile) and "fused" (Triton kernels, forward and backward; CPU only through
TRITON_INTERPRET=1) use the exact factorisation of ``zoo/ops/grassmann.py``, which
never lists the (B, L, |Δ|, 496) Plücker tensor. "auto" times "factored", "compiled"
and, on CUDA, "fused" on the first input of each shape bucket and runs the fastest (a
torch.compile that fails here counts as never fastest); ``backend`` says which ran
("eager", "factored", "compiled", "triton", "triton_interpret").
Pre-LN or post-LN is the backbone's choice (ModelConfig.block); the paper's is post-LN.
In the pre-LN block the mixer reads u = LN(h) and h + (1-a)*(g-u) is added.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import fastpath
from ..ops.grassmann import (bias_scale, combine_partners, fused_backend, grassmann_features,
                             grassmann_features_compiled, grassmann_features_factored, grassmann_features_fused,
                             plucker, triton)
from ..ops.fastpath import fastest
from .base import Mixer, check_choice

PAIRINGS = ("past", "future")
AGGREGATES = ("mean", "sum")
MIXINGS = ("blend", "gated_residual")
# "eager" is this file's reference; the others compute the same g through the exact
# factorisation of zoo/ops/grassmann.py: "factored" in plain torch, "compiled" the same
# under torch.compile, "fused" the Triton kernels; "auto" picks the fastest available.
IMPLS = ("eager", "factored", "compiled", "fused", "auto")


class Grassmann(Mixer):
    """Causal Grassmann mixing (arXiv 2512.19428); see the module docstring.

    Parameters: W_red (d*r + r), W_plü (r(r-1)/2 * d + d), W_gate (2d*d + d).
    """

    name = "grassmann"
    revision = 2  # returns the update of the blend (1: the blend, the residual inside)
    causal = True  # False only for the paper's literal, leaking, pairing="future"
    fast_path = ("impl='fused': Triton fwd+bwd (CUDA); 'compiled'/'factored': factored torch; "
                 "'auto' picks the fastest by measurement; default 'factored'")

    def __init__(self, d_model: int, r: int = 32, offsets=(1, 2, 4, 8, 12, 16),
                 pairing: str = "past", normalize: bool = True, eps: float = 1e-6,
                 aggregate: str = "mean", mixing: str = "blend", impl: str = "factored"):
        super().__init__()
        own = self.name
        if not _is_int(r) or r < 2:
            raise ValueError(f"{own}: r={r!r} must be an integer >= 2 (a 2-plane needs r >= 2)")
        if r > d_model:
            raise ValueError(f"{own}: r={r} must be <= d_model={d_model} (r reduces d_model)")
        if (not isinstance(offsets, (tuple, list)) or not offsets
                or not all(_is_int(o) and o > 0 for o in offsets)):
            raise ValueError(
                f"{own}: offsets={offsets!r} must be a non-empty list of positive integers")
        if len(set(offsets)) != len(offsets):
            raise ValueError(f"{own}: offsets={offsets!r} has duplicates")
        check_choice(own, "pairing", pairing, PAIRINGS)
        check_choice(own, "aggregate", aggregate, AGGREGATES)
        check_choice(own, "mixing", mixing, MIXINGS)
        check_choice(own, "impl", impl, IMPLS)
        if impl == "fused" and triton is None:
            raise ValueError(f"{own}: impl='fused' needs triton, which is not importable")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"{own}: eps={eps!r} must be a positive number")
        self.r, self.offsets, self.pairing = r, tuple(offsets), pairing
        self.normalize, self.eps, self.aggregate, self.mixing = bool(normalize), float(eps), aggregate, mixing
        self.causal = pairing == "past"
        self.impl = impl
        self.backend = "eager"
        self.w_red = nn.Linear(d_model, r)
        self.w_plu = nn.Linear(r * (r - 1) // 2, d_model)
        self.w_gate = nn.Linear(2 * d_model, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        z = self.w_red(h)  # (B, L, r)
        g = self._features(z)  # (B, L, D)
        return self._update(h, g)

    def _update(self, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The gated update of the stream from its input h and the features g, (B, L, D)."""
        # The sigmoid of a float32 (or float64) logit: under bf16 autocast a gate rounded to bf16 near 1
        # mis-weighs the whole stream in the blend (2.3x the bf16 harness test's reference error).
        logit = self.w_gate(torch.cat([h, g], dim=-1))  # (B, L, D)
        a = torch.sigmoid(logit.to(torch.promote_types(logit.dtype, torch.float32)))
        if self.mixing == "blend":
            return ((1 - a) * (g - h)).to(h.dtype)  # a*h + (1-a)*g, less the h the block adds back
        return (a * g).to(h.dtype)

    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        """The last max(Δ) reduced tokens z, (B, T, r) (T = 0 here)."""
        if not self.causal:
            raise NotImplementedError(f"{self.name}: pairing='future' reads later tokens; it has no step form")
        return {"z": torch.zeros(batch, 0, self.r, device=device, dtype=dtype)}

    def prefill(self, h: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """The features of the new tokens over the cached z and their own: a window of the
        last max(Δ) tokens holds every partner, and while the context is shorter the
        window is the whole of it, so each offset is valid exactly where it is in the
        parallel form."""
        L = h.shape[1]
        z = torch.cat([state["z"], self.w_red(h)], 1)  # (B, T + L, r)
        g = self._features(z)[:, -L:]  # (B, L, D)
        return self._update(h, g), {"z": z[:, -max(self.offsets):]}

    def step(self, h: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One token, h (B, D): identity 1 on the window gives the token's combined partner
        W_t, and g_t = W_plü (z_t ∧ W_t) + b_plü, its 496 Plücker coordinates projected
        once. The same function as the forward; a whole-window ``_features`` would redo
        every cached token's features and rebuild the (r, r, D) bilinear weight for one
        output."""
        z = torch.cat([state["z"], self.w_red(h)[:, None]], 1)  # (B, T + 1, r): the window, the token last
        zc = z.float() if z.dtype in (torch.float16, torch.bfloat16) else z  # the norms in fp32 at least
        # a partner within sqrt(eps) of parallel is a repeat rounded differently
        # (combine_partners); at float32 that is 3.5e-4 rad, against ~1e-6 of rounding
        W = combine_partners(zc, self.offsets, "past", self.normalize, self.eps, self.aggregate,
                             parallel_below=torch.finfo(z.dtype).eps ** 0.5)[:, -1]  # (B, r)
        g = F.linear(plucker(z[:, -1], W.to(z.dtype)), self.w_plu.weight)  # (B, D)
        scale = bias_scale(z.shape[1], self.offsets, "past", self.aggregate, z.device, z.dtype)[-1]  # (1,)
        self.backend = "plucker_step"
        return self._update(h, g + scale * self.w_plu.bias), {"z": z[:, -max(self.offsets):]}

    # impl="auto": the fastest exact implementation, measured (forward, plus backward
    # when gradients are on) on the first input of each shape bucket in this process:
    # {bucket: (impl, {impl: seconds})}. Shared by every Grassmann layer of the process.
    auto_choices: dict[tuple, tuple[str, dict[str, float]]] = {}

    def _features(self, z: torch.Tensor) -> torch.Tensor:
        args = (z, self.w_plu.weight, self.w_plu.bias, self.offsets, self.pairing,
                self.normalize, self.eps, self.aggregate)
        impl = self._auto_impl(args) if self.impl == "auto" else self.impl
        if impl == "fused" and not fastpath.enabled():
            impl = "factored"  # torch_only(): the same function, in plain torch
        g = IMPL_FNS[impl](*args)
        self.backend = fused_backend(z.device) if impl == "fused" else impl
        return g

    def _auto_impl(self, args) -> str:
        z, weight, bias = args[:3]
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in args[:3])
        B, L, _ = z.shape
        fused = (fused_backend(z.device) == "triton" and z.dtype != torch.float64
                 and fastpath.enabled())
        bucket = (z.device.type, z.dtype, grad, fused, _pow2(B * L), _pow2(L), *weight.shape,
                  *args[3:])
        if bucket not in Grassmann.auto_choices:
            names = ["factored", "compiled"]
            if fused:
                names.insert(0, "fused")  # the interpreter, on CPU, is never the fastest
            inputs = [t.detach().requires_grad_(grad) for t in args[:3] if t is not None]

            def run(fn):
                def call():
                    g = fn(*inputs, *([None] if bias is None else []), *args[3:])
                    if grad:
                        torch.autograd.grad(g, inputs, torch.ones_like(g))
                return call

            Grassmann.auto_choices[bucket] = fastest(
                {name: run(IMPL_FNS[name]) for name in names}, z.device)
        return Grassmann.auto_choices[bucket][0]

    def core_flops(self, B: int, L: int) -> float:
        # The formula as the paper states it (the eager path), whatever ``impl`` ran: the
        # factored / compiled / fused paths do less work for the same function, so their
        # FLOP/s column is eager-equivalent throughput, not the arithmetic they performed.
        # (FlopCounterMode would count the wedges not at all, elementwise, and W_plü twice:
        # as the nn.Linear it is and as the F.linear the feature path calls on its weight.)
        P = self.r * (self.r - 1) // 2  # Plücker coordinates per pair
        # per offset: wedge 3P (2 mul + 1 sub), normalise 3P (square-sum + divide), sum P
        return B * L * len(self.offsets) * P * (7 if self.normalize else 4)

    def state_size(self, seq_len: int) -> int:
        # The last max(Δ) reduced tokens z (the current h is input, not state), fewer while
        # the context is shorter. The "future" pairing cannot stream without a max(Δ)
        # delay; its buffer is the same.
        return min(seq_len, max(self.offsets)) * self.r

    def extra_repr(self) -> str:
        return (f"r={self.r}, offsets={self.offsets}, pairing={self.pairing!r}, "
                f"normalize={self.normalize}, eps={self.eps}, aggregate={self.aggregate!r}, "
                f"mixing={self.mixing!r}, impl={self.impl!r}")


IMPL_FNS = {"eager": grassmann_features, "factored": grassmann_features_factored,
            "compiled": grassmann_features_compiled, "fused": grassmann_features_fused}


def _pow2(n: int) -> int:
    """The power of two at or above n: shapes within a factor 2 share a measurement."""
    return 1 << max(n - 1, 0).bit_length()


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
