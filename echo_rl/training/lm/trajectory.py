"""Build a :class:`~echo_rl.types.TokenTrajectory` turn by turn, append-only.

The builder owns the token stream the policy continues: ``token_ids`` is
always exactly the context of the next generation. Actions are appended as
sampled (ids and log-probs from the engine, never decoded and re-encoded);
the decoded text is kept only as chat history for rendering later deltas.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from echo_rl.training.lm.chat_delta import ChatRenderer, Message
from echo_rl.types import ACTION, TEMPLATE, WARNING, TokenTrajectory


class TrajectoryBuilder:
    """One episode: ``start`` → (``add_action`` → ``add_observation``)* → ``finish``.

    ``observation_role`` is the chat role observations are sent as (``user``,
    or a template's tool/function-result role).
    """

    def __init__(self, renderer: ChatRenderer, first_observation: Sequence[Any], *, system: str | None = None,
                 observation_role: str = "user", group_id: int = 0, episode_id: int = 0,
                 policy_version: int = 0, max_observation_tokens: int | None = None) -> None:
        if max_observation_tokens is not None and max_observation_tokens < 1:
            raise ValueError(f"max_observation_tokens={max_observation_tokens} is invalid: must be None or >= 1")
        self.renderer = renderer
        self.max_observation_tokens = max_observation_tokens
        self.truncated_observations = 0
        self.observation_role = observation_role
        self.history: list[Message] = [{"role": "system", "content": system}] if system is not None else []
        delta = renderer.message_delta(self.history, observation_role, first_observation, add_generation_prompt=True)
        prefix = renderer.encode(renderer.render(self.history, add_generation_prompt=False))
        self.token_ids: list[int] = prefix + delta.token_ids
        self.roles: list[int] = [TEMPLATE] * len(prefix) + delta.roles
        self.logprobs: list[float] = [0.0] * len(self.token_ids)
        self.history.append({"role": observation_role, "content": _text(first_observation)})
        self.prompt_length = len(self.token_ids)
        self.rewards: list[float] = []
        self.env_output_count = 0
        self.group_id, self.episode_id, self.policy_version = group_id, episode_id, policy_version
        self._awaiting = "action"
        self.turn_texts: list[str] = []

    def add_action(self, sampled_ids: Sequence[int], logprobs: Sequence[float], *, text: str | None = None) -> None:
        """Append the sampled tokens as they are, then the template's end-of-turn tokens.

        When the sampled ids already end with the template's first end-of-turn
        token (the model stopped by emitting it), only the rest is appended.
        """
        if self._awaiting != "action":
            raise RuntimeError("add_action() called twice without add_observation() in between")
        ids = [int(i) for i in sampled_ids]
        lps = [float(x) for x in logprobs]
        if not ids or len(ids) != len(lps):
            raise ValueError(f"sampled_ids ({len(ids)}) and logprobs ({len(lps)}) must be non-empty and equal length")
        if not all(math.isfinite(x) and x <= 1e-6 for x in lps):
            raise ValueError("logprobs must be finite log-probabilities (<= 0)")
        end = self.renderer.turn_end(self.history)
        if end and ids[-1] == end[0]:
            end = end[1:]
        if text is None:
            text = self.renderer.tokenizer.decode(ids, skip_special_tokens=True)
        self.token_ids += ids + end
        self.roles += [ACTION] * len(ids) + [TEMPLATE] * len(end)
        self.logprobs += lps + [0.0] * len(end)
        self.history.append({"role": "assistant", "content": text})
        self.turn_texts.append(text)
        self._awaiting = "reward"

    def add_observation(self, segments: Sequence[Any], reward: float) -> None:
        """The environment's answer to the last action: its reward and its observation segments."""
        self.add_reward(reward)
        segments = [(seg.role, seg.text) if hasattr(seg, "role") else (seg[0], seg[1]) for seg in segments]
        delta = self.renderer.message_delta(self.history, self.observation_role, segments, add_generation_prompt=True)
        cap = self.max_observation_tokens
        while cap is not None and delta.body_count > cap:
            segments = _shrink(segments, 0.9 * cap / delta.body_count)
            delta = self.renderer.message_delta(self.history, self.observation_role, segments,
                                                add_generation_prompt=True)
            self.truncated_observations += 1
        self.token_ids += delta.token_ids
        self.roles += delta.roles
        self.logprobs += [0.0] * len(delta.token_ids)
        self.env_output_count += delta.body_count
        self.history.append({"role": self.observation_role, "content": _text(segments)})
        self._awaiting = "action"

    def add_reward(self, reward: float) -> None:
        if self._awaiting != "reward":
            raise RuntimeError("a reward needs an action first (add_action)")
        self.rewards.append(float(reward))
        self._awaiting = "observation"

    def finish(self, *, reward: float | None = None, **info: Any) -> TokenTrajectory:
        """Close the episode; ``reward`` is the last action's reward if not given yet.

        A trailing observation after the last action is kept (its tokens are
        env-model targets); a trailing generation prompt with no action after
        it is dropped so the trajectory ends on what was actually seen.
        """
        if self._awaiting == "reward":
            if reward is None:
                raise ValueError("the last action has no reward: pass finish(reward=...)")
            self.add_reward(reward)
        elif reward is not None:
            raise ValueError("finish(reward=...) given but the last action already has a reward")
        ids, roles, lps = self.token_ids, self.roles, self.logprobs
        if self._awaiting == "action" and self.rewards:  # drop the unused generation prompt
            gen = self.renderer.generation_prompt(self.history)
            n = len(gen)
            if n and ids[-n:] == gen and all(r == TEMPLATE for r in roles[-n:]):
                ids, roles, lps = ids[:-n], roles[:-n], lps[:-n]
        return TokenTrajectory(list(ids), list(roles), list(lps), list(self.rewards), self.prompt_length,
                               self.env_output_count, group_id=self.group_id, episode_id=self.episode_id,
                               policy_version=self.policy_version, info=dict(info))


def _shrink(segments: list[tuple[str, str]], keep: float) -> list[tuple[str, str]]:
    """Cut the body to ``keep`` of its characters, warnings first (they are short and say what went wrong)."""
    budget = max(1, int(sum(len(t) for _, t in segments) * keep))
    out = []
    for role, text in sorted(segments, key=lambda s: s[0] != "warning"):
        out.append((role, text[:budget]))
        budget -= len(out[-1][1])
    return [s for s in out if s[1]]


def _text(segments: Sequence[Any]) -> str:
    return "".join(seg.text if hasattr(seg, "role") else seg[1] for seg in segments)


def valid_action_rate(trajectories: list) -> float:
    """Fraction of turns the environment accepted (no ``warning`` tokens in the observation that followed):
    what an untrained instruct model fails first, answering in prose instead of an action."""
    ok = n = 0
    for t in trajectories:
        roles, spans = t.role_array(), t.turn_spans()
        for i, (_, end) in enumerate(spans):
            nxt = spans[i + 1][0] if i + 1 < len(spans) else len(roles)
            n, ok = n + 1, ok + int(not (roles[end:nxt] == WARNING).any())
    return ok / n if n else 0.0
