"""Live progress: what a run is doing, env steps against the budget, return, success rate, steps/s, wall time.

A rich progress bar on a terminal; plain lines (about every 10%) otherwise, so
CI logs and pipes stay readable. Steps/s is the run's average over wall time
since training began (warm start and evaluations included), so the figure is
the one a user can multiply by; an iteration's own rate is in
``timings.jsonl`` (``time/sps``). The total is the budget asked for: a run
that ends a few steps past it (whole updates) shows, e.g., ``66/64``.
Evaluations get a line of their own: success and, for language-model agents,
the held-out env-output CE, so learning is visible without opening files.

Work that takes minutes before the first iteration says so as it goes, so a
run is never silent: :func:`working` while setup builds the agent and loads its
model (a spinner on a terminal), :meth:`TrainingProgress.note` for a stage (the
agent built, a cached warm start loaded), :meth:`TrainingProgress.count` for
k/n of a long piece (SFT steps with their loss, evaluation episodes) with the
time left. Agents
whose iterations are slow (``line_per_iteration``: a language-model update)
get a line per iteration. Every plain line also goes, time-stamped, to the
run's ``progress.log`` (:meth:`open_log`), also under ``--no-progress`` and
while a terminal shows the bar, so ``tail -f`` follows a run started elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from echo_rl.utils.monitoring import LineLogger


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


@contextlib.contextmanager
def working(text: str, enabled: bool = True, console: Console | None = None) -> Iterator[None]:
    """A transient spinner with ``text`` while the block runs, on a terminal only: setup (building the agent,
    loading a model) says what it is doing at once, and leaves no line behind, so an error in it is still the
    one line on stderr."""
    console = console or Console(stderr=True)
    if not (enabled and console.is_terminal):
        yield
        return
    with console.status(Text(text)):  # a Text: "[setup]" is no rich markup tag
        yield


def _due(done: int, total: int, last: int) -> bool:
    """A plain line at the first item, about every tenth of ``total`` after the last line, and the end."""
    return done == 1 or done >= total or done >= last + max(total // 10, 1)


def _fields(values: dict[str, float]) -> list[str]:
    return [f"{name.replace('_', ' ')} {value:.3f}" for name, value in values.items()]


class Count:
    """k/n of one long piece of work (SFT steps, evaluation episodes), as lines at the start, about every tenth
    and the end, each with the elapsed time and, until the end, the time left at the rate so far."""

    def __init__(self, emit: Callable[[str], None], prefix: str, total: int, noun: str, detail: str = ""):
        self.emit, self.prefix, self.total, self.noun = emit, prefix, int(total), noun
        self.done = self._last = 0
        self._t0 = time.perf_counter()
        emit(f"{prefix} 0/{self.total:,} {noun}" + (f" ({detail})" if detail else ""))

    def advance(self, n: int = 1, **values: float) -> None:
        """``n`` more done; ``values`` (e.g. ``loss=``) are shown on this item's line."""
        self.done += n
        if not _due(self.done, self.total, self._last):
            return
        self._last = self.done
        elapsed = time.perf_counter() - self._t0
        parts = [f"{self.prefix} {self.done:,}/{self.total:,} {self.noun}", *_fields(values),
                 f"{format_duration(elapsed)} elapsed"]
        if 0 < self.done < self.total:
            parts.append(f"~{format_duration(elapsed / self.done * (self.total - self.done))} left")
        self.emit(" | ".join(parts))


class TrainingProgress:
    """A run's progress on the terminal (``enabled``) and in its log file (:meth:`open_log`).

    ``line_per_iteration``: a plain line after every iteration, also under the terminal's bar (agents whose
    iteration is one slow update). ``iteration_budget``: the iterations the run ends after (0: the env-step
    budget ends it); with it, the per-iteration line counts updates and estimates the time left from them.
    """

    def __init__(self, total: int, start: int = 0, enabled: bool = True, line_per_iteration: bool = False,
                 iteration_budget: int = 0):
        self.total, self.start, self.enabled = total, start, enabled
        self.line_per_iteration, self.iteration_budget = line_per_iteration, iteration_budget
        self.console = Console(stderr=True)
        self.live = enabled and self.console.is_terminal
        self._progress = None
        self._task = None
        self._next_line = start
        self._return = self._success = None
        self._log: LineLogger | None = None
        self._iter0: tuple[float, int] | None = None  # (time, updates) at the first iteration: the ETA's base

    def open_log(self, path: str | os.PathLike) -> None:
        """Append every plain line to ``path`` from now on."""
        self._log = LineLogger(path).open()

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def note(self, text: str) -> None:
        """One line on the terminal (when enabled) and in the log."""
        if self._log is not None:
            self._log.write(text)
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)  # "[eval]" is no rich tag
        else:
            print(text, file=sys.stderr, flush=True)

    def count(self, prefix: str, total: int, noun: str, detail: str = "") -> Count:
        """A :class:`Count` whose lines go where :meth:`note`'s go."""
        return Count(self.note, prefix, total, noun, detail)

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

    def iteration_line(self, step: int, row: dict, sps: float, elapsed: float) -> str:
        """The per-iteration line: ``[train] update 3/12 | 24/100,000 steps | ... | loss 0.412 | ~1:10 left``."""
        updates = int(row.get("train/updates", 0))
        now = time.perf_counter()
        if self._iter0 is None:  # the first iteration's end: the rate counts from the second on
            self._iter0 = (now, updates)
        head = f"[train] update {updates:,}" + (f"/{self.iteration_budget:,}" if self.iteration_budget else "")
        text = head + " | " + self.line(step, row, sps, elapsed)[len("[train] "):]
        loss = row.get("lm/loss")
        if loss is not None:
            text += f" | loss {loss:.3f}"
        t0, u0 = self._iter0
        if self.iteration_budget and updates > u0 and updates < self.iteration_budget:
            text += f" | ~{format_duration((now - t0) / (updates - u0) * (self.iteration_budget - updates))} left"
        return text

    def update(self, step: int, row: dict, sps: float, elapsed: float) -> None:
        due = self.line_per_iteration or step >= self._next_line or step >= self.total
        if due:
            self._next_line = step + max(self.total // 10, 1)
        if self.line_per_iteration:
            text = self.iteration_line(step, row, sps, elapsed)
        else:
            text = self.line(step, row, sps, elapsed)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, description=text.split(" steps | ", 1)[1])
        if not due:
            return
        if self._progress is not None and not self.line_per_iteration:
            if self._log is not None:
                self._log.write(text)  # the bar shows it on the terminal
        else:
            self.note(text)

    def evaluation(self, step: int, result: dict) -> None:
        if result:
            self.note(format_eval(step, result))


SILENT = TrainingProgress(0, enabled=False)  # an agent's reporter outside a trainer (e.g. ``echo-rl eval``)
