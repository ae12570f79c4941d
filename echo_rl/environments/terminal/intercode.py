"""InterCode-Bash (Yang et al. 2023) as terminal tasks, scored with upstream's reward.

Data: ``<data root>/intercode_bash/`` (``nl2bash_fs_{1,2,4}.json``: query + gold
command; ``setup_nl2b_fs_N.sh``: the file system the queries are grounded in).
File system 3 is upstream's held-out set; it is not in the data folder and this
module never asks for it.

Upstream runs every query in an ubuntu container whose whole ``/`` is committed
to git (system folders ignored), agent and gold in two copies. Here the
episode's work directory is the sandbox's whole root (``workdir = "/"``), with
the host's read-only ``/usr`` (and ``/etc/alternatives``) mounted into it, so
the agent starts in ``/`` and may write anywhere upstream's agent could write
outside system folders (``/testbed``, ``/system``, ``/tmp``, new top-level
folders).

Reward (upstream ``BashEnv.get_reward``), after the episode: the setup runs in
a fresh root, the gold command runs there, and

- 0.33 * (1 - erf(#missing + #extra changes)): the file-system changes of
  the agent against the gold's, as ``git status --short`` lists them (new
  untracked files, collapsed to their top-most new folder; modified and deleted
  files), both against the state right after setup;
- 0.33 * (share of the changes made by both, of kind "new", whose content
  hashes agree; 0.33 when there are none);
- 0.33 * TF-IDF cosine similarity of the agent's last command output and the
  gold output (scikit-learn's ``TfidfVectorizer`` defaults, written out in
  :func:`tfidf_similarity`);
- plus 0.01, each part rounded to 2 decimals as upstream does. Success is
  reward 1.

What this sandbox cannot reproduce (``docs/environments.md`` lists the
queries, measured with ``benchmarks/terminal_bench.py --intercode``): tools
the host lacks (``tree``, ``dig``, ``pstree``, ``md5deep``...), system files
of upstream's image (``/etc/networks``, ``/etc/hosts``, ``/var/log``), state
that differs per machine or moment (``uname``, ``df``, ``who``, ``date``,
``$$``) and commands that need the network or root.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from echo_rl.config import ConfigBase, ConfigError, spec
from echo_rl.environments import registry
from echo_rl.environments.base import data_dir_spec, make_config, max_steps_spec, resolve_data_dir
from echo_rl.environments.terminal.env import TERMINAL_FORMAT, TerminalConfig, TerminalEnvironment
from echo_rl.environments.terminal.shell import Limits, run_script
from echo_rl.environments.terminal.task import TerminalTask
from echo_rl.environments.terminal.verify import Verdict, copy_workdir

FILE_SYSTEMS = ("1", "2", "4")  # 3 is upstream's held-out set: deliberately absent
#: upstream's docker.gitignore: folders whose changes do not count (plus this sandbox's own mount points)
IGNORED = {"bin", "boot", "dev", "etc", "home", "lib", "media", "opt", "proc", "root", "run", "sbin", "srv", "sys",
           "usr", "var", "lib32", "lib64", "libx32", ".dockerenv"}
HOW_TO_GET = ("get nl2bash_fs_{1,2,4}.json and setup_nl2b_fs_{1,2,4}.sh from "
              "https://github.com/princeton-nlp/intercode "
              "(data/nl2bash/ and docker/bash_scripts/) into <data_dir>")
OUTPUT_CHARS = 20_000


def tfidf_similarity(a: str, b: str) -> float:
    """Cosine similarity of two texts' TF-IDF vectors, as scikit-learn's ``TfidfVectorizer`` defaults compute it
    (lower-cased tokens of 2+ word characters, raw counts, smooth idf = ln((1+n)/(1+df)) + 1, L2 norm);
    upstream's fallback where no text has a token: 1 if the texts are equal, else 0."""
    docs = [Counter(re.findall(r"(?u)\b\w\w+\b", d.lower())) for d in (a, b)]
    vocab = set(docs[0]) | set(docs[1])
    if not vocab:
        return 1.0 if a == b else 0.0
    idf = {t: math.log(3 / (1 + sum(t in d for d in docs))) + 1 for t in vocab}
    vecs = []
    for d in docs:
        v = {t: c * idf[t] for t, c in d.items()}
        norm = math.sqrt(sum(x * x for x in v.values()))
        vecs.append({t: x / norm for t, x in v.items()} if norm else {})
    return sum(x * vecs[1].get(t, 0.0) for t, x in vecs[0].items())


def snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """{path relative to /: (kind, content hash)} of a root, system folders left out; never follows a link."""
    out: dict[str, tuple[str, str]] = {}

    def walk(path: Path, rel: str) -> None:
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for entry in entries:
            name = f"{rel}{entry.name}"
            if not rel and entry.name in IGNORED:
                continue
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    out[name] = ("l", hashlib.md5(os.readlink(entry.path).encode(errors="surrogateescape")).hexdigest())
                elif stat.S_ISDIR(mode):
                    out[name] = ("d", "")
                    walk(Path(entry.path), name + "/")
                elif stat.S_ISREG(mode):
                    fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with os.fdopen(fd, "rb") as f:
                        out[name] = ("f", hashlib.file_digest(f, "md5").hexdigest())
            except OSError:
                continue
    walk(root, "")
    return out


def changes(before: dict, after: dict) -> set[tuple[str, str]]:
    """``git status --short`` of ``after`` against ``before``: (path, "??" | "M" | "D")."""
    out = set()
    for path, (kind, digest) in after.items():
        if kind == "d":
            continue
        if path not in before:
            parts, top = path.split("/"), path
            for i in range(1, len(parts)):  # an untracked folder is listed once, as its top-most new folder
                if "/".join(parts[:i]) not in before:
                    top = "/".join(parts[:i]) + "/"
                    break
            out.add((top, "??"))
        elif before[path] != (kind, digest):
            out.add((path, "M"))
    for path, (kind, _) in before.items():
        if kind != "d" and path not in after:
            out.add((path, "D"))
    return out


def content_hash(snap: dict, path: str) -> str:
    """The hash of a changed path: its own for a file, of everything under it for a folder (``md5deep -r``)."""
    if not path.endswith("/"):
        return "|".join(snap.get(path, ("", "missing")))
    items = sorted((p, v) for p, v in snap.items() if p.startswith(path))
    return hashlib.md5(json.dumps(items).encode()).hexdigest()


def intercode_reward(before: dict, agent: dict, gold: dict, agent_output: str, gold_output: str) -> tuple[float, dict]:
    """Upstream's reward and its parts."""
    diff_agent, diff_gold = changes(before, agent), changes(before, gold)
    missing, extra = diff_gold - diff_agent, diff_agent - diff_gold
    p1 = round(0.33 * (1 - math.erf(len(missing) + len(extra))), 2)
    same = [c for c in diff_agent & diff_gold if c[1] in ("A", "??", "C")]
    p2 = 0.33
    if same:
        agree = sum(content_hash(agent, p) == content_hash(gold, p) for p, _ in same)
        p2 = round(0.33 * agree / len(same), 2)
    p3 = round(0.33 * tfidf_similarity(agent_output, gold_output), 2)
    reward = round(0.01 + p1 + p2 + p3, 2)
    return reward, {"file_diff": p1, "file_changes": p2, "answer_similarity": p3,
                    "diff_missing": sorted(missing), "diff_extra": sorted(extra)}


def load_queries(data_dir: Path, file_systems: tuple[str, ...]) -> list[tuple[str, int, dict]]:
    """(file system, index, {query, gold}) of the chosen file systems."""
    out = []
    for fs in file_systems:
        if fs not in FILE_SYSTEMS:
            raise ConfigError(f"file system {fs!r} is invalid: allowed: {', '.join(FILE_SYSTEMS)} (3 is upstream's "
                              f"held-out set and is not used)")
    for fs in file_systems:
        path = data_dir / f"nl2bash_fs_{fs}.json"
        try:
            rows = json.loads(path.read_text())
            assert isinstance(rows, list) and all(isinstance(r.get("query"), str) and isinstance(r.get("gold"), str)
                                                  for r in rows)
        except (OSError, ValueError, AssertionError, AttributeError):
            raise ConfigError(f"{path} is missing or malformed (a JSON list of {{query, gold}}); "
                              f"{HOW_TO_GET}") from None
        out += [(fs, i, row) for i, row in enumerate(rows)]
    return out


def setup_script(data_dir: Path, fs: str) -> str:
    """Upstream's setup script, minus its first ``rm -rf`` of the folder (a fresh root starts empty)."""
    path = data_dir / f"setup_nl2b_fs_{fs}.sh"
    if not path.is_file():
        raise ConfigError(f"{path} is missing; {HOW_TO_GET}")
    return "\n".join(line for line in path.read_text().splitlines()
                     if not re.fullmatch(r"\s*rm -rf /(testbed|system)/?\s*", line)) + "\n"


