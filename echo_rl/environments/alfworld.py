"""ALFWorld (Shridhar et al., ICLR 2021): the real TextWorld household games as a text environment.

Games are the ALFWorld 2.1.1 ``game.tw-pddl`` files (the version ReAct and
Reflexion report on), played by TextWorld's PDDL backend through alfworld's own
``AlfredDemangler`` / ``AlfredInfos`` wrappers; success is TextWorld's ``won``
(the PDDL goal holds), reward 1.0 once. Observations are as ReAct saw them
(welcome banner dropped, ``You arrive at loc N.`` stripped; ``react_format``).
``Nothing happens.`` (TextWorld's answer to any command that does not apply) is a
``warning`` segment. ``move X to Y`` (2.1.3 syntax) is accepted for the
matching admissible ``put X in/on Y`` (the literal 2.1.1 command text).

Expert: alfworld 0.4.2's hand-coded ``HandCodedTWAgent``, which was written for
2.1.3 games; it is shown the admissible commands in 2.1.3 form and its
``move X to Y`` answers are mapped back to 2.1.1's ``put``. It needs TextWorld
``facts`` each step (``expert=True``; a little slower).

Needs ``pip install 'echo-rl[alfworld]'`` (alfworld==0.4.2, textworld[pddl];
fast-downward-textworld builds from source with cmake + g++, ~5 min).
Data: ``<data_dir>/<split>.tar.xz`` or an extracted ``json_2.1.1/<split>/``;
archives are extracted once into ``cache_dir`` and checked against
``manifest_sha256.json`` when present.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echo_rl.config import ConfigBase, spec
from echo_rl.environments import registry
from echo_rl.environments.base import (ENV_OUTPUT, WARNING, Segment, StepOutcome, TextEnvironment,
                                       data_dir_spec, make_config, max_steps_spec, resolve_data_dir, warning)
from echo_rl.environments.reply_format import TaskFormat
from echo_rl.utils.optional import require

TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")
TASK_ALIASES = {"pick_and_place": "pick_and_place_simple", "look_at_obj": "look_at_obj_in_light",
                "pick_clean": "pick_clean_then_place_in_recep", "pick_heat": "pick_heat_then_place_in_recep",
                "pick_cool": "pick_cool_then_place_in_recep", "pick_two_obj": "pick_two_obj_and_place"}
SPLITS = ("valid_unseen", "valid_seen", "valid_train")
HOW_TO_GET = ("get the ALFWorld 2.1.1 games (json_2.1.1, alfworld release 0.2.2 assets json_2.1.1_json.zip + "
              "_pddl.zip, or ../shared/data/alfworld/<split>.tar.xz) into data_dir")
NOTHING = "Nothing happens."


@dataclass
class ALFWorldConfig(ConfigBase):
    """Which ALFWorld games and how they are shown.

    ``task_type`` selects one of the six ALFWorld task types (full name or the
    short alias, e.g. ``pick_and_place`` for ``pick_and_place_simple``) or
    ``all``. ``max_objects`` keeps games whose room holds at most this many
    objects of the goal's object type (the target and its look-alike
    distractors; 1-4 in valid_unseen), None keeps all.
    """

    split: str = spec("valid_unseen", help="valid_unseen (134, ReAct's split), valid_seen (140), valid_train (200)",
                      choices=SPLITS)
    task_type: str = spec("all", help="one of the six task types (or its short alias), or all",
                          choices=("all",) + TASK_TYPES + tuple(TASK_ALIASES))
    max_objects: int | None = spec(None, help="keep games with at most this many objects of the goal's type "
                                   "(None: all)")
    max_steps: int = max_steps_spec(50)
    react_format: bool = spec(True, help="observations as ReAct saw them (no banner, no 'You arrive at loc N.')")
    expert: bool = spec(True, help="run alfworld's hand-coded expert beside the game (needs TextWorld facts)")
    data_dir: str | None = data_dir_spec()
    cache_dir: str | None = spec(None, help="where archives are extracted (None: $XDG_CACHE_HOME/echo_rl or "
                                 "~/.cache/echo_rl)")

    def validate(self) -> None:
        if self.max_objects is not None and self.max_objects < 1:
            self._fail("max_objects", self.max_objects, "must be None or >= 1")

    @property
    def task_type_full(self) -> str:
        return TASK_ALIASES.get(self.task_type, self.task_type)


# -- data ---------------------------------------------------------------------------

def _cache_root(cache_dir: str | None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "echo_rl" / "alfworld"


def game_files(split: str, data_dir: str | None = None, cache_dir: str | None = None) -> list[Path]:
    """Sorted ``game.tw-pddl`` paths of a split (extracting ``<split>.tar.xz`` once if needed)."""
    root = resolve_data_dir(data_dir, "alfworld", "ECHO_RL_ALFWORLD_DIR", HOW_TO_GET)
    folder = root / "json_2.1.1" / split
    if not folder.is_dir():
        archive = root / f"{split}.tar.xz"
        if not archive.is_file():
            raise FileNotFoundError(f"ALFWorld split {split!r}: neither {folder} nor {archive} exists; {HOW_TO_GET}")
        target = _cache_root(cache_dir)
        folder = target / "json_2.1.1" / split
        stamp = target / f".{split}.sha256"
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if not folder.is_dir() or not stamp.is_file() or stamp.read_text() != digest:
            target.mkdir(parents=True, exist_ok=True)
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(target, filter="data")
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise ValueError(f"ALFWorld archive {archive} is unreadable ({exc}); {HOW_TO_GET}") from None
            _verify(root / "manifest_sha256.json", target, split)
            stamp.write_text(digest)
    files = sorted(folder.glob("*/*/game.tw-pddl"))
    if not files:
        raise FileNotFoundError(f"no ALFWorld games (*/*/game.tw-pddl) in {folder}; {HOW_TO_GET}")
    return files


def _verify(manifest: Path, root: Path, split: str) -> None:
    if not manifest.is_file():
        return
    expected = json.loads(manifest.read_text())
    for rel, sha in expected.items():
        if f"/{split}/" not in rel:
            continue
        path = root / rel
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            raise ValueError(f"ALFWorld game {path} is missing or differs from {manifest}; {HOW_TO_GET}")


def game_meta(path: Path) -> dict:
    """task_type and the count of goal-type objects (for ``max_objects``) of one game."""
    traj = path.with_name("traj_data.json")
    try:
        meta = json.loads(traj.read_text())
        task_type, target = meta["task_type"], meta["pddl_params"]["object_target"]
        problem = json.loads(path.read_text())["pddl_problem"]
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"ALFWorld game {path} (or its traj_data.json) is malformed ({exc}); {HOW_TO_GET}") from None
    n = len(set(re.findall(rf"\b({re.escape(target)}_bar_\S+) - object", problem)))
    return {"task_type": task_type, "goal_objects": n, "target": target}


# -- 2.1.1 <-> 2.1.3 command forms -------------------------------------------------

_PUT = re.compile(r"^put (.+?) (?:in/on|in|on) (.+)$")
_MOVE = re.compile(r"^move (.+) to (.+)$")


def to_213(command: str) -> str:
    m = _PUT.match(command)
    return f"move {m.group(1)} to {m.group(2)}" if m else command


def from_213(command: str, admissible: list[str]) -> str:
    m = _MOVE.match(command)
    if not m:
        return command
    for c in admissible:
        p = _PUT.match(c)
        if p and (p.group(1), p.group(2)) == (m.group(1), m.group(2)):
            return c
    return command


def _react_obs(text: str, first: bool) -> str:
    if first:
        return "\n".join(text.split("\n\n")[1:]).strip() or text
    if text.startswith("You arrive at loc "):
        return text[text.find(". ") + 2:]
    return text


# -- environment ---------------------------------------------------------------------

class ALFWorldEnvironment(TextEnvironment):
    """One ALFWorld game per episode; ``won`` when the PDDL goal holds (reward 1.0)."""

    supports_snapshot = False  # restore() replays the episode's actions (a game load + steps, ~1-2 s)
    has_expert = True

    def __init__(self, config: ALFWorldConfig | None = None, render_mode: str | None = None, **overrides: Any):
        config = make_config(ALFWorldConfig, config, overrides)
        require("textworld", "alfworld", "textworld[pddl]")
        require("alfworld", "alfworld", "alfworld==0.4.2")
        super().__init__(config, render_mode)
        files = game_files(config.split, config.data_dir, config.cache_dir)
        self.games = []
        for f in files:
            meta = game_meta(f)
            if config.task_type != "all" and meta["task_type"] != config.task_type_full:
                continue
            if config.max_objects is not None and meta["goal_objects"] > config.max_objects:
                continue
            self.games.append((f, meta))
        self._tw = None
        self._loaded: int | None = None
        self._state: Any = None
        self._expert = None
        self._expert_next: str | None = None
        self._expert_rng = self._expert_rng0 = random.Random(0).getstate()
        self._history: list[str] = []

    def _num_tasks(self) -> int:
        return len(self.games)

    def _task_id(self) -> str:
        if not self.games:
            return ""
        path = self.games[self._task_index][0]
        return f"{path.parent.parent.name}/{path.parent.name}"

    @property
    def game_file(self) -> Path:
        return self.games[self._task_index][0]

    def _load(self, index: int) -> None:
        if self._loaded == index and self._tw is not None:
            return
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        self.close()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=self.config.expert,
                                   extras=["gamefile"])
        self._tw = textworld.start(str(self.games[index][0]), infos, wrappers=[AlfredDemangler(), AlfredInfos])
        self._loaded = index

    def _reset_task(self, index: int, options: dict) -> list[Segment]:
        return self._start(index, random.Random(int(self.np_random.integers(2**31))).getstate())

    def _start(self, index: int, expert_rng: Any) -> list[Segment]:
        self._load(index)
        self._state = self._tw.reset()
        self._history = []
        if self.config.expert:
            from alfworld.agents.expert import HandCodedTWAgent

            self._expert = HandCodedTWAgent(max_steps=200)
            self._expert.reset(str(self.game_file))
            self._expert.observe(self._state["feedback"])
            self._expert_next = "look"  # what alfworld's AlfredExpert plans first
        self._expert_rng0 = self._expert_rng = expert_rng
        text = self._state["feedback"]
        if self.config.react_format:
            text = _react_obs(text, first=True)
        return [Segment(ENV_OUTPUT, text)]

    def _admissible_actions(self) -> list[str]:
        return list(self._state["admissible_commands"]) if self._state is not None else []

    def _step(self, action: str) -> StepOutcome:
        command = " ".join(action.strip().split())
        admissible = self._admissible_actions()
        command = from_213(command, admissible)
        if command not in admissible and command.lower() in admissible:
            command = command.lower()
        if command not in admissible:
            # what TextWorld answers to any command that does not apply; skip the engine round trip
            return StepOutcome(warning(NOTHING))
        self._state, _, done = self._tw.step(command)
        self._history.append(command)
        won = bool(self._state["won"])
        self._update_expert(command)
        text = self._state["feedback"]
        if self.config.react_format:
            text = _react_obs(text, first=False)
        role = WARNING if text.strip() == NOTHING else ENV_OUTPUT
        return StepOutcome([Segment(role, text)], 1.0 if won else 0.0, won or bool(done and won), won)

    def _update_expert(self, command: str) -> None:
        if self._expert is None:
            return
        from alfworld.agents.expert import HandCodedAgentFailed, HandCodedAgentTimeout

        state = dict(self._state)
        admissible = list(self._state["admissible_commands"])
        state["admissible_commands"] = [to_213(c) for c in admissible]
        saved = random.getstate()
        random.setstate(self._expert_rng)  # the expert breaks ties with `random`; keep it seeded and ours
        try:
            nxt = self._expert.act(state, 0, state["won"], to_213(command))
            nxt = from_213(nxt, admissible)
            self._expert_next = nxt if nxt in admissible else "look"
        except (HandCodedAgentFailed, HandCodedAgentTimeout):
            self._expert_next = None
        finally:
            self._expert_rng = random.getstate()
            random.setstate(saved)

    def expert_action(self) -> str:
        """alfworld's hand-coded expert's next command (2.1.1 form)."""
        if not self.config.expert:
            raise RuntimeError("ALFWorldConfig.expert is False: the expert is not running for this env")
        if self._expert_next is None:
            raise RuntimeError(f"the hand-coded expert gave up on {self._task_id()}")
        return self._expert_next

    def snapshot(self) -> Any:
        """The episode so far (base state + actions); restoring replays it on a fresh reset."""
        return self._base_state(), list(self._history), self._expert_rng0

    def restore(self, snap: Any) -> None:
        base, history, expert_rng0 = snap
        self._start(base["_task_index"], expert_rng0)
        for command in history:
            self._state, _, _ = self._tw.step(command)
            self._history.append(command)
            self._update_expert(command)
        self._restore_base(dict(base))

    def close(self) -> None:
        if self._tw is not None:
            try:
                self._tw.close()
            except Exception:  # noqa: BLE001 - best effort on teardown
                pass
        self._tw = None
        self._loaded = None


def _factory(**kw: Any) -> ALFWorldEnvironment:
    return ALFWorldEnvironment(ALFWorldConfig(**kw))


_ALFWORLD = TaskFormat(  # the ReAct paper's two few-shot games stand in for the one-shot example
    instruction="Reply with one action written as in the examples (e.g. 'go to cabinet 1'), and nothing else.",
    example="", answer="", max_tokens=48)


registry.register_text_env(
    "alfworld", _factory, train_config={"split": "valid_train"}, eval_config={"split": "valid_unseen"},
    reply_format=_ALFWORLD, description="ALFWorld 2.1.1 household games (TextWorld PDDL)",
    data="game files: echo-rl env-data --download alfworld (or $ECHO_RL_ALFWORLD_DIR); needs the alfworld extra")

__all__ = ["ALFWorldConfig", "ALFWorldEnvironment", "TASK_TYPES", "game_files", "game_meta", "to_213",
           "from_213"]
