"""EchoRL: reinforcement learning for agents on interactive tasks."""

from echo_rl.config import (
    BandwidthConfig,
    ConfigError,
    ExecutionConfig,
    PlanningConfig,
    PPOConfig,
    ReplayConfig,
    TrainingConfig,
)

# The floors that own the names a config holds register their rules with echo_rl.config on import (the
# ground floor imports nothing above it); this package runs before any echo_rl.* import, so they are always in.
from echo_rl.environments import registry as _tasks  # noqa: E402,F401
from echo_rl.models import api as _api_models, fetch as _fetched_models  # noqa: E402,F401
from echo_rl.training import agents as _agents  # noqa: E402,F401
from echo_rl.lm import objectives as _lm_objectives  # noqa: E402,F401
from echo_rl.utils import tracking as _loggers  # noqa: E402,F401

__version__ = "0.1.0"


_LAZY = {  # heavy modules (torch, the agents, the harness) load only when asked for
    "EchoRLTrainer": "echo_rl.training.trainer",
    "BenchmarkConfig": "echo_rl.evaluation.benchmark",
    "EchoRLBenchmark": "echo_rl.evaluation.benchmark",
    "load_policy": "echo_rl.hub.models",  # hub names, run directories and exported files
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'echo_rl' has no attribute {name!r}")


__all__ = [
    "BandwidthConfig", "BenchmarkConfig", "ConfigError", "EchoRLBenchmark", "EchoRLTrainer", "ExecutionConfig", "PlanningConfig",
    "PPOConfig", "ReplayConfig", "TrainingConfig", "__version__", "load_policy",
]
