"""Multi-turn episodes of raw token ids on any engine backend: the episode form of ``submit_rollout``.

The engine keeps no episode state (it serves one window per request); an
episode's history is the generator's, accumulated in the same
:class:`~echo_rl.lm.trajectory.TokenStream` the LM generator's
:class:`~echo_rl.lm.trajectory.TrajectoryBuilder` uses, and it ends as
the same :class:`~echo_rl.types.TokenTrajectory`. Sampled tokens are appended
exactly as sampled (never decoded and re-tokenized), so each turn's prompt
extends the previous one and the engine's radix cache serves it. Rewards go
to the sessions' :class:`~echo_rl.training.bandwidth.BandwidthEfficiencyTracker`
with the turn's prompt and cached lengths (η_bw), and to the trajectory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from echo_rl.config import BandwidthConfig
from echo_rl.engine.errors import AdmissionTimeout
from echo_rl.training.bandwidth import BandwidthEfficiencyTracker
from echo_rl.lm.trajectory import TokenStream
from echo_rl.types import ACTION, TokenTrajectory, role_code

if TYPE_CHECKING:
    from echo_rl.engine.request import GenerationResult

#: admission waits an RL worker sits out before its episode fails (each lasts ``ExecutionConfig.timeout``)
ADMISSION_RETRIES = 20


async def generate_admitted(engine: Any, prompt_ids: Sequence[int], **kwargs: Any) -> GenerationResult:
    """``engine.generate`` that waits out admission timeouts. A worker's own concurrency is bounded, so a long
    wait means a loaded machine, not overload; dropping the episode would bias a batch or an evaluation toward
    the episodes that happened to be admitted. A request that was never admitted sampled nothing, so the retry
    (same seed) is exact."""
    waits = 0
    while True:
        try:
            return await engine.generate(prompt_ids, **kwargs)
        except AdmissionTimeout:
            waits += 1
            if waits > ADMISSION_RETRIES:
                raise


class EpisodeSession(TokenStream):
    """One multi-turn episode on ``engine``: ``append`` observations, ``generate`` actions, ``record_reward``."""

    def __init__(self, engine: Any, episode_id: Any, tracker: BandwidthEfficiencyTracker | None = None) -> None:
        super().__init__(policy_version=int(getattr(engine, "policy_version", 0)))
        self.engine, self.session_id, self.tracker = engine, episode_id, tracker
        self.results: list[GenerationResult] = []

    def append(self, token_ids: Sequence[int], role: str = "env_output") -> None:
        """Context tokens of one role (``template``, ``env_output``, ``warning``)."""
        code = role_code(role)
        if code == ACTION:
            raise ValueError("role='action' tokens come from generate(), with their log-probs")
        self.extend_context(token_ids, [code] * len(token_ids))

    async def generate(self, **kwargs: Any) -> GenerationResult:
        """Act on the whole history; the sampled tokens join it as ``action`` tokens."""
        result = await generate_admitted(self.engine, self.token_ids, **kwargs)
        self.extend_action(result.token_ids, result.logprobs, result.policy_versions)
        self.results.append(result)
        return result

    def record_reward(self, reward: float, done: bool = False) -> float:
        """The last turn's reward: into the trajectory, and into η_bw against the bandwidth the turn cost
        (its prompt with the prefix the cache served); returns that b_eff."""
        if not self.results:
            raise ValueError("record_reward: the episode has no generated turn yet")
        if len(self.rewards) >= len(self.results):
            raise ValueError("record_reward: the last turn already has its reward")
        self.rewards.append(float(reward))
        last = self.results[-1]
        if self.tracker is None:
            return 0.0
        return self.tracker.record_rollout_step(reward, last.prompt_length, last.cached_length, episode_end=done)

    def trajectory(self, **info: Any) -> TokenTrajectory:
        """The episode so far as the trainer's trajectory (one reward per turn: call ``record_reward`` each turn);
        its prompt is everything before the first action."""
        prompt = next((i for i, r in enumerate(self.roles) if r == ACTION), len(self.roles))
        return self.to_trajectory(prompt, **info)


class EpisodeSessions:
    """Episode sessions by id over one engine, sharing one η_bw tracker (``bandwidth``)."""

    def __init__(self, engine: Any, tracker: BandwidthEfficiencyTracker | None = None) -> None:
        self.engine = engine
        scale = getattr(getattr(engine, "config", None), "bandwidth_scale", 1.0)
        self.bandwidth = tracker if tracker is not None else BandwidthEfficiencyTracker(BandwidthConfig(scale=scale))
        self._episodes: dict[Any, EpisodeSession] = {}

    def episode(self, episode_id: Any, prompt_ids: Sequence[int] = (), role: str = "template") -> EpisodeSession:
        """The session of ``episode_id`` (created with ``prompt_ids`` on first use)."""
        if episode_id not in self._episodes:
            self._episodes[episode_id] = EpisodeSession(self.engine, episode_id, self.bandwidth)
            if prompt_ids:
                self._episodes[episode_id].append(prompt_ids, role)
        return self._episodes[episode_id]

    async def submit_rollout(self, episode_id: Any, new_token_ids: Sequence[int], *, role: str = "env_output",
                             priority: float | None = None, **generate_kwargs: Any) -> GenerationResult:
        """One turn: append ``new_token_ids`` (the observation) to the episode's history, then act on it.
        ``priority`` is r in the engine's admission priority (``generate``'s ``reward_estimate``)."""
        if priority is not None:
            generate_kwargs["reward_estimate"] = priority
        session = self.episode(episode_id)
        session.append(new_token_ids, role)
        return await session.generate(**generate_kwargs)

    def end_episode(self, episode_id: Any) -> EpisodeSession:
        """Forget the session (its history stays in the engine's prefix cache until evicted)."""
        try:
            return self._episodes.pop(episode_id)
        except KeyError:
            raise KeyError(f"episode_id={episode_id!r} has no open session") from None
