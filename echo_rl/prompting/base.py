"""What every prompting agent shares: episode results, action parsing, ALFWorld's few-shot prompts."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from echo_rl.config import ConfigError
from echo_rl.environments.registry import task_spec
from echo_rl.prompting.prompts import extract_reply, is_thought  # noqa: F401 - re-exported
from echo_rl.models.backbone import Backbone, Completion, Usage
from echo_rl.models.scripted import ScriptedBackbone
from echo_rl.utils.paths import data_root


@dataclass
class EpisodeResult:
    task_id: str
    seed: int
    success: bool
    reward: float
    steps: int  # environment actions taken on the committed path
    turns: int  # backbone calls
    usage: Usage
    trajectory: list[dict] = field(default_factory=list)  # [{"role": "agent"|"env", "text": ...}]
    env_steps: int = 0  # all environment steps, lookahead included
    error: str | None = None
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "seed": self.seed, "success": self.success, "reward": self.reward,
                "steps": self.steps, "turns": self.turns, "env_steps": self.env_steps, "error": self.error,
                "seconds": round(self.seconds, 3), **{f"usage_{k}": v for k, v in self.usage.to_dict().items()}}


class TextAgent:
    """Base of the prompting baselines: one backbone, episodes over any text environment."""

    name = "agent"

    def __init__(self, backbone: Backbone, *, task: str | None = None) -> None:
        if not isinstance(backbone, Backbone):
            raise ConfigError(f"backbone must be an echo_rl.models.Backbone, got {type(backbone).__name__}")
        self.backbone = backbone
        self.task = task
        self.episode_usage = Usage()  # tokens of the current (or last) episode, kept when it fails midway

    def run_episode(self, env: Any, *, seed: int, max_steps: int | None = None,
                    options: dict | None = None) -> EpisodeResult:
        """One episode, from synchronous code."""
        return run_sync(self.arun_episode(env, seed=seed, max_steps=max_steps, options=options))

    async def arun_episode(self, env: Any, *, seed: int, max_steps: int | None = None,
                           options: dict | None = None) -> EpisodeResult:
        """One episode as a coroutine: many run at once on one event loop (``runner.run_episodes``)."""
        raise NotImplementedError


def parse_action(text: str) -> str:
    """The first non-empty line of a reply, without its wrapping (``>``, numbering, ``Action:``, a fence)."""
    return extract_reply(text, False)


def is_multiline_task(task: str) -> bool:
    """Whether a text task's actions span several lines (ARC's grids): its ``TaskSpec.multiline``."""
    return task_spec(task).multiline


def parse_reply(text: str, multiline: bool) -> str:
    """The action (or thought) in a reply: its first line, or for multi-line tasks the whole answer."""
    return extract_reply(text, multiline)


async def achat(backbone: Backbone, messages: list[dict], **sampling: Any) -> Completion:
    """One backbone call from an episode coroutine: the engine's ``achat`` when the backbone has one,
    else its blocking ``chat`` in a worker thread, so concurrent episodes never wait on each other."""
    if hasattr(backbone, "achat"):
        return await backbone.achat(messages, **sampling)

    if isinstance(backbone, ScriptedBackbone):  # replies computed in Python: no thread needed
        return backbone.chat(messages, **sampling)
    return await asyncio.to_thread(backbone.chat, messages, **sampling)


def run_sync(coro: Any) -> Any:
    """Run an episode coroutine from synchronous code (each call its own event loop)."""
    return asyncio.run(coro)


def match_admissible(action: str, admissible: list[str] | None) -> str | None:
    """The admissible command ``action`` names (case and spacing ignored), else None."""
    if not admissible:
        return None
    norm = " ".join(action.lower().split())
    for a in admissible:
        if " ".join(a.lower().split()) == norm:
            return a
    return None


# -- ALFWorld (ReAct protocol) ------------------------------------------------------

ALFWORLD_PREFIXES = {  # task-type prefix -> key in alfworld_3prompts.json (upstream ReAct notebook)
    "pick_and_place": "put", "pick_clean_then_place": "clean", "pick_heat_then_place": "heat",
    "pick_cool_then_place": "cool", "look_at_obj": "examine", "pick_two_obj": "puttwo",
}
_ARRIVE = re.compile(r"^You arrive at loc \d+\. ")


def clean_alfworld(obs: str) -> str:
    """Observation as ReAct saw it: no welcome banner, no ``You arrive at loc N.`` prefix."""
    if obs.startswith("-= Welcome to TextWorld"):
        obs = "\n".join(obs.split("\n\n")[1:])
    return _ARRIVE.sub("", obs.strip())


def alfworld_kind(info: dict, observation: str) -> str:
    """The prompt family (put, clean, heat, cool, examine, puttwo) of an ALFWorld game."""
    for key in ("task_type", "game_type", "task_id"):
        value = str(info.get(key) or "")
        for prefix, kind in ALFWORLD_PREFIXES.items():
            if value.startswith(prefix) or value == kind:
                return kind
    goal = observation.split("Your task is to:")[-1].lower()
    if "put two" in goal or "find two" in goal:
        return "puttwo"
    if "clean" in goal:
        return "clean"
    if "hot" in goal or "heat" in goal:
        return "heat"
    if "cool" in goal:
        return "cool"
    if "look at" in goal or "examine" in goal:
        return "examine"
    return "put"


@lru_cache(maxsize=4)
def _alfworld_prompts(path: str) -> dict:
    return json.loads(open(path).read())


def alfworld_examples(kind: str, mode: str = "react") -> str:
    """The two published few-shot examples for an ALFWorld task family (ReAct's choice: _1 then _0)."""
    path = data_root() / "alfworld" / "react" / "alfworld_3prompts.json"
    if not path.is_file():
        raise FileNotFoundError(f"ReAct ALFWorld prompts not found at {path}: copy alfworld_3prompts.json from "
                                "https://github.com/ysymyth/ReAct (prompts/) there, or set ECHO_RL_DATA_DIR")
    prompts = _alfworld_prompts(str(path))
    return prompts[f"{mode}_{kind}_1"] + prompts[f"{mode}_{kind}_0"]
