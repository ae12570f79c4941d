"""The built-in methods' runners, and their registration in :mod:`echo_rl.evaluation.methods`.

References (random, the env's expert), prompting agents (ReAct, Act-only,
ToT over a backbone: episodes run concurrently, a local checkpoint served by
the execution engine) and trained methods (``methods.run_trained``: EchoRLTrainer
in the cell's work directory). ``echo_rl.evaluation`` imports this module, and
Python runs it before any ``echo_rl.evaluation.*`` module, so every built-in
name is known as soon as the registry is.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from echo_rl.config import ConfigError
from echo_rl.environments.registry import minigrid_id, task_spec
from echo_rl.evaluation.methods import (CellContext, MethodSpec, MethodUnavailable, Runner, _close, _env_notes,
                                        _make_text_env, env_config, register_method, run_trained,
                                        run_text_episodes, run_vector_episodes)
from echo_rl.evaluation.records import NO_BACKBONE, CellOutcome, EpisodeRecord
from echo_rl.models import load_backbone
from echo_rl.prompting.base import is_multiline_task
from echo_rl.prompting.engine_backbone import EngineBackbone, engine_backed
from echo_rl.prompting.runner import EXPERT, EpisodeJob, build_agent, expert_backbone, run_episodes

async def _run_random(ctx: CellContext) -> CellOutcome:
    """Uniform random actions: the floor every method must beat."""
    env_id = minigrid_id(ctx.cell.task)
    if env_id is not None:
        return CellOutcome(episodes=run_vector_episodes(ctx, env_id, lambda env, obs, rng: int(
            rng.integers(env.action_space.n))))
    env = _make_text_env(ctx)

    def act(obs: str, info: dict, rng: np.random.Generator) -> str:
        actions = info.get("admissible_actions")
        if not actions:
            raise MethodUnavailable(f"{ctx.cell.task} has no finite set of admissible actions, so a uniform "
                                    f"random policy is undefined there")
        return str(actions[int(rng.integers(len(actions)))])

    try:
        return CellOutcome(episodes=run_text_episodes(ctx, env, act), notes=_env_notes(env))
    finally:
        _close(env)


async def _run_expert(ctx: CellContext) -> CellOutcome:
    """The environment's own hand-coded expert: the reference a learned method is compared to."""
    env = _make_text_env(ctx)
    try:
        if not getattr(env, "has_expert", False):
            raise MethodUnavailable(f"the {ctx.cell.task} environment has no hand-coded expert")
        return CellOutcome(episodes=run_text_episodes(ctx, env, lambda obs, info, rng: env.expert_action()),
                           notes=_env_notes(env))
    finally:
        _close(env)


async def _run_prompting(ctx: CellContext, agent: str) -> CellOutcome:
    """ReAct / Act-only / ToT from echo_rl.prompting over the cell's backbone (``expert``: the env's expert,
    scripted), ``ctx.concurrency`` episodes at once through :func:`echo_rl.prompting.runner.run_episodes`."""
    model = None
    if ctx.cell.backbone != EXPERT:  # before the env: a missing API key skips the cell without building it
        try:
            model = engine_backed(load_backbone(ctx.cell.backbone, ctx.backbone_config or None))
        except ConfigError as exc:  # e.g. an API backbone without its key: nothing was sent
            raise MethodUnavailable(str(exc)) from None
    try:
        probe = _make_text_env(ctx)  # an env this setup cannot build skips the cell before any episode
    except BaseException:
        _close(model)
        raise
    notes = {"backbone": getattr(model, "name", ctx.cell.backbone), "concurrency": ctx.concurrency,
             **_env_notes(probe)}
    _close(probe)
    task = agent_task(ctx.cell.task)
    # a task without its own reply format takes the generic one; its TaskSpec says whether answers span lines
    options = {"multiline": True} if task is None and is_multiline_task(ctx.cell.task) else {}

    def make_agent(env: Any) -> Any:
        return build_agent(agent, model if model is not None else expert_backbone(env), task=task,
                           **{**options, **ctx.method_config})

    jobs = [EpisodeJob(i, ctx.episode_seed(i)) for i in range(ctx.num_episodes)]
    t0 = time.perf_counter()
    try:
        results = await run_episodes(jobs, lambda: _make_text_env(ctx), make_agent, max_steps=ctx.max_steps,
                                     concurrency=ctx.concurrency, before_each=ctx.check_deadline)
        loop_s = time.perf_counter() - t0
        if isinstance(model, EngineBackbone):
            engine = model.snapshot()
            notes["engine"] = {k: engine[k] for k in ("kv_reuse_rate", "etps", "generated_tokens", "prompt_tokens",
                                                      "sequences_per_step") if k in engine}
    finally:
        _close(model)
    episodes = [EpisodeRecord(success=bool(r.success), reward=float(r.reward), length=int(r.steps),
                              wall_time_s=r.seconds, seed=r.seed, tokens=r.usage.total_tokens,
                              prompt_tokens=r.usage.prompt_tokens, cost_usd=r.usage.cost) for r in results]
    errors = [r.error for r in results if r.error]
    if errors:
        notes["episode_errors"] = errors[:5]
        notes["num_episode_errors"] = len(errors)
    return CellOutcome(episodes=episodes, notes=notes, episodes_wall_s=loop_s if ctx.concurrency > 1 else None)


