"""Expert demonstrations as token trajectories, for an SFT warm start.

The environments' hand-coded experts act; their action text is encoded once
(plus the end-of-turn token the policy must learn to emit) and laid out with
the same delta rendering as rollouts, so SFT and RL see identical token
streams and roles; the system prompt, observation role and reply format are the
task's turn protocol (``task_format``), the same the rollouts read. Behaviour log-probs are 0 (no policy sampled these
tokens); ``info["source"] == "expert"`` marks them, and they are meant for
:meth:`LMLearner.sft_update`, not for a policy-gradient step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from echo_rl.environments.registry import task_format
from echo_rl.lm.chat_delta import ChatRenderer
from echo_rl.lm.rollout import lm_turn_setup
from echo_rl.lm.trajectory import TrajectoryBuilder
from echo_rl.types import TokenTrajectory


def expert_trajectory(env: Any, renderer: ChatRenderer, *, seed: int, options: dict | None = None,
                      task: str | None = None, system: str | None = None, max_turns: int = 64,
                      episode_id: int = 0) -> TokenTrajectory:
    """One expert episode of ``task``'s env; ``system`` (``lm_config.system_prompt``) left at None is the
    task's, as in the rollouts."""
    if not getattr(env, "has_expert", False):
        raise ValueError(f"{type(env).__name__} has no expert to demonstrate with")
    _, info = env.reset(seed=seed, options=options)
    group = info.get("task_group")
    system, observation_role = lm_turn_setup(task_format(task, env), renderer, system)
    b = TrajectoryBuilder(renderer, info["segments"], system=system, observation_role=observation_role,
                          episode_id=episode_id)
    end = renderer.turn_end([{"role": "user", "content": "x"}])
    won = terminated = truncated = False
    for _ in range(max_turns):
        action = env.expert_action()
        ids = renderer.encode(action) + end[:1]
        b.add_action(ids, [0.0] * len(ids), text=action)
        _, reward, terminated, truncated, info = env.step(action)
        won = bool(info.get("won", False))
        b.add_observation(info["segments"], reward)
        if terminated or truncated:
            break
    extra = {"task_group": group} if group is not None else {}
    return b.finish(won=won, truncated=bool(truncated or not terminated), source="expert",
                    actions=list(b.turn_texts), **extra)


def sft_batches(demos: list[TokenTrajectory], steps: int, batch_episodes: int,
                rng: Any) -> Iterator[list[TokenTrajectory]]:
    """``steps`` SFT batches: every demo each step (``batch_episodes`` 0), or minibatches of ``batch_episodes``
    drawn without replacement through a shuffled pass; a new shuffle starts when fewer than a batch are left
    (those few wait for the next pass, as with ``drop_last``)."""
    if not batch_episodes or batch_episodes >= len(demos):
        for _ in range(steps):
            yield demos
        return
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_episodes:
            order = [int(i) for i in rng.permutation(len(demos))]
        yield [demos[i] for i in order[:batch_episodes]]
        order = order[batch_episodes:]
