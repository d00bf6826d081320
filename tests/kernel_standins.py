"""Test fixture: the REAL mamba-ssm / causal-conv1d / flash-linear-attention code on CPU.

Our mixers have CUDA branches that call mamba_ssm's and fla's kernels. To test those
branches on a machine without a GPU we run the packages' own code: their pure-PyTorch
references as they are, and their Triton kernels through Triton's interpreter
(``TRITON_INTERPRET=1``, which tests/conftest.py sets before anything imports triton).
What stands in the way, and what ``install()`` does about it, process-wide:

1. The compiled extensions are missing in a CPU build (``MAMBA_SKIP_CUDA_BUILD=TRUE``,
   ``CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE``), and mamba_ssm / causal_conv1d import them at
   module level. We put stand-in modules into ``sys.modules`` (``selective_scan_cuda``,
   ``causal_conv1d_cuda``) whose every function raises NotImplementedError: they exist
   only so that the packages import. The CUDA selective scan is NOT emulated; call
   ``selective_scan_ref`` / ``mamba_inner_ref`` instead.
2. mamba_ssm's fused Mamba-2 block calls causal-conv1d's C++ wrappers
   ``causal_conv1d_fwd_function`` / ``causal_conv1d_bwd_function``. We supply Python
   versions with the same positional signatures (the C++ ones write into ``dx`` and
   ``final_states_out`` in place; so do ours) computing a depthwise causal conv in fp32,
   the backward by autograd. They are set in causal_conv1d.cpp_functions (so the
   package's own ``causal_conv1d_fn`` runs them) and in every loaded mamba_ssm module that
   holds them as globals. Without causal-conv1d installed, our own reference
   (``conv1d_ref`` below, causal_conv1d_ref's signature) stands in for the package's.
3. The interpreter has no driver: ``torch.cuda.device(None)`` and
   ``torch.cuda.get_device_properties`` raise on a CPU build, and a Triton autotuner
   cannot benchmark. ``torch.cuda.device`` becomes a no-op context manager and
   ``get_device_properties`` answers ``multi_processor_count=SM_COUNT`` (only when CUDA
   is unavailable), and every autotuner in the loaded
   ``mamba_ssm.ops.triton`` and ``fla`` modules is pinned to one of its own configs (the
   smallest tiles, see TILES; every config of an autotuner computes the same thing).
4. Triton 3.9's interpreter leaves a ``for i in range(n)`` loop index a Python int where
   compiled Triton has a tensor, and fla's chunk_rwkv6 calls ``i.to(tl.int64)`` on one.
   We extend the interpreter's source rewrite to make it a tensor (see
   ``_loop_indices_as_tensors``). Its int32 overflow checks (a debug aid compiled
   kernels leave out) are turned off: they took over half its time.
5. mamba_ssm 2.3's ``mamba_inner_ref`` is PyTorch but scans with the CUDA
   ``selective_scan_fn``; the namespace's version scans with ``selective_scan_ref``.

On a machine with CUDA and a full build, nothing is stubbed or pinned and the namespace
holds the real kernels. Known interpreter limits: bf16 arithmetic is wrong (use fp32 or
fp16). mamba_ssm's own limits: ``mamba_split_conv1d_scan_ref`` normalises over all of
d_inner, unlike its kernel, so it is no reference at ngroups > 1;
``mamba_split_conv1d_scan_combined`` asserts that its conv channels (d_inner + 2 * ngroups *
d_state) are a multiple of 8; ``ssd_chunk_scan_combined_ref`` needs whole chunks.

    import kernel_standins                      # tests/ is on sys.path under pytest
    if (why := kernel_standins.available()) is not None:
        pytest.skip(why)
    ks = kernel_standins.install()
    out = ks.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=16, D=D)
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import sys
import types
import warnings

import torch
import torch.nn.functional as F

# Pip distribution -> top-level module, with the lowest version whose API we rely on.
REQUIRED = {
    "mamba-ssm": ("mamba_ssm", "2.0", "the SSD Triton kernels (ops/triton/ssd_combined.py)"),
    "flash-linear-attention": ("fla", "0.2", "chunk_rwkv6 in the (B, L, H, K) layout"),
    "triton": ("triton", "2.2", "mamba_ssm's SSD kernels"),
}
OPTIONAL = {"causal-conv1d": "causal_conv1d"}  # its causal_conv1d_ref and causal_conv1d_fn

# Compiled extensions that a CPU build lacks, and the package that imports each.
COMPILED = {"selective_scan_cuda": "mamba-ssm", "causal_conv1d_cuda": "causal-conv1d"}

# Modules whose Triton autotuners are pinned (prefixes of sys.modules names).
PINNED_PREFIXES = ("mamba_ssm.ops.triton", "fla.")

_STATE: types.SimpleNamespace | None = None


# ---------------------------------------------------------------------------- checks

def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v.split("+")[0])[:3])


def available() -> str | None:
    """None when ``install()`` can work here, else a one-line reason to skip."""
    for dist, (module, min_version, why) in REQUIRED.items():
        version = _version(dist)
        if version is None or importlib.util.find_spec(module) is None:
            return f"{dist} is not installed (needed for {why})"
        if _vtuple(version) < _vtuple(min_version):
            return f"{dist} {version} is older than {min_version} (needed for {why})"
    if torch.cuda.is_available():  # the kernels run for real: make gpu-check's parity covers them
        return "CUDA is available: the CPU route through stand-ins is for machines without a GPU"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return ("no CUDA and TRITON_INTERPRET is not 1: the Triton kernels cannot run "
                "(set it before triton is first imported, as tests/conftest.py does)")
    return None


# ---------------------------------------------------------------- compiled stand-ins

def _raiser(module: str, name: str):
    def standin(*args, **kwargs):
        raise NotImplementedError(
            f"{module}.{name}: stand-in for the compiled {module}: no CUDA build on this "
            f"machine; call the Python reference instead (tests/kernel_standins.py)")
    standin.__name__ = standin.__qualname__ = name
    return standin


def _standin_module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name, f"Stand-in for the compiled {name} (tests/kernel_standins.py): "
                                 f"every function raises NotImplementedError.")
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, origin="tests/kernel_standins.py")
    mod.__file__ = __file__
    mod.LINBENCH_STANDIN = True

    def __getattr__(attr: str):  # any function the package looks up, e.g. fwd, bwd
        if attr.startswith("_"):  # dunders and private probes (pytest, inspect) get none
            raise AttributeError(attr)
        return _raiser(name, attr)

    mod.__getattr__ = __getattr__
    return mod


def _is_standin(module) -> bool:
    return getattr(module, "LINBENCH_STANDIN", False) is True


def _stand_in_compiled() -> list[str]:
    """Put a stand-in into sys.modules for each compiled extension that will not import."""
    done = []
    for name, dist in COMPILED.items():
        if _version(dist) is None:  # the package that imports it is not installed
            continue
        if name in sys.modules:
            if _is_standin(sys.modules[name]):
                done.append(name)
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            sys.modules[name] = _standin_module(name)
            done.append(name)
    return done


# ------------------------------------------------------------- causal conv1d, Python

def conv1d_ref(x, weight, bias=None, initial_states=None, return_final_states=False,
               final_states_out=None, activation=None, seq_idx=None):
    """Depthwise causal conv1d, our own reference with causal_conv1d_ref's signature
    (used only where causal-conv1d is not installed).

    x: (batch, dim, seqlen); weight: (dim, width); bias: (dim,); initial_states:
    (batch, dim, width - 1); seq_idx: (batch, seqlen), a position sees only earlier
    positions of its own sequence (and a negative id gives 0); activation: None or
    "silu"/"swish". Returns out (batch, dim, seqlen) [, final_states (batch, dim, width - 1)].
    """
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError("activation must be None, silu, or swish")
    dtype_in, (dim, width), seqlen = x.dtype, weight.shape, x.shape[-1]
    x = x.to(weight.dtype)
    if initial_states is None:
        xp = F.pad(x, (width - 1, 0))
    else:
        xp = torch.cat([initial_states.to(weight.dtype), x], dim=-1)
    if seq_idx is None:
        out = F.conv1d(xp, weight.unsqueeze(1), bias, groups=dim)
    else:
        assert not return_final_states, "seq_idx does not support return_final_states"
        prev = (seq_idx.new_full((x.shape[0], width - 1), -1) if initial_states is None
                else seq_idx[:, :1].expand(-1, width - 1))
        ids = torch.cat([prev, seq_idx], dim=-1).unfold(-1, width, 1)  # (b, l, width)
        same = (ids == seq_idx.unsqueeze(-1)).to(xp.dtype)
        out = (xp.unfold(-1, width, 1) * same.unsqueeze(1) * weight[None, :, None, :]).sum(-1)
        if bias is not None:
            out = out + bias[None, :, None]
        out = out.masked_fill((seq_idx < 0).unsqueeze(1), 0.0)
    if activation is not None:
        out = F.silu(out)
    out = out[..., :seqlen].to(dtype_in)
    if not return_final_states:
        return out
    final = xp[..., xp.shape[-1] - (width - 1):].to(dtype_in)  # the last width - 1 inputs
    if final_states_out is not None:
        final_states_out.copy_(final)
        final = final_states_out
    return out, final


def _reference_conv():
    try:
        from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref
        return causal_conv1d_ref
    except ImportError:
        return conv1d_ref


def causal_conv1d_fwd_function(x, weight, bias, seq_idx, initial_states, final_states_out,
                               silu_activation):
    """Python stand-in for causal_conv1d.cpp_functions.causal_conv1d_fwd_function:
    same positional arguments, same result; fp32 inside like the CUDA kernel; writes
    ``final_states_out`` (batch, dim, width - 1) in place when given."""
    ref = _reference_conv()
    with torch.no_grad():
        res = ref(x.float(), weight.float(), None if bias is None else bias.float(),
                  initial_states=None if initial_states is None else initial_states.float(),
                  return_final_states=final_states_out is not None,
                  activation="silu" if silu_activation else None, seq_idx=seq_idx)
        out, final = res if final_states_out is not None else (res, None)
        if final is not None:
            final_states_out.copy_(final)
    return out.to(x.dtype)


def causal_conv1d_bwd_function(x, weight, bias, dout, seq_idx, initial_states, dfinal_states,
                               dx, return_dinitial_states, silu_activation):
    """Python stand-in for causal_conv1d.cpp_functions.causal_conv1d_bwd_function:
    same positional arguments, returns (dx, dweight, dbias, dinitial_states); writes into
    ``dx`` when one is given (mamba_ssm passes a view of its gradient buffer)."""
    ref = _reference_conv()
    with torch.enable_grad():
        xg = x.detach().float().requires_grad_()
        wg = weight.detach().float().requires_grad_()
        bg = None if bias is None else bias.detach().float().requires_grad_()
        ig = None
        if initial_states is not None:
            ig = initial_states.detach().float().requires_grad_(bool(return_dinitial_states))
        want_final = dfinal_states is not None
        res = ref(xg, wg, bg, initial_states=ig, return_final_states=want_final,
                  activation="silu" if silu_activation else None, seq_idx=seq_idx)
        outs, grads = ([res[0], res[1]], [dout.float(), dfinal_states.float()]) if want_final \
            else ([res], [dout.float()])
        inputs = [t for t in (xg, wg, bg, ig) if t is not None and t.requires_grad]
        got = dict(zip(map(id, inputs), torch.autograd.grad(outs, inputs, grads, allow_unused=True)))

    def grad_of(t, like):
        g = got.get(id(t)) if t is not None else None
        if t is not None and g is None:
            g = torch.zeros_like(t)
        return None if g is None else g.to(like.dtype)

    gx = grad_of(xg, x)
    if dx is None:
        dx = gx
    else:
        dx.copy_(gx)
    dinit = grad_of(ig, initial_states) if return_dinitial_states and ig is not None else None
    return dx, grad_of(wg, weight), grad_of(bg, bias) if bias is not None else None, dinit


_CONV_GLOBALS = {
    "causal_conv1d_fwd_function": causal_conv1d_fwd_function,
    "causal_conv1d_bwd_function": causal_conv1d_bwd_function,
}


def _install_conv() -> tuple[object, object, str]:
    """Route causal conv1d through the Python functions above where the compiled one is a
    stand-in. Returns (causal_conv1d_fn, causal_conv1d_ref, where they come from)."""
    compiled = sys.modules.get("causal_conv1d_cuda")
    if compiled is not None and not _is_standin(compiled):
        from causal_conv1d import causal_conv1d_fn
        from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref
        return causal_conv1d_fn, causal_conv1d_ref, "causal-conv1d (compiled)"
    try:
        import causal_conv1d.causal_conv1d_interface as iface
        import causal_conv1d.cpp_functions as cpp
    except ImportError:
        iface = None
    if iface is not None:
        for mod in (cpp, iface):  # CausalConv1dFn looks these up in iface at run time
            for name, fn in _CONV_GLOBALS.items():
                setattr(mod, name, fn)
        fn, ref, where = iface.causal_conv1d_fn, iface.causal_conv1d_ref, \
            "causal-conv1d (Python fwd/bwd stand-ins)"
    else:
        fn, ref, where = _ConvFn.apply_fn, conv1d_ref, "tests/kernel_standins.py (no causal-conv1d)"
    # mamba_ssm binds them at import; set them in every loaded module that holds them.
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("mamba_ssm"):
            continue
        for attr, value in (*_CONV_GLOBALS.items(), ("causal_conv1d_fn", fn)):
            if attr in vars(mod):
                setattr(mod, attr, value)
    return fn, ref, where


class _ConvFn(torch.autograd.Function):
    """causal_conv1d_fn without causal-conv1d: our fwd/bwd functions behind autograd."""

    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx, initial_states, activation):
        ctx.silu = activation in ("silu", "swish")
        ctx.save_for_backward(x, weight, bias, seq_idx, initial_states)
        return causal_conv1d_fwd_function(x, weight, bias, seq_idx, initial_states, None, ctx.silu)

    @staticmethod
    def backward(ctx, dout):
        x, weight, bias, seq_idx, initial_states = ctx.saved_tensors
        dx, dw, db, dinit = causal_conv1d_bwd_function(
            x, weight, bias, dout, seq_idx, initial_states, None, None,
            initial_states is not None and initial_states.requires_grad, ctx.silu)
        return dx, dw, db, None, dinit, None

    @staticmethod
    def apply_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                 return_final_states=False, final_states_out=None, activation=None):
        if return_final_states:
            raise NotImplementedError("return_final_states needs causal-conv1d installed")
        return _ConvFn.apply(x, weight, bias, seq_idx, initial_states, activation)


# ------------------------------------------------------------ interpreter fix-ups

class _NoDevice(contextlib.nullcontext):
    """No-op stand-in for torch.cuda.device on a machine without CUDA (the kernels'
    ``with torch.cuda.device(x.device.index)`` gets None for a CPU tensor)."""

    def __init__(self, device=None):
        super().__init__()
        self.idx = device


# What the kernels' launch code reads from torch.cuda.get_device_properties on a CPU
# tensor: only multi_processor_count (mamba_ssm sizes its split reductions by it).
SM_COUNT = int(os.environ.get("KERNEL_STANDINS_SM_COUNT", "132"))  # an H100's


def _cpu_device_properties(device=None):
    """Stand-in for torch.cuda.get_device_properties without CUDA."""
    return types.SimpleNamespace(name="cpu (tests/kernel_standins.py)", major=0, minor=0,
                                 multi_processor_count=SM_COUNT, total_memory=0,
                                 shared_memory_per_block=48 * 1024,
                                 shared_memory_per_block_optin=48 * 1024)


def _patch_cuda_device() -> bool:
    """torch.cuda.device -> no-op context manager and torch.cuda.get_device_properties ->
    a CPU stand-in, only where CUDA is unavailable (where the originals only raise)."""
    if torch.cuda.is_available():
        return False
    torch.cuda.device = _NoDevice
    torch.cuda.get_device_properties = _cpu_device_properties
    return True


def _skip_overflow_checks() -> bool:
    """The interpreter checks every int32 add/sub/mul of a kernel for overflow (a debug
    aid that compiled kernels leave out unless built with debug): over half its time on
    these kernels. Off, unless KERNEL_STANDINS_SANITIZE_OVERFLOW=1."""
    if os.environ.get("KERNEL_STANDINS_SANITIZE_OVERFLOW") == "1":
        return False
    import dataclasses
    from triton.runtime import interpreter
    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    return True


def _loop_indices_as_tensors() -> bool:
    """Compiled Triton makes the index of a ``for i in range(n)`` / ``tl.range`` loop a
    tensor; Triton 3.9's interpreter leaves it a Python int, so kernels that call a
    tensor method on it (fla's chunk_fwd_h: ``i_t.to(tl.int64)``) fail with "'int' object
    has no attribute 'to'". Extend the interpreter's source rewrite so that such a loop
    starts with ``i = interpreter_semantic.to_tensor(i, False)``, as it already does for
    every assignment. ``tl.static_range`` loops (unrolled, constexpr index) are left be."""
    import ast

    from triton.runtime import interpreter
    if getattr(interpreter.FunctionRewriter.ast_transformer, "kernel_standins", False):
        return True

    def is_range(call) -> bool:
        return isinstance(call, ast.Call) and (
            (isinstance(call.func, ast.Name) and call.func.id == "range")
            or (isinstance(call.func, ast.Attribute) and call.func.attr == "range"))

    class LoopIndexAsTensor(interpreter.ASTTransformer):
        kernel_standins = True

        def visit_For(self, node):
            node = self.generic_visit(node)
            if is_range(node.iter) and isinstance(node.target, ast.Name):
                name = node.target.id
                to_tensor = ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()),
                                          attr="to_tensor", ctx=ast.Load())
                wrap = ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())],
                                  value=ast.Call(func=to_tensor, args=[ast.Name(id=name, ctx=ast.Load()),
                                                                       ast.Constant(value=False)],
                                                 keywords=[]))
                node.body.insert(0, ast.copy_location(wrap, node))
            return node

    interpreter.FunctionRewriter.ast_transformer = LoopIndexAsTensor()
    interpreter.InterpretedFunction.rewritten_fn.clear()  # rewrite again on next launch
    return True


def _tile_size(config) -> int:
    size = 1
    for value in config.kwargs.values():
        if isinstance(value, int) and not isinstance(value, bool):
            size *= max(value, 1)
    return size


def _autotuners(obj, seen: set):
    """The Autotuner objects in a (possibly Heuristics-wrapped) Triton kernel."""
    from triton.runtime.autotuner import Autotuner
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        if isinstance(obj, Autotuner):
            yield obj
        obj = getattr(obj, "fn", None)


# Which config an autotuner keeps: "smallest" tiles (the default: on the small shapes of
# a test the interpreter spends less on masked-off lanes, ~2x faster than "largest" on
# the SSD kernels, and the kernels' multi-tile paths get exercised) or "largest".
TILES = os.environ.get("KERNEL_STANDINS_TILES", "smallest")


def _pin_autotuners() -> dict[str, str]:
    """Cut every autotuner in the loaded mamba_ssm.ops.triton and fla modules to one of
    its own configs: the smallest (or largest, see TILES) product of its integer
    meta-parameters, ties broken by the fewest stages and warps. Every config of an
    autotuner computes the same result; only the speed differs."""
    pinned, seen = {}, set()
    sign = -1 if TILES == "largest" else 1  # prefer few stages/warps either way
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(PINNED_PREFIXES):
            continue
        for attr, value in list(vars(mod).items()):
            for tuner in _autotuners(value, seen):
                if len(tuner.configs) > 1:
                    pick = max if TILES == "largest" else min
                    best = pick(tuner.configs, key=lambda c: (
                        _tile_size(c), sign * (c.num_stages or 0), sign * (c.num_warps or 0)))
                    tuner.configs = [best]
                    tuner.cache.clear()
                pinned[f"{mod_name}.{attr}"] = str(tuner.configs[0])
    return pinned


# ------------------------------------------------- references that call the CUDA scan

def _on_reference_scan(ssi, fn):
    """Some of mamba_ssm 2.3's references are pure PyTorch but for one call: they scan with
    ``selective_scan_fn`` (the CUDA kernel), looked up in selective_scan_interface at call
    time (mamba_inner_ref; ssd_selective_scan and so mamba_split_conv1d_scan_ref and
    mamba_conv1d_scan_ref). Without the compiled scan, run ``fn`` with that global bound to
    ``selective_scan_ref`` (same signature) for the duration of each call."""
    if not _is_standin(sys.modules.get("selective_scan_cuda")):
        return fn

    def on_reference_scan(*args, **kwargs):
        saved = ssi.selective_scan_fn
        ssi.selective_scan_fn = ssi.selective_scan_ref
        try:
            return fn(*args, **kwargs)
        finally:
            ssi.selective_scan_fn = saved

    on_reference_scan.__name__ = on_reference_scan.__qualname__ = fn.__name__
    on_reference_scan.__doc__ = (f"{fn.__module__}.{fn.__name__}, scanning with selective_scan_ref "
                                 f"(tests/kernel_standins.py).\n{fn.__doc__ or ''}")
    on_reference_scan.__wrapped__ = fn
    return on_reference_scan


def _import_mamba_ssm() -> str:
    """Import the mamba_ssm package; where its ``__init__`` fails (it imports every model
    module, Mamba-3 and the HF LM head included), register the package without running
    it, so that the submodules used here (which need only torch, triton and einops) still
    import. Returns how it was imported."""
    if "mamba_ssm" in sys.modules:
        return "package"
    try:
        importlib.import_module("mamba_ssm")
        return "package"
    except ImportError as err:
        spec = importlib.util.find_spec("mamba_ssm")
        pkg = importlib.util.module_from_spec(spec)  # __path__ set, __init__ not run
        pkg.__version__ = _version("mamba-ssm")
        sys.modules["mamba_ssm"] = pkg
        return f"submodules only (mamba_ssm/__init__.py: {type(err).__name__}: {err})"


# --------------------------------------------------------------------------- install

_KERNEL_MODULES = (
    "mamba_ssm.ops.selective_scan_interface",
    "mamba_ssm.ops.triton.ssd_combined",
    "mamba_ssm.ops.triton.layernorm_gated",
    "fla.ops.rwkv6",
)


def install() -> types.SimpleNamespace:
    """Make the real packages' references and Triton kernels callable here (idempotent).

    Returns a namespace: mamba_inner_ref, selective_scan_ref (the references of the
    compiled kernels), mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined,
    chunk_rwkv6 (Triton), causal_conv1d_fn, causal_conv1d_ref; versions (pip name ->
    version or None), stand_ins (the compiled modules faked), mamba_ssm_import
    ("package", or "submodules only (...)" where mamba_ssm/__init__ cannot import),
    conv_source (where causal_conv1d_fn/_ref come from), interpret (Triton interpreter on),
    pinned (autotuner -> the one config kept; empty with CUDA).
    """
    global _STATE
    if _STATE is not None:
        return _STATE
    reason = available()
    if reason is not None:
        raise RuntimeError(f"kernel_standins.install(): {reason}")

    stand_ins = _stand_in_compiled()
    # Importing them warns ~30 times on a CPU box (fla: "Triton is not supported on current
    # platform, roll back to CPU", "Flash Attention is not installed"; mamba_ssm's Mamba-3
    # imports: cutlass and torch.jit deprecations): all expected here, none ours.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mamba_ssm_import = _import_mamba_ssm()
        mods = {name: importlib.import_module(name) for name in _KERNEL_MODULES}
    conv_fn, conv_ref, conv_source = _install_conv()
    interpret = not torch.cuda.is_available()
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction
        kernel = mods["mamba_ssm.ops.triton.ssd_combined"]._chunk_scan_chunk_state_bwd_dx_kernel
        while not isinstance(kernel, InterpretedFunction) and hasattr(kernel, "fn"):
            kernel = kernel.fn
        if not isinstance(kernel, InterpretedFunction):
            raise RuntimeError("kernel_standins.install(): mamba_ssm's Triton kernels were "
                               "imported before TRITON_INTERPRET=1 was set, so they cannot run "
                               "without a GPU; set it before anything imports triton")
        _patch_cuda_device()
        _skip_overflow_checks()
        _loop_indices_as_tensors()
        pinned = _pin_autotuners()
    else:
        pinned = {}

    ssi, ssd = mods["mamba_ssm.ops.selective_scan_interface"], mods["mamba_ssm.ops.triton.ssd_combined"]
    rwkv6 = mods["fla.ops.rwkv6"]
    versions = {dist: _version(dist) for dist in (*REQUIRED, *OPTIONAL, "torch")}
    _STATE = types.SimpleNamespace(
        mamba_inner_ref=_on_reference_scan(ssi, ssi.mamba_inner_ref),
        selective_scan_ref=ssi.selective_scan_ref,
        mamba_chunk_scan_combined=ssd.mamba_chunk_scan_combined,
        mamba_split_conv1d_scan_combined=ssd.mamba_split_conv1d_scan_combined,
        chunk_rwkv6=rwkv6.chunk_rwkv6,
        causal_conv1d_fn=conv_fn,
        causal_conv1d_ref=conv_ref,
        versions=versions,
        stand_ins=stand_ins,
        mamba_ssm_import=mamba_ssm_import,
        conv_source=conv_source,
        interpret=interpret,
        pinned=pinned,
    )
    return _STATE
