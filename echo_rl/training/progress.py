"""Live progress: env steps against the budget, return, success rate, steps/s, wall time.

A rich progress bar on a terminal; plain lines (about every 10%) otherwise, so
CI logs and pipes stay readable. Steps/s is the run's average over wall time
since training began (warm start and evaluations included), so the figure is
the one a user can multiply by; an iteration's own rate is in
``timings.jsonl`` (``time/sps``). The total is the budget asked for: a run
that ends a few steps past it (whole updates) shows, e.g., ``66/64``.
Evaluations get a line of their own: success and, for language-model agents,
the held-out env-output CE, so learning is visible without opening files.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@dataclass
class WallClock:
    """Where a run's wall time went (seconds): setup (building the agent, loading a model), start (the agent's
    warm start, e.g. SFT, and engine start), evaluation, iterations (acting + learning), total."""

    setup: float = 0.0
    start: float = 0.0
    evaluation: float = 0.0
    iterations: float = 0.0
    total: float = 0.0

    def summary(self, steps: int) -> dict[str, Any]:
        """``summary.json`` entries: the breakdown, and steps/s over the whole run and over iterations alone."""
        return {"time_s": {k: round(v, 3) for k, v in (("setup", self.setup), ("start", self.start),
                                                        ("evaluation", self.evaluation),
                                                        ("iterations", self.iterations), ("total", self.total))},
                "env_steps_per_s": round(steps / self.total, 3) if self.total > 0 else 0.0,
                "iteration_env_steps_per_s": round(steps / self.iterations, 3) if self.iterations > 0 else 0.0}


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_eval(step: int, result: dict) -> str:
    """One line per evaluation: ``[eval] step 64: success 0.38 (8 episodes) | held-out env CE 2.104``."""
    parts = [f"success {result['success_rate']:.2f}" + (f" ({int(result['episodes'])} episodes)"
                                                         if "episodes" in result else "")]
    if "avg_reward" in result:
        parts.append(f"return {result['avg_reward']:.3f}")
    if "valid_action_rate" in result:
        parts.append(f"valid actions {result['valid_action_rate']:.0%}")
    if "heldout_env_ce" in result:
        parts.append(f"held-out env CE {result['heldout_env_ce']:.3f}")
    if result.get("failed"):
        parts.append(f"{int(result['failed'])} failed")
    return f"[eval] step {step:,}: " + " | ".join(parts)


class TrainingProgress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True):
        self.total, self.start, self.enabled = total, start, enabled
        self.console = Console(stderr=True)
        self.live = enabled and self.console.is_terminal
        self._progress = None
        self._task = None
        self._next_line = start
        self._return = self._success = None

    def __enter__(self) -> "TrainingProgress":
        if self.live:
            self._progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.description}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                      console=self.console)
            self._progress.__enter__()
            self._task = self._progress.add_task("", total=self.total, completed=self.start)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def line(self, step: int, row: dict, sps: float, elapsed: float) -> str:
        """The plain progress line; ``sps``: average env steps/s since training began."""
        self._return = row.get("episode/return", self._return)
        self._success = row.get("episode/success_rate", self._success)
        parts = [f"return {self._return:.3f}" if self._return is not None else "return -",
                 f"success {self._success:.2f}" if self._success is not None else "success -",
                 f"{sps:,.2f} steps/s avg" if sps < 100 else f"{sps:,.0f} steps/s avg",
                 f"{format_duration(elapsed)} elapsed"]
        return f"[train] {step:,}/{self.total:,} steps | " + " | ".join(parts)

    def update(self, step: int, row: dict, sps: float, elapsed: float) -> None:
        if not self.enabled:
            return
        text = self.line(step, row, sps, elapsed)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, description=text.split(" steps | ", 1)[1])
        elif step >= self._next_line or step >= self.total:
            print(text, file=sys.stderr, flush=True)
            self._next_line = step + max(self.total // 10, 1)

    def evaluation(self, step: int, result: dict) -> None:
        if not self.enabled or not result:
            return
        text = format_eval(step, result)
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)  # "[eval]" is no rich tag
        else:
            print(text, file=sys.stderr, flush=True)
