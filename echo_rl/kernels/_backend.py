"""Loads the optional compiled kernels (``_native``); everything falls back to numpy without them.

Set ``ECHO_RL_DISABLE_NATIVE=1`` to force the numpy reference path (tests run both).
"""

from __future__ import annotations

import importlib
import os

_native = None
_why_not = ""
# every function native/module.cpp registers; a loaded module lacking one is stale
_FUNCTIONS = ("attention_cost", "effective_cost", "bw_priorities", "bw_efficiency", "plan_surprise", "ema_update",
              "prefix_match", "cdf_sample", "scan", "tree_set", "tree_set_range", "tree_find", "tree_sample",
              "first_invalid", "update_priorities", "per_update", "sample_region", "write_rows", "gather", "add_one")

if os.environ.get("ECHO_RL_DISABLE_NATIVE", "").lower() in ("1", "true", "yes"):
    _why_not = "disabled by ECHO_RL_DISABLE_NATIVE"
else:
    try:
        _native = importlib.import_module("echo_rl.kernels._native")
    except ImportError as exc:  # not built (no compiler at install time) or ABI mismatch
        _native = None
        _why_not = f"compiled kernels not built or not loadable ({exc}); reinstall with a C++ compiler"
    else:  # a module built from older sources would fail on first use of a newer kernel
        _stale = [f for f in _FUNCTIONS if not hasattr(_native, f)]
        if _stale:
            _native = None
            _why_not = (f"the compiled module predates its source (no {', '.join(_stale)}); "
                        "rebuild with `pip install -e .`")


def kernels_available() -> bool:
    """True when the compiled C++ fast path is loaded."""
    return _native is not None


def kernels_status() -> str:
    """One line: which backend is in use and, if numpy, why."""
    return "compiled C++ kernels loaded" if _native is not None else f"numpy reference ({_why_not})"


def native_module():
    """The compiled module, or None."""
    return _native


def resolve(use_native: bool | None):
    """The native module to use for an object: ``None`` = auto, ``True`` = require it, ``False`` = numpy."""
    if use_native is None:
        return _native
    if use_native and _native is None:
        raise RuntimeError(f"use_native=True but {kernels_status()}")
    return _native if use_native else None


def as_c_contiguous(arr):
    """``arr`` itself when C-contiguous, else a C-contiguous copy; keeps 0-d arrays 0-d
    (``np.ascontiguousarray`` would make them 1-d)."""
    return arr if arr.flags.c_contiguous else arr.copy(order="C")
