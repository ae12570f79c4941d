"""EchoRLTrainer: actors -> learner -> evaluation, with a run directory and resume.

The loop is agent-agnostic: an agent (``echo_rl.training.agents``) owns acting
and learning, through the members of ``echo_rl.training.protocol.Agent``; the
trainer owns the schedule (evaluation, checkpoints), the
run directory, metrics, progress and interruption. ``metrics.jsonl`` holds only
quantities that are a function of (config, seed) — wall-clock figures go to
``timings.jsonl`` — so two runs with one seed write identical metrics.

Text tasks (``config.text_task``: alfworld, webshop, cruxeval, arc, or
MiniGrid with a ``backbone``) run through the same loop with a language-model
agent (``echo_rl.lm.loop.LMAgent``) whose methods are coroutines: it
drives the execution engine on this event loop. For them an "env step" is a
turn and one iteration is one learner update. Their metrics are not
bit-reproducible: the engine batches concurrent episodes, and batch shapes
change float rounding.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.distributed.learner_rank import current as current_learner
from echo_rl.training.agents import build_agent
from echo_rl.training.progress import TrainingProgress, WallClock, format_duration, working
from echo_rl.training.protocol import EVAL_SEED_OFFSET, Agent  # noqa: F401  (EVAL_SEED_OFFSET: re-exported)
from echo_rl.training.run_dir import RunDirectory, default_run_dir
from echo_rl.utils.monitoring import JsonlLogger
from echo_rl.utils.tracking import open_loggers


@dataclass
class TrainingMetrics:
    """What ``await trainer.train()`` returns."""

    evaluation_results: dict[str, float]
    total_timesteps: int
    num_updates: int
    wall_time: float
    run_dir: str
    interrupted: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)


def resolve_device(name: str) -> torch.device:
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"TrainingConfig.device={name!r} is invalid: torch reports no CUDA device; use cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("TrainingConfig.device='mps' is invalid: torch reports no MPS device; use cpu")
    return torch.device(name)


class EchoRLTrainer:
    """Train ``config.agent`` on ``config.env_name``; nothing happens until :meth:`train`."""

    def __init__(self, config: TrainingConfig, run_dir: str | Path | None = None, resume: bool = False,
                 show_progress: bool = True):
        if config.num_learners > 1:
            from echo_rl.distributed.data_parallel import check_config  # needed on this path only

            check_config(config)
            if resume:
                raise ConfigError(f"--resume is invalid with num_learners={config.num_learners}: each learner's envs "
                                  f"mid-episode are not checkpointed (resume with num_learners=1)")
        self.config = config
        self.run = RunDirectory(run_dir or default_run_dir(config), config)
        self.resume = resume
        self.show_progress = show_progress
        self.agent: Agent | None = None
        self._stop = False

    # -- public -----------------------------------------------------------------
    async def train(self) -> TrainingMetrics:
        if self.config.num_learners > 1 and current_learner() is None:
            # spawn the data-parallel learners; learner 0 trains into this run directory
            from echo_rl.distributed.data_parallel import run_learners  # needed on this path only

            # Ctrl-C reaches the learners (one process group): they agree to stop, checkpoint and return
            ignore = threading.current_thread() is threading.main_thread()
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignore else None
            try:
                results = await asyncio.to_thread(run_learners, self.config, _train_learner, str(self.run.path),
                                                  self.show_progress)
            finally:
                if ignore:
                    signal.signal(signal.SIGINT, previous)
            return results[0]
        cfg = self.config
        t0 = time.perf_counter()  # wall time counts everything: setup, warm start, evaluations, iterations
        clock = WallClock()
        device = resolve_device(cfg.device)
        loading = f" and loading the model {cfg.backbone}" if cfg.backbone else ""
        with working(f"[setup] building the {cfg.agent} agent on {cfg.env_name}{loading} …", self.show_progress):
            start_step = self._setup(device)
        clock.setup = time.perf_counter() - t0
        agent = self.agent
        # the bar's total is the budget asked for (an agent that takes whole updates may end a little past it)
        progress = TrainingProgress(cfg.total_timesteps, start_step, enabled=self.show_progress,
                                    line_per_iteration=agent.line_per_iteration,
                                    iteration_budget=agent.iteration_budget)
        keep = start_step if self.resume else -1
        metrics_log = JsonlLogger("metrics.jsonl", self.run.jail).open(truncate_after_step=keep)
        try:
            timings_log = JsonlLogger("timings.jsonl", self.run.jail).open(truncate_after_step=keep)
        except BaseException:
            metrics_log.close()
            await _maybe_await(self.agent.close())
            raise
        try:
            try:
                progress.open_log(self.run.progress_log_path)
            except OSError as exc:
                raise ConfigError(f"cannot write {self.run.progress_log_path}: {exc.strerror or exc}") from None
            tb = open_loggers(cfg, self.run)  # TensorBoard / W&B / MLflow, as cfg.loggers selects
        except BaseException:  # e.g. W&B without a key: release what _setup opened
            metrics_log.close()
            timings_log.close()
            progress.close_log()
            await _maybe_await(agent.close())
            raise
        agent.progress = progress
        # a line once setup succeeded (a terminal showed a spinner meanwhile), so bad input stays one line
        model = f", model {cfg.backbone}," if cfg.backbone else ""
        resumed = f"; resuming at step {start_step:,}" if start_step else ""
        progress.note(f"[setup] {cfg.agent} agent on {cfg.env_name}{model} built in {format_duration(clock.setup)}"
                      + resumed)
        target = math.ceil(cfg.total_timesteps / cfg.steps_per_update) * cfg.steps_per_update
        last_eval: dict[str, float] = {}
        history: list[dict[str, Any]] = []
        steps0 = agent.env_steps

        async def evaluate(step: int) -> dict[str, float]:
            tic = time.perf_counter()
            result = await self.aevaluate()
            clock.evaluation += time.perf_counter() - tic
            progress.evaluation(step, result)
            return result

        restore = self._install_sigint()
        threads = torch.get_num_threads()
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)  # process-wide: restored when train() returns
        try:
            tic = time.perf_counter()
            await _maybe_await(agent.start())
            clock.start = time.perf_counter() - tic
            if start_step == 0 and agent.evaluate_at_start:
                last_eval = await evaluate(0)
                metrics_log.log({"train/updates": 0.0, **{f"eval/{k}": v for k, v in last_eval.items()}}, 0)
                tb.log({f"eval/{k}": v for k, v in last_eval.items()}, 0)
                history.append({"step": 0, **last_eval})
            with progress:
                while not self._finished(target) and not self._stopping():
                    prev = agent.env_steps
                    tic = time.perf_counter()
                    row = await _maybe_await(agent.train_iteration())
                    dt = time.perf_counter() - tic
                    clock.iterations += dt
                    step = agent.env_steps
                    row["train/updates"] = float(agent.updates)
                    elapsed = time.perf_counter() - t0  # the iteration's line comes before its evaluation's
                    progress.update(step, row, (step - steps0) / elapsed, elapsed)
                    if self._due(prev, step, cfg.evaluation_frequency) and not self._finished(target):
                        last_eval = await evaluate(step)
                        row.update({f"eval/{k}": v for k, v in last_eval.items()})
                        history.append({"step": step, **last_eval})
                    metrics_log.log(row, step)
                    elapsed = time.perf_counter() - t0
                    timing = {"time/sps": (step - prev) / dt, "time/elapsed": elapsed,
                              "time/avg_sps": (step - steps0) / elapsed, **agent.timings}
                    timings_log.log(timing, step)
                    tb.log({**row, **timing}, step)
                    if self._due(prev, step, cfg.save_frequency) and not self._finished(target):
                        self._checkpoint()
                    await asyncio.sleep(0)
            interrupted = self._stopping()
            logged = None
            if self.resume and agent.env_steps == start_step and self._finished(target):
                logged = self._final_eval_logged(agent.env_steps)
            if logged is not None:  # killed after the final checkpoint: its evaluation row is already there
                last_eval = logged
                history.append({"step": agent.env_steps, **last_eval})
            elif not interrupted:
                last_eval = await evaluate(agent.env_steps)
                metrics_log.log({"train/updates": float(agent.updates), **{f"eval/{k}": v for k, v in last_eval.items()}},
                                agent.env_steps)
                tb.log({f"eval/{k}": v for k, v in last_eval.items()}, agent.env_steps)
                history.append({"step": agent.env_steps, **last_eval})
            self._checkpoint()
        finally:
            restore()
            await _maybe_await(agent.close())
            torch.set_num_threads(threads)
            metrics_log.close()
            timings_log.close()
            progress.close_log()
            tb.close()
        clock.total = time.perf_counter() - t0
        result = TrainingMetrics(last_eval, agent.env_steps, agent.updates, clock.total, str(self.run.path),
                                 interrupted, history)
        self._finish(result, clock, agent.env_steps - steps0)
        return result

    async def aevaluate(self, episodes: int | None = None) -> dict[str, float]:
        """:meth:`evaluate` on the running event loop (text agents act through the engine on it).
        Data-parallel learners other than 0 do not evaluate (their weights are learner 0's)."""
        learner = current_learner()
        if learner is not None and learner.rank > 0:
            return {}
        return await _maybe_await(self.agent.run_evaluation(episodes or self.config.evaluation_episodes))

    def evaluate(self, episodes: int | None = None) -> dict[str, float]:
        """Success rate and mean return over a fixed, seeded set of evaluation episodes (held-out games for
        text tasks)."""
        result = self.agent.run_evaluation(episodes or self.config.evaluation_episodes)
        return asyncio.run(_awaited(result)) if inspect.isawaitable(result) else result

    def request_stop(self) -> None:
        """Finish the current iteration, checkpoint and return (what Ctrl-C does)."""
        self._stop = True

    # -- internals ----------------------------------------------------------------
    def _final_eval_logged(self, step: int) -> dict[str, float] | None:
        """The evaluation logged at ``step`` when ``metrics.jsonl`` holds one (a resume of a finished run)."""
        for row in reversed(JsonlLogger.read("metrics.jsonl", self.run.jail)):
            if row.get("step") == step and any(k.startswith("eval/") for k in row):
                return {k[5:]: v for k, v in row.items() if k.startswith("eval/")}
        return None

    def _stopping(self) -> bool:
        """A stop was asked for (Ctrl-C, :meth:`request_stop`); data-parallel learners stop together."""
        learner = current_learner()
        return self._stop if learner is None else learner.any_(self._stop)

    def _finished(self, target: int) -> bool:
        return self.agent.env_steps >= target or self.agent.finished

    def _due(self, prev: int, step: int, every: int) -> bool:
        """Evaluation/checkpoint time: every ``every`` env steps, or on the agent's own cadence (updates)."""
        due = self.agent.due()
        return _crossed(prev, step, every) if due is None else due

    def build_agent(self, device: torch.device) -> None:
        """Create the training envs and the agent (untrained, or ready to load a checkpoint)."""
        learner = current_learner()
        self.agent = build_agent(self.config if learner is None else learner.local_config(), device)

    def _setup(self, device: torch.device) -> int:
        ckpt = self.run.latest_checkpoint()
        if not self.resume and ckpt is not None:
            raise ConfigError(f"run directory {self.run.path} already holds a run; pass --resume or a new --run-dir")
        if self.resume and ckpt is None:
            raise ConfigError(f"--resume: no checkpoint in {self.run.checkpoint_dir}")
        self.build_agent(device)
        try:
            self.run.create()
            if not self.resume:
                return 0
            loaded = {}

            def apply(payload: dict, rollout: Any) -> None:
                self.agent.load_state_dict(payload["state"])
                self.agent.load_rollout_state(rollout)
                loaded["step"] = payload["step"]

            self.run.load_newest(apply)
        except BaseException:
            self.agent.close()
            raise
        return int(loaded["step"])

    def _checkpoint(self) -> None:
        self.run.save_checkpoint(self.agent.env_steps, self.agent.state_dict(), self.agent.rollout_state())

    def _install_sigint(self):
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum, frame):
            if self._stop:  # second Ctrl-C: stop hard
                raise KeyboardInterrupt
            self._stop = True

        signal.signal(signal.SIGINT, handler)
        return lambda: signal.signal(signal.SIGINT, previous)

    def _finish(self, result: TrainingMetrics, clock: WallClock, steps: int) -> None:
        """``summary.json``: steps against the budget, and wall time over the whole run (``env_steps_per_s``)
        beside the iterations alone (``iteration_env_steps_per_s``), with where the rest went (``time_s``)."""
        rows = JsonlLogger.read("metrics.jsonl", self.run.jail)
        self.run.plot_learning_curve(rows)
        self.run.write_summary({
            "env_name": self.config.env_name, "agent": self.config.agent, "seed": self.config.seed,
            "total_timesteps": result.total_timesteps, "timestep_budget": self.config.total_timesteps,
            "num_updates": result.num_updates,
            "evaluation_results": result.evaluation_results, "interrupted": result.interrupted,
            "wall_time_s": round(result.wall_time, 3), **clock.summary(steps),
            **self.agent.summary_fields(),
        })


def _train_learner(rank: int, run_dir: str, show_progress: bool) -> TrainingMetrics | None:
    """One data-parallel learner's run: learner 0 owns ``run_dir`` (metrics, checkpoints, summary); the
    others train alike into a scratch directory that is removed after."""
    import shutil
    import tempfile

    config = current_learner().config
    if rank == 0:
        return asyncio.run(EchoRLTrainer(config, run_dir, show_progress=show_progress).train())
    scratch = tempfile.mkdtemp(prefix=f"echo_rl_learner{rank}_")
    try:
        asyncio.run(EchoRLTrainer(config, Path(scratch) / "run", show_progress=False).train())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return None


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _awaited(awaitable: Any) -> Any:
    return await awaitable  # asyncio.run takes a coroutine; an agent may return any awaitable


def _crossed(prev: int, now: int, every: int) -> bool:
    return every > 0 and now // every > prev // every
