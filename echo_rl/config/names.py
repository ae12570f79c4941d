"""Name rules: how a config checks names that an upper floor owns (tasks, agents, loggers, backbones).

The config floor imports nothing above it, so each owner registers its rule
here when imported (:func:`register_name_rule`), and ``echo_rl/__init__``
imports every owner; Python runs it before any ``echo_rl.config`` import, so a
TrainingConfig is never validated without them.
"""

from __future__ import annotations

from typing import Any, Callable

NAME_RULES: dict[str, str] = {
    "task": "task(env_name): raise ConfigError for an unknown task (echo_rl.environments.registry)",
    "vector_task": "vector_task(env_name) -> bool: a MiniGrid task, else a text task (echo_rl.environments.registry)",
    "agent": "agent(name): raise ConfigError for an unknown agent (echo_rl.training.agents)",
    "loggers": "loggers(loggers, tracking): raise ConfigError for unknown loggers/options (echo_rl.utils.tracking)",
    "default_backbone": "default_backbone() -> (name, None or how to fetch it): text tasks' default backbone "
                        "(echo_rl.models.fetch)",
    "api_backbone": "api_backbone(name) -> bool: an API model, which has no weights to train (echo_rl.models.api)",
    "lm_objective": "lm_objective() -> names: the registered LM objectives (echo_rl.lm.objectives)",
}
_name_rules: dict[str, Callable[..., Any]] = {}


def register_name_rule(rule: str, fn: Callable[..., Any]) -> None:
    """Install the owner's rule for names a config holds (:data:`NAME_RULES`); registering again replaces it."""
    if rule not in NAME_RULES:
        raise ValueError(f"unknown name rule {rule!r}; allowed: {', '.join(NAME_RULES)}")
    if not callable(fn):
        raise TypeError(f"name rule {rule!r} must be callable, got {type(fn).__name__}")
    _name_rules[rule] = fn


def name_rule(rule: str) -> Callable[..., Any]:
    """The owner's rule; a missing one is an error, never a skipped check."""
    if rule not in _name_rules:
        raise RuntimeError(f"no {rule!r} name rule is registered ({NAME_RULES[rule]}); it registers on import "
                           f"of its owner, which 'import echo_rl' imports")
    return _name_rules[rule]


# Names of the vector policy's parts; their owners (echo_rl.models.encoders / .augmentation) build them.
ENCODER_NAMES = (None, "mlp", "minigrid", "minigrid_cnn", "nature_cnn", "impala_cnn")
AUGMENTATION_NAMES = (None, "random_shift", "random_crop", "color_jitter")
