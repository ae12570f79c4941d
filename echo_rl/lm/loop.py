"""The text branch of :class:`~echo_rl.training.trainer.EchoRLTrainer`: a language-model agent.

``LMAgent`` has the agent interface the trainer drives (``train_iteration``,
``evaluate``, ``state_dict``...), so text tasks share the trainer's one loop:
run directory, evaluation schedule, checkpoints, resume, progress, metrics.

One iteration = one learner update, across a narrow generator ↔ trainer
boundary: the :class:`~echo_rl.lm.generator.LMGenerator` runs rounds
of ``num_actors`` concurrent episodes through the engine (``num_actors /
group_size`` task seeds × ``group_size`` episodes each, so the engine batches
them and siblings share the prompt's KV) until ``batch_size`` environment
steps (turns) are collected, as ``TokenTrajectory`` batches; the
:class:`~echo_rl.lm.trainer.LMTrainer` step runs one ECHO/GRPO update
(and replay steps); then one versioned
:class:`~echo_rl.lm.generator.WeightUpdate` (policy and latent planner
together) reaches the engine under a new policy version (no stale KV is
reused). The agent owns the run's η_bw tracker: the generator records every
turn from the engine's ``prompt_length`` / ``cached_length``, the trainer
every learner step's |ℓ_PG|. Before the first update: an optional
SFT warm start on expert episodes. Evaluation: greedy success on held-out
games (ALFWorld's ``valid_unseen``; seeds disjoint from training elsewhere)
and the env-output CE on a fixed pool of held-out expert episodes (the
paper's world-model metric).

TrainingConfig → this agent: ``agent=ppo`` is GRPO (λ = 0), ``agent=echo-rl``
is ECHO (λ = ``lm_config.env_loss_coef``, 0 with ``echo_config.world_model_coef
= 0``), plus the latent plan with ``echo_config.latent_plan = True`` (``--plan``; its
KL weight is ``planning_config.kl_weight``). ``lm_config.objective="ppo-rlhf"``
replaces GRPO's group advantages by a value head and GAE, ``"gigpo"`` adds step-level
advantages over the anchor states the task names (``TaskSpec.anchor_state``); ``lm_config.reward``
takes rewards from the environment, an AI judge (RLAIF) or a mix.

Replay (``lm_config.replay_updates > 0``; ``--no-replay`` switches it off for
echo-rl) is part of the trainer step (``trainer.py``).
"""

from __future__ import annotations

import asyncio
import copy
import fcntl
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from echo_rl.algorithms.rlaif import AIJudge, DEFAULT_RUBRIC, mix_rewards
from echo_rl.config import BandwidthConfig, ConfigError, TrainingConfig
from echo_rl.environments.registry import make_env, task_format
from echo_rl.training.bandwidth import BandwidthEfficiencyTracker
from echo_rl.lm.chat_delta import ChatRenderer
from echo_rl.lm.generator import LMGenerator
from echo_rl.lm.plan import LMPlanner
from echo_rl.lm.policy import is_tiny, load_policy, resolve_lm_defaults  # noqa: F401  (re-exported)
from echo_rl.lm.rollout import env_kwargs
from echo_rl.lm.sft import expert_trajectory, sft_batches
from echo_rl.lm.trainer import LMTrainer
from echo_rl.lm.trajectory import valid_action_rate  # noqa: F401  (re-exported)
from echo_rl.models import load_backbone
from echo_rl.prompting.engine_backbone import engine_backed
from echo_rl.training.protocol import AgentBase

HELD_OUT_SEED_BASE = 1_000_000  # training seeds stay below, evaluation seeds start here
HELD_OUT_POOL_OFFSET = 10_000   # the held-out CE pool uses other seeds than the evaluation episodes
EVAL_CONCURRENCY = 16           # evaluation episodes in flight at once (more if num_actors is larger)


def by_group(trajs: list) -> dict[str, list]:
    """Trajectories by their task's group (``info["task_group"]``, e.g. the terminal tasks' level); ungrouped
    ones are left out."""
    groups: dict[str, list] = {}
    for t in trajs:
        if t.info.get("task_group") is not None:
            groups.setdefault(str(t.info["task_group"]), []).append(t)
    return dict(sorted(groups.items()))


