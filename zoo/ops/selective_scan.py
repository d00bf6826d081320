"""Selective scan, the S6 core of Mamba-1.

Per channel d and state n, with input-dependent step size delta:

    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t        (d, n)
    y_t = C_t . h_t  (+ D * u_t)  (* silu(z_t))

Argument layouts and semantics are those of mamba_ssm's ``selective_scan_ref`` so
the CUDA kernel ``selective_scan_fn`` is a drop-in replacement; ``selective_scan_ref``
here is the same recurrence one step at a time, to check either against. The PyTorch path
splits L into chunks, each recomputed in backward, and steps through the
recurrence one (batch, dim, dstate) state at a time. Only per-step decays
exp(delta*A) <= 1 are ever formed (never exp of a positive cumulative sum), so it is
stable for any length and step size. A log-depth (Hillis-Steele) scan inside the
chunk was 2.7x slower on CPU (fwd+bwd at batch 32, dim 128, dstate 16, L 64 and 256),
because each of its log T passes writes a fresh (batch, dim, T, dstate) tensor.

On CPU the torch path still makes ~30 passes over (batch, dim, L, dstate) tensors, so
``selective_scan`` runs ``selective_scan_fused_cpu`` there instead: one C++ pass forward,
one backward (selective_scan_cpu.cpp, built on first use by cpu_kernels), 25x faster
fwd+bwd single-threaded at batch 64, dim 256, dstate 16, L 256 in fp32. It takes the step's
bias and softplus, the skip and the gate inside, and reads Mamba's (batch, L, dim) views in
place: without the copies and the elementwise passes around it, Mamba's training step at
L 64, d 64, batch 64 went from 114 to 81 ms on a 2-core AMD EPYC.
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from . import cpu_kernels
from .fastpath import Kernel

SELECTIVE_SCAN = Kernel("mamba_ssm.ops.selective_scan_interface", "selective_scan_fn", "mamba-ssm",
                        "2.0.0", "the argument layouts of mamba_ssm 2")
# The fused CPU kernel (selective_scan_cpu.cpp): pointers, then batch, dim, L, n, G, T, softplus.
SCAN_CPP = "selective_scan_cpu.cpp"
_P, _N = ctypes.c_void_p, ctypes.c_int64
SCAN_SIGNATURES = {f"selective_scan_{way}_{s}": (_P,) * k + (_N,) * 7
                   for way, k in (("fwd", 13), ("bwd", 21)) for s in ("f32", "f64")}
SCAN_SIGNATURES["exp_approx_f32"] = SCAN_SIGNATURES["softplus_f32"] = (_P, _P, _N)


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   return_last_state=False, chunk_size=64):
    """u, delta: (batch, dim, L); A: (dim, dstate) real;
    B, C: (batch, dstate, L), grouped (batch, G, dstate, L) with dim % G == 0 (channel c
    reads group c // (dim // G)), or time-invariant (dim, dstate);
    D: (dim,); z: (batch, dim, L); delta_bias: (dim,).
    Returns out (batch, dim, L) in u's dtype, and with ``return_last_state`` also the
    final state (batch, dim, dstate) in the accumulation dtype (float32, or float64).
    Runs mamba_ssm's CUDA kernel when it is importable and u is a CUDA tensor it
    supports; else, on CPU, ``selective_scan_fused_cpu``; else ``selective_scan_chunked``."""
    backend = selective_scan_backend(u, A, B, C)
    if backend == "mamba_ssm_scan":
        # The kernel takes no chunk size, and (unlike the torch path) does not
        # backpropagate through the returned last state.
        return SELECTIVE_SCAN(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias,
                                   delta_softplus=delta_softplus,
                                   return_last_state=return_last_state)
    scan = selective_scan_fused_cpu if backend == "cpu_fused" else selective_scan_chunked
    return scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                chunk_size)


def selective_scan_backend(u, A=None, B=None, C=None) -> str:
    """The path ``selective_scan`` takes for these inputs: "mamba_ssm_scan" (CUDA),
    "cpu_fused" or "torch_chunked". A, B, C left out mean what Mamba passes: a real A
    and per-step B and C of u's batch."""
    if SELECTIVE_SCAN.usable(u):
        return "mamba_ssm_scan"
    return "cpu_fused" if _cpu_scan(u, A, B, C) is not None else "torch_chunked"


def _cpu_scan(u, A=None, B=None, C=None) -> ctypes.CDLL | None:
    """The fused CPU kernel's library when it runs these inputs, else None."""
    if any(t.device.type != "cpu" for t in (u, A, B, C) if t is not None):
        return None
    if A is not None and (A.is_complex() or A.dim() != 2 or A.shape[0] != u.shape[1]):
        return None
    shapes = [X.shape for X in (B, C) if X is not None]
    if any(len(s) == 2 for s in shapes):  # time-invariant (dim, dstate): the torch path
        return None
    groups = {1 if len(s) == 3 else s[1] for s in shapes}
    if len(groups) > 1 or u.shape[1] % max(groups, default=1):  # the torch path says why
        return None
    if A is not None and any(s[0] != u.shape[0] or s[-1] != u.shape[2] or s[-2] != A.shape[1]
                             for s in shapes):  # broadcast or mismatched: the torch path says
        return None
    return cpu_kernels.library(SCAN_CPP, SCAN_SIGNATURES)


def selective_scan_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                       return_last_state=False):
    """The recurrence literally, one time step at a time (the readable reference, as
    mamba_ssm's ``selective_scan_ref``; cost L Python steps). Same arguments and returns
    as ``selective_scan`` less ``chunk_size``; accumulates in fp32 (fp64 for fp64)."""
    batch, dim, L = u.shape
    dtype_in, acc = u.dtype, torch.promote_types(u.dtype, torch.float32)
    u, delta, A = u.to(acc), delta.to(acc), A.to(acc)
    if delta_bias is not None:
        delta = delta + delta_bias.to(acc)[:, None]
    if delta_softplus:
        delta = F.softplus(delta)

    def per_channel(X):  # B or C -> a function of t giving (batch or 1, dim or 1, dstate)
        X = X.to(acc)
        if X.dim() == 2:  # time-invariant (dim, dstate)
            return lambda t: X[None]
        if X.dim() == 3:  # (batch, dstate, L): one vector shared by all channels
            return lambda t: X[:, None, :, t]
        X = X.repeat_interleave(dim // X.shape[1], dim=1)  # channel c reads group c // (dim // G)
        return lambda t: X[..., t]

    B_at, C_at = per_channel(B), per_channel(C)
    h = u.new_zeros(batch, dim, A.shape[1])  # (batch, dim, dstate)
    ys = []
    for t in range(L):
        dt = delta[:, :, t, None]  # (batch, dim, 1)
        h = torch.exp(dt * A) * h + dt * B_at(t) * u[:, :, t, None]
        ys.append((h * C_at(t)).sum(-1))  # (batch, dim)
    y = torch.stack(ys, dim=-1) if ys else u.new_zeros(batch, dim, 0)
    return _finish(y, h, u, D, z, dtype_in, return_last_state)


def selective_scan_chunked(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                           delta_softplus=False, return_last_state=False, chunk_size=64):
    """Pure-PyTorch selective scan; same signature and results as ``selective_scan``.
    Work and live memory per step of the chunk loop are O(batch*dim*chunk_size*dstate);
    with autograd on, each chunk is recomputed in backward, so what is kept for the
    backward pass is the inputs plus one (batch, dim, dstate) state per chunk."""
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"selective_scan: chunk_size must be a positive integer, got {chunk_size!r}")
    if A.is_complex():
        raise ValueError("selective_scan: complex A is not supported by the torch path")
    batch, dim, L = u.shape
    for name, X in (("B", B), ("C", C)):
        if X.dim() == 4 and dim % X.shape[1]:
            raise ValueError(f"selective_scan: dim={dim} is not divisible by the {X.shape[1]} "
                             f"groups of {name}")
    dtype_in = u.dtype
    # Accumulate in fp32 for fp32/bf16/fp16 inputs, and keep fp64 for fp64 (tests).
    acc = torch.float64 if dtype_in == torch.float64 else torch.float32
    u, delta, A = u.to(acc), delta.to(acc), A.to(acc)
    if delta_bias is not None:
        delta = delta + delta_bias.to(acc)[:, None]
    if delta_softplus:
        delta = F.softplus(delta)

    h = u.new_zeros(batch, dim, A.shape[1])  # (b, d, n) state carried across chunks
    recompute = torch.is_grad_enabled()
    ys = []
    for t0 in range(0, L, chunk_size):
        t = slice(t0, t0 + chunk_size)
        args = (h, u[:, :, t], delta[:, :, t], A, _time_slice(B, t), _time_slice(C, t))
        if recompute:
            y, h = checkpoint(_scan_chunk, *args, use_reentrant=False)
        else:
            y, h = _scan_chunk(*args)
        ys.append(y)
    y = torch.cat(ys, dim=2) if ys else u.new_zeros(batch, dim, 0)  # (b, d, L)
    return _finish(y, h, u, D, z, dtype_in, return_last_state)


