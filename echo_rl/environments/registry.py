"""The task registry: task names -> :class:`TaskSpec` (factory and metadata), and vector task names.

Vector tasks (small policies) are MiniGrid ids: ``minigrid`` (DoorKey-5x5),
``minigrid:<EnvId>`` or a bare ``MiniGrid-...`` / ``BabyAI-...`` id, and the
gymnasium tasks of :mod:`echo_rl.environments.gym_vector`: ``gym:<EnvId>``
(classic-control ids also bare: ``CartPole-v1``, ``Pendulum-v1``), ``minigrid-pixels:<EnvId>``,
``atari:<Game>`` and the DeepMind Control Suite's ``dmc:<domain>-<task>`` /
``dmc-pixels:<domain>-<task>``.

Text tasks (language-model agents) are :class:`TaskSpec` entries: the factory
and what the rest of EchoRL needs to know about the task (its training and
held-out splits, whether answers span lines, its turn protocol (the reply
format LM training and the prompting agents read), where its data comes from, what a step's state is for
step-level credit: ``anchor_state``). Every text task registers
itself from its own module with :func:`register_text_env` (or
:func:`register_task`) - the built-ins at the end of ``alfworld.py``,
``webshop.py`` and the rest, a user's task from the user's module. A task
registered from user code is a task everywhere: ``make_env``,
``TrainingConfig(env_name=...)``, ``BenchmarkConfig`` and the CLI (which imports
the user's module first: ``echo-rl --plugin MODULE`` or ``ECHO_RL_PLUGINS``, see
``echo_rl.plugins``). The built-in modules are imported on the first lookup,
so ``import echo_rl`` stays cheap.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from echo_rl.config import ConfigError, register_name_rule
from echo_rl.environments.reply_format import GENERIC, GENERIC_MULTILINE, TaskFormat

DEFAULT_MINIGRID_ID = "MiniGrid-DoorKey-5x5-v0"

#: modules whose import registers the built-in text tasks, in listing order
BUILTIN_TASK_MODULES = ("echo_rl.environments.alfworld", "echo_rl.environments.webshop",
                        "echo_rl.environments.cruxeval", "echo_rl.environments.arc",
                        "echo_rl.environments.minigrid", "echo_rl.environments.terminal.env",
                        "echo_rl.environments.terminal.intercode", "echo_rl.environments.openenv_task")

#: gymnasium task families (``family:<id>``) and the classic-control ids accepted without ``gym:``
GYM_FAMILIES = ("gym", "minigrid-pixels", "atari", "dmc", "dmc-pixels")
CLASSIC_CONTROL = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1", "MountainCarContinuous-v0")

REGISTER_HINT = "register your own with echo_rl.environments.registry.register_text_env(name, factory)"
ANCHOR_STATES = ("observation", "state_key")  # TaskSpec.anchor_state: the observation text or info["state_key"]
ATARI_EXTRA = "pip install 'echo-rl[atari]'"


@dataclass(frozen=True)
class TaskSpec:
    """A text task: how to build it and what training, evaluation and the prompting agents need to know."""

    name: str
    factory: Callable[..., Any]  # factory(**env_config) -> a TextEnvironment
    train_config: Mapping[str, Any] = field(default_factory=dict)  # env overrides for training episodes
    eval_config: Mapping[str, Any] = field(default_factory=dict)  # env overrides for held-out evaluation
    multiline: bool = False  # answers span several lines (ARC's grids): replies are not cut at the first line
    # the task's turn protocol, read by LM rollouts, SFT and the prompting agents (ReAct, Act-only, ToT): a
    # TaskFormat (instruction, one-shot example, reply parser, tools, observation role, stop strings, token
    # budget), or env -> TaskFormat where it depends on the env's settings; None: the generic format (see
    # echo_rl.environments.reply_format; a tool-use task: reply_format.tool_format)
    reply_format: TaskFormat | Callable[[Any], TaskFormat] | None = None
    data: str = ""  # where its data comes from / what it needs, one line (listings, skip messages)
    description: str = ""
    # what a step's state is where steps are compared across episodes (GiGPO's anchor states):
    # "observation" (its text) or "state_key" (the env's canonical info["state_key"], where text is ambiguous)
    anchor_state: str = "observation"

    @property
    def prompting(self) -> bool:
        """The task registered its own reply format for the prompting agents."""
        return self.reply_format is not None

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name.strip() or name != name.strip() or ":" in name:
            raise ConfigError(f"task name {name!r} is invalid: must be a non-empty string without ':' or "
                              f"surrounding spaces")
        if not callable(self.factory):
            raise ConfigError(f"factory for task {name!r} is invalid: must be callable, got "
                              f"{type(self.factory).__name__}")
        if name != "minigrid" and (minigrid_id(name) is not None or gym_task(name) is not None):
            raise ConfigError(f"task name {name!r} is invalid: MiniGrid-/BabyAI- names are MiniGrid's env ids")
        for what in ("train_config", "eval_config"):
            value = getattr(self, what)
            if not isinstance(value, Mapping):
                raise ConfigError(f"TaskSpec.{what} of task {name!r} is invalid: must be a mapping of env "
                                  f"options, got {type(value).__name__}")
            object.__setattr__(self, what, MappingProxyType(dict(value)))  # shared: nobody may mutate it
        if self.anchor_state not in ANCHOR_STATES:
            raise ConfigError(f"anchor_state={self.anchor_state!r} of task {name!r} is invalid: allowed: "
                              f"{', '.join(ANCHOR_STATES)}")
        fmt = self.reply_format
        if fmt is not None and not isinstance(fmt, TaskFormat) and not callable(fmt):
            raise ConfigError(f"reply_format of task {name!r} is invalid: must be an "
                              f"echo_rl.environments.reply_format.TaskFormat or env -> TaskFormat, got "
                              f"{type(fmt).__name__}")
        if isinstance(fmt, TaskFormat) and fmt.multiline != self.multiline:
            raise ConfigError(f"reply_format of task {name!r} is invalid: its multiline={fmt.multiline} "
                              f"contradicts the task's multiline={self.multiline}")


_TASKS: dict[str, TaskSpec] = {}
_builtins_loaded = False
_builtins_lock = threading.RLock()


def _load_builtins() -> None:
    """Import the built-in task modules once; each registers its task(s) from its own file."""
    global _builtins_loaded
    with _builtins_lock:  # reentrant: the modules register through register_task while they import
        if _builtins_loaded:
            return
        _builtins_loaded = True  # first, for that re-entry; other threads wait on the lock until all are in
        try:
            for module in BUILTIN_TASK_MODULES:
                importlib.import_module(module)
        except BaseException:
            _builtins_loaded = False  # the next lookup raises the same error instead of missing tasks
            raise


def register_task(spec: TaskSpec) -> TaskSpec:
    """Add (or replace) a text task; the built-ins are registered first, so a user's entry of the same name
    replaces the built-in one."""
    if not isinstance(spec, TaskSpec):
        raise ConfigError(f"register_task needs a TaskSpec, got {type(spec).__name__}")
    _load_builtins()
    _TASKS[spec.name] = spec
    return spec


def register_text_env(name: str, factory: Callable[..., Any], **metadata: Any) -> TaskSpec:
    """Register a text-environment factory under a task name (the :class:`TaskSpec` fields as keywords).

    ``factory(**env_config)`` returns an env with the text contract (``reset(seed=...)``,
    ``step(action: str)``, ``info["segments"]``; subclass ``echo_rl.environments.base.TextEnvironment``).
    Registering a name again replaces its entry; MiniGrid names are reserved.
    """
    fields = set(TaskSpec.__dataclass_fields__) - {"name", "factory"}
    unknown = set(metadata) - fields
    if unknown:
        raise ConfigError(f"register_text_env({name!r}): unknown TaskSpec field(s) {', '.join(sorted(unknown))}; "
                          f"allowed: {', '.join(sorted(fields))}")
    return register_task(TaskSpec(name, factory, **metadata))


def text_task_names() -> list[str]:
    """The built-in text tasks in ``BUILTIN_TASK_MODULES`` order, then those registered from user code.

    Sorted, not insertion order: a built-in module imported directly registers before the others.
    """
    _load_builtins()
    rank = {m: i for i, m in enumerate(BUILTIN_TASK_MODULES)}
    order = {name: i for i, name in enumerate(_TASKS)}
    return sorted(_TASKS, key=lambda n: (rank.get(_TASKS[n].factory.__module__, len(rank)), order[n]))


def task_spec(task: str) -> TaskSpec:
    """The :class:`TaskSpec` of a text task name (``minigrid:<EnvId>`` and bare MiniGrid ids are ``minigrid``'s)."""
    if minigrid_id(task) is not None:
        task = "minigrid"
    _load_builtins()
    if task not in _TASKS:
        check_task_name(task)  # a vector task, or unknown: says which
        raise ConfigError(f"task {task!r} is a vector task; it has no text environment")
    return _TASKS[task]


def find_task_spec(task: str | None) -> TaskSpec | None:
    """The :class:`TaskSpec` of a registered text task, or None (for None, vector tasks and unregistered
    names): the lookup of callers with a fallback for tasks the registry does not know."""
    if task is None:
        return None
    if minigrid_id(task) is not None:
        task = "minigrid"
    _load_builtins()
    return _TASKS.get(task)


def split_configs(task: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """(training, held-out evaluation) env overrides of a text task; ``({}, {})`` where seeds alone hold out."""
    spec = task_spec(task)
    return spec.train_config, spec.eval_config


def minigrid_env_ids() -> list[str]:
    import gymnasium as gym
    import minigrid  # noqa: F401  (registers the MiniGrid/BabyAI ids)

    return sorted(k for k in gym.registry if k.startswith(("MiniGrid-", "BabyAI-")))


def minigrid_id(task: str) -> str | None:
    """The MiniGrid env id a vector task names, or None if it is not a MiniGrid task."""
    if task == "minigrid":
        return DEFAULT_MINIGRID_ID
    if task.startswith("minigrid:"):
        return task.split(":", 1)[1]
    if task.startswith(("MiniGrid-", "BabyAI-")):
        return task
    return None


def gym_task(task: str) -> tuple[str, str] | None:
    """(family, env id) of a gymnasium vector task (``gym:CartPole-v1`` -> ("gym", "CartPole-v1")), else None."""
    if task in CLASSIC_CONTROL:
        return "gym", task
    family, sep, env_id = task.partition(":")
    if sep and family in GYM_FAMILIES:
        return family, env_id
    return None


def import_ale():
    """ale-py's Atari envs registered with gymnasium (a one-line error naming the extra when it is missing)."""
    import gymnasium as gym

    try:
        import ale_py
    except ImportError:
        raise ConfigError(f"Atari tasks need ale-py: {ATARI_EXTRA}") from None
    gym.register_envs(ale_py)
    return ale_py


def atari_id(game: str) -> str:
    """``Pong`` -> ``ALE/Pong-v5``; a full id is kept."""
    return game if "/" in game or game.endswith(("-v4", "-v5")) else f"ALE/{game}-v5"


def _check_gym_task(task: str, family: str, env_id: str) -> None:
    import gymnasium as gym

    if family in ("dmc", "dmc-pixels"):
        from echo_rl.environments.dmc import check_name  # gymnasium: loaded on first use

        check_name(env_id, family)
        return
    if family == "atari":
        import_ale()
        env_id = atari_id(env_id)
    ids = minigrid_env_ids() if family == "minigrid-pixels" else sorted(gym.registry)
    if env_id not in ids:
        example = {"gym": "gym:CartPole-v1", "minigrid-pixels": f"minigrid-pixels:{DEFAULT_MINIGRID_ID}",
                   "atari": "atari:Pong"}[family]
        raise ConfigError(f"unknown {family} env id {env_id!r} in task {task!r}; e.g. {example}")


def check_task_name(task: str) -> None:
    """Raise ConfigError (one line, valid names listed) for an unknown task."""
    parsed = gym_task(task)
    if parsed is not None:
        _check_gym_task(task, *parsed)
        return
    env_id = minigrid_id(task)
    if env_id is not None:
        if env_id not in minigrid_env_ids():
            raise ConfigError(
                f"unknown MiniGrid env id {env_id!r} in task {task!r}; e.g. minigrid:{DEFAULT_MINIGRID_ID} "
                f"(all ids: python -c 'import echo_rl.environments.registry as r; print(r.minigrid_env_ids())')")
        return
    if task not in text_task_names():
        names = [t for t in text_task_names() if t != "minigrid"]
        raise ConfigError(f"unknown task {task!r}; allowed: minigrid, minigrid:<EnvId>, {', '.join(CLASSIC_CONTROL)}, "
                          f"gym:<EnvId>, minigrid-pixels:<EnvId>, atari:<Game>, dmc:<domain>-<task>, "
                          f"dmc-pixels:<domain>-<task>, {', '.join(names)} "
                          f"({REGISTER_HINT})")


def make_env(name: str, **config: Any) -> Any:
    """Build the text environment registered as ``name`` (``minigrid:<EnvId>`` picks MiniGrid's env id)."""
    check_task_name(name)
    env_id = minigrid_id(name)
    if env_id is not None and name != "minigrid":
        if config.get("env_id", env_id) != env_id:
            raise ConfigError(f"task {name!r} names env id {env_id!r} but env_id={config['env_id']!r} was given")
        name, config = "minigrid", {**config, "env_id": env_id}
    return task_spec(name).factory(**config)


def is_vector_task(task: str) -> bool:
    """A MiniGrid or gymnasium task (small vector policies); any other task is a text task."""
    return minigrid_id(task) is not None or gym_task(task) is not None


register_name_rule("task", check_task_name)  # TrainingConfig(env_name=...) is checked against this registry
register_name_rule("vector_task", is_vector_task)


def task_format(task: str | None, env: Any = None) -> TaskFormat:
    """The format ``task`` registered (one that depends on the env is computed from ``env``; ``None`` before
    one exists), else the generic one; ``None`` and unregistered names get the generic format too.

    The one lookup of a task's turn protocol: prompting agents, LM rollouts and SFT all call it.
    """
    spec = find_task_spec(task)
    if spec is None:
        return GENERIC
    fmt = spec.reply_format
    if fmt is None:
        return GENERIC_MULTILINE if spec.multiline else GENERIC
    if isinstance(fmt, TaskFormat):
        return fmt
    made = fmt(env)
    if not isinstance(made, TaskFormat):
        raise ConfigError(f"reply_format of task {spec.name!r} is invalid: it returned {type(made).__name__}, "
                          f"not a TaskFormat")
    if made.multiline != spec.multiline:
        raise ConfigError(f"reply_format of task {spec.name!r} is invalid: its multiline={made.multiline} "
                          f"contradicts the task's multiline={spec.multiline}")
    return made