def episode_metrics(results: list) -> dict[str, float]:
    """Success, reward, length and valid-action rate of evaluation episodes (failed ones are counted, not scored;
    a fatal error is re-raised), and ``success_rate/<group>`` / ``episodes/<group>`` per task group."""
    fatal = [r for r in results if isinstance(r, BaseException) and not isinstance(r, Exception)]
    if fatal:
        raise fatal[0]
    trajs = [r for r in results if not isinstance(r, Exception)]
    if not trajs:  # one failed episode (an admission timeout on a loaded machine) must not end the run
        raise RuntimeError(f"every one of {len(results)} evaluation episodes failed; first error: {results[0]!r}")
    out = {"success_rate": float(np.mean([t.info["won"] for t in trajs])),
           "avg_reward": float(np.mean([t.total_reward for t in trajs])),
           "avg_length": float(np.mean([t.num_turns for t in trajs])),
           "valid_action_rate": valid_action_rate(trajs),
           "episodes": float(len(trajs)), "failed": float(len(results) - len(trajs))}
    for group, members in by_group(trajs).items():
        out[f"success_rate/{group}"] = float(np.mean([t.info["won"] for t in members]))
        out[f"episodes/{group}"] = float(len(members))
    return out


class LMAgent(AgentBase):
    """A causal LM acting through the execution engine and learning with ECHO/GRPO (see module doc)."""

    evaluate_at_start = True  # success and env CE before the first update: the start of every curve
    line_per_iteration = True  # an update takes seconds to minutes: each gets a progress line

    def __init__(self, config: TrainingConfig, device: torch.device) -> None:
        torch.manual_seed(config.seed)
        model, self.tokenizer = load_policy(config.backbone, config.seed)
        self.tiny = is_tiny(model)
        config = resolve_lm_defaults(config, self.tiny)
        self.config, self.device = config, device
        lm = config.lm_config
        self._make_env = make_env
        self.renderer = ChatRenderer(self.tokenizer)
        probe = self.env(held_out=False)
        if (lm.sft_episodes and lm.sft_steps or lm.heldout_pool) and not getattr(probe, "has_expert", False):
            raise ConfigError(f"lm_config.sft_episodes / heldout_pool need expert demonstrations, which task "
                              f"{config.env_name!r} does not have: set both to 0")
        if lm.sft_env_config and lm.sft_episodes and lm.sft_steps:
            self.sft_env()  # bad options fail here, with the env's own message, not after the model loads
        if lm.extra_eval_env:
            extra = self.extra_eval_env()
            if extra.num_tasks < 1:
                raise ConfigError(f"lm_config.extra_eval_env={lm.extra_eval_env!r} has no tasks with "
                                  f"extra_eval_env_config={lm.extra_eval_env_config!r}")
        if lm.lora_rank:  # adapters only: the base weights stay frozen (lora.py)
            from echo_rl.lm.lora import add_lora  # needed on this path only
            try:
                model = add_lora(model, lm.lora_rank, lm.lora_alpha, lm.lora_targets)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        self.model = model.to(device)
        if lm.activation_checkpointing and getattr(model, "supports_gradient_checkpointing", False):
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 names it so
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.use_plan = config.agent == "echo-rl" and config.echo_config.latent_plan
        self.lam = lm.env_loss_coef if config.agent == "echo-rl" and config.echo_config.world_model_coef > 0 else 0.0
        pc = config.planning_config
        self.planner = (LMPlanner(self.model.config.hidden_size, pc, lm.plan_tokens).to(device)
                        if self.use_plan else None)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # η_bw of the run, at the engine's bandwidth scale: the generator's turns, the trainer's updates
        self.bandwidth = BandwidthEfficiencyTracker(BandwidthConfig(scale=config.execution_config.bandwidth_scale))
        self.trainer = LMTrainer(config, self.model, self.planner, pad, self.lam, self.bandwidth)
        self.learner, self.replay = self.trainer.learner, self.trainer.replay
        self.judge = self._make_judge() if lm.reward != "env" else None
        self.env_steps = 0
        self.updates = 0
        self.sft_done = not (lm.sft_episodes and lm.sft_steps)
        self.next_seed = config.seed
        self.timings: dict[str, float] = {}
        self._pending: dict[str, float] = {}
        self._heldout: list | None = None
        self._sft_cache: Path | None = None  # this run's SFT result in sft_cache_dir (its evaluation before RL too)
        if config.backend == "ray":  # the same generator interface over Ray workers (lm/ray_lm.py)
            if lm.extra_eval_env:
                raise ConfigError("lm_config.extra_eval_env runs with backend=local only; clear it for Ray")
            from echo_rl.lm.ray_lm import RayLMGenerator, default_lm_workers  # needed on this path only

            self.generator: Any = RayLMGenerator(config, self.bandwidth, default_lm_workers(config))
        else:
            self.generator = LMGenerator(config.execution_config, self.renderer, lm, config.env_name,
                                         lambda held_out: self.env(held_out), self.bandwidth)

    @property
    def finished(self) -> bool:
        """The step budget is spent (updates take whole episodes, so the trainer's round-up to whole batches
        of ``batch_size`` does not apply), or ``lm_config.max_updates`` is reached."""
        n = self.config.lm_config.max_updates
        return self.env_steps >= self.config.total_timesteps or (bool(n) and self.updates >= n)

    @property
    def iteration_budget(self) -> int:
        return self.config.lm_config.max_updates

    def due(self) -> bool | None:
        """Evaluate/checkpoint now (after an update)? None: the trainer's env-step schedule decides."""
        n = self.config.lm_config.eval_every_updates
        return None if not n else self.updates % n == 0

    def run_evaluation(self, episodes: int) -> Any:
        """The trainer's evaluation (``protocol.Agent``): :meth:`evaluate`, a coroutine on the engine's loop."""
        return self.evaluate(episodes)

    def summary_fields(self) -> dict[str, Any]:
        return {"backbone": self.config.backbone, "text_task": True}

    # -- lifecycle ------------------------------------------------------------------
    def env(self, held_out: bool) -> Any:
        return self._make_env(self.config.env_name, **env_kwargs(self.config, held_out))

    def sft_env(self) -> Any:
        """The expert's environment: the training one with ``lm_config.sft_env_config`` on top."""
        return self._checked_env("sft_env_config", self.config.env_name, self.sft_env_kwargs())

    def sft_env_kwargs(self) -> dict[str, Any]:
        return {**env_kwargs(self.config, False), **self.config.lm_config.sft_env_config}

    def extra_eval_env(self) -> Any:
        lm = self.config.lm_config
        return self._checked_env("extra_eval_env_config", lm.extra_eval_env, lm.extra_eval_env_config)

    def _checked_env(self, field: str, name: str, kwargs: dict) -> Any:
        """``make_env``, with an option the task does not take reported as ``lm_config.<field>``'s error."""
        try:
            return self._make_env(name, **kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"lm_config.{field}={getattr(self.config.lm_config, field)!r} is invalid for task "
                              f"{name!r}: {exc}") from None

    @property
    def engine(self) -> Any:
        """The generator's engine (None while it is not running)."""
        return self.generator.engine

    async def start(self) -> None:
        """Warm start (fresh runs), then the generator's engine on a copy of the current weights."""
        self.warm_start()
        planner = copy.deepcopy(self.planner).to(self.learner.engine_dtype) if self.planner is not None else None
        await self.generator.start(self.learner.engine_copy(), planner, self.learner.version)

    def warm_start(self) -> dict[str, float]:
        """The SFT warm start, once (its metrics; {} after the first call): afterwards ``model`` is where RL
        starts (``benchmarks/external_match.py`` exports it so an external run starts from the same weights)."""
        if self.sft_done:
            return {}
        self._pending = {f"sft/{k}": v for k, v in self._sft().items()}
        self.sft_done = True
        self.learner.version = 0  # SFT is the starting point of the RL policy: version 0, a fresh optimiser
        self.learner.optimizer = self.learner.make_optimizer(self.config.lm_config.learning_rate)
        if self.learner.ref_model is not None:  # the KL reference is where RL starts: the SFT policy
            self.learner.ref_model.load_state_dict(self.model.state_dict())
        return dict(self._pending)

    def close(self) -> Any:
        """Stop the engine: an awaitable while it runs, None otherwise (so sync callers need no loop). A local
        judge's engine thread stops here too."""
        host = getattr(getattr(getattr(self, "judge", None), "backbone", None), "host", None)
        if host is not None:
            host.close()
        return self.generator.stop() if self.generator.running else None

    # -- acting and learning ----------------------------------------------------------
    async def train_iteration(self) -> dict[str, float]:
        cfg, lm = self.config, self.config.lm_config
        t0 = time.perf_counter()
        rng = np.random.default_rng(self.next_seed)
        batch = await self.generator.rollouts(  # never past the env steps (turns) the run has left
            rng, num_actors=cfg.num_actors, group_size=lm.group_size, batch_size=cfg.batch_size,
            budget=cfg.total_timesteps - self.env_steps, update=self.updates + 1,
            held_out_seed_base=HELD_OUT_SEED_BASE)
        trajs, failed, steps = batch.trajectories, batch.failed, batch.steps
        env_returns = [t.total_reward for t in trajs]
        judged = await self._judge(trajs) if self.judge is not None else {}
        t1 = time.perf_counter()
        m, replayed = self.trainer.step(trajs)
        await self.generator.sync(self.trainer.weight_update())
        self.env_steps += steps
        self.updates += 1
        self.next_seed = int(rng.integers(2**31))  # a resumed run draws exactly what this one would
        row = {"episode/success_rate": float(np.mean([t.info["won"] for t in trajs])),
               "episode/return": float(np.mean(env_returns)),
               "episode/length": float(np.mean([t.num_turns for t in trajs])),
               "episode/count": float(len(trajs)), "episode/failed": float(len(failed)),
               "episode/valid_action_rate": valid_action_rate(trajs),
               "lm/lambda": self.lam, "lm/plan": float(self.use_plan)}
        row.update({f"lm/{k}": v for k, v in m.items()})
        row.update(judged)
        row.update(replayed)
        row.update(self._pending)
        row.update(batch.metrics)
        self._pending = {}
        snap = self.generator.snapshot()
        row.update({"engine/kv_reuse_rate": snap["kv_reuse_rate"], "engine/eta_bw": self.bandwidth.eta_bw(),
                    "engine/policy_version": snap["policy_version"]})
        self.timings = {"time/rollout_s": t1 - t0, "time/update_s": time.perf_counter() - t1,
                        "time/etps": snap["etps"], "time/engine_computed_tokens_per_s": snap["computed_tokens_per_s"]}
        return row

    # -- RLAIF ----------------------------------------------------------------------------
    def _make_judge(self) -> Any:
        lm = self.config.lm_config
        # a local judge decodes on the engine (where it runs the architecture), like every other local model
        return AIJudge(engine_backed(load_backbone(lm.judge_backbone)), lm.judge_rubric or DEFAULT_RUBRIC,
                       mode=lm.judge_mode, on_unparsed="zero")

    async def _judge(self, trajs: list) -> dict[str, float]:
        """Replace each trajectory's rewards: ``rlaif`` puts the judge's score on the last turn (the others 0);
        ``mix`` scales the env rewards by (1 - w) and adds w·score on the last turn, so the return is
        ``mix_rewards(env_return, score, w)``."""
        lm = self.config.lm_config
        w = 1.0 if lm.reward == "rlaif" else lm.judge_weight
        def judge_all() -> list:
            out = []
            for t in trajs:
                msgs = [m for m in t.info["history"] if m["role"] != "system"]
                out.append(self.judge.judge(msgs[0]["content"], msgs[1:]))
            return out

        judgements = await asyncio.to_thread(judge_all)
        for t, j in zip(trajs, judgements):
            t.info["env_return"], t.info["judge_score"] = t.total_reward, j.score
            t.rewards = [(1.0 - w) * r for r in t.rewards[:-1]] + [mix_rewards(t.rewards[-1], j.score, w)]
        scores = [j.score for j in judgements]
        return {"rlaif/judge_score": float(np.mean(scores)),
                "rlaif/unparsed": float(np.mean([not j.parsed for j in judgements])),
                "rlaif/return": float(np.mean([t.total_reward for t in trajs]))}

    async def evaluate(self, episodes: int) -> dict[str, float]:
        """Success on held-out games (greedy, or sampled at ``eval_temperature`` with fixed seeds) + env-output
        CE on the held-out expert pool. Before RL from a cached SFT, the result is shared like the SFT: runs that
        differ only after it (GRPO's and ECHO's of one seed) evaluate the same weights once."""
        path = self._start_eval_path(episodes)
        if path is None:
            return await self._evaluate(episodes)
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a sibling evaluating these weights now: wait for its result
            if path.is_file():
                self.progress.note(f"[eval] before RL: the same weights' evaluation loaded from {path}")
                return json.loads(path.read_text())
            out = await self._evaluate(episodes)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(out))
            os.replace(tmp, path)
            return out

    def _start_eval_path(self, episodes: int) -> Path | None:
        """Where the evaluation before RL of cached SFT weights is shared (None: not shared), keyed by the SFT
        result and every setting an evaluation reads."""
        if self.updates or self._sft_cache is None or not self.generator.running:
            return None
        cfg, lm = self.config, self.config.lm_config
        key = {"sft": self._sft_cache.name, "episodes": episodes, "num_actors": cfg.num_actors,
               "env": env_kwargs(cfg, True), "execution": cfg.execution_config.to_dict(), "plan": self.use_plan,
               "lm": {k: getattr(lm, k) for k in ("action_mode", "eval_temperature", "max_turns", "max_new_tokens",
                                                  "max_episode_tokens", "heldout_pool", "extra_eval_env",
                                                  "extra_eval_env_config", "extra_eval_episodes")}}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return self._sft_cache.with_name(f"{self._sft_cache.stem}.eval-{digest}.json")

    async def _evaluate(self, episodes: int) -> dict[str, float]:
        own = not self.generator.running
        if own:  # called outside training (echo-rl eval): a short-lived engine
            sft_done, self.sft_done = self.sft_done, True
            await self.start()
            self.sft_done = sft_done
        try:
            # at most EVAL_CONCURRENCY episodes in flight: each holds its whole context's KV in the engine, and
            # 100 concurrent multi-thousand-token episodes of a real model are GBs (what sets the peak RSS)
            concurrency = max(self.config.num_actors, EVAL_CONCURRENCY)
            done = self.progress.count(f"[eval] step {self.env_steps:,}:", episodes, "episodes",
                                       f"{min(concurrency, episodes)} at a time")
            results = await self.generator.evaluation_episodes(
                [HELD_OUT_SEED_BASE + i for i in range(episodes)], concurrency, on_done=done.advance)
            extra = await self._extra_evaluation(concurrency) if own or self.updates == 0 or self.finished else {}
        finally:
            if own:
                await self.generator.stop()
        out = episode_metrics(results)
        pool = self.heldout_pool()
        if pool:
            out["heldout_env_ce"] = self.learner.held_out_env_ce(pool)
            for group, trajs in by_group(pool).items():
                out[f"heldout_env_ce/{group}"] = self.learner.held_out_env_ce(trajs)
        return {**out, **extra}

    async def _extra_evaluation(self, concurrency: int) -> dict[str, float]:
        """``lm_config.extra_eval_env`` on ``extra_eval_episodes`` tasks spread evenly over its task list (the same
        tasks at every evaluation and in every run), as ``<task>/<metric>``."""
        lm = self.config.lm_config
        if not lm.extra_eval_env:
            return {}
        n, k = self.extra_eval_env().num_tasks, lm.extra_eval_episodes
        done = self.progress.count(f"[eval] {lm.extra_eval_env}:", k, "episodes", f"{min(concurrency, k)} at a time")
        results = await self.generator.evaluation_episodes(
            [HELD_OUT_SEED_BASE + i for i in range(k)], concurrency, on_done=done.advance,
            make_env=self.extra_eval_env, task_indices=[i * n // k for i in range(k)])
        return {f"{lm.extra_eval_env}/{key}": v for key, v in episode_metrics(results).items()
                if "/" not in key}

    def heldout_pool(self) -> list:
        if self._heldout is None:
            n, turns = self.config.lm_config.heldout_pool, self.config.lm_config.max_turns
            self._heldout = [expert_trajectory(self.env(held_out=True), self.renderer,
                                               seed=HELD_OUT_SEED_BASE + HELD_OUT_POOL_OFFSET + i, max_turns=turns,
                                               task=self.config.env_name, system=self.config.lm_config.system_prompt)
                             for i in range(n)]
        return self._heldout

    def _sft(self) -> dict[str, float]:
        """Warm start on expert episodes; with ``sft_cache_dir`` the result is shared by runs that differ only
        after SFT (e.g. the λ arms of one seed): a run that finds a sibling computing it waits for its result."""
        cfg, lm = self.config, self.config.lm_config
        rng = np.random.default_rng([cfg.seed, 7])
        seeds = [int(s) for s in rng.integers(0, HELD_OUT_SEED_BASE, lm.sft_episodes)]
        cache = None
        if lm.sft_cache_dir:
            key = {"backbone": cfg.backbone, "seed": cfg.seed, "env_name": cfg.env_name,
                   "env": self.sft_env_kwargs(), "sft": [lm.sft_episodes, lm.sft_steps, lm.sft_learning_rate,
                                                          lm.max_turns, lm.sft_batch_episodes, lm.compute_dtype],
                   "protocol": repr(task_format(cfg.env_name, self.env(held_out=False))),  # prompt, parser, role
                   "plan": [self.use_plan, lm.plan_tokens, cfg.planning_config.to_dict()] if self.use_plan else None}
            if lm.system_prompt is not None:  # the demonstrations' own system message (absent: the task's)
                key["system"] = lm.system_prompt
            if lm.lora_rank:  # adapters change what SFT trains and the state's keys (absent: full fine-tuning)
                key["lora"] = [lm.lora_rank, lm.lora_alpha, lm.lora_targets]
            digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
            cache = self._sft_cache = Path(lm.sft_cache_dir) / f"sft-{digest}.pt"
            cache.parent.mkdir(parents=True, exist_ok=True)
            with open(cache.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
                if cache.is_file():
                    state = torch.load(cache, weights_only=True)
                    self.model.load_state_dict(state["model"])
                    if self.planner is not None:
                        self.planner.load_state_dict(state["planner"])
                    self.progress.note(f"[sft] warm start loaded from {cache}")
                    return {**state["metrics"], "cached": 1.0}
                return self._sft_train(rng, seeds, cache)
        return self._sft_train(rng, seeds, None)

    def _sft_train(self, rng: np.random.Generator, seeds: list[int], cache: Path | None) -> dict[str, float]:
        cfg, lm = self.config, self.config.lm_config
        self.learner.optimizer = self.learner.make_optimizer(lm.sft_learning_rate)
        done = self.progress.count("[sft]", lm.sft_steps, "steps", f"warm start on {lm.sft_episodes} expert "
                                   f"episodes, {min(lm.sft_batch_episodes or lm.sft_episodes, lm.sft_episodes)} a step")
        demos = [expert_trajectory(self.sft_env(), self.renderer, seed=s, max_turns=lm.max_turns,
                                   task=cfg.env_name, system=lm.system_prompt) for s in seeds]
        m: dict[str, float] = {}
        for batch in sft_batches(demos, lm.sft_steps, lm.sft_batch_episodes, rng):
            m = self.learner.sft_update(batch)
            done.advance(loss=m["loss"])
        if cache is not None:
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            torch.save({"model": self.model.state_dict(), "metrics": m,
                        "planner": self.planner.state_dict() if self.planner is not None else {}}, tmp)
            os.replace(tmp, cache)
        return {**m, "cached": 0.0}

    # -- checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        ref = self.learner.ref_model
        return {"model": self.model.state_dict(), "optimizer": self.learner.optimizer.state_dict(),
                "ref_model": ref.state_dict() if ref is not None else {},
                "planner": self.planner.state_dict() if self.planner is not None else {},
                "learner_steps": self.learner.steps, "version": self.learner.version, "env_steps": self.env_steps,
                "updates": self.updates, "next_seed": self.next_seed, "sft_done": self.sft_done,
                **({"value_head": self.learner.value_head.state_dict()} if self.learner.value_head is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if self.learner.ref_model is not None:
            self.learner.ref_model.load_state_dict(state["ref_model"])
        if self.planner is not None:
            self.planner.load_state_dict(state["planner"])
        if self.learner.value_head is not None:
            self.learner.value_head.load_state_dict(state["value_head"])
        self.learner.optimizer = self.learner.make_optimizer(self.config.lm_config.learning_rate)
        self.learner.optimizer.load_state_dict(state["optimizer"])
        self.learner.steps, self.learner.version = int(state["learner_steps"]), int(state["version"])
        self.env_steps, self.updates = int(state["env_steps"]), int(state["updates"])
        self.next_seed, self.sft_done = int(state["next_seed"]), bool(state["sft_done"])

    def rollout_state(self) -> dict | None:
        """Every update starts whole episodes, so only the replay (if any) is carried: its exact save file
        (contents, priorities, sampling RNG), so a resumed run samples what this one would have."""
        if self.replay is None:
            return None
        return self.replay.state()

    def load_rollout_state(self, state: Any) -> None:
        if self.replay is not None and state:
            self.replay.load_state(state)
