"""The generator side of the LM path: rollout rounds through the execution engine into trajectories.

The boundary to the trainer is narrow (SkyRL's generator ↔ trainer split):
the generator only produces :class:`~echo_rl.types.TokenTrajectory` batches
through the engine, and only changes policy through :meth:`LMGenerator.sync`,
one versioned :class:`WeightUpdate` that carries the model's weights and the
latent planner's together (the engine loads both in one step under the new
version, so no plan is computed with one version's planner and the other's
embeddings). It owns the engine, the engine's copy of the policy and planner,
and the rollout workers; the η_bw tracker it records into is the trainer's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from echo_rl.config import ExecutionConfig, LMConfig
from echo_rl.engine.engine import AsyncExecutionEngine
from echo_rl.training.bandwidth import BandwidthEfficiencyTracker
from echo_rl.lm.chat_delta import ChatRenderer
from echo_rl.lm.plan import EpisodePlan
from echo_rl.lm.rollout import CandidateScorer, LMRolloutWorker
from echo_rl.types import TokenTrajectory

PLANNER = "planner"  # the name the latent planner is attached to the engine under


@dataclass
class WeightUpdate:
    """What the trainer pushes after a step: the engine copy's weights and the planner's, as one version."""

    version: int
    model: dict[str, torch.Tensor] | None
    planner: dict[str, torch.Tensor] | None = None


@dataclass
class RolloutBatch:
    """One update's worth of rollouts: the trajectories, the episodes that failed, the env steps they took,
    and the generator's own metrics for the update's row (a remote generator's ``async/*``)."""

    trajectories: list[TokenTrajectory]
    failed: list[Exception]
    steps: int
    metrics: dict[str, float] = field(default_factory=dict)


class LMGenerator:
    """Runs rollout rounds of ``num_actors`` concurrent episodes (``group_size`` per task seed) on the engine."""

    def __init__(self, execution: ExecutionConfig, renderer: ChatRenderer, lm: LMConfig, task: str | None,
                 make_env: Callable[[bool], Any], tracker: BandwidthEfficiencyTracker) -> None:
        """``lm``: the run's ``lm_config`` (held-out episodes sample at its ``eval_temperature``); ``task``: the
        registered task whose turn protocol the episodes follow."""
        self.execution, self.renderer, self.lm_config, self.task = execution, renderer, lm, task
        self.eval_config = lm.replace(temperature=lm.eval_temperature)
        self.make_env, self.bandwidth = make_env, tracker
        self.engine: Any = None
        self.engine_model: Any = None
        self.engine_planner: Any = None

    async def start(self, model: Any, planner: Any | None, version: int) -> None:
        """Serve ``model`` (the engine's own copy of the policy; ``planner`` its copy of the latent planner)
        as policy ``version``."""
        self.engine_model = model.eval()
        self.engine = await AsyncExecutionEngine(self.execution, self.engine_model).start()
        self.engine_planner = self.engine.attach(PLANNER, planner) if planner is not None else None
        if version:
            await self.engine.update_weights(None, version=version)
        engine = self.engine
        scorer = CandidateScorer(self.engine_model, lambda: engine.policy_version)
        plan = None
        if self.engine_planner is not None:
            embed = self.engine_model.get_input_embeddings()
            plan = lambda rng: EpisodePlan(self.engine_planner, embed, rng)  # noqa: E731
        self.worker, self.eval_worker = (
            LMRolloutWorker(engine, self.renderer, lm, task=self.task, scorer=scorer, plan=plan, tracker=self.bandwidth)
            for lm in (self.lm_config, self.eval_config))

    @property
    def running(self) -> bool:
        return self.engine is not None

    async def stop(self) -> None:
        await self.engine.stop()
        self.engine = None

    async def sync(self, update: WeightUpdate) -> int:
        """Load the trainer's new weights (model and planner in one engine step) as ``update.version``."""
        modules = {PLANNER: update.planner} if self.engine_planner is not None else None
        return await self.engine.update_weights(update.model, version=update.version, modules=modules)

    async def rollouts(self, rng: np.random.Generator, *, num_actors: int, group_size: int, batch_size: int,
                       budget: int, update: int, held_out_seed_base: int) -> RolloutBatch:
        """Rounds of ``num_actors`` concurrent episodes (``num_actors / group_size`` task seeds × ``group_size``
        episodes each, so the engine batches them and siblings share the prompt's KV) until ``batch_size``
        env steps (turns) are collected or the run's ``budget`` of env steps is spent. One failing episode
        (an env error, an admission timeout) drops out; it does not abort the batch."""
        trajs, failed, steps, rnd = [], [], 0, 0
        groups = num_actors // group_size
        while (steps < batch_size and steps < budget) or not trajs:
            if rnd >= 100 and not trajs:
                raise RuntimeError(f"every rollout of update {update} failed; first error: {failed[0]!r}")
            seeds = rng.integers(0, held_out_seed_base, groups)
            draws = rng.integers(0, 2**31, groups * group_size)
            base = rnd * groups
            turns = max(1, -(-(budget - steps) // num_actors))  # the round's share of what is left
            jobs = [self.worker.episode(self.make_env(False), seed=int(s), group_id=base + g,
                                        episode_id=(base + g) * group_size + k,
                                        sample_seed=int(draws[g * group_size + k]), max_turns=turns)
                    for g, s in enumerate(seeds) for k in range(group_size)]
            results = await asyncio.gather(*jobs, return_exceptions=True)
            fatal = [r for r in results if isinstance(r, BaseException) and not isinstance(r, Exception)]
            if fatal:
                raise fatal[0]
            failed += [r for r in results if isinstance(r, Exception)]
            new = [r for r in results if not isinstance(r, Exception)]
            trajs += new
            steps += sum(t.num_turns for t in new)
            rnd += 1
        return RolloutBatch(trajs, failed, steps)

    async def evaluation_episodes(self, seeds: list[int], concurrency: int,
                                  on_done: Callable[[], None] | None = None, make_env: Callable[[], Any] | None = None,
                                  task_indices: list[int] | None = None) -> list[Any]:
        """One held-out episode per seed (``episode_id`` = its index), at most ``concurrency`` in flight (each
        holds its whole context's KV in the engine); failed episodes come back as their exceptions.
        ``on_done()`` is called as each episode ends, failed or not (the run's progress count). ``make_env``
        (default: the held-out env) and ``task_indices`` (one per seed; default: the seed picks) let another task
        be evaluated on a fixed list of its tasks."""
        slots = asyncio.Semaphore(concurrency)
        make = make_env or (lambda: self.make_env(True))

        async def one(i: int, seed: int) -> Any:
            options = None if task_indices is None else {"task_index": task_indices[i]}
            async with slots:
                try:
                    return await self.eval_worker.episode(make(), seed=seed, options=options, episode_id=i)
                finally:
                    if on_done is not None:
                        on_done()

        return await asyncio.gather(*[one(i, s) for i, s in enumerate(seeds)], return_exceptions=True)

    def snapshot(self) -> dict[str, float]:
        """The engine's counters."""
        return self.engine.snapshot()
