"""Evaluate a prompting agent with a backbone on a text task: success, reward, tokens, cost, cost/success.

``echo-rl eval --task T --agent A --backbone B`` lands here. Episodes are a
function of the seed: when fewer episodes than tasks are asked for, the tasks
are a seeded sample (sorted), otherwise every task in order (ALFWorld's 134
valid_unseen games, as ReAct reports); episode i is reset with ``seed + i``.

Episodes run concurrently (:func:`run_episodes`): each of ``concurrency``
workers owns an environment and an agent, all share one backbone. A local
checkpoint is served by the execution engine (:func:`engine_backed`), so the
workers' requests decode together and share the prefix cache; the results do
not depend on the order episodes finish in.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from echo_rl.prompting.base import EpisodeResult, TextAgent
from echo_rl.config import ConfigError
from echo_rl.environments.registry import check_task_name, make_env, task_spec
from echo_rl.models import load_backbone
from echo_rl.utils.statistics import wilson_interval
from echo_rl.models.backbone import Backbone, Usage
from echo_rl.models.local import ContextLengthError
from echo_rl.models.scripted import ScriptedBackbone
from echo_rl.prompting.engine_backbone import engine_backed
from echo_rl.prompting.tot import VALUE_MARK

AGENT_NAMES = ("react", "act", "tot")
DEFAULT_CONCURRENCY = 8  # episodes in flight: enough to fill the engine's batches on a CPU
EXPERT = "expert"  # backbone name: the env's hand-coded expert answering through the backbone protocol


def expert_backbone(env: Any) -> Backbone:
    """A scripted backbone that answers every action prompt with ``env.expert_action()``.

    It checks the agents' prompting, parsing and control loop on a real task
    (the success rate it reaches is the loop's, bounded by the expert's); it is
    not a model. Value prompts of ToT are answered ``sure``.
    """
    if not getattr(env, "has_expert", False):
        raise ConfigError(f"backbone 'expert' is invalid for {type(env).__name__}: it has no hand-coded expert")

    def respond(messages: list[dict]) -> str:
        return "sure" if VALUE_MARK in messages[-1]["content"] else env.expert_action()

    return ScriptedBackbone(respond, name=EXPERT)


def build_agent(agent: str, backbone: Backbone, task: str | None = None, **options: Any) -> TextAgent:
    """``react``, ``act`` (ReAct's Act-only ablation) or ``tot``; ``options`` go to the agent."""
    if agent not in AGENT_NAMES:
        raise ConfigError(f"unknown agent {agent!r}; allowed: {', '.join(AGENT_NAMES)}")
    try:
        if agent == "tot":
            from echo_rl.prompting.tot import TreeOfThoughtsAgent  # needed on this path only

            return TreeOfThoughtsAgent(backbone, task=task, **options)
        from echo_rl.prompting.react import ReActAgent  # needed on this path only

        return ReActAgent(backbone, task=task, mode="act" if agent == "act" else "react", **options)
    except TypeError as exc:
        raise ConfigError(f"agent {agent!r}: bad option ({exc})") from None


def episode_plan(num_tasks: int | None, episodes: int, seed: int) -> list[int | None]:
    """Task index of each episode (None: let the env's seeded RNG choose)."""
    if not num_tasks:
        return [None] * episodes
    if episodes >= num_tasks:
        return [i % num_tasks for i in range(episodes)]
    import numpy as np

    return sorted(int(i) for i in np.random.default_rng(seed).choice(num_tasks, size=episodes, replace=False))


def summarize(results: list[EpisodeResult], *, task: str, agent: str, backbone: str, seed: int,
              seconds: float) -> dict[str, Any]:
    n = len(results)
    successes = sum(r.success for r in results)
    usage = sum((r.usage for r in results), Usage())
    cost = usage.cost
    lo, hi = wilson_interval(successes, n)
    return {
        "task": task, "agent": agent, "backbone": backbone, "seed": seed, "episodes": n,
        "successes": successes, "success_rate": successes / n if n else 0.0, "success_rate_ci95": [lo, hi],
        "avg_reward": sum(r.reward for r in results) / n if n else 0.0,
        "avg_steps": sum(r.steps for r in results) / n if n else 0.0,
        "errors": sum(r.error is not None for r in results),
        "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens, "tokens_per_episode": usage.total_tokens / n if n else 0.0,
        "requests": usage.requests,
        "tokens_per_second": usage.total_tokens / seconds if seconds > 0 else None,  # ETPS over the run's wall time
        "cost_usd": cost,  # None: the backbone's model has no entry in the price table
        "cost_per_success_usd": (cost / successes) if cost is not None and successes else None,
        "seconds": round(seconds, 3),
        "per_episode": [r.summary() for r in results],
    }


@dataclass(frozen=True)
class EpisodeJob:
    """Episode ``index`` of a plan: reset with ``seed`` and ``options``."""

    index: int
    seed: int
    options: dict | None = None


async def run_episodes(jobs: list[EpisodeJob], make_env: Callable[[], Any],
                       make_agent: Callable[[Any], TextAgent], *, max_steps: int | None = None,
                       concurrency: int = DEFAULT_CONCURRENCY, before_each: Callable[[], None] | None = None,
                       on_result: Callable[[EpisodeJob, EpisodeResult], None] | None = None) -> list[EpisodeResult]:
    """Run ``jobs`` with up to ``concurrency`` episodes in flight; results in job order.

    Each worker builds its own environment (``make_env()``) and agent
    (``make_agent(env)``). An episode that outgrows the model's context, or
    meets an API or environment failure, fails alone (``EpisodeResult.error``
    says why, its tokens still counted); configuration errors stop the run.
    ``before_each`` runs before every episode (a deadline check may raise).
    """
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency={concurrency!r} is invalid: must be an integer >= 1")
    pending = list(jobs)
    results: dict[int, EpisodeResult] = {}

    async def worker() -> None:
        env = make_env()
        try:
            agent = make_agent(env)
            while pending:
                job = pending.pop(0)
                if before_each is not None:
                    before_each()
                res = await _one_episode(agent, env, job, max_steps)
                results[job.index] = res
                if on_result is not None:
                    on_result(job, res)
        finally:
            close = getattr(env, "close", None)
            if close is not None:
                close()

    tasks = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(jobs)))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [results[j.index] for j in jobs]


