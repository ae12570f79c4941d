"""The agent protocol: everything :class:`~echo_rl.training.trainer.EchoRLTrainer` calls on an agent.

The trainer owns the schedule (evaluation, checkpoints), the run directory and
metrics; an agent owns acting and learning. :class:`Agent` names every member
the trainer uses, so an agent is checked once when it is built
(:func:`missing_members`) instead of probed with ``getattr`` on every step.
:class:`AgentBase` carries the default hooks (no warm start, the trainer's
env-step schedule, no wall-clock figures), so an agent writes only what it
does differently.

Any method may return an awaitable instead of its value: the language-model
agent acts through the execution engine on the trainer's event loop, so its
``start``, ``train_iteration``, ``run_evaluation`` and ``close`` are coroutines.
The vector agents (PPO, IMPALA, echo-rl) return plain values.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Awaitable, Mapping, Protocol, TypeVar, Union, runtime_checkable

from echo_rl.config import TrainingConfig
from echo_rl.environments.minigrid_vector import make_vector_env
from echo_rl.training.progress import SILENT, TrainingProgress

EVAL_SEED_OFFSET = 1_000_000  # evaluation episodes use seeds disjoint from the training actors'

T = TypeVar("T")
MaybeAwaitable = Union[T, Awaitable[T]]


@runtime_checkable
class Agent(Protocol):
    """What the trainer drives. Counters are summed over actors; an update is one learner step."""

    env_steps: int
    updates: int
    #: evaluate before the first iteration of a fresh run (the start of every learning curve)
    evaluate_at_start: bool
    #: where the agent says what its long work is doing (warm start, evaluation); the trainer sets its own
    progress: TrainingProgress
    #: a progress line after every iteration (one is slow: a language-model update), not every ~10% of the budget
    line_per_iteration: bool
    #: the iterations the run ends after, for the progress line's count and time left (0: the env-step budget)
    iteration_budget: int

    @property
    def finished(self) -> bool:
        """Done before the env-step budget (e.g. a cap on updates)."""
        ...

    @property
    def timings(self) -> Mapping[str, float]:
        """Wall-clock figures of the last iteration (``timings.jsonl``, never ``metrics.jsonl``)."""
        ...

    def start(self) -> MaybeAwaitable[None]:
        """Called once before the first iteration (fresh or resumed)."""
        ...

    def due(self) -> bool | None:
        """Evaluate/checkpoint after this iteration? None: the trainer's env-step schedule decides."""
        ...

    def train_iteration(self) -> MaybeAwaitable[dict[str, float]]:
        """Collect ``config.steps_per_update`` env steps, learn, advance the counters; flat metrics."""
        ...

    def run_evaluation(self, episodes: int) -> MaybeAwaitable[dict[str, float]]:
        """The run's evaluation: a fixed, seeded set of ``episodes`` held-out episodes."""
        ...

    def summary_fields(self) -> dict[str, Any]:
        """Extra entries of the run's ``summary.json``."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def rollout_state(self) -> Any:
        """Actor state (envs mid-episode) as plain data for ``state_codec``, so a resumed run continues exactly."""
        ...

    def load_rollout_state(self, state: Any) -> None: ...

    def close(self) -> MaybeAwaitable[None]: ...


AGENT_MEMBERS = ("env_steps", "updates", "evaluate_at_start", "finished", "timings", "start", "due",
                 "train_iteration", "run_evaluation", "summary_fields", "state_dict", "load_state_dict",
                 "rollout_state", "load_rollout_state", "close", "progress", "line_per_iteration", "iteration_budget")


def missing_members(agent: Any) -> list[str]:
    """The :class:`Agent` members ``agent`` lacks (``isinstance(agent, Agent)`` says only yes or no)."""
    return [name for name in AGENT_MEMBERS if not hasattr(agent, name)]


class AgentBase:
    """Default hooks of :class:`Agent`; subclasses set ``env_steps`` / ``updates`` and implement the rest."""

    evaluate_at_start: bool = False
    timings: Mapping[str, float] = MappingProxyType({})  # an agent that times its parts assigns a dict
    progress: TrainingProgress = SILENT
    line_per_iteration: bool = False
    iteration_budget: int = 0

    @property
    def finished(self) -> bool:
        return False

    def start(self) -> MaybeAwaitable[None]:
        return None

    def due(self) -> bool | None:
        return None

    def summary_fields(self) -> dict[str, Any]:
        return {}


class VectorAgentBase(AgentBase):
    """Agents on vector (MiniGrid) envs: evaluation runs ``evaluate(make_envs, ...)`` on fresh seeded envs."""

    config: TrainingConfig

    def evaluate(self, make_envs, episodes: int, seed: int, num_envs: int = 8) -> dict[str, float]:
        raise NotImplementedError

    def run_evaluation(self, episodes: int) -> dict[str, float]:
        cfg = self.config
        make_envs = lambda n: make_vector_env(cfg.env_name, n, **cfg.env_config)  # noqa: E731
        return self.evaluate(make_envs, episodes, cfg.seed + EVAL_SEED_OFFSET, num_envs=min(cfg.num_actors, 16))


__all__ = ["AGENT_MEMBERS", "Agent", "AgentBase", "EVAL_SEED_OFFSET", "VectorAgentBase", "missing_members"]
