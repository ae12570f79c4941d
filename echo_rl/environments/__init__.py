"""Environments: the text-env contract (``base``), the registry (``make_env``) and the five benchmarks.

Modules are imported on demand (``make_env(name)`` imports ``echo_rl.environments.<name>``),
so optional dependencies (ALFWorld's TextWorld, WebShop's rank_bm25/thefuzz) load only when used.
"""

# The registry is light (no torch, no gymnasium): the names user code registers tasks with live here too.
from echo_rl.environments.registry import TaskFormat, TaskSpec, make_env, register_task, register_text_env, task_spec

__all__ = ["TaskFormat", "TaskSpec", "make_env", "register_task", "register_text_env", "task_spec"]