def selective_scan_fused_cpu(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                             delta_softplus=False, return_last_state=False, chunk_size=64):
    """The selective scan by the fused C++ kernel (selective_scan_cpu.cpp), forward and
    backward, the step's bias and softplus, the skip D and the gate silu(z) included; same
    signature and results as ``selective_scan_chunked``, to which it falls back for what the
    kernel does not take (CUDA tensors, complex A, time-invariant B or C, no compiler).
    ``chunk_size`` is how many steps the backward recomputes from each kept state.

    The kernel works in the (batch, L, dim) layout: u, delta and z given as transposed views
    of (batch, L, dim) tensors, as Mamba passes them, and B, C as views of (batch, L, dstate)
    ones, are read in place (no copies), and the output is a view of a (batch, L, dim) tensor."""
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"selective_scan: chunk_size must be a positive integer, got {chunk_size!r}")
    lib = _cpu_scan(u, A, B, C)
    if lib is None or delta.shape != u.shape or (z is not None and z.shape != u.shape):
        return selective_scan_chunked(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                      return_last_state, chunk_size)
    dtype_in = u.dtype
    acc = torch.float64 if dtype_in == torch.float64 else torch.float32  # as the torch path
    u, delta, z = (None if t is None else _channels_last(t.to(acc)) for t in (u, delta, z))
    # (b, n, L) or (b, G, n, L) -> (b, G, L, n) with n contiguous: one step's n values adjacent
    B, C = (_state_last((X[:, None] if X.dim() == 3 else X).to(acc).transpose(-1, -2)) for X in (B, C))
    A, D, delta_bias = (None if t is None else t.to(acc).contiguous() for t in (A, D, delta_bias))
    y, h = _FusedScan.apply(lib, u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus),
                            chunk_size)  # (b, L, d), (b, d, n)
    out = y.transpose(1, 2).to(dtype_in)  # (b, d, L)
    return (out, h) if return_last_state else out


