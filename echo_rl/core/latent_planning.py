"""Latent planning at its promised import path, ``echo_rl.core.latent_planning``.

The code lives in :mod:`echo_rl.planning` (distribution, encoder, policy, optimizer); this module
only re-exports it so the documented imports keep working.
"""

from echo_rl.config import PlanningConfig
from echo_rl.planning.distribution import PlanDistribution, consecutive_plan_kl, gaussian_kl
from echo_rl.planning.encoder import StateWindow, TrajectoryEncoder
from echo_rl.planning.optimizer import LatentPlanningOptimizer
from echo_rl.planning.policy import PolicyNetwork

__all__ = ["LatentPlanningOptimizer", "PlanDistribution", "PlanningConfig", "PolicyNetwork", "StateWindow",
           "TrajectoryEncoder", "consecutive_plan_kl", "gaussian_kl"]
