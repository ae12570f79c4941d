"""Build a :class:`~echo_rl.types.TokenTrajectory` turn by turn, append-only: the one trajectory accumulator.

:class:`TokenStream` is the token stream the policy continues: ``token_ids`` is
always exactly the context of the next generation. Actions are appended as
sampled (ids and log-probs from the engine, never decoded and re-encoded).
:class:`TrajectoryBuilder` (chat episodes of the LM generator) renders
observations through the chat template and keeps the decoded text only as
chat history for later deltas; :class:`~echo_rl.lm.session.EpisodeSession`
(raw token turns) appends ids as given. Both end in the same ``TokenTrajectory``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from echo_rl.lm.chat_delta import ChatRenderer, Message
from echo_rl.types import ACTION, ENV_OUTPUT, TEMPLATE, WARNING, TokenTrajectory


class TokenStream:
    """Token ids with one role code per token, the behaviour log-prob of each action token (0 elsewhere)
    and the policy version that sampled it (None elsewhere), plus one reward per action turn."""

    def __init__(self, *, group_id: int = 0, episode_id: int = 0, policy_version: int = 0) -> None:
        self.token_ids: list[int] = []
        self.roles: list[int] = []
        self.logprobs: list[float] = []
        self.token_versions: list[int | None] = []
        self.rewards: list[float] = []
        self.group_id, self.episode_id, self.policy_version = group_id, episode_id, policy_version

    def extend_context(self, token_ids: Sequence[int], roles: Sequence[int]) -> None:
        """Tokens the policy reads and did not sample (template, observation, warning)."""
        ids = [int(t) for t in token_ids]
        if len(ids) != len(roles) or ACTION in roles:
            raise ValueError(f"{len(ids)} context tokens need as many non-action roles, got {list(roles)[:8]}...")
        self.token_ids += ids
        self.roles += list(roles)
        self.logprobs += [0.0] * len(ids)
        self.token_versions += [None] * len(ids)

    def extend_action(self, token_ids: Sequence[int], logprobs: Sequence[float],
                      versions: Sequence[int] | None = None) -> None:
        """Tokens as the policy sampled them, with their log-probs (and the weights version of each)."""
        ids = [int(i) for i in token_ids]
        lps = [float(x) for x in logprobs]
        if not ids or len(ids) != len(lps):
            raise ValueError(f"sampled_ids ({len(ids)}) and logprobs ({len(lps)}) must be non-empty and equal length")
        if not all(math.isfinite(x) and x <= 1e-6 for x in lps):
            raise ValueError("logprobs must be finite log-probabilities (<= 0)")
        if versions is not None and len(versions) != len(ids):
            raise ValueError(f"versions ({len(versions)}) must have one entry per sampled token ({len(ids)})")
        self.token_ids += ids
        self.roles += [ACTION] * len(ids)
        self.logprobs += lps
        self.token_versions += [None] * len(ids) if versions is None else [int(v) for v in versions]

    def to_trajectory(self, prompt_length: int, *, end: int | None = None, **info: Any) -> TokenTrajectory:
        """The stream (up to ``end``) as a trajectory: ``token_ids[:prompt_length]`` is its prompt and
        |O| counts the observation-body tokens after it."""
        end = len(self.token_ids) if end is None else end
        roles = self.roles[:end]
        body = sum(1 for r in roles[prompt_length:] if r in (ENV_OUTPUT, WARNING))
        return TokenTrajectory(list(self.token_ids[:end]), list(roles), list(self.logprobs[:end]),
                               list(self.rewards), prompt_length, body, group_id=self.group_id,
                               episode_id=self.episode_id, policy_version=self.policy_version, info=dict(info))


class TrajectoryBuilder(TokenStream):
    """One episode: ``start`` → (``add_action`` → ``add_observation``)* → ``finish``.

    ``observation_role`` is the chat role observations are sent as (``user``,
    or a template's tool/function-result role).
    """

    def __init__(self, renderer: ChatRenderer, first_observation: Sequence[Any], *, system: str | None = None,
                 observation_role: str = "user", group_id: int = 0, episode_id: int = 0,
                 policy_version: int = 0, max_observation_tokens: int | None = None) -> None:
        if max_observation_tokens is not None and max_observation_tokens < 1:
            raise ValueError(f"max_observation_tokens={max_observation_tokens} is invalid: must be None or >= 1")
        super().__init__(group_id=group_id, episode_id=episode_id, policy_version=policy_version)
        self.renderer = renderer
        self.max_observation_tokens = max_observation_tokens
        self.truncated_observations = 0
        self.observation_role = observation_role
        self.history: list[Message] = [{"role": "system", "content": system}] if system is not None else []
        delta = renderer.message_delta(self.history, observation_role, first_observation, add_generation_prompt=True)
        prefix = renderer.encode(renderer.render(self.history, add_generation_prompt=False))
        self.extend_context(prefix + delta.token_ids, [TEMPLATE] * len(prefix) + delta.roles)
        self.history.append({"role": observation_role, "content": observation_text(first_observation)})
        self.prompt_length = len(self.token_ids)
        self.env_output_count = 0
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
        self.extend_action(ids, logprobs)
        end = self.renderer.turn_end(self.history)
        if end and ids[-1] == end[0]:
            end = end[1:]
        if text is None:
            text = self.renderer.tokenizer.decode(ids, skip_special_tokens=True)
        self.extend_context(end, [TEMPLATE] * len(end))
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
        self.extend_context(delta.token_ids, delta.roles)
        self.env_output_count += delta.body_count
        self.history.append({"role": self.observation_role, "content": observation_text(segments)})
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
        ids, roles, end = self.token_ids, self.roles, len(self.token_ids)
        if self._awaiting == "action" and self.rewards:  # drop the unused generation prompt
            gen = self.renderer.generation_prompt(self.history)
            n = len(gen)
            if n and ids[-n:] == gen and all(r == TEMPLATE for r in roles[-n:]):
                end -= n
        return self.to_trajectory(self.prompt_length, end=end, **info)


def _shrink(segments: list[tuple[str, str]], keep: float) -> list[tuple[str, str]]:
    """Cut the body to ``keep`` of its characters, warnings first (they are short and say what went wrong)."""
    budget = max(1, int(sum(len(t) for _, t in segments) * keep))
    out = []
    for role, text in sorted(segments, key=lambda s: s[0] != "warning"):
        out.append((role, text[:budget]))
        budget -= len(out[-1][1])
    return [s for s in out if s[1]]


def observation_text(segments: Sequence[Any]) -> str:
    """The observation an env's segments spell (``Segment`` objects or ``(role, text)`` pairs)."""
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
