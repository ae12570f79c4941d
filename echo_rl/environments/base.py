"""The text-environment contract every EchoRL text task follows.

``reset(seed, options) -> (observation, info)`` and ``step(action_text) ->
(observation, reward, terminated, truncated, info)``, as gymnasium defines them,
with :class:`UnicodeText` spaces so gymnasium's env checker applies. The
observation is always ``"".join(seg.text for seg in info["segments"])``: the
segments say which characters the environment produced as its answer
(``env_output``) and which are feedback on a bad action (``warning``), which the
ECHO loss and the token role masks need. ``info`` also carries ``won``,
``admissible_actions`` (a list, or None where the task has no finite action set),
``step`` and ``task_id``; a task whose observation text does not identify its state (MiniGrid's
egocentric view looks the same from many cells) adds ``state_key``, a canonical string of the state
(:meth:`TextEnvironment._state_key`), and registers ``anchor_state="state_key"``: step-level credit
(GiGPO) compares steps that start from the same state by it.

An invalid action never raises: it yields a ``warning`` segment and the episode
goes on (and counts towards ``max_steps``, after which the episode is truncated).

Environments that can copy their state cheaply set ``supports_snapshot`` and
implement :meth:`TextEnvironment.snapshot` / :meth:`TextEnvironment.restore`
(Tree-of-Thoughts lookahead). Environments with a hand-coded expert implement
:meth:`TextEnvironment.expert_action`.
"""

from __future__ import annotations

import copy
import os
import string
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
from gymnasium import spaces

from echo_rl.config import ConfigBase, ConfigError, spec
from echo_rl.utils.paths import data_root

ENV_OUTPUT = "env_output"
WARNING = "warning"
ROLES = (ENV_OUTPUT, WARNING)

MAX_TEXT_LENGTH = 1_000_000
TRUNCATION_MARKER = "\n[... {cut} characters cut: observations are at most {limit} characters]"


class Segment(NamedTuple):
    """A piece of an observation and the role its tokens get (env_output or warning)."""

    role: str
    text: str


class UnicodeText(spaces.Text):
    """A Text space over all of Unicode.

    gymnasium's ``Text`` only contains strings drawn from its charset; task text
    (code, product pages, ALFWorld rooms) is arbitrary Unicode, so membership
    here is "a str of allowed length". ``sample()`` still draws from printable
    ASCII, which makes a good source of invalid actions for tests.
    """

    def __init__(self, max_length: int = MAX_TEXT_LENGTH, *, min_length: int = 0, seed: Any = None):
        super().__init__(max_length=max_length, min_length=min_length, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, UnicodeText) and (self.min_length, self.max_length) == (
            other.min_length, other.max_length)


class StepOutcome(NamedTuple):
    """What a task's ``_step`` returns; the base class adds truncation and info."""

    segments: list[Segment]
    reward: float = 0.0
    terminated: bool = False
    won: bool = False
    extra: dict | None = None
    truncated: bool = False  # the task's own time limit (besides max_steps)


def warning(text: str) -> list[Segment]:
    return [Segment(WARNING, text)]


def env_output(text: str) -> list[Segment]:
    return [Segment(ENV_OUTPUT, text)]


def resolve_data_dir(configured: str | None, subdir: str, env_var: str, how_to_get: str) -> Path:
    """Where a task's data lives: the config's ``data_dir``, else ``$<env_var>``, else the data root.

    Never downloads; a missing folder raises FileNotFoundError naming the path
    and how to obtain the data.
    """
    if configured:
        path = Path(configured).expanduser()
    elif os.environ.get(env_var):
        path = Path(os.environ[env_var]).expanduser()
    else:
        path = data_root() / subdir
    if not path.exists():
        raise FileNotFoundError(f"{subdir} data not found at {path} (set data_dir or ${env_var}); {how_to_get}")
    return path


