"""Compatibility import path of the EchoRL vector agent; it lives in :mod:`echo_rl.training.echo`.

``echo_rl.training.echo_agent:EchoAgent`` is the name run configs, checkpoints' rollout
state and user code have always imported; it is the same class.
"""

from echo_rl.training.echo.adder import REPLAY_CHECKPOINT_LIMIT, REPLAY_MEMORY_LIMIT
from echo_rl.training.echo.agent import EchoAgent, _ActorState
from echo_rl.training.echo.model import STATE_SCALE, WorldModelHead, unfold_windows

__all__ = ["EchoAgent", "REPLAY_CHECKPOINT_LIMIT", "REPLAY_MEMORY_LIMIT", "STATE_SCALE", "WorldModelHead",
           "_ActorState", "unfold_windows"]
