"""The method registry: what each benchmark method needs, and how a cell of it runs.

Every method declares the task kinds it handles (``text`` environments from
``echo_rl.environments.make_env``, ``vector`` MiniGrid environments), whether
it needs a language-model backbone, and the modules or trainer agents it is
built on. :meth:`MethodSpec.skip_reason` answers, before any work starts,
why a cell cannot run in the current setup; the harness records such a cell
as ``skipped`` with that reason instead of inventing a number. A runner may
also raise :class:`MethodUnavailable` once it has looked closer (e.g. an
environment without admissible actions for the random reference).
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.environments.registry import make_env, minigrid_id, text_task_names
from echo_rl.evaluation.records import NO_BACKBONE, Cell, CellOutcome, EpisodeRecord
from echo_rl.models import load_backbone
from echo_rl.models.resolve import resolve_backbone

TASK_KINDS = ("text", "vector")


class MethodUnavailable(RuntimeError):
    """This method cannot run this cell in the current setup; the message says why."""


class CellTimeout(RuntimeError):
    """The cell ran past ``evaluation_timeout``."""


@dataclass
class CellContext:
    """Everything a runner may use. Episode ``i`` of seed ``s`` uses env seed ``s * 10_000 + i``."""

    cell: Cell
    num_episodes: int
    max_steps: int
    task_config: dict[str, Any]
    method_config: dict[str, Any]
    work_dir: Path
    deadline: float
    device: str = "cpu"
    fingerprint: str = ""
    concurrency: int = 1  # episodes a prompting runner may run at once
    backbone_config: dict[str, Any] = field(default_factory=dict)  # BackboneConfig fields (dtype, device, ...)

    def episode_seed(self, i: int) -> int:
        return self.cell.seed * 10_000 + i

    def check_deadline(self) -> None:
        if time.monotonic() > self.deadline:
            raise CellTimeout(f"cell ran past evaluation_timeout ({self.cell.label} on {self.cell.task}, "
                              f"seed {self.cell.seed})")


Runner = Callable[[CellContext], Awaitable[CellOutcome]]


def task_kinds(task: str) -> tuple[str, ...]:
    """Which forms a task name offers: MiniGrid tasks are both text and vector tasks; registered ones are text."""
    kinds = []
    if task in text_task_names() or minigrid_id(task) is not None:  # any MiniGrid id also exists as text
        kinds.append("text")
    if minigrid_id(task) is not None:
        kinds.append("vector")
    return tuple(kinds)


def _module_missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True


@dataclass(frozen=True)
class MethodSpec:
    name: str
    kind: str  # reference | prompting | trained
    description: str
    runner: Runner
    task_kinds: tuple[str, ...]
    needs_backbone: bool = False
    requires: tuple[str, ...] = ()
    trainer_agent: str | None = None
    origin: str = ""  # the issue / module that provides it, for skip messages
    lm_on_text: bool = False  # on text-only tasks it trains a language model, so it needs a backbone there
    extra: dict[str, Any] = field(default_factory=dict)
    # TrainingConfig fields this method sets for a cell on (task, backbone), under the user's echo_rl_configs
    training_defaults: Callable[[str, str], dict[str, Any]] | None = None

    def uses_backbone(self, task: str) -> bool:
        """Whether a cell of this method on ``task`` runs once per backbone."""
        return self.needs_backbone or (self.lm_on_text and minigrid_id(task) is None)

    def skip_reason(self, task: str, backbone: str) -> str | None:
        """Why (task, backbone) cannot run with this method here, or None if it can be attempted."""
        kinds = task_kinds(task)
        if not set(kinds) & set(self.task_kinds):
            return (f"{self.name} runs on {'/'.join(self.task_kinds)} tasks; {task!r} is "
                    f"{'/'.join(kinds) or 'neither'}")
        for module in self.requires:
            if _module_missing(module):
                return f"{self.name} needs {module}, which is not in this installation yet ({self.origin})"
        if self.trainer_agent is not None:
            if _module_missing("echo_rl.training.trainer"):
                return f"{self.name} needs echo_rl.training.trainer (EchoRLTrainer), not in this installation yet"
            from echo_rl.training.agents import AGENTS  # needed on this path only

            if self.trainer_agent not in AGENTS:
                return (f"trainer agent {self.trainer_agent!r} is not registered yet ({self.origin}); "
                        f"registered: {', '.join(sorted(AGENTS))}")
        if self.uses_backbone(task) and backbone == NO_BACKBONE:
            return f"{self.name} needs a backbone on {task!r}; pass --backbones"
        weightless = _weightless(backbone) if self.trainer_agent is not None and self.uses_backbone(task) else None
        if weightless:
            return (f"{self.name} trains the backbone's weights and {weightless} {backbone!r} has none; use tiny, "
                    f"tiny:<preset> or a local checkpoint")
        return None

    def training_config(self, task: str, backbone: str, overrides: dict[str, Any] | None = None,
                        **base: Any) -> Any:
        """The TrainingConfig a cell of this trained method builds: ``base`` fields, then the method's own
        (``training_defaults``), then the user's ``overrides`` (mappings such as lm_config merge)."""
        data: dict[str, Any] = {"env_name": task, "agent": self.trainer_agent, **base}
        if backbone != NO_BACKBONE and self.uses_backbone(task):
            data["backbone"] = backbone
        for layer in (self.training_defaults(task, backbone) if self.training_defaults else {}, overrides or {}):
            for k, v in layer.items():
                data[k] = {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
        return TrainingConfig.from_dict(data)


def _weightless(name: str) -> str | None:
    """What kind of backbone ``name`` is when a trainer cannot update its weights ("API model", "registered
    backbone"), else None (the one resolver says; an unknown name is left to the trainer's own error)."""
    try:
        ref = resolve_backbone(name, strict=False)
    except ConfigError:  # e.g. a registered model not fetched here: the benchmark's name check said so
        return None
    if ref is None or ref.has_weights:
        return None
    return "registered backbone" if ref.kind == "registered" else "API model"


_METHODS: dict[str, MethodSpec] = {}


REGISTER_HINT = ("register your own with echo_rl.evaluation.methods.register_baseline(name, runner), "
                 "register_trained(name, agent) or register_method(MethodSpec(...))")


def register_method(spec: MethodSpec) -> None:
    """Add (or replace) a method; its name becomes valid in ``BenchmarkConfig.baselines``."""
    if not isinstance(spec, MethodSpec):
        raise ConfigError(f"register_method needs a MethodSpec, got {type(spec).__name__}")
    if not isinstance(spec.name, str) or not spec.name.strip() or spec.name != spec.name.strip():
        raise ConfigError(f"baseline name {spec.name!r} is invalid: must be a non-empty string")
    if not callable(spec.runner):
        raise ConfigError(f"runner of baseline {spec.name!r} is invalid: must be an async callable (CellContext)")
    bad = set(spec.task_kinds) - set(TASK_KINDS)
    if bad or not spec.task_kinds:
        raise ConfigError(f"MethodSpec.task_kinds={spec.task_kinds!r} is invalid; allowed: {', '.join(TASK_KINDS)}")
    _METHODS[spec.name] = spec


def register_baseline(name: str, runner: Runner, *, task_kinds: tuple[str, ...] = ("text",),
                      needs_backbone: bool = False, description: str = "", kind: str = "custom") -> MethodSpec:
    """Register a benchmark baseline from user code.

    ``runner`` is ``async def runner(ctx: CellContext) -> CellOutcome``: it runs ``ctx.num_episodes``
    episodes of ``ctx.cell.task`` (``make_text_env(ctx)`` builds the cell's environment, and
    ``run_text_episodes`` / ``load_cell_backbone(ctx)`` do the usual loop / backbone) and returns the
    records. With ``needs_backbone`` the benchmark runs it once per backbone in ``backbones``.
    """
    spec = MethodSpec(name, kind, description or f"{name} (registered from user code)", runner,
                      tuple(task_kinds), needs_backbone=needs_backbone)
    register_method(spec)
    return spec


def register_trained(name: str, agent: str | None = None, *, task_kinds: tuple[str, ...] = ("vector",),
                     description: str = "", training_defaults: Callable[[str, str], dict[str, Any]] | None = None
                     ) -> MethodSpec:
    """Register a benchmark method that trains ``agent`` (a name in ``echo_rl.training.agents.AGENTS``,
    default ``name``; see ``register_agent``) with EchoRLTrainer in each cell and reports its final
    evaluation, exactly like the built-in ``ppo`` and ``impala`` methods."""
    spec = MethodSpec(name, "trained", description or f"{agent or name} trained by EchoRLTrainer (registered)",
                      run_trained, tuple(task_kinds), trainer_agent=agent or name, origin="registered from user code",
                      training_defaults=training_defaults)
    register_method(spec)
    return spec


def method_names() -> list[str]:
    return sorted(_METHODS)


def get_method(name: str) -> MethodSpec:
    if name not in _METHODS:
        raise ConfigError(f"unknown baseline {name!r}; allowed: {', '.join(method_names())} ({REGISTER_HINT})")
    return _METHODS[name]


# ---------------------------------------------------------------------------
# Episode loops
# ---------------------------------------------------------------------------

def run_episodes(ctx: CellContext, env: Any, act: Callable[[Any, dict, np.random.Generator], Any], *,
                 won: Callable[[dict, float, bool], bool] = lambda info, reward, terminated: bool(info.get("won")),
                 begin: Callable[[Any], None] | None = None) -> list[EpisodeRecord]:
    """The harness's one episode loop: ``ctx.num_episodes`` seeded episodes of at most ``ctx.max_steps`` steps.

    ``act(obs, info, rng)`` picks each action; ``won(info, reward, terminated)`` reads success after each
    step (by default the text contract's ``info['won']``); ``begin(env)`` runs after each reset.
    """
    out = []
    for i in range(ctx.num_episodes):
        ctx.check_deadline()
        seed = ctx.episode_seed(i)
        rng = np.random.default_rng(seed)
        t0 = time.perf_counter()
        obs, info = env.reset(seed=seed)
        if begin is not None:
            begin(env)
        total, steps, success, done = 0.0, 0, won(info, 0.0, False), False
        while not done and steps < ctx.max_steps:
            obs, reward, terminated, truncated, info = env.step(act(obs, info, rng))
            total += float(reward)
            steps += 1
            success = won(info, float(reward), bool(terminated))
            done = terminated or truncated
        out.append(EpisodeRecord(success=success, reward=total, length=steps, wall_time_s=time.perf_counter() - t0,
                                 seed=seed))
    return out


def run_vector_episodes(ctx: CellContext, env_id: str,
                        act: Callable[[Any, Any, np.random.Generator], int]) -> list[EpisodeRecord]:
    """Gymnasium MiniGrid episodes; success = terminated with positive reward (MiniGrid's goal signal)."""
    import gymnasium as gym
    import minigrid  # noqa: F401  (registers the ids)

    env = gym.make(env_id, **env_config(ctx))
    try:
        return run_episodes(ctx, env, lambda obs, info, rng: act(env, obs, rng),
                            won=lambda info, reward, terminated: terminated and reward > 0)
    finally:
        env.close()


def run_text_episodes(ctx: CellContext, env: Any, act: Callable[[str, dict, np.random.Generator], str],
                      begin: Callable[[Any], None] | None = None) -> list[EpisodeRecord]:
    """Text-env episodes through the contract ``reset(seed)`` / ``step(action)``; success = ``info['won']``."""
    return run_episodes(ctx, env, act, begin=begin)


def env_config(ctx: CellContext) -> dict[str, Any]:
    """The task's config with the harness step cap as the environment's own ``max_steps``.

    Every method then meets the same task: the env truncates at the cap (and
    MiniGrid's reward, 1 - 0.9 * steps / max_steps, is scaled by it) for the
    references, the prompting agents and the trainer alike.
    """
    return {"max_steps": ctx.max_steps, **ctx.task_config}


def make_text_env(ctx: CellContext) -> Any:
    """The cell's text environment (its task, the task config and the harness step cap)."""
    return _make_text_env(ctx)


def load_cell_backbone(ctx: CellContext) -> Any:
    """The cell's backbone (registered ones included); a backbone that cannot load here skips the cell."""
    try:
        return load_backbone(ctx.cell.backbone, ctx.backbone_config or None)
    except ConfigError as exc:  # e.g. an API backbone without its key: nothing was sent
        raise MethodUnavailable(str(exc)) from None


def _make_text_env(ctx: CellContext) -> Any:
    task, kwargs = ctx.cell.task, env_config(ctx)
    env_id = minigrid_id(task)
    if env_id is not None:  # MiniGrid as text: the same gymnasium env the vector methods see
        task, kwargs = "minigrid", {"env_id": env_id, **kwargs}
    try:
        return make_env(task, **kwargs)
    except ConfigError as exc:
        if "not available yet" in str(exc):
            raise MethodUnavailable(str(exc)) from None
        raise
    except (ImportError, FileNotFoundError) as exc:  # a missing extra or data set: this setup cannot run it
        raise MethodUnavailable(f"{task} environment unavailable here: {exc}") from None


def _env_notes(env: Any) -> dict[str, Any]:
    """What the env says it is, e.g. "WebShop (synthetic catalogue)" — shown beside its results."""
    label = getattr(env, "label", None)
    return {"benchmark": label} if isinstance(label, str) else {}


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)
    if close is not None:
        close()