class TextEnvironment(gym.Env):
    """Base class: seeding, step counting, ``max_steps`` truncation, role segments, info.

    Subclasses implement ``_num_tasks()``, ``_reset_task(index, options) ->
    list[Segment]``, ``_step(action) -> StepOutcome`` and optionally
    ``_admissible_actions()``, ``_task_id()``, ``expert_action()`` and the
    snapshot hooks.
    """

    metadata = {"render_modes": ["ansi"]}
    supports_snapshot = False
    has_expert = False

    def __init__(self, config: ConfigBase, render_mode: str | None = None):
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode={render_mode!r} is invalid: allowed: None, ansi")
        self.config = config
        self.render_mode = render_mode
        self.observation_space = UnicodeText()
        self.action_space = UnicodeText()
        self.max_steps = config.max_steps
        self._steps = 0
        self._done = True
        self._started = False
        self._won = False
        self._last_obs = ""
        self._task_index = 0

    # -- hooks ----------------------------------------------------------------
    def _num_tasks(self) -> int:
        raise NotImplementedError

    def _reset_task(self, index: int, options: dict) -> list[Segment]:
        raise NotImplementedError

    def _step(self, action: str) -> StepOutcome:
        raise NotImplementedError

    def _admissible_actions(self) -> list[str] | None:
        return None

    def _task_id(self) -> str:
        return str(self._task_index)

    def _task_group(self) -> str | None:
        """The group the current task is reported under (e.g. the terminal tasks' ``level2``; None: no groups);
        it becomes ``info["task_group"]``, and held-out evaluations give success per group."""
        return None

    def _state_key(self) -> str | None:
        """A canonical string of the current state, equal exactly when the states are (None: the observation
        text is the state); it becomes ``info["state_key"]``."""
        return None

    def expert_action(self) -> str:
        """The next action of the hand-coded expert for the current state."""
        raise NotImplementedError(f"{type(self).__name__} has no expert")

    def snapshot(self) -> Any:
        """A copy of the episode state that :meth:`restore` can return to."""
        raise NotImplementedError(f"{type(self).__name__} does not support snapshot/restore")

    def restore(self, snap: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support snapshot/restore")

    # -- gymnasium API --------------------------------------------------------
    @property
    def num_tasks(self) -> int:
        return self._num_tasks()

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Start an episode; ``options={"task_index": i}`` picks a task, else the seeded RNG does."""
        super().reset(seed=seed)
        options = dict(options or {})
        n = self._num_tasks()
        if n <= 0:
            raise ConfigError(f"{type(self).__name__}: no task matches the config {self.config}")
        if "task_index" in options:
            index = options["task_index"]
            if not isinstance(index, int) or not 0 <= index < n:
                raise ConfigError(f"options['task_index']={index!r} is invalid: must be an int in [0, {n})")
        else:
            index = int(self.np_random.integers(n))
        self._task_index = index
        self._steps = 0
        self._won = False
        self._done = False
        self._started = True
        segments = fit_segments(self._reset_task(index, options), self.observation_space.max_length)
        return self._observe(segments), self._info(segments)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if not self._started:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset()")
        if self._done:
            segments = warning("The episode is over; call reset().")
            return self._observe(segments), 0.0, True, False, self._info(segments)
        if not isinstance(action, str):
            outcome = self._non_text_action(action)
        else:
            outcome = self._step(action)
        segments = fit_segments(outcome.segments, self.observation_space.max_length)
        self._steps += 1
        self._won = self._won or outcome.won
        terminated = bool(outcome.terminated)
        truncated = not terminated and (outcome.truncated or self._steps >= self.max_steps)
        self._done = terminated or truncated
        info = self._info(segments)
        if outcome.extra:
            info.update(outcome.extra)
        return self._observe(segments), float(outcome.reward), terminated, truncated, info

    def _non_text_action(self, action: Any) -> StepOutcome:
        return StepOutcome(warning(f"Actions are text; got {type(action).__name__}."))

    def render(self) -> str | None:
        return self._last_obs if self.render_mode == "ansi" else None

    # -- helpers --------------------------------------------------------------
    def _observe(self, segments: list[Segment]) -> str:
        for seg in segments:
            if seg.role not in ROLES:
                raise ValueError(f"segment role {seg.role!r} is not one of {ROLES}")
        self._last_obs = "".join(seg.text for seg in segments)
        return self._last_obs

    def _info(self, segments: list[Segment]) -> dict:
        info = {
            "segments": list(segments),
            "admissible_actions": None if self._done else self._admissible_actions(),
            "won": self._won,
            "step": self._steps,
            "max_steps": self.max_steps,
            "task_id": self._task_id(),
        }
        key, group = self._state_key(), self._task_group()
        if key is not None:
            info["state_key"] = key
        if group is not None:
            info["task_group"] = group
        return info

    def _base_state(self) -> dict:
        return {k: copy.copy(getattr(self, k)) for k in
                ("_steps", "_done", "_started", "_won", "_last_obs", "_task_index")}

    def _restore_base(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


def fit_segments(segments: list[Segment], limit: int) -> list[Segment]:
    """Cut an observation longer than ``limit`` characters to exactly fit, ending it with a marker.

    An observation must lie in the declared space (a task's error text can be
    megabytes); the marker says how much was cut and takes the role of the
    segment it ends, so role masks stay aligned with the text.
    """
    total = sum(len(seg.text) for seg in segments)
    if total <= limit:
        return segments
    def marker(kept: int) -> str:
        return TRUNCATION_MARKER.format(cut=total - kept, limit=limit)

    keep = max(0, limit - len(marker(0)))
    while keep + 1 + len(marker(keep + 1)) <= limit:  # the count may have fewer digits: fill exactly
        keep += 1
    end = marker(keep)[:limit - keep]
    out: list[Segment] = []
    for seg in segments:
        if len(seg.text) < keep:
            out.append(seg)
            keep -= len(seg.text)
            continue
        out.append(Segment(seg.role, seg.text[:keep] + end))
        break
    return out


def max_steps_spec(default: int) -> Any:
    return spec(default, help="actions per episode before it is truncated", min=1)


def data_dir_spec() -> Any:
    return spec(None, help="data folder (None: the task's env var, else <data root>/<task>)")


def make_config(cls: type, config: Any, overrides: dict) -> Any:
    """Accept a config object, a dict or keyword overrides (``Env(config)``, ``Env(**fields)``)."""
    if config is None:
        return cls(**overrides)
    if isinstance(config, dict):
        return cls.from_dict({**config, **overrides})
    if not isinstance(config, cls):
        raise ConfigError(f"config must be a {cls.__name__} or a dict, got {type(config).__name__}")
    return config.replace(**overrides) if overrides else config