def agent_task(task: str) -> str | None:
    """The prompt family of a task name: ``minigrid:<Id>`` is ``minigrid``; a task whose :class:`TaskSpec` says
    the prompting agents have no reply format for it (``prompting=False``) is None (the generic format)."""
    spec = task_spec(task)
    return spec.name if spec.prompting else None


def _prompting(agent: str) -> Runner:
    async def run(ctx: CellContext) -> CellOutcome:
        return await _run_prompting(ctx, agent)

    return run


def _lm_objective(objective: str, judged: bool = False) -> Callable[[str, str], dict[str, Any]]:
    """TrainingConfig fields of an LM baseline: its objective, and for RLAIF the judge (the cell's own
    backbone judges its episodes unless echo_rl_configs names another judge_backbone)."""
    def defaults(task: str, backbone: str) -> dict[str, Any]:
        lm: dict[str, Any] = {"objective": objective}
        if judged:
            lm.update(reward="rlaif", judge_backbone=None if backbone == NO_BACKBONE else backbone)
        return {"lm_config": lm}

    return defaults


for _spec in (
    MethodSpec("random", "reference", "uniform random over admissible actions / the action space", _run_random,
               ("text", "vector")),
    MethodSpec("expert", "reference", "the environment's hand-coded expert", _run_expert, ("text",),
               origin="issue 5: text environments"),
    MethodSpec("react", "prompting", "ReAct (Yao et al. 2023) over a backbone", _prompting("react"), ("text",),
               needs_backbone=True, requires=("echo_rl.prompting.react",), origin="issue 6: prompting baselines"),
    MethodSpec("act", "prompting", "Act-only (ReAct's ablation without thoughts) over a backbone",
               _prompting("act"), ("text",), needs_backbone=True, requires=("echo_rl.prompting.react",),
               origin="issue 6: prompting baselines"),
    MethodSpec("tot", "prompting", "Tree of Thoughts (Yao et al. 2023) over a backbone", _prompting("tot"),
               ("text",), needs_backbone=True, requires=("echo_rl.prompting.tot",),
               origin="issue 6: prompting baselines"),
    MethodSpec("ppo", "trained", "PPO trained by EchoRLTrainer", run_trained, ("vector",),
               trainer_agent="ppo", origin="issue 2: trainer"),
    MethodSpec("impala", "trained", "IMPALA (V-trace) trained by EchoRLTrainer", run_trained, ("vector",),
               trainer_agent="impala", origin="issue 4: IMPALA"),
    MethodSpec("echo-rl", "trained", "the EchoRL agent trained by EchoRLTrainer (LM agent on text tasks)",
               run_trained, ("text", "vector"), trainer_agent="echo-rl", lm_on_text=True,
               origin="issues 4 and 8: EchoRL agents"),
    MethodSpec("ppo-rlhf", "trained", "PPO-RLHF language-model agent (value head + GAE on the env reward) "
               "trained by EchoRLTrainer", run_trained, ("text",), needs_backbone=True, trainer_agent="ppo",
               origin="issue 8: LM trainer", training_defaults=_lm_objective("ppo-rlhf")),
    MethodSpec("rlaif", "trained", "RLAIF language-model agent (PPO on an AI judge's score; the judge is the "
               "cell's backbone unless lm_config.judge_backbone says otherwise) trained by EchoRLTrainer",
               run_trained, ("text",), needs_backbone=True, trainer_agent="ppo", origin="issue 8: LM trainer",
               training_defaults=_lm_objective("ppo-rlhf", judged=True)),
):
    register_method(_spec)
