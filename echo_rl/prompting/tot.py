"""Tree of Thoughts (Yao et al., NeurIPS 2023) for sequential text tasks: BFS/beam over actions.

At each depth, every state in the beam asks the backbone to *propose* up to
``breadth`` candidate next actions (one call, one per line, as the paper's
propose prompt does); each candidate is then *valued* by the backbone
(``sure`` / ``likely`` / ``impossible``, mapped to 20 / 1 / 0.001 and summed
over ``value_samples`` as in the paper's Game-of-24 setup), and the best
``beam`` states survive. With ``lookahead`` the candidate is tried in a copy
of the environment first, so the value prompt sees the resulting observation
and a winning move is taken at once:

- ``snapshot``: the environment's own ``snapshot()``/``restore()`` (ALFWorld's replays the game);
- ``replay``: restore by ``reset(seed)`` and replaying the path (deterministic envs; slow on ALFWorld);
- ``none``: value the action text alone, beam 1 (every env);
- ``auto``: ``snapshot`` when the env supports it, else ``none``.

Lookahead steps are counted in ``EpisodeResult.env_steps``; ``steps`` counts
the committed path only.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from echo_rl.prompting.base import (EpisodeResult, TextAgent, achat, alfworld_examples, alfworld_kind, clean_alfworld,
                                 match_admissible, parse_reply)
from echo_rl.prompting.prompts import TaskFormat, is_thought, task_format
from echo_rl.prompting.react import turn_seed
from echo_rl.config import ConfigError
from echo_rl.models.backbone import Backbone, Usage

PROPOSE_MARK = "Propose the next actions."
VALUE_MARK = "Evaluate the candidate action."
SEPARATOR = "---"
VALUES = {"sure": 20.0, "likely": 1.0, "impossible": 0.001}
LOOKAHEAD = ("auto", "snapshot", "replay", "none")
def _has_snapshot(env: Any) -> bool:
    """The env implements snapshot()/restore() (cheap when ``supports_snapshot``, else e.g. by replay)."""
    from echo_rl.environments.base import TextEnvironment  # gymnasium: loaded on first use

    if getattr(env, "supports_snapshot", False):
        return True
    method = getattr(type(env), "snapshot", None)
    return method is not None and method is not getattr(TextEnvironment, "snapshot", None)


SYSTEM = ("You are an agent solving a task in a text environment. You either propose candidate actions or judge "
          "how promising a candidate is, exactly in the format asked.")


@dataclass
class Node:
    actions: list[str]
    history: list[tuple[str, str]]  # (action, observation) along the path
    obs: str
    info: dict
    value: float = 0.0
    snap: Any = None
    done: bool = False
    won: bool = False
    reward: float = 0.0
    trace: list[dict] = field(default_factory=list)
    parent: "Node | None" = None


class TreeOfThoughtsAgent(TextAgent):
    name = "tot"

    def __init__(self, backbone: Backbone, *, task: str | None = None, breadth: int = 3, beam: int = 1,
                 value_samples: int = 1, lookahead: str = "auto", few_shot: str | None = "auto",
                 max_tokens: int | None = None, temperature: float = 0.7, value_temperature: float = 0.0,
                 multiline: bool | None = None) -> None:
        """``max_tokens`` (default: the task format's budget per candidate, times ``breadth``) bounds a
        propose call; the task's format instruction and one-shot example join every prompt."""
        super().__init__(backbone, task=task)
        self.format = task_format(task)
        self.multiline = self.format.multiline if multiline is None else bool(multiline)
        for field_name, v in (("breadth", breadth), ("beam", beam), ("value_samples", value_samples)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{field_name}={v!r} is invalid: must be an integer >= 1")
        if lookahead not in LOOKAHEAD:
            raise ConfigError(f"lookahead={lookahead!r} is invalid: allowed: {', '.join(LOOKAHEAD)}")
        self.breadth, self.beam, self.value_samples, self.lookahead = breadth, beam, value_samples, lookahead
        self.few_shot = few_shot
        self.max_tokens = max_tokens or min(self.format.max_tokens * breadth, 192 if not self.multiline else 1024)
        self.temperature, self.value_temperature = temperature, value_temperature

    # -- prompts -------------------------------------------------------------------
    def _context(self, node: Node, first_obs: str, first_info: dict) -> str:
        parts = [self._fmt.system_prompt()]  # the task's instruction (+ the tool-call format of a tool-use task)
        if self.task == "alfworld" and self.few_shot == "auto":
            parts.append("Here are two examples of solved tasks.\n" +
                         alfworld_examples(alfworld_kind(first_info, first_obs), "act"))
        elif self.few_shot == "auto" and self._fmt.example:
            parts.append(self._fmt.example_text())
        elif self.few_shot not in (None, "auto", "none"):
            parts.append(f"Here are examples.\n{self.few_shot}")
        parts.append("Here is the task.\n" + first_obs)
        parts.extend(f"> {a}\n{o}" for a, o in node.history)
        return "\n".join(parts)

    async def _propose(self, context: str, node: Node) -> list[str]:
        admissible = node.info.get("admissible_actions")
        if self.multiline:
            ask = f"{context}\n\n{PROPOSE_MARK} Give up to {self.breadth} different candidate answers, best first, " \
                  f"each written exactly as the task asks, separated by a line containing only {SEPARATOR}."
        else:
            ask = f"{context}\n\n{PROPOSE_MARK} Give up to {self.breadth} different promising next actions, one " \
                  "per line, each written exactly as the task asks, best first."
        if admissible:
            ask += "\nValid actions: " + "; ".join(admissible)
        self._calls += 1
        reply = await achat(self.backbone, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}],
                            max_tokens=self.max_tokens, temperature=self.temperature,
                            stop=() if self.multiline else ("\n\n",), seed=turn_seed(self._seed, self._calls))
        self.episode_usage = self.episode_usage + reply.usage
        out: list[str] = []
        pieces = re.split(rf"(?m)^\s*{SEPARATOR}\s*$", reply.text) if self.multiline else reply.text.splitlines()
        for line in pieces:
            action = self._fmt.action(line) if self._fmt.tools else parse_reply(line, self.multiline)
            if not action or is_thought(action):
                continue
            if admissible:
                action = match_admissible(action, admissible) or action
            if action not in out:
                out.append(action)
        if admissible and any(a in admissible for a in out):  # drop invalid ones when valid ones exist
            out = [a for a in out if a in admissible]
        return out[: self.breadth]

    async def _value(self, context: str, action: str, result: str | None) -> float:
        ask = f"{context}\n\n{VALUE_MARK}\nCandidate next action: {action}\n"
        if result is not None:
            ask += f"Resulting observation: {result}\n"
        ask += "How likely is it that this action leads to completing the task? Answer with one word: sure, " \
               "likely or impossible."
        total = 0.0
        for _ in range(self.value_samples):
            self._calls += 1
            reply = await achat(self.backbone, [{"role": "system", "content": SYSTEM},
                                                {"role": "user", "content": ask}],
                                max_tokens=8, temperature=self.value_temperature,
                                seed=turn_seed(self._seed, self._calls))
            self.episode_usage = self.episode_usage + reply.usage
            m = re.search(r"\b(sure|likely|impossible)\b", reply.text.lower())
            total += VALUES[m.group(1)] if m else 0.0
        return total

    # -- environment copies ------------------------------------------------------------
    def _mode(self, env: Any) -> str:
        if self.lookahead == "auto":
            mode = "snapshot" if getattr(env, "supports_snapshot", False) else "none"
        else:
            mode = self.lookahead
        if mode == "snapshot" and not _has_snapshot(env):
            raise ConfigError(f"lookahead='snapshot' is invalid for {type(env).__name__}: it has no snapshot/restore; "
                              "allowed here: replay, none")
        if mode == "none" and self.beam > 1:
            raise ConfigError(f"beam={self.beam} needs lookahead (snapshot or replay) to keep several env states")
        return mode

    def _restore(self, env: Any, mode: str, node: Node, seed: int, options: dict | None) -> None:
        if mode == "snapshot":
            env.restore(node.snap)
        elif mode == "replay":
            env.reset(seed=seed, options=options)
            for a in node.actions:
                env.step(a)
        self._env_steps += len(node.actions) if mode == "replay" else 0

    # -- episode ---------------------------------------------------------------------------
    async def arun_episode(self, env: Any, *, seed: int, max_steps: int | None = None,
                           options: dict | None = None) -> EpisodeResult:
        start, before = time.perf_counter(), None
        mode = self._mode(env)
        self._env_steps, self._calls, self._seed, self.episode_usage = 0, 0, seed, Usage()
        self._fmt: TaskFormat = task_format(self.task, env)
        obs, info = env.reset(seed=seed, options=options)
        first_obs = clean_alfworld(obs) if self.task == "alfworld" else obs
        depth_limit = max_steps or getattr(env, "max_steps", None) or 50
        root = Node([], [], first_obs, info, snap=env.snapshot() if mode == "snapshot" else None,
                    won=bool(info.get("won")), trace=[{"role": "env", "text": first_obs}])
        frontier, best = [root], root
        for _ in range(depth_limit):
            children: list[Node] = []
            for node in frontier:
                if len(frontier) > 1 or mode != "none":
                    self._restore(env, mode, node, seed, options)
                context = self._context(node, first_obs, info)
                for action in await self._propose(context, node) or ["look"]:
                    child = self._expand(env, mode, node, action, seed, options)
                    if child.won:
                        best = child
                        return self._result(env, mode, best, seed, options, start, before)
                    child.value = await self._value(context, action, child.obs if mode != "none" else None)
                    children.append(child)
                    if mode != "none":
                        self._restore(env, mode, node, seed, options)
            if not children:
                break
            children.sort(key=lambda c: -c.value)  # stable: ties keep proposal order
            frontier = [c for c in children if not c.done][: self.beam] or children[:1]
            best = frontier[0]
            if mode == "none":  # commit the chosen action in the one real environment
                best = self._expand(env, "commit", best.parent, best.actions[-1], seed, options)
                frontier = [best]
            if all(c.done for c in frontier):
                break
        return self._result(env, mode, best, seed, options, start, before)

    def _expand(self, env: Any, mode: str, node: Node, action: str, seed: int, options: dict | None) -> Node:
        if mode == "none":  # no simulation: the child is a hypothesis until it is committed
            return Node(node.actions + [action], node.history, node.obs, node.info, trace=node.trace,
                        reward=node.reward, parent=node)
        obs, r, terminated, truncated, info = env.step(action)
        self._env_steps += 1
        obs = clean_alfworld(obs) if self.task == "alfworld" else obs
        child = Node(node.actions + [action], node.history + [(action, obs)], obs, info,
                     snap=env.snapshot() if mode == "snapshot" else None, done=bool(terminated or truncated),
                     won=bool(info.get("won")), reward=node.reward + float(r),
                     trace=node.trace + [{"role": "agent", "text": action}, {"role": "env", "text": obs}])
        return child

    def _result(self, env: Any, mode: str, best: Node, seed: int, options: dict | None, start: float,
                before: Any) -> EpisodeResult:
        if mode in ("snapshot", "replay"):
            self._restore(env, mode, best, seed, options)  # leave the env in the chosen state
        usage = self.episode_usage
        return EpisodeResult(str(best.info.get("task_id", "")), seed, best.won, best.reward, len(best.actions),
                             usage.requests, usage, best.trace, env_steps=self._env_steps,
                             seconds=time.perf_counter() - start)

