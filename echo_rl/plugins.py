"""User extensions for the ``echo-rl`` CLI: modules that register tasks, backbones, agents, objectives, baselines.

A user's own task (``register_text_env``), backbone (``echo_rl.models.register_backbone``), vector
agent (``echo_rl.training.agents.register_agent``), LM objective
(``echo_rl.lm.objectives.register_lm_objective``) or baseline
(``echo_rl.evaluation.methods.register_baseline`` / ``register_trained``) is registered by importing
their module (worked examples: ``examples/extending/``). In Python, importing it is enough; the CLI
runs in a new process, so it imports, before parsing anything:

* every module named by ``--plugin MODULE`` (repeatable; ``echo-rl --plugin my_tasks train ...``),
* every module in ``$ECHO_RL_PLUGINS`` (comma separated),
* every entry point of the ``echo_rl.plugins`` group (a package declares
  ``[project.entry-points."echo_rl.plugins"] my_tasks = "my_pkg.tasks"``).
"""

from __future__ import annotations

import importlib
import os
from importlib import metadata

from echo_rl.config import ConfigError

ENV_VAR = "ECHO_RL_PLUGINS"
ENTRY_POINT_GROUP = "echo_rl.plugins"


def plugin_modules(extra: list[str] | None = None) -> list[str]:
    """Module names to import: ``extra`` (``--plugin``), then ``$ECHO_RL_PLUGINS``, in order, once each."""
    names = [*(extra or []), *(m.strip() for m in os.environ.get(ENV_VAR, "").split(",") if m.strip())]
    return list(dict.fromkeys(names))


def load_plugins(extra: list[str] | None = None) -> list[str]:
    """Import the plugin modules and entry points; returns what was loaded. A module that cannot be
    imported is a one-line :class:`ConfigError` naming it (its own errors are not hidden)."""
    loaded = []
    for name in plugin_modules(extra):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):  # the plugin itself (or its package) is missing
                raise ConfigError(f"plugin module {name!r} not found (from --plugin or ${ENV_VAR}); it must be "
                                  f"importable: on sys.path or installed") from None
            raise
        loaded.append(name)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        ep.load()
        loaded.append(f"{ep.name}={ep.value}")
    return loaded