def _channels_last(t):
    """(b, d, L) -> a (b, L, d) view with d contiguous, copied only if it is not one."""
    t = t.transpose(1, 2)
    return t if t.stride(-1) == 1 else t.contiguous()


def _state_last(X):
    """(b, G, L, n) with n contiguous, copied only if it is not."""
    return X if X.stride(-1) == 1 else X.contiguous()


class _FusedScan(torch.autograd.Function):
    """(the kernel's library; u, dt (b, L, d); A (d, n); B, C (b, G, L, n); D (d,) or None;
    z (b, L, d) or None; bias (d,) or None; softplus; T) -> y (b, L, d), last state (b, d, n).
    Keeps the inputs and the state entering every T steps; backward recomputes from those."""

    @staticmethod
    def forward(ctx, lib, u, dt, A, B, C, D, z, bias, softplus, T):
        f64 = u.dtype == torch.float64
        fwd = lib.selective_scan_fwd_f64 if f64 else lib.selective_scan_fwd_f32
        # kept from here: torch_only() or LINBENCH_NO_CPU_KERNELS may be on by the backward
        ctx.bwd = lib.selective_scan_bwd_f64 if f64 else lib.selective_scan_bwd_f32
        (batch, L, dim), (G, n) = u.shape, (B.shape[1], A.shape[1])
        strides = _strides(u, dt, z, B, C)
        y = u.new_empty(batch, L, dim)
        y_pre = None if z is None else u.new_empty(batch, L, dim)  # the gate's input, for its gradient
        h_last = u.new_empty(batch, dim, n)
        h_chunks = u.new_empty(batch, dim, -(-L // T), n)  # the state entering each chunk
        at = cpu_kernels.row_address

        def run(b0, b1):
            fwd(at(u, b0), at(dt, b0), at(z, b0), at(A), at(D), at(bias), at(B, b0), at(C, b0),
                strides.data_ptr(), at(y, b0), at(y_pre, b0), at(h_last, b0), at(h_chunks, b0), b1 - b0, dim, L, n,
                G, T, int(softplus))

        cpu_kernels.over_batch(run, batch)
        ctx.save_for_backward(u, dt, A, B, C, D, z, bias, h_chunks, y_pre, strides)
        ctx.T, ctx.softplus = T, softplus
        ctx.set_materialize_grads(False)  # no zero-filled d(last state) when it is unused
        return y, h_last

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_last):
        u, dt, A, B, C, D, z, bias, h_chunks, y_pre, strides = ctx.saved_tensors
        (batch, L, dim), (G, n) = u.shape, (B.shape[1], A.shape[1])
        dy = u.new_zeros(batch, L, dim) if dy is None else dy.to(u.dtype).contiguous()
        dh_last = None if dh_last is None else dh_last.to(u.dtype).contiguous()
        du, ddt = u.new_empty(batch, L, dim), u.new_empty(batch, L, dim)
        dz = None if z is None else u.new_empty(batch, L, dim)
        # per batch row, so that slices never share a sum
        dA, dD, dbias = u.new_empty(batch, dim, n), u.new_empty(batch, dim), u.new_empty(batch, dim)
        dB, dC = B.new_empty(B.shape), C.new_empty(C.shape)
        at = cpu_kernels.row_address

        def run(b0, b1):
            ctx.bwd(at(u, b0), at(dt, b0), at(z, b0), at(A), at(D), at(bias), at(B, b0),
                    at(C, b0), strides.data_ptr(), at(h_chunks, b0), at(y_pre, b0), at(dy, b0),
                    at(dh_last, b0), at(du, b0), at(ddt, b0), at(dz, b0), at(dA, b0), at(dB, b0),
                    at(dC, b0), at(dD, b0), at(dbias, b0), b1 - b0, dim, L, n, G, ctx.T,
                    int(ctx.softplus))

        cpu_kernels.over_batch(run, batch)
        return (None, du, ddt, dA.sum(0), dB, dC, None if D is None else dD.sum(0), dz,
                None if bias is None else dbias.sum(0), None, None)


def _strides(u, dt, z, B, C) -> torch.Tensor:
    """The kernel's Strides: batch and time strides of u, dt, z ((b, L, d), d contiguous) and
    batch, group and time strides of B, C ((b, G, L, n), n contiguous), in elements."""
    z_st = (0, 0) if z is None else (z.stride(0), z.stride(1))
    return torch.tensor([u.stride(0), u.stride(1), dt.stride(0), dt.stride(1), *z_st,
                         *B.stride()[:3], *C.stride()[:3]], dtype=torch.int64)


def _finish(y, h, u, D, z, dtype_in, return_last_state):
    """The skip D * u and the gate silu(z) on the scan's y (b, d, L), in u's (accumulation)
    dtype; y back in the input dtype, with the last state if asked."""
    if D is not None:
        y = y + u * D.to(u.dtype)[:, None]
    if z is not None:
        y = y * F.silu(z.to(u.dtype))
    out = y.to(dtype_in)
    return (out, h) if return_last_state else out


def _time_slice(X, t: slice):
    return X if X.dim() == 2 else X[..., t]


def _per_step(X, dim: int, dtype):
    """B or C for the steps of one chunk, broadcastable against (b, d, T, n)."""
    X = X.to(dtype)
    if X.dim() == 2:  # (d, n): the same at every step
        return X[None, :, None, :]
    X = X.transpose(-1, -2)  # (b, T, n) or (b, G, T, n)
    if X.dim() == 3:
        return X[:, None]  # (b, 1, T, n): shared by all channels
    return X.repeat_interleave(dim // X.shape[1], dim=1)  # (b, d, T, n)


def _scan_chunk(h0, u, delta, A, B, C):
    """One chunk of T steps from state h0 (b, d, n): returns y (b, d, T) and the last state."""
    dim = u.shape[1]
    dt = delta[..., None]  # (b, d, T, 1)
    a = torch.exp(dt * A[:, None, :])  # (b, d, T, n) per-step decay
    bu = dt * u[..., None] * _per_step(B, dim, u.dtype)  # (b, d, T, n) per-step input
    # unbind, not a[:, :, t]: the backward of one unbind is one stack, while each
    # indexing would scatter into its own zero (b, d, T, n) gradient.
    h, hs = h0, []
    for a_t, bu_t in zip(a.unbind(2), bu.unbind(2)):
        h = torch.addcmul(bu_t, a_t, h)  # (b, d, n)
        hs.append(h)
    y = (torch.stack(hs, 2) * _per_step(C, dim, u.dtype)).sum(-1)  # (b, d, T)
    return y, h
