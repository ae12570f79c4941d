"""A terminal task in Harbor's layout, loaded from a directory or built in memory.

A task directory holds:

- ``instruction.md``: what the agent is asked (its first observation);
- ``task.toml``: limits and metadata, read with the standard library's
  ``tomllib``. Harbor's own fields are honoured where they apply here:
  ``[agent] timeout_sec`` (total seconds of commands per episode),
  ``[verifier] timeout_sec``, ``[environment] memory_mb`` / ``memory``
  ("2G"). EchoRL's own go in ``[echo_rl]``: ``max_turns``,
  ``command_timeout_sec``, ``output_chars``, ``max_processes``, ``cpu_seconds``,
  ``file_size_mb``, ``workdir`` (where the work directory is mounted, default
  the Dockerfile's last ``WORKDIR``, else ``/app``) and ``cwd`` (the shell's
  start directory, default the work directory);
- the setup that builds the start file system: ``environment/setup.sh`` (or
  ``setup.sh`` beside ``instruction.md``), or,
  Harbor's way, ``environment/Dockerfile`` restricted to a plain file system
  (``FROM`` is ignored because the sandbox's tools are the host's read-only
  ``/usr``; ``WORKDIR``, ``COPY``/``ADD`` of local files, ``RUN`` and ``ENV``
  become a setup script; anything needing another image, a package manager or
  the network fails at setup with the script's output);
- ``tests/``: the verifier, entry ``tests/test.sh``; it exits 0/1 or writes a
  reward to ``/logs/verifier/reward.txt`` (a number) or ``reward.json``
  (``{"reward": x}``); it never is visible to the agent;
- the oracle: ``solution/solve.sh`` (Harbor) or ``solution.sh``.

``[environment] docker_image`` names a prebuilt image, which cannot run here:
such a task is refused with a :class:`TaskError` saying so.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from echo_rl.environments.terminal.shell import Limits

DEFAULT_WORKDIR = "/app"
DEFAULT_MAX_TURNS = 16
SOLUTION_FILES = ("solution/solve.sh", "solution.sh")
IGNORED_DOCKER = ("FROM", "ARG", "LABEL", "USER", "CMD", "ENTRYPOINT", "EXPOSE", "SHELL", "VOLUME", "STOPSIGNAL",
                  "HEALTHCHECK", "MAINTAINER", "ONBUILD")
_ECHO_KEYS = {"max_turns", "command_timeout_sec", "output_chars", "max_processes", "cpu_seconds", "file_size_mb",
              "workdir", "cwd"}


class TaskError(ValueError):
    """A task directory that cannot run here; the message names the file and what is allowed."""


@dataclass(frozen=True)
class TerminalTask:
    """Everything an episode needs; ``tests`` is a folder or ``{relative path: content}``."""

    name: str
    instruction: str
    setup: str  # bash script run in ``cwd`` (as the agent's uid, in its own sandbox) before the episode
    tests: Path | Mapping[str, str]
    solution: str  # the oracle, a bash script
    workdir: str = DEFAULT_WORKDIR
    cwd: str | None = None
    context: Path | None = None  # environment/ (read-only at /setup/context during setup: COPY sources)
    limits: Limits = Limits()
    max_turns: int = DEFAULT_MAX_TURNS
    agent_timeout: float = 600.0
    verifier_timeout: float = 60.0
    env: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for path in (self.workdir, self.cwd or self.workdir):
            if not path.startswith("/") or path in ("/tmp", "/usr", "/proc", "/dev") or \
                    path.startswith(("/usr/", "/proc/", "/dev/", "/tests", "/logs", "/setup")):
                raise TaskError(f"task {self.name}: workdir/cwd {path!r} is invalid: must be an absolute path "
                                f"outside /usr, /proc, /dev, /tmp, /tests, /logs and /setup ('/': the whole root)")
        if not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise TaskError(f"task {self.name}: max_turns={self.max_turns!r} is invalid: must be an integer >= 1")

    @property
    def start_dir(self) -> str:
        return self.cwd or self.workdir

    def write_tests(self, dest: Path) -> Path:
        """The tests folder on disk (in-memory tests are written under ``dest``)."""
        if isinstance(self.tests, Path):
            return self.tests
        for rel, text in self.tests.items():
            path = dest / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return dest

    def write(self, dest: str | Path) -> Path:
        """Write the task as a Harbor-layout directory (``load_task`` reads it back)."""
        dest = Path(dest)
        (dest / "environment").mkdir(parents=True, exist_ok=True)
        (dest / "solution").mkdir(exist_ok=True)
        (dest / "instruction.md").write_text(self.instruction)
        (dest / "environment" / "setup.sh").write_text(self.setup)
        (dest / "solution" / "solve.sh").write_text(self.solution)
        self.write_tests(dest / "tests")
        lim = self.limits
        echo = {"max_turns": self.max_turns, "command_timeout_sec": lim.command_timeout,
                "output_chars": lim.output_chars, "max_processes": lim.max_processes, "cpu_seconds": lim.cpu_seconds,
                "file_size_mb": lim.file_size_mb, "workdir": self.workdir, "cwd": self.start_dir}
        lines = ['version = "1.0"', "", "[metadata]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in self.metadata.items() if isinstance(v, (str, int, float))]
        lines += ["", "[agent]", f"timeout_sec = {float(self.agent_timeout)}", "", "[verifier]",
                  f"timeout_sec = {float(self.verifier_timeout)}", "", "[environment]", f"memory_mb = {lim.memory_mb}",
                  "", "[echo_rl]"] + [f"{k} = {json.dumps(v)}" for k, v in echo.items()]
        (dest / "task.toml").write_text("\n".join(lines) + "\n")
        return dest


def _memory_mb(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(value), re.I)
    if not match:
        raise TaskError(f"{where}: memory={value!r} is invalid: use megabytes (memory_mb = 2048) or a size like '2G'")
    scale = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}[match.group(2).upper()]
    return max(1, int(float(match.group(1)) * scale))


def _number(table: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise TaskError(f"{where}: {key}={value!r} is invalid: must be a positive number")
    return value


def dockerfile_setup(text: str, where: str) -> tuple[str, str | None, dict[str, str]]:
    """A plain-file-system Dockerfile as (setup script, last WORKDIR or None, ENV values)."""
    logical, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    if buf:
        logical.append(buf)
    script, workdir, env = ["set -e"], None, {}
    for line in logical:
        word, _, rest = line.strip().partition(" ")
        op, rest = word.upper(), rest.strip()
        if op in IGNORED_DOCKER:
            continue
        if rest.startswith("["):  # exec form: a JSON list
            try:
                parts = json.loads(rest)
            except ValueError:
                raise TaskError(f"{where}: cannot parse {line.strip()!r} (exec form must be a JSON list)") from None
        else:
            parts = shlex.split(rest) if op in ("COPY", "ADD", "WORKDIR") else [rest]
        if op == "WORKDIR":
            workdir = parts[0] if parts[0].startswith("/") else f"{workdir or '/'}/{parts[0]}".replace("//", "/")
            script.append(f"mkdir -p {shlex.quote(workdir)} && cd {shlex.quote(workdir)}")
        elif op in ("COPY", "ADD"):
            parts = [p for p in parts if not p.startswith("--")]
            if len(parts) < 2 or any(re.match(r"[a-z]+://", p) for p in parts):
                raise TaskError(f"{where}: {line.strip()!r} is not supported: only COPY/ADD of files from "
                                f"environment/ into the file system")
            srcs = " ".join("/setup/context/" + shlex.quote(p.lstrip("/")) for p in parts[:-1])
            dest = shlex.quote(parts[-1])
            script.append(f"mkdir -p {dest} 2>/dev/null || true; cp -a {srcs} {dest}" if parts[-1].endswith("/")
                          else f"cp -a {srcs} {dest}")
        elif op == "RUN":
            script.append(shlex.join(parts) if rest.startswith("[") else parts[0])
        elif op == "ENV":
            pairs = re.findall(r'(\w+)=("[^"]*"|\S+)', rest) or ([tuple(rest.split(None, 1))] if rest else [])
            for key, value in pairs:
                value = value[1:-1] if value.startswith('"') else value
                env[key] = value
                script.append(f"export {key}={shlex.quote(value)}")
        else:
            raise TaskError(f"{where}: instruction {op} is not supported; a plain file system allows "
                            f"WORKDIR, COPY, ADD, RUN, ENV (and ignores {', '.join(IGNORED_DOCKER)})")
    return "\n".join(script) + "\n", workdir, env


def load_task(path: str | Path) -> TerminalTask:
    """Read a Harbor-layout task directory; :class:`TaskError` names what is missing or invalid."""
    root = Path(path)
    if not (root / "instruction.md").is_file():
        raise TaskError(f"{root}: not a terminal task (no instruction.md); a task directory holds instruction.md, "
                        f"task.toml, environment/, tests/test.sh and solution/solve.sh")
    try:
        config = tomllib.loads((root / "task.toml").read_text()) if (root / "task.toml").exists() else {}
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{root / 'task.toml'}: not valid TOML ({exc})") from None
    where = str(root / "task.toml")
    environment, echo = config.get("environment", {}), config.get("echo_rl", {})
    unknown = set(echo) - _ECHO_KEYS
    if unknown:
        raise TaskError(f"{where}: unknown [echo_rl] key(s) {', '.join(sorted(unknown))}; allowed: "
                        f"{', '.join(sorted(_ECHO_KEYS))}")
    if environment.get("docker_image"):
        raise TaskError(f"{where}: [environment] docker_image={environment['docker_image']!r} cannot run here: "
                        f"terminal tasks run in a bubblewrap sandbox over the host's /usr, not in Docker images")
    context = root / "environment"
    if (context / "setup.sh").is_file() or (root / "setup.sh").is_file():
        script = context / "setup.sh" if (context / "setup.sh").is_file() else root / "setup.sh"
        setup, docker_workdir, env = script.read_text(), None, {}
    elif (context / "Dockerfile").is_file():
        setup, docker_workdir, env = dockerfile_setup((context / "Dockerfile").read_text(),
                                                      str(context / "Dockerfile"))
    else:
        setup, docker_workdir, env = "", None, {}
    if not (root / "tests" / "test.sh").is_file():
        raise TaskError(f"{root}: no tests/test.sh (the verifier, run after the episode)")
    solution = next((root / f for f in SOLUTION_FILES if (root / f).is_file()), None)
    memory = environment.get("memory_mb", environment.get("memory", Limits.memory_mb))
    limits = Limits(command_timeout=_number(echo, "command_timeout_sec", where, Limits.command_timeout),
                    cpu_seconds=int(_number(echo, "cpu_seconds", where, Limits.cpu_seconds)),
                    memory_mb=_memory_mb(memory, where),
                    max_processes=int(_number(echo, "max_processes", where, Limits.max_processes)),
                    file_size_mb=int(_number(echo, "file_size_mb", where, Limits.file_size_mb)),
                    output_chars=int(_number(echo, "output_chars", where, Limits.output_chars)))
    workdir = echo.get("workdir") or docker_workdir or DEFAULT_WORKDIR
    return TerminalTask(
        name=root.name, instruction=(root / "instruction.md").read_text(), setup=setup, tests=root / "tests",
        solution=solution.read_text() if solution else "", workdir=workdir, cwd=echo.get("cwd"),
        context=context if context.is_dir() else None, limits=limits,
        max_turns=int(_number(echo, "max_turns", where, DEFAULT_MAX_TURNS)),
        agent_timeout=_number(config.get("agent", {}), "timeout_sec", where, 600.0),
        verifier_timeout=_number(config.get("verifier", {}), "timeout_sec", where, 60.0),
        env=env, metadata=dict(config.get("metadata", {})))


def load_tasks(path: str | Path) -> list[TerminalTask]:
    """One task directory, or a folder of task directories (sorted by name)."""
    root = Path(path)
    if (root / "instruction.md").is_file():
        return [load_task(root)]
    if not root.is_dir():
        raise TaskError(f"{root}: no such task directory")
    tasks = [load_task(d) for d in sorted(root.iterdir()) if (d / "instruction.md").is_file()]
    if not tasks:
        raise TaskError(f"{root}: holds no task directories (each needs instruction.md, task.toml, tests/test.sh)")
    return tasks


_SKIP = re.compile(r"\s*(#.*)?$|\s*set\s+-[euxo]+(\s+pipefail)?\s*$")


def split_commands(script: str) -> list[str]:
    """A script as the commands an agent would type, in order: comments and ``set -e`` lines dropped,
    multi-line constructs (loops, here-documents, continued lines) kept whole.

    Completeness is decided by ``bash -n`` (parse only, nothing runs) on the lines gathered so far.
    """
    commands, chunk = [], []
    for line in script.splitlines():
        if not chunk and (_SKIP.match(line) or line.startswith("#!")):
            continue
        chunk.append(line)
        text = "\n".join(chunk)
        if text.rstrip().endswith("\\"):
            continue
        check = subprocess.run(["bash", "-n"], input=text.encode(), capture_output=True)
        if check.returncode == 0 and b"here-document" not in check.stderr:  # bash only warns on an open heredoc
            commands.append(text)
            chunk = []
    if chunk:
        commands.append("\n".join(chunk))
    return commands


def with_limits(task: TerminalTask, **changes: Any) -> TerminalTask:
    """``task`` with some :class:`Limits` fields replaced."""
    return replace(task, limits=replace(task.limits, **changes))