async def _one_episode(agent: TextAgent, env: Any, job: EpisodeJob, max_steps: int | None) -> EpisodeResult:
    start = time.perf_counter()
    try:
        return await agent.arun_episode(env, seed=job.seed, max_steps=max_steps, options=job.options)
    except ContextLengthError as exc:  # the episode outgrew the model's context: it fails, the run goes on
        error = str(exc)
    except (ConfigError, ImportError, FileNotFoundError):
        raise  # configuration problems stop the run with their own one-line message
    except Exception as exc:  # noqa: BLE001 - an API or env failure fails this episode, not the run
        error = f"{type(exc).__name__}: {exc}"
    task_id = "" if job.options is None else str(job.options.get("task_index", ""))
    return EpisodeResult(task_id, job.seed, False, 0.0, 0, 0, agent.episode_usage, error=error,
                         seconds=time.perf_counter() - start)


def evaluate_text_agent(task: str, agent: str, backbone: str | Backbone, episodes: int, seed: int,
                        max_steps: int | None = None, env_config: dict | None = None, output: str | None = None,
                        agent_config: dict | None = None, backbone_config: dict | None = None,
                        concurrency: int = DEFAULT_CONCURRENCY) -> dict:
    """Run ``episodes`` episodes of ``agent`` with ``backbone`` on text task ``task``; return and print the scores."""
    if agent not in AGENT_NAMES:
        raise ConfigError(f"unknown agent {agent!r}; allowed: {', '.join(AGENT_NAMES)}")
    if not isinstance(episodes, int) or episodes < 1:
        raise ConfigError(f"episodes={episodes!r} is invalid: must be an integer >= 1")
    if max_steps is not None and max_steps < 1:
        raise ConfigError(f"max_steps={max_steps!r} is invalid: must be >= 1")
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency={concurrency!r} is invalid: must be an integer >= 1")
    check_task_name(task)
    env_config = dict(env_config or {})
    if max_steps is not None:
        env_config.setdefault("max_steps", max_steps)
    if task == "alfworld" and backbone != EXPERT:
        env_config.setdefault("expert", False)  # the hand-coded expert only slows a model's episodes down
    probe = make_env(task, **env_config)  # fails on a bad task config before a model loads; gives the plan
    num_tasks = getattr(probe, "num_tasks", None)
    _close(probe)
    model = None
    if isinstance(backbone, Backbone):
        model = backbone
    elif backbone != EXPERT:
        model = engine_backed(load_backbone(backbone, backbone_config))  # a bad name or missing key fails here
    spec = task_spec(task)  # its prompt family (None: the generic reply format) and whether answers span lines
    agent_task = spec.name if spec.prompting else None
    options = {"multiline": True} if agent_task is None and spec.multiline else {}

    def make_agent(env: Any) -> TextAgent:
        return build_agent(agent, model if model is not None else expert_backbone(env), task=agent_task,
                           **{**options, **(agent_config or {})})

    plan = episode_plan(num_tasks, episodes, seed)
    jobs = [EpisodeJob(i, seed + i, None if index is None else {"task_index": index}) for i, index in enumerate(plan)]
    traj_file = None
    if output:
        out = Path(output)
        out.parent.mkdir(parents=True, exist_ok=True)
        traj_file = open(out.with_suffix(".trajectories.jsonl"), "w")

    def record(job: EpisodeJob, res: EpisodeResult) -> None:
        if traj_file is not None:
            traj_file.write(json.dumps({"episode": job.index, **res.summary(), "trajectory": res.trajectory}) + "\n")
            traj_file.flush()

    start = time.perf_counter()
    try:
        results = asyncio.run(run_episodes(jobs, lambda: make_env(task, **env_config), make_agent,
                                           max_steps=max_steps, concurrency=concurrency, on_result=record))
    finally:
        if traj_file is not None:
            traj_file.close()
        if model is not None and not isinstance(backbone, Backbone):
            model.close()
    summary = summarize(results, task=task, agent=agent, backbone=getattr(model, "name", str(backbone)), seed=seed,
                        seconds=time.perf_counter() - start)
    summary["concurrency"] = concurrency
    if output:
        Path(output).write_text(json.dumps(summary, indent=2, sort_keys=True))
    print(format_summary(summary), file=sys.stderr)
    return summary


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)
    if close is not None:
        close()


def format_summary(s: dict) -> str:
    cost = "n/a (no price)" if s["cost_usd"] is None else f"${s['cost_usd']:.4f}"
    cps = "n/a" if s["cost_per_success_usd"] is None else f"${s['cost_per_success_usd']:.4f}"
    lo, hi = s["success_rate_ci95"]
    return (f"{s['task']} | {s['agent']} | {s['backbone']}: success {s['successes']}/{s['episodes']} = "
            f"{s['success_rate']:.3f} (95% CI {lo:.3f}-{hi:.3f}), avg reward {s['avg_reward']:.3f}, "
            f"tokens {s['total_tokens']} ({s['tokens_per_episode']:.0f}/episode), cost {cost}, cost/success {cps}"
            + (f", {s['errors']} episode errors" if s["errors"] else ""))
