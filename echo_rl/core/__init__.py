"""The promised import paths ``echo_rl.core`` and ``echo_rl.core.*``: thin compatibility modules.

The code lives in rooms named for what they hold: ``echo_rl.planning`` (``core.latent_planning``),
``echo_rl.engine`` (``core.async_execution``), ``echo_rl.replay`` (``core.prioritized_replay``);
``echo_rl.training.bandwidth`` and ``echo_rl.engine.scheduler`` (``core.bandwidth``: the η_bw tracker is
training's, the priority rule the engine's). The config classes are re-exported here;
the heavier classes are imported from their modules so importing ``echo_rl.core`` stays cheap.
"""

from echo_rl.config import BandwidthConfig, ExecutionConfig, PlanningConfig, PPOConfig, ReplayConfig

__all__ = ["BandwidthConfig", "ExecutionConfig", "PlanningConfig", "PPOConfig", "ReplayConfig"]