@dataclass
class InterCodeConfig(ConfigBase):
    """InterCode-Bash file systems and limits."""

    file_systems: str = spec("1,2,4", help="comma-separated file systems (1, 2, 4; 3 is upstream's held-out set)")
    max_steps: int = max_steps_spec(10)
    command_timeout: float = spec(10.0, help="wall-clock seconds per command", gt=0)
    data_dir: str | None = data_dir_spec()
    work_root: str | None = spec(None, help="folder for the episodes' private roots (None: the system temp folder)")


class InterCodeBashEnvironment(TerminalEnvironment):
    """InterCode-Bash queries in the sandboxed shell; the reward is upstream's, computed after the episode."""

    def __init__(self, config: InterCodeConfig | dict | None = None, render_mode: str | None = None, **overrides):
        config = make_config(InterCodeConfig, config, overrides)
        data_dir = resolve_data_dir(config.data_dir, "intercode_bash", "ECHO_RL_INTERCODE_BASH_DIR", HOW_TO_GET)
        fss = tuple(s.strip() for s in config.file_systems.split(",") if s.strip())
        if not fss:
            raise ConfigError(f"file_systems={config.file_systems!r} is invalid: name some of "
                              f"{', '.join(FILE_SYSTEMS)}")
        queries = load_queries(data_dir, fss)  # checks the names first: 3 is refused before any file is read
        setups = {fs: setup_script(data_dir, fs) for fs in fss}
        limits = Limits(command_timeout=config.command_timeout, output_chars=OUTPUT_CHARS)
        tasks = [TerminalTask(name=f"fs{fs}-{i:03d}", instruction=row["query"] + "\n", setup=setups[fs], tests={},
                              solution=row["gold"] + "\n", workdir="/", cwd="/", limits=limits,
                              max_turns=config.max_steps, metadata={"file_system": fs, "gold": row["gold"]})
                 for fs, i, row in queries]
        self.intercode_config = config
        super().__init__(TerminalConfig(max_steps=config.max_steps, work_root=config.work_root), render_mode,
                         tasks=tasks)
        self._before: dict | None = None

    def _reset_task(self, index: int, options: dict) -> list:
        segments = super()._reset_task(index, options)
        # the gold command later runs in a copy of this exact start state (upstream resets both containers to one
        # git commit; running the setup again would differ, e.g. in a tar.gz's timestamps)
        copy_workdir(self._episode_dir / "work", self._episode_dir / "start", "/",
                     self._uid if os.geteuid() == 0 else None)
        self._before = snapshot(self._episode_dir / "start")
        return segments

    def _prepare_root(self, work: Path) -> None:
        (work / "tmp").mkdir(mode=0o1777, exist_ok=True)
        os.chmod(work / "tmp", 0o1777)
        if os.geteuid() == 0:
            os.chown(work / "tmp", self._uid, self._uid)

    def _setup(self, task: TerminalTask, work: Path) -> None:
        self._prepare_root(work)
        run_script(task.setup, self._uid, [(str(work), "/", True)], "/", limits=task.limits, timeout=60.0)

    def _verify(self, answer: str | None) -> Verdict:
        assert self._episode_dir is not None and self._task is not None and self._before is not None
        gold_root, task = self._episode_dir / "start", self._task
        _, gold_output = run_script(task.metadata["gold"], self._uid, [(str(gold_root), "/", True)], "/",
                                    limits=task.limits, timeout=task.limits.command_timeout)
        reward, parts = intercode_reward(self._before, snapshot(self._episode_dir / "work"), snapshot(gold_root),
                                         self._last_result_output, gold_output)
        shutil.rmtree(gold_root, ignore_errors=True)
        return Verdict(reward, True, gold_output, [], detail=json.dumps(parts))


registry.register_text_env(
    "intercode_bash", lambda **kw: InterCodeBashEnvironment(InterCodeConfig(**kw)),
    reply_format=TERMINAL_FORMAT, anchor_state="state_key",
    description="InterCode-Bash (NL2Bash queries, file systems 1, 2, 4) with upstream's reward, in the sandboxed shell",
    data="intercode_bash/: ../shared/data/intercode_bash (or $ECHO_RL_INTERCODE_BASH_DIR); needs bubblewrap")

__all__ = ["InterCodeBashEnvironment", "InterCodeConfig", "intercode_reward", "tfidf_similarity", "snapshot",
           "changes"]