async def run_trained(ctx: CellContext) -> CellOutcome:
    """Train with EchoRLTrainer in the cell's work dir, then take the trainer's final evaluation.

    A cell killed mid-training resumes from the trainer's last checkpoint when
    its work dir was made by the same settings (a fingerprint file says so).
    """
    import shutil

    from echo_rl.training.trainer import EchoRLTrainer  # torch, gymnasium, minigrid: loaded on first use

    overrides = dict(ctx.method_config)
    config = get_method(ctx.cell.method).training_config(
        ctx.cell.task, ctx.cell.backbone, overrides, seed=ctx.cell.seed, device=ctx.device,
        evaluation_episodes=ctx.num_episodes, env_config=env_config(ctx))
    if "evaluation_frequency" not in overrides:  # a few points for the learning curve
        config = config.replace(evaluation_frequency=max(config.total_timesteps // 5, 1))
    run_dir = ctx.work_dir / "train"
    stamp = ctx.work_dir / "fingerprint"
    resume = False
    if run_dir.exists():
        if stamp.is_file() and stamp.read_text() == ctx.fingerprint and any(run_dir.rglob("state.pt")):
            resume = True
        else:
            shutil.rmtree(run_dir)
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(ctx.fingerprint)
    try:
        trainer = EchoRLTrainer(config, run_dir=run_dir, resume=resume, show_progress=False)
    except ConfigError as exc:  # e.g. text-task training before the LM trainer supports it
        if "not implemented" in str(exc) or "not supported" in str(exc):
            raise MethodUnavailable(str(exc)) from None
        raise
    metrics = await trainer.train()
    if metrics.interrupted:
        raise KeyboardInterrupt  # Ctrl-C: the trainer checkpointed; the benchmark stops and resumes later
    results = dict(metrics.evaluation_results or {})
    if "success_rate" not in results:
        raise RuntimeError(f"trainer returned no evaluation_results['success_rate'] (got {sorted(results)})")
    curve = [{"step": float(h["step"]), "success_rate": float(h["success_rate"])}
             for h in metrics.history if h.get("success_rate") is not None]
    return CellOutcome(
        success_rate=float(results["success_rate"]),
        mean_reward=_first(results, "avg_reward", "mean_return", "mean_reward"),
        mean_length=_first(results, "avg_length", "mean_length", "episode_length"),
        num_episodes=int(results.get("episodes", ctx.num_episodes)),
        learning_curve=curve,
        env_steps_trained=int(metrics.total_timesteps),
        notes={"evaluation_results": {k: v for k, v in results.items() if isinstance(v, (int, float))},
               "train_run_dir": str(metrics.run_dir), "resumed_training": resume},
    )


def _first(d: dict, *keys: str) -> float | None:
    for k in keys:
        if d.get(k) is not None:
            return float(d[k])
    return None
