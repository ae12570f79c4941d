"""Imports made when needed: an optional dependency (a missing extra names its pip install) or a ``"module:attr"``."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def require(module: str, extra: str, package: str | None = None) -> ModuleType:
    """Import ``module`` or raise ImportError naming ``pip install 'echo-rl[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pkg = package or module.split(".")[0]
        raise ImportError(
            f"{pkg} is needed for this feature: pip install 'echo-rl[{extra}]' (or pip install {pkg})"
        ) from exc


def load_attr(target: str) -> Any:
    """``"package.module:attr"`` -> that attribute, its module imported now: how registries name built-ins,
    so checking a name stays cheap and the heavy module loads only when the thing is built."""
    module, sep, attr = target.partition(":")
    if not (module and sep and attr):
        raise ValueError(f"{target!r} is not 'module:attr'")
    return getattr(importlib.import_module(module), attr)
