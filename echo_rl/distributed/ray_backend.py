"""Ray backend for vector training (``TrainingConfig.backend='ray'``)."""

from __future__ import annotations

from echo_rl.config import ConfigError, TrainingConfig


def build_ray_agent(config: TrainingConfig, device):
    """The trainer's agent with actors (and learners) placed as Ray actors."""
    raise ConfigError("TrainingConfig.backend='ray' is not implemented yet; use backend=local")
