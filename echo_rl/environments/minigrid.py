"""MiniGrid as text: an egocentric description plus the mission, actions as words.

The environment wraps the real gymnasium MiniGrid env (same dynamics, reward
``1 - 0.9 * steps / max_steps`` on success). The 7x7 egocentric view is decoded
into sentences ("a yellow key 2 steps forward and 1 step left"); the seven
actions are words (``turn left``, ``turn right``, ``move forward``, ``pick up``,
``drop``, ``toggle``, ``done``). The same environment serves vector agents:
``step`` also takes the integer action, and ``info["vector_obs"]`` carries the
MiniGrid dict observation (image, direction, mission); ``info["state_key"]`` is
the true state (pose, carried object, grid), the task's anchor state for
step-level credit. For batched vector
training use :func:`make_minigrid_env` / the PPO adapter in ``minigrid_vector``.

Expert: a breadth-first planner over the true grid (fetch the key, open the
door, reach the goal / open the door), recomputed every step, for the
goal-reaching and Unlock tasks; BabyAI ids use minigrid's ``BabyAIBot``.
"""

from __future__ import annotations

import copy
import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from echo_rl.config import ConfigBase, ConfigError, spec
from echo_rl.environments import registry
from echo_rl.environments.base import (Segment, StepOutcome, TextEnvironment, env_output, make_config,
                                       warning)
from echo_rl.environments.reply_format import TaskFormat

ACTION_WORDS = ("turn left", "turn right", "move forward", "pick up", "drop", "toggle", "done")
_ALIASES = {"left": 0, "right": 1, "forward": 2, "move forward": 2, "go forward": 2, "pickup": 3, "pick up": 3,
            "drop": 4, "toggle": 5, "open": 5, "done": 6}
DIRECTIONS = ("east", "south", "west", "north")

# task_type -> (allowed grid sizes, env id pattern); the first size is the default.
TASKS: dict[str, tuple[tuple[int, ...], str]] = {
    "key_door": ((5, 6, 8, 16), "MiniGrid-DoorKey-{n}x{n}-v0"),
    "empty": ((5, 6, 8, 16), "MiniGrid-Empty-{n}x{n}-v0"),
    "lava_gap": ((5, 6, 7), "MiniGrid-LavaGapS{n}-v0"),
    "four_rooms": ((19,), "MiniGrid-FourRooms-v0"),
    "unlock": ((6,), "MiniGrid-Unlock-v0"),
}


@dataclass
class MiniGridConfig(ConfigBase):
    """Which MiniGrid task; ``task_type`` + ``grid_size`` name an env id (key_door + 8 -> DoorKey-8x8)."""

    task_type: str = spec("key_door", help="key_door, empty, lava_gap, four_rooms or unlock",
                          choices=tuple(TASKS))
    grid_size: int | None = spec(None, help="side of the grid incl. walls (key_door/empty: 5,6,8,16; lava_gap: "
                                 "5,6,7; four_rooms: 19; unlock: 6); None: the smallest")
    env_id: str | None = spec(None, help="a MiniGrid/BabyAI gymnasium id; overrides task_type and grid_size")
    max_steps: int | None = spec(None, help="actions before truncation (None: the MiniGrid env's own limit)")

    def validate(self) -> None:
        if self.max_steps is not None and self.max_steps < 1:
            self._fail("max_steps", self.max_steps, "must be None or >= 1")
        if self.env_id is None and self.grid_size is not None:
            sizes = TASKS[self.task_type][0]
            if self.grid_size not in sizes:
                self._fail("grid_size", self.grid_size,
                           f"{self.task_type} allows {', '.join(map(str, sizes))}")

    def resolved_env_id(self) -> str:
        if self.env_id is not None:
            return self.env_id
        sizes, pattern = TASKS[self.task_type]
        return pattern.format(n=self.grid_size or sizes[0])


def parse_action(text: str) -> int | None:
    t = " ".join(text.strip().lower().replace("_", " ").split()).rstrip(".")
    if t in ACTION_WORDS:
        return ACTION_WORDS.index(t)
    return _ALIASES.get(t)


def _steps(n: int, word: str) -> str:
    return f"{n} step{'s' if n != 1 else ''} {word}"


