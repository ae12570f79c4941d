"""Config dataclasses: validated on construction, YAML round-trip, dotted overrides.

This is the ground floor: it imports nothing of ``echo_rl`` above it. Names a
config holds but an upper floor owns (tasks, agents, loggers, backbones) are
checked by the rules their owners register here (:func:`register_name_rule`).

Its rooms: ``base`` (:func:`spec`, :class:`ConfigBase`, :class:`ConfigError`),
``components`` (each part's config), ``names`` (name rules and the vector
policy's part names) and ``training`` (:class:`TrainingConfig`). Import from
``echo_rl.config``; the rooms are how the floor is laid out, not an API.
"""

from echo_rl.config.base import ConfigBase, ConfigError, _coerce, _type_ok, parse_override, spec
from echo_rl.config.components import (
    LATENT_PLAN_DEFAULT,
    BandwidthConfig,
    DQNConfig,
    EchoAgentConfig,
    ExecutionConfig,
    LMConfig,
    PlanningConfig,
    PPOConfig,
    ReplayConfig,
)
from echo_rl.config.names import (
    AUGMENTATION_NAMES,
    ENCODER_NAMES,
    NAME_RULES,
    _name_rules,
    name_rule,
    register_name_rule,
)
from echo_rl.config.training import TrainingConfig

__all__ = [
    "AUGMENTATION_NAMES", "BandwidthConfig", "ConfigBase", "ConfigError", "DQNConfig", "ENCODER_NAMES",
    "EchoAgentConfig", "LATENT_PLAN_DEFAULT",
    "ExecutionConfig", "LMConfig", "NAME_RULES", "PPOConfig", "PlanningConfig", "ReplayConfig", "TrainingConfig",
    "name_rule", "parse_override", "register_name_rule", "spec",
]
