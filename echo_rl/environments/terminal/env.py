"""The ``terminal`` task family: an agent works in a sandboxed shell, a verifier scores the result.

An episode: ``reset`` builds a fresh private work directory with the task's
setup script and starts one sandboxed bash (:mod:`.shell`); the observation is
the task's ``instruction.md``. Each action is one tool call in the text format
of :mod:`echo_rl.environments.tool_calls` (``<bash>CMD</bash>`` or
``<submit>ANSWER</submit>``): a command's output is an ``env_output`` segment;
a reply that is not a tool call is a ``warning`` segment carrying the parser's
message. ``submit`` ends the episode; so do the task's ``max_turns`` and its
``[agent] timeout_sec`` of command time, where the episode is truncated. Either
way the shell and everything it started are killed and the verifier runs over
a copy of the final work directory (:mod:`.verify`); its reward is the
episode's reward, given on the last step (``won``: reward >= 1).

Tasks come from the procedural generator (:mod:`.generator`, the default) or
from Harbor-layout task directories (``task_dir``). ``expert_action()`` replays
the task's oracle (``solution.sh``'s commands in order, then ``submit``), the
demonstrator for SFT.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echo_rl.config import ConfigBase, ConfigError, spec
from echo_rl.environments import registry
from echo_rl.environments.base import StepOutcome, TextEnvironment, env_output, make_config, max_steps_spec, warning
from echo_rl.environments.reply_format import tool_format
from echo_rl.environments.terminal.shell import ShellSession, episode_uid, run_script
from echo_rl.environments.terminal.task import TaskError, TerminalTask, load_tasks, split_commands, with_limits
from echo_rl.environments.terminal.verify import Verdict, run_verifier
from echo_rl.environments.tool_calls import (TERMINAL_TOOLS, ToolCall, ToolCallError, format_instruction, parse_text,
                                             render_text)

NO_OUTPUT = "(no output)"
SPLITS = ("train", "test", "all")


@dataclass
class TerminalConfig(ConfigBase):
    """Which terminal tasks, and the sandbox's limits (a task's task.toml sets its own)."""

    task_dir: str | None = spec(None, help="a Harbor-layout task directory, or a folder of them (None: the "
                                "procedural generator's tasks)")
    split: str = spec("train", help="generated tasks: train, test (held-out instances and templates) or all",
                      choices=SPLITS)
    level: int = spec(0, help="generated tasks: only this level (1 one command, 2 look then act, 3 multi-step "
                      "file work); 0: all levels", min=0, max=3)
    instances_per_template: int = spec(200, help="generated tasks per template", min=5)
    max_steps: int = max_steps_spec(16)
    command_timeout: float | None = spec(None, help="wall-clock seconds per command (None: the task's, default 10)",
                                         gt=0)
    work_root: str | None = spec(None, help="folder for the episodes' private work directories (None: the system "
                                 "temp folder)")


class TerminalEnvironment(TextEnvironment):
    """Sandboxed shell episodes over :class:`TerminalTask` s."""

    has_expert = True
    tools = TERMINAL_TOOLS  # bash(command), submit(answer): OpenAI's tool shape via Tool.schema()

    def __init__(self, config: TerminalConfig | dict | None = None, render_mode: str | None = None,
                 tasks: list[TerminalTask] | None = None, **overrides: Any):
        config = make_config(TerminalConfig, config, overrides)
        super().__init__(config, render_mode)
        self.tasks = list(tasks) if tasks is not None else self._load_tasks(config)
        self._session: ShellSession | None = None
        self._episode_dir: Path | None = None
        self._uid = 0
        self._task: TerminalTask | None = None
        self._bash_steps = 0
        self._command_seconds = 0.0
        self._last_result_output = ""
        self._cwd = ""  # the shell's working directory after the last command (ShellResult.cwd)
        self._expert_cache: dict[int, list[str]] = {}
        self.last_verdict: Verdict | None = None
        self._finalizer = weakref.finalize(self, TerminalEnvironment._cleanup, [None, None])

    @staticmethod
    def _load_tasks(config: TerminalConfig) -> list[TerminalTask]:
        if config.task_dir:
            try:
                return load_tasks(Path(config.task_dir).expanduser())
            except TaskError as exc:
                raise ConfigError(str(exc)) from None
        from echo_rl.environments.terminal.generator import generate_tasks  # generated tasks only: built on use

        return generate_tasks(config.split, level=config.level, per_template=config.instances_per_template)

    # -- hooks ----------------------------------------------------------------
    def _num_tasks(self) -> int:
        return len(self.tasks)

    def _task_id(self) -> str:
        return self._task.name if self._task is not None else str(self._task_index)

    def _state_key(self) -> str:
        """The working directory and the last command's output: the instruction alone is the same text at every
        step, and one command's output can follow from different directories (GiGPO's anchor state)."""
        return f"cwd={self._cwd}\n{self._last_result_output}"

    def _task_group(self) -> str | None:
        level = self._task.metadata.get("level") if self._task is not None else None
        return None if level is None else f"level{level}"

    def _reset_task(self, index: int, options: dict) -> list:
        self._end_episode()
        task = self.tasks[index]
        if self.config.command_timeout:
            task = with_limits(task, command_timeout=self.config.command_timeout)
        self._task, self._bash_steps, self._command_seconds, self.last_verdict = task, 0, 0.0, None
        self._last_result_output = ""  # the last command's output, as the shell gave it (InterCode scores it)
        self._cwd = task.start_dir
        self.max_steps = min(self.config.max_steps, task.max_turns)
        root = self.config.work_root or tempfile.gettempdir()
        os.makedirs(root, exist_ok=True)
        self._episode_dir = Path(tempfile.mkdtemp(prefix="echo-terminal-", dir=root))  # 0700: no other host user
        work = self._episode_dir / "work"
        work.mkdir()
        self._uid = episode_uid()
        if os.geteuid() == 0:
            os.chown(work, self._uid, self._uid)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, TerminalEnvironment._cleanup, [None, self._episode_dir])
        self._setup(task, work)
        self._session = ShellSession(work, task.workdir, task.start_dir, limits=task.limits, env=dict(task.env),
                                     uid=self._uid).start()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, TerminalEnvironment._cleanup, [self._session, self._episode_dir])
        return env_output(task.instruction.rstrip("\n") + "\n")

    def _setup(self, task: TerminalTask, work: Path) -> None:
        if not task.setup.strip():
            return
        binds = [(str(work), task.workdir, True)]
        if task.context is not None:
            binds.append((str(task.context), "/setup/context", False))
        code, output = run_script(task.setup, self._uid, binds, task.start_dir, limits=task.limits,
                                  env=dict(task.env), timeout=max(60.0, task.limits.command_timeout))
        if code != 0:
            raise TaskError(f"task {task.name}: the setup script failed (exit {code}): {output[-500:]}")

    def _step(self, action: str) -> StepOutcome:
        try:
            call = parse_text(action, TERMINAL_TOOLS)
        except ToolCallError as exc:
            return self._maybe_last(StepOutcome(warning(f"{exc}.\n")))
        if call.name == "submit":
            return self._finish(call.arguments["answer"], StepOutcome(env_output("Submitted.\n"), terminated=True))
        command = call.arguments["command"]
        if "\0" in command:
            return self._maybe_last(StepOutcome(warning("A command cannot contain a NUL character.\n")))
        assert self._session is not None
        self._bash_steps += 1
        start = time.monotonic()
        result = self._session.run(command)
        self._command_seconds += time.monotonic() - start
        self._last_result_output, self._cwd = result.output, result.cwd
        text = result.output
        if result.exit_code not in (0, None):
            text += ("" if not text or text.endswith("\n") else "\n") + f"[exit code {result.exit_code}]"
        text = text or NO_OUTPUT
        outcome = StepOutcome(env_output(text if text.endswith("\n") else text + "\n"),
                              extra={"exit_code": result.exit_code})
        if self._command_seconds > self._task.agent_timeout:
            return self._finish(None, outcome._replace(truncated=True))
        return self._maybe_last(outcome)

    def _maybe_last(self, outcome: StepOutcome) -> StepOutcome:
        """The step that reaches max_steps ends the episode: the verifier scores what is there."""
        if self._steps + 1 >= self.max_steps:
            return self._finish(None, outcome)
        return outcome

    def _finish(self, answer: str | None, outcome: StepOutcome) -> StepOutcome:
        if self._session is not None:
            self._session.close()  # every process of the agent is gone before the verifier starts
        verdict = self._verify(answer)
        self.last_verdict = verdict
        extra = {**(outcome.extra or {}), "verifier": {"reward": verdict.reward, "detail": verdict.detail,
                                                       "dropped_links": verdict.dropped_links}}
        self._end_episode()
        return outcome._replace(reward=verdict.reward, won=verdict.reward >= 1.0, extra=extra)

    def _verify(self, answer: str | None) -> Verdict:
        assert self._episode_dir is not None and self._task is not None
        scratch = self._episode_dir / "verify"
        scratch.mkdir()
        return run_verifier(self._task, self._episode_dir / "work", scratch, self._uid, answer)

    def expert_action(self) -> str:
        """The oracle's next command (solution.sh's commands in order), then ``submit``."""
        if self._task is None:
            raise RuntimeError("expert_action() called before reset()")
        if self._task_index not in self._expert_cache:
            self._expert_cache[self._task_index] = split_commands(self._task.solution)
        commands = self._expert_cache[self._task_index]
        if self._bash_steps < len(commands):
            return render_text(ToolCall("bash", {"command": commands[self._bash_steps]}))
        return render_text(ToolCall("submit", {"answer": ""}))

    def system_prompt(self) -> str:
        """The current task's instruction followed by the tool-call format."""
        instruction = self._task.instruction.strip() if self._task else ""
        return f"{instruction}\n\n{format_instruction(TERMINAL_TOOLS)}".strip()

    # -- cleanup --------------------------------------------------------------
    def _end_episode(self) -> None:
        TerminalEnvironment._cleanup([self._session, self._episode_dir])
        self._session, self._episode_dir = None, None

    @staticmethod
    def _cleanup(state: list) -> None:
        session, directory = state
        if session is not None:
            session.close()
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def close(self) -> None:
        self._end_episode()
        self._finalizer.detach()
        super().close()


TERMINAL_FORMAT = tool_format(
    "You work in a Linux terminal to complete the task. You see each command's output. When the task is "
    "done, submit (an empty answer for file work).", TERMINAL_TOOLS,
    example="Create a file named greeting.txt in the current directory that contains the line: hello",
    answer="<bash>echo hello > greeting.txt</bash>",
    thought="One echo with a redirect writes the file.",
    more=((NO_OUTPUT, "<submit></submit>"),), max_tokens=256)


registry.register_text_env(
    "terminal", lambda **kw: TerminalEnvironment(TerminalConfig(**kw)), train_config={"split": "train"},
    eval_config={"split": "test"}, reply_format=TERMINAL_FORMAT, anchor_state="state_key",
    description="Terminal tasks: shell commands in a bubblewrap sandbox, scored by a verifier (generated or "
                "Harbor-layout task directories)",
    data="none for generated tasks (needs bubblewrap); task_dir=... for Harbor-layout task directories")

__all__ = ["TERMINAL_FORMAT", "TerminalConfig", "TerminalEnvironment"]
