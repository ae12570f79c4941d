"""Task names -> environment factories.

Vector tasks (small policies) are MiniGrid ids: ``minigrid`` (DoorKey-5x5),
``minigrid:<EnvId>`` or a bare ``MiniGrid-...`` / ``BabyAI-...`` id, and the
gymnasium tasks of :mod:`echo_rl.environments.gym_vector`: ``gym:<EnvId>``
(classic-control ids also bare: ``CartPole-v1``), ``minigrid-pixels:<EnvId>``
and ``atari:<Game>``. Text tasks
(language-model agents) are registered by name with :func:`register_text_env`
and built with :func:`make_env`. A task registered from user code is a task
everywhere: ``make_env``, ``TrainingConfig(env_name=...)``, ``BenchmarkConfig``
and the CLI (which imports the user's module first: ``echo-rl --plugin MODULE``
or ``ECHO_RL_PLUGINS``, see ``echo_rl.plugins``).
"""

from __future__ import annotations

from typing import Any, Callable

from echo_rl.config import ConfigError, register_name_rule

DEFAULT_MINIGRID_ID = "MiniGrid-DoorKey-5x5-v0"
TEXT_TASKS = ("alfworld", "webshop", "cruxeval", "arc", "minigrid")

#: gymnasium task families (``family:<id>``) and the classic-control ids accepted without ``gym:``
GYM_FAMILIES = ("gym", "minigrid-pixels", "atari")
CLASSIC_CONTROL = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0")

_TEXT_FACTORIES: dict[str, Callable[..., Any]] = {}
REGISTER_HINT = "register your own with echo_rl.environments.registry.register_text_env(name, factory)"


def register_text_env(name: str, factory: Callable[..., Any]) -> None:
    """Register a text-environment factory under a task name.

    ``factory(**env_config)`` returns an env with the text contract (``reset(seed=...)``,
    ``step(action: str)``, ``info["segments"]``; subclass ``echo_rl.environments.base.TextEnvironment``).
    Registering a name again replaces its factory; MiniGrid names are reserved.
    """
    if not isinstance(name, str) or not name.strip() or name != name.strip() or ":" in name:
        raise ConfigError(f"task name {name!r} is invalid: must be a non-empty string without ':' or "
                          f"surrounding spaces")
    if not callable(factory):
        raise ConfigError(f"factory for task {name!r} is invalid: must be callable, got {type(factory).__name__}")
    if name != "minigrid" and (minigrid_id(name) is not None or gym_task(name) is not None):
        raise ConfigError(f"task name {name!r} is invalid: MiniGrid-/BabyAI- names are MiniGrid's env ids")
    _TEXT_FACTORIES[name] = factory


def text_task_names() -> list[str]:
    """The built-in text tasks, then those registered from user code."""
    return [*TEXT_TASKS, *sorted(set(_TEXT_FACTORIES) - set(TEXT_TASKS))]


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


def _check_gym_task(task: str, family: str, env_id: str) -> None:
    import gymnasium as gym

    if family == "atari":
        from echo_rl.environments.gym_vector import atari_id, import_ale

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
    if task not in TEXT_TASKS and task not in _TEXT_FACTORIES:
        names = [t for t in text_task_names() if t != "minigrid"]
        raise ConfigError(f"unknown task {task!r}; allowed: minigrid, minigrid:<EnvId>, {', '.join(CLASSIC_CONTROL)}, "
                          f"gym:<EnvId>, minigrid-pixels:<EnvId>, atari:<Game>, {', '.join(names)} "
                          f"({REGISTER_HINT})")


def make_env(name: str, **config: Any) -> Any:
    """Build the text environment registered as ``name`` (``minigrid:<EnvId>`` picks MiniGrid's env id)."""
    check_task_name(name)
    env_id = minigrid_id(name)
    if env_id is not None and name != "minigrid":
        if config.get("env_id", env_id) != env_id:
            raise ConfigError(f"task {name!r} names env id {env_id!r} but env_id={config['env_id']!r} was given")
        name, config = "minigrid", {**config, "env_id": env_id}
    if name not in _TEXT_FACTORIES:
        _import_text_env(name)
    if name not in _TEXT_FACTORIES:
        raise ConfigError(f"text environment {name!r} is not available yet; registered: {sorted(_TEXT_FACTORIES)}")
    return _TEXT_FACTORIES[name](**config)


def _import_text_env(name: str) -> None:
    import importlib

    try:
        importlib.import_module(f"echo_rl.environments.{name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("echo_rl"):
            return
        raise


def is_vector_task(task: str) -> bool:
    """A MiniGrid or gymnasium task (small vector policies); any other task is a text task."""
    return minigrid_id(task) is not None or gym_task(task) is not None


register_name_rule("task", check_task_name)  # TrainingConfig(env_name=...) is checked against this registry
register_name_rule("vector_task", is_vector_task)
