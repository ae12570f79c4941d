"""Text-environment episodes through the execution engine, into :class:`~echo_rl.types.TokenTrajectory`.

The task's turn protocol (its :class:`~echo_rl.environments.reply_format.TaskFormat`,
looked up once per episode with ``task_format``, as the prompting agents do)
gives the system prompt, the observations' chat role (``tool`` where the task
asks for it and the template has that role), the stop strings, the token
budget and the one reply parser: first line, whole multi-line reply, or tool
call (handed to the env as its canonical ``<bash>...</bash>`` text; a reply
with no valid call reaches the env as is and comes back as a ``warning``).

Two ways to act. ``generate``: the engine samples a reply that ends at the
template's end-of-turn token or the budget; it is cut after the token that
completes a stop string (the tokens kept are a prefix of the sampled ones,
their log-probs unchanged, and the template's end-of-turn tokens follow as
context), then parsed into the action. Token-in, token-out: the trajectory
holds the sampled ids as sampled and each observation's ids as rendered once
(a delta after the last assistant turn), and each turn's prompt is exactly the
trajectory so far, so nothing is decoded and re-encoded across turns. ``choose``: every admissible
action is scored by its log-likelihood under the current weights (candidate
tokens + the end-of-turn token, teacher-forced) and one is picked greedily or
by sampling from the softmax over those scores; its tokens and per-token
log-probs join the trajectory like sampled ones. Each turn's context is the
builder's token stream, which only grows, so the engine's radix cache serves
all earlier turns.

The worker is the generator side of the generator ↔ trainer boundary: it
only talks to the engine (``generate``; scoring and the latent plan's soft
prefix run on the engine's thread through ``engine.call``, so they never race
a decode step or a weight update) and hands back trajectories. Each generated
turn's reward and the engine's ``prompt_length`` / ``cached_length`` go to the
η_bw tracker (``bandwidth``), whose episode every end closes.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from echo_rl.config import BandwidthConfig, LMConfig, TrainingConfig
from echo_rl.environments.registry import find_task_spec, split_configs, task_format
from echo_rl.environments.reply_format import TaskFormat
from echo_rl.training.bandwidth import BandwidthEfficiencyTracker
from echo_rl.lm.chat_delta import ChatRenderer, check_prefix_preserving
from echo_rl.lm.session import generate_admitted
from echo_rl.lm.trajectory import TrajectoryBuilder, observation_text
from echo_rl.models.teacher_forcing import continuation_logprobs, token_logprobs
from echo_rl.types import TokenTrajectory

#: the LM path's line before the task's instruction in the system prompt (``TaskFormat.system_prompt``)
LM_INTRO = "You are an agent in a text environment."


def env_kwargs(config: TrainingConfig, held_out: bool) -> dict[str, Any]:
    """The env options of a training (or held-out evaluation) episode: the task's registered split
    (``TaskSpec.train_config`` / ``eval_config``; seeded generated tasks, MiniGrid's, hold out by seed alone),
    then the run's own ``env_config`` / ``lm_config.eval_env_config``."""
    train, evaluation = split_configs(config.env_name)
    kw = {**train, **config.env_config}
    return {**kw, **evaluation, **config.lm_config.eval_env_config} if held_out else kw


def anchor_state(task: str | None) -> str:
    """What ``task`` calls a step's state (GiGPO's anchor): its ``TaskSpec.anchor_state``, else the observation."""
    spec = find_task_spec(task)
    return spec.anchor_state if spec is not None else "observation"


def lm_turn_setup(fmt: TaskFormat, renderer: ChatRenderer, system_prompt: str | None = None) -> tuple[str | None, str]:
    """(system prompt, observation chat role) of an LM episode under ``fmt``: rollouts and SFT both use it,
    so demonstrations and rollouts see the same prompt. ``system_prompt`` (``lm_config.system_prompt``)
    overrides the task's; ``""`` means no system message."""
    system = fmt.system_prompt(LM_INTRO) if system_prompt is None else (system_prompt or None)
    return system, fmt.chat_role(renderer.has_tool_role)


def stop_cut(token_ids: Sequence[int], stops: Sequence[str], decode: Callable[[Sequence[int]], str]) -> int:
    """How many of ``token_ids`` to keep: up to the token that completes the first stop string (kept), all of
    them when none occurs. A prefix of what was sampled, so its log-probs stay those of the sampler."""
    if not stops or not any(s in decode(token_ids) for s in stops):
        return len(token_ids)
    lo, hi = 1, len(token_ids)  # the shortest prefix whose text holds a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in decode(token_ids[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo


class CandidateScorer:
    """Per-token log-probs (temperature 1) of candidate continuations, teacher-forced on a causal LM
    (:mod:`echo_rl.models.teacher_forcing`, the one scorer the backbone and the server use too).

    The worker runs it through ``engine.call`` (the engine's thread, between steps): on the engine's
    own model it then never reads weights a decode step or a weight update is using.
    """

    def __init__(self, model: Any, version: Callable[[], int] = lambda: 0) -> None:
        self.model, self.version = model, version

    def score(self, context: Sequence[int], candidates: Sequence[Sequence[int]],
              prefix: torch.Tensor | None = None) -> list[list[float]]:
        """``prefix`` ``[P, hidden]``: latent-plan rows between the context and each candidate (as the engine
        places them)."""
        return token_logprobs(continuation_logprobs(self.model, context, candidates, prefix), candidates)


class LMRolloutWorker:
    """Runs episodes of a text env with a language-model policy served by ``engine``.

    It reads the run's :class:`~echo_rl.config.LMConfig` as it is: ``action_mode``, ``max_turns``,
    ``max_new_tokens`` (None: the task's budget), ``temperature``, ``max_episode_tokens`` and
    ``system_prompt``. Sampling is plain softmax at that temperature (no top-p): the learner's importance
    ratio is taken against exactly that distribution.
    """

    def __init__(self, engine: Any, renderer: ChatRenderer, config: LMConfig | None = None, *,
                 task: str | None = None, scorer: CandidateScorer | None = None,
                 parse: Callable[[str], str] | None = None, plan: Callable[[np.random.Generator], Any] | None = None,
                 tracker: BandwidthEfficiencyTracker | None = None) -> None:
        """``task``: the registered task whose turn protocol (``TaskFormat``) and anchor state episodes follow
        (None: the generic protocol, the observation as anchor). ``plan``: a factory of per-episode
        :class:`~echo_rl.lm.plan.EpisodePlan` (latent plan as a soft prefix before each action), or None for
        no plan. ``tracker``: the trainer's η_bw tracker (default:
        one of the worker's own, at the engine's bandwidth scale). ``parse``: reply text -> action, replacing the
        task's parser (``TaskFormat.action``)."""
        self.engine, self.renderer = engine, renderer
        scale = getattr(getattr(engine, "config", None), "bandwidth_scale", 1.0)
        self.bandwidth = tracker if tracker is not None else BandwidthEfficiencyTracker(BandwidthConfig(scale=scale))
        self.plan = plan
        self.config = config or LMConfig()
        self.task, self.anchor_state = task, anchor_state(task)
        if self.config.action_mode == "choose" and scorer is None:
            raise ValueError("action_mode='choose' needs a scorer (CandidateScorer over the policy's weights)")
        self.scorer, self.parse = scorer, parse
        self._checked_roles: set[str] = set()
        self._check_role(lm_turn_setup(task_format(task), renderer, self.config.system_prompt)[1])
        end = renderer.turn_end([{"role": "user", "content": "x"}])
        if not end:
            raise ValueError("the chat template has no end-of-turn tokens, so replies cannot be stopped")
        self.turn_end_id = end[0]
        eos = getattr(renderer.tokenizer, "eos_token_id", None)
        self.stop_ids = tuple(sorted({self.turn_end_id} | ({eos} if eos is not None else set())))

    def _check_role(self, role: str) -> None:
        if role not in self._checked_roles:  # once per role: the template must append turns in it
            check_prefix_preserving(self.renderer, observation_role=role)
            self._checked_roles.add(role)

    async def episode(self, env: Any, *, seed: int, options: dict | None = None, group_id: int = 0,
                      episode_id: int = 0, sample_seed: int | None = None,
                      max_turns: int | None = None) -> TokenTrajectory:
        """One episode; ``seed`` picks the task, ``sample_seed`` (default ``seed``) the policy's samples,
        so siblings of a GRPO group share the task but not the draws; ``max_turns`` (default the config's)
        caps this episode (the run's step budget may be nearly spent), which then ends truncated."""
        cfg = self.config
        t_env = t_gen = 0.0
        t0 = time.perf_counter()
        _, info = env.reset(seed=seed, options=options)
        group = info.get("task_group")
        t_env += time.perf_counter() - t0
        fmt = task_format(self.task, env)
        system, role = lm_turn_setup(fmt, self.renderer, cfg.system_prompt)
        self._check_role(role)
        parse = self.parse or fmt.action
        budget = cfg.max_new_tokens or fmt.max_tokens
        decode = lambda ids: self.renderer.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        version = self.engine.policy_version if cfg.action_mode == "generate" else self.scorer.version()
        b = TrajectoryBuilder(self.renderer, info["segments"], system=system,
                              observation_role=role, group_id=group_id, episode_id=episode_id,
                              policy_version=version)
        rng = np.random.default_rng(seed if sample_seed is None else sample_seed)
        anchors = [self._anchor(info)]  # the state each turn starts from
        ep_plan = None if self.plan is None else self.plan(np.random.default_rng([rng.integers(2**31), 1]))
        won = truncated = False
        versions: set[int] = set()
        for turn in range(min(max_turns or cfg.max_turns, cfg.max_turns)):
            t0 = time.perf_counter()
            n_ctx = len(b.token_ids)
            p_rows = 0 if ep_plan is None else ep_plan.planner.num_tokens
            limit = min(self.engine.max_context, cfg.max_episode_tokens)
            if n_ctx + p_rows + budget > limit:
                truncated = True  # the context is full: the episode ends here, as a time limit would
                break
            prefix = None if ep_plan is None else await self.engine.call(ep_plan.next_prefix, b.token_ids)
            if cfg.action_mode == "generate":
                res = await generate_admitted(
                    self.engine, b.token_ids, max_new_tokens=budget, temperature=cfg.temperature,
                    stop_token_ids=self.stop_ids, seed=int(rng.integers(2**31)), plan_embeddings=prefix)
                keep = stop_cut(res.token_ids, fmt.stop, decode)
                ids, lps = res.token_ids[:keep], res.logprobs[:keep]
                versions.update(res.policy_versions[:keep])
                text = decode(ids)
                action = parse(text)
            else:
                action, ids, lps = await self.engine.call(self._choose, b.token_ids, info.get("admissible_actions"),
                                                          rng, prefix)
                text = action
            t_gen += time.perf_counter() - t0
            b.add_action(ids, lps, text=text)
            if ep_plan is not None:
                ep_plan.action_done(n_ctx, len(ids))
            t0 = time.perf_counter()
            _, reward, terminated, trunc, info = env.step(action)
            t_env += time.perf_counter() - t0
            won = bool(info.get("won", False))
            if cfg.action_mode == "generate":  # feeds eta_bw: the turn's reward against its uncached prefill
                self.bandwidth.record_rollout_step(reward, res.prompt_length, res.cached_length)
            b.add_observation(info["segments"], reward)
            anchors.append(self._anchor(info))
            if terminated or trunc:
                truncated = bool(trunc)
                break
        else:
            truncated = True
        if cfg.action_mode == "generate":  # every end (done, turn cap, full context) closes eta_bw's episode
            self.bandwidth.end_episode()
        extra = {} if ep_plan is None else {"plan_eps": ep_plan.eps}
        if group is not None:
            extra["task_group"] = group
        traj = b.finish(won=won, truncated=truncated, actions=list(b.turn_texts),
                        truncated_observations=b.truncated_observations, history=list(b.history),
                        anchor_states=anchors[:len(b.turn_texts)],
                        policy_versions=sorted(versions) if versions else [version], **extra)
        traj.timings.update({"env_s": t_env, "act_s": t_gen})
        return traj

    def _anchor(self, info: dict) -> str:
        """The state a turn starts from, as the task defines it (``TaskSpec.anchor_state``)."""
        if self.anchor_state == "state_key":
            key = info.get("state_key")
            if not isinstance(key, str):
                raise ValueError(f"the task's anchor state is info['state_key'] (anchor_state='state_key'), but "
                                 f"its info has {type(key).__name__}; the task must put a str there every step")
            return key
        return observation_text(info["segments"])

    def _choose(self, context: list[int], admissible: Sequence[str] | None, rng: np.random.Generator,
                prefix: torch.Tensor | None = None) -> tuple[str, list[int], list[float]]:
        if not admissible:
            raise ValueError("action_mode='choose' needs info['admissible_actions'] from the environment")
        cands = [self.renderer.encode(a) + [self.turn_end_id] for a in admissible]
        lps = self.scorer.score(context, cands, prefix)
        totals = np.array([sum(x) for x in lps])
        t = self.config.temperature
        if t == 0:
            k = int(np.argmax(totals))
        else:
            z = totals / t
            p = np.exp(z - z.max())
            k = int(rng.choice(len(p), p=p / p.sum()))
        if not all(math.isfinite(x) for x in lps[k]):
            raise ValueError(f"candidate {admissible[k]!r} has a non-finite log-prob")
        return admissible[k], cands[k], lps[k]
