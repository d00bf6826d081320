"""Guarded imports of the CUDA fast paths.

flash-attn, mamba-ssm and flash-linear-attention fail to import on a CPU-only
machine (and sometimes with errors other than ImportError, e.g. a missing
libcudart). Every fast path goes through ``optional`` so that no module of the
zoo ever fails to import because a CUDA package is absent.
"""
from __future__ import annotations

import importlib


def optional(module: str, attr: str | None = None):
    """Return ``module`` (or ``module.attr``), or None when it cannot be imported."""
    try:
        mod = importlib.import_module(module)
        return getattr(mod, attr) if attr else mod
    except Exception:  # ImportError, OSError (no libcuda), RuntimeError, AttributeError
        return None