def describe(obs: dict, carrying: Any = None) -> str:
    """Sentences for the egocentric view: what is where, relative to the agent."""
    from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT

    image = obs["image"]
    view = image.shape[0]
    ax, ay = view // 2, view - 1
    seen = []
    for y in range(view):
        for x in range(view):
            obj = IDX_TO_OBJECT[int(image[x, y, 0])]
            if obj in ("unseen", "empty", "wall", "floor", "agent"):
                continue
            colour = IDX_TO_COLOR[int(image[x, y, 1])]
            name = f"{colour} {obj}" if obj not in ("lava",) else obj
            if obj == "door":
                name = f"{('open', 'closed', 'locked')[int(image[x, y, 2])]} {colour} door"
            if obj == "goal":
                name = "goal"
            fwd, side = ay - y, x - ax
            parts = []
            if fwd:
                parts.append(_steps(fwd, "forward"))
            if side:
                parts.append(_steps(abs(side), "right" if side > 0 else "left"))
            where = " and ".join(parts) if parts else "here"
            seen.append((fwd + abs(side), f"a {name} {where}"))
    seen.sort()
    front = IDX_TO_OBJECT[int(image[ax, ay - 1, 0])]
    lines = [f"Mission: {obs['mission']}",
             f"You face {DIRECTIONS[int(obs['direction'])]}."
             + (f" You see {'; '.join(s for _, s in seen)}." if seen else " You see nothing of note."),
             f"In front of you: {'nothing' if front in ('empty', 'floor') else front}. "
             f"You carry {'a ' + carrying.color + ' ' + carrying.type if carrying else 'nothing'}.",
             f"Actions: {', '.join(ACTION_WORDS)}."]
    return "\n".join(lines)


class MiniGridEnvironment(TextEnvironment):
    """A MiniGrid/BabyAI env with text observations and word actions (ints accepted too)."""

    supports_snapshot = True
    has_expert = True

    def __init__(self, config: MiniGridConfig | None = None, render_mode: str | None = None, **overrides: Any):
        config = make_config(MiniGridConfig, config, overrides)
        import minigrid  # noqa: F401  (registers the ids)

        env_id = config.resolved_env_id()
        if env_id not in gym.registry or not env_id.startswith(("MiniGrid-", "BabyAI-")):
            raise ConfigError(f"MiniGridConfig.env_id={env_id!r} is invalid: not a registered MiniGrid/BabyAI id")
        self.env_id = env_id
        self.env = gym.make(env_id).unwrapped
        self._own_max = config.max_steps
        super().__init__(config, render_mode)
        self._obs: dict = {}
        self._bot = None

    # TextEnvironment reads config.max_steps; None means the MiniGrid limit.
    @property
    def max_steps(self) -> int:  # type: ignore[override]
        return self._own_max or int(self.env.max_steps)

    @max_steps.setter
    def max_steps(self, value: Any) -> None:
        pass

    def _num_tasks(self) -> int:
        return 2**31 - 1  # each seed is a different layout

    def _task_id(self) -> str:
        return f"{self.env_id}#{self._task_index}"

    def _reset_task(self, index: int, options: dict) -> list[Segment]:
        self._obs, _ = self.env.reset(seed=index)
        self._bot = None
        return env_output(describe(self._obs, self.env.carrying))

    def _admissible_actions(self) -> list[str]:
        return list(ACTION_WORDS)

    def _step(self, action: str) -> StepOutcome:
        idx = parse_action(action)
        if idx is None:
            return StepOutcome(warning(f"Unknown action {action[:80]!r}; use one of: {', '.join(ACTION_WORDS)}."))
        return self._do(idx)

    def _non_text_action(self, action: Any) -> StepOutcome:
        if isinstance(action, (int, np.integer)) and 0 <= int(action) < len(ACTION_WORDS):
            return self._do(int(action))
        return StepOutcome(warning(f"Unknown action {action!r}; use a word or an int 0-6."))

    def _do(self, idx: int) -> StepOutcome:
        self._obs, reward, terminated, truncated, _ = self.env.step(idx)
        won = bool(terminated and reward > 0)
        text = describe(self._obs, self.env.carrying)
        return StepOutcome(env_output(text), float(reward), bool(terminated), won, truncated=bool(truncated))

    def _state_key(self) -> str:
        """Agent pose, what it carries and a digest of the full grid (doors, keys, balls where they are now):
        the egocentric text alone is the same from many cells."""
        env = self.env
        carrying = env.carrying
        held = f"{carrying.color} {carrying.type}" if carrying is not None else "nothing"
        grid = hashlib.blake2b(env.grid.encode().tobytes(), digest_size=8).hexdigest()
        return f"pos={int(env.agent_pos[0])},{int(env.agent_pos[1])} dir={int(env.agent_dir)} carry={held} grid={grid}"

    def _info(self, segments: list[Segment]) -> dict:
        info = super()._info(segments)
        info["vector_obs"] = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in self._obs.items()}
        return info

    # -- expert -----------------------------------------------------------------
    def expert_action(self) -> str:
        """The planner's next action word for the current state."""
        if self.env_id.startswith("BabyAI-"):
            from minigrid.utils.baby_ai_bot import BabyAIBot

            if self._bot is None:
                self._bot = BabyAIBot(self.env)
            return ACTION_WORDS[int(self._bot.replan())]
        return ACTION_WORDS[plan_next_action(self.env)]

    def snapshot(self) -> Any:
        return self._base_state(), copy.deepcopy(self.env), copy.deepcopy(self._obs)

    def restore(self, snap: Any) -> None:
        base, env, obs = snap
        self._restore_base(dict(base))
        self.env = copy.deepcopy(env)
        self._obs = copy.deepcopy(obs)
        self._bot = None


