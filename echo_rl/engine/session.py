"""Episode sessions over any engine backend: the multi-turn token history an RL trajectory is built from.

Split from ``engine`` so the local engine and the vLLM backend share it; it
only needs the backend's ``generate`` and ``bandwidth_tracker``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from echo_rl.engine.engine import GenerationResult


class EngineFrontend:
    """Episode sessions over any engine that has ``generate`` and ``bandwidth_tracker`` (the backend seam)."""

    _episodes: dict

    def episode(self, episode_id: Any, prompt_ids: Sequence[int] = (), role: str = "template") -> "EpisodeSession":
        """The session of ``episode_id`` (created with ``prompt_ids`` on first use)."""
        if episode_id not in self._episodes:
            self._episodes[episode_id] = EpisodeSession(self, episode_id)
            if prompt_ids:
                self._episodes[episode_id].append(prompt_ids, role)
        return self._episodes[episode_id]

    async def submit_rollout(self, episode_id: Any = None, new_token_ids: Sequence[int] | None = None, *,
                             role: str = "env_output", state_sequence: Sequence[int] | None = None,
                             priority: float | None = None, **generate_kwargs) -> "GenerationResult":
        """One turn of an episode: append ``new_token_ids`` (the observation) to its history, then act.

        ``submit_rollout(state_sequence=ids, priority=r)`` (the product description's form) acts on
        one window of token ids with no episode kept; ``priority`` is r in the bandwidth-aware
        admission priority r / (b_eff + q + eps) (``generate``'s ``reward_estimate``).
        """
        if priority is not None:
            generate_kwargs["reward_estimate"] = priority
        if state_sequence is not None:
            if episode_id is not None or new_token_ids is not None:
                raise TypeError("submit_rollout takes either (episode_id, new_token_ids) or state_sequence=, not both")
            return await self.generate(state_sequence, **generate_kwargs)
        if episode_id is None or new_token_ids is None:
            raise TypeError("submit_rollout needs (episode_id, new_token_ids) or state_sequence=")
        session = self.episode(episode_id)
        session.append(new_token_ids, role)
        return await session.generate(**generate_kwargs)

    def end_episode(self, episode_id: Any) -> "EpisodeSession":
        """Forget the session (its history stays in the prefix cache until evicted)."""
        try:
            return self._episodes.pop(episode_id)
        except KeyError:
            raise KeyError(f"episode_id={episode_id!r} has no open session") from None


class EpisodeSession:
    """One multi-turn episode: its token history, per-token roles and behaviour log-probs.

    Tokens are appended exactly as sampled (never decoded and re-tokenized), so
    each turn's prompt extends the previous one and the cache serves it.
    """

    def __init__(self, engine: "EngineFrontend", episode_id: Any):
        self.engine, self.episode_id = engine, episode_id
        self.token_ids: list[int] = []
        self.roles: list[str] = []
        self.behavior_logprobs: list[float | None] = []
        self.policy_versions: list[int | None] = []
        self.results: list[GenerationResult] = []

    def append(self, token_ids: Sequence[int], role: str = "env_output") -> None:
        ids = [int(t) for t in token_ids]
        self.token_ids += ids
        self.roles += [role] * len(ids)
        self.behavior_logprobs += [None] * len(ids)
        self.policy_versions += [None] * len(ids)

    def record_reward(self, reward: float, done: bool = False) -> float:
        """Account the last turn's reward against the bandwidth it cost (feeds eta_bw); returns its b_eff.

        The turn's cost is that of its prompt with the prefix the cache served.
        """
        if not self.results:
            raise ValueError("record_reward: the episode has no generated turn yet")
        last = self.results[-1]
        return self.engine.bandwidth_tracker.record_rollout_step(
            reward, last.prompt_length, last.cached_length, episode_end=done)

    async def generate(self, **kwargs) -> GenerationResult:
        """Act on the whole history; the sampled tokens join it with role ``action``."""
        result = await self.engine.generate(self.token_ids, **kwargs)
        self.token_ids += result.token_ids
        self.roles += ["action"] * len(result.token_ids)
        self.behavior_logprobs += result.logprobs
        self.policy_versions += result.policy_versions
        self.results.append(result)
        return result