# -- the planner ------------------------------------------------------------------

_DIR_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))


def _passable(env: Any, x: int, y: int) -> bool:
    cell = env.grid.get(x, y)
    if cell is None:
        return True
    if cell.type == "lava":
        return False
    if cell.type == "door":
        if cell.is_open or not cell.is_locked:
            return True
        carrying = env.carrying
        return carrying is not None and carrying.type == "key" and carrying.color == cell.color
    return cell.can_overlap()


def _bfs(env: Any, reach: tuple[int, int] | None = None, face: tuple[int, int] | None = None) -> int | None:
    """First action of a shortest left/right/forward path to stand on ``reach`` or face ``face``."""
    start = (int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir))

    def done(s: tuple[int, int, int]) -> bool:
        if reach is not None:
            return (s[0], s[1]) == reach
        dx, dy = _DIR_VEC[s[2]]
        return (s[0] + dx, s[1] + dy) == face

    if done(start):
        return -1
    first: dict = {start: None}
    q = deque([start])
    while q:
        s = q.popleft()
        x, y, d = s
        dx, dy = _DIR_VEC[d]
        nexts = [(0, (x, y, (d - 1) % 4)), (1, (x, y, (d + 1) % 4))]
        if _passable(env, x + dx, y + dy):
            nexts.append((2, (x + dx, y + dy, d)))
        for a, n in nexts:
            if n in first:
                continue
            first[n] = a if first[s] is None else first[s]
            if done(n):
                return first[n]
            q.append(n)
    return None


def _find(env: Any, kind: str, color: str | None = None) -> list[tuple[int, int]]:
    out = []
    for x in range(env.grid.width):
        for y in range(env.grid.height):
            c = env.grid.get(x, y)
            if c is not None and c.type == kind and (color is None or c.color == color):
                out.append((x, y))
    return out


def _act_towards(env: Any, action: int) -> int:
    """Turn a planned 'forward' into 'toggle' when a closed door is in the way."""
    if action == 2:
        front = env.grid.get(*env.front_pos)
        if front is not None and front.type == "door" and not front.is_open:
            return 5
    return action


def plan_next_action(env: Any) -> int:
    """Next action (index) for goal-reaching and door-opening MiniGrid tasks."""
    mission = env.mission.lower()
    wants_open = mission.startswith("open the") and not _find(env, "goal")
    targets = _find(env, "goal") if not wants_open else [p for p in _find(env, "door")]
    if not targets:
        raise NotImplementedError(f"the MiniGrid expert handles goal-reaching and Unlock tasks, not {mission!r}")
    for t in targets:
        if wants_open:
            door = env.grid.get(*t)
            if door.is_open or (door.is_locked and not _holds_key(env, door.color)):
                continue
            a = _bfs(env, face=t)
            if a == -1:
                if door.is_locked and not _holds_key(env, door.color):
                    break
                return 5
            if a is not None:
                return _act_towards(env, a)
        else:
            a = _bfs(env, reach=t)
            if a is not None and a != -1:
                return _act_towards(env, a)
    # blocked: fetch the key of a locked door
    for door_pos in _find(env, "door"):
        door = env.grid.get(*door_pos)
        if door.is_locked and not _holds_key(env, door.color):
            for key_pos in _find(env, "key", door.color):
                a = _bfs(env, face=key_pos)
                if a == -1:
                    return 3 if env.carrying is None else 4
                if a is not None:
                    return _act_towards(env, a)
    if wants_open:
        for t in targets:
            a = _bfs(env, face=t)
            if a == -1:
                return 5
            if a is not None:
                return _act_towards(env, a)
    raise NotImplementedError(f"the MiniGrid expert found no plan for {mission!r}")


def _holds_key(env: Any, color: str) -> bool:
    c = env.carrying
    return c is not None and c.type == "key" and c.color == color


try:  # the lead's vector adapter, re-exported when present
    from echo_rl.environments.minigrid_vector import make_minigrid_env  # noqa: F401
except ImportError:  # pragma: no cover
    pass

_MINIGRID = TaskFormat(
    instruction="Reply with exactly one action from the list after 'Actions:', written as listed, and nothing else.",
    example=("Mission: get to the green goal square\nYou face east. You see a green goal 1 step forward.\n"
             "In front of you: goal. You carry nothing.\n"
             "Actions: turn left, turn right, move forward, pick up, drop, toggle, done."),
    answer="move forward",
    thought="the goal is right in front of me, so I move forward onto it.",
    max_tokens=16)


registry.register_text_env(  # held out by seed: procedurally generated, no split
    "minigrid", lambda **kw: MiniGridEnvironment(MiniGridConfig(**kw)), reply_format=_MINIGRID,
    anchor_state="state_key",
    description="MiniGrid / BabyAI as text (minigrid:<EnvId>)", data="none: generated by the minigrid package")

__all__ = ["MiniGridConfig", "MiniGridEnvironment", "ACTION_WORDS", "describe", "parse_action",
           "plan_next_action"]
