"""Running a task's verifier after the episode, out of the agent's reach.

The agent's sandbox never mounts ``tests/`` or ``/logs``. After the episode
every process of the agent is gone (its sandbox is killed), the final work
directory is copied, and the verifier runs in a fresh sandbox over the copy,
with ``tests/`` read-only at ``/tests``, an empty writable ``/logs/verifier``
and the submitted answer read-only at ``/logs/agent/answer.txt``. The reward is
the number in ``/logs/verifier/reward.txt`` (or ``reward.json``'s ``reward``),
else 1.0 if ``test.sh`` exits 0 and 0.0 otherwise; a verifier that times out
scores 0. Nothing the agent printed is ever read.

The copy keeps files, directories and symlinks (never following one) and skips
FIFOs, sockets and devices. A symlink whose target, resolved the way the
verifier's kernel would (following the copy's other links), leaves the work
directory for anything but the system's read-only tools (``/usr``, ``/bin``,
``/lib*``), ``/tmp`` or ``/dev/null`` is removed: otherwise a link planted by
the agent could point an output file at the verifier's own expected answer in
``/tests`` or at its reward file.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from echo_rl.environments.terminal.shell import Limits, run_script

MAX_COPY_ENTRIES = 50_000
ALLOWED_OUTSIDE = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/tmp", "/dev/null")
FORBIDDEN = ("/tests", "/logs", "/proc", "/setup")
SYSTEM_LINKS = {d: os.readlink(d) for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
                if os.path.islink(d)}


@dataclass
class Verdict:
    reward: float
    passed: bool  # the verifier ran to its end (no timeout)
    output: str = ""
    dropped_links: list[str] = field(default_factory=list)
    detail: str = ""


class _Resolver:
    """Resolve a sandbox path the way the kernel would, reading links of the work-dir copy on the host."""

    def __init__(self, copy_root: Path, mount: str):
        self.root, self.mount = copy_root, mount.rstrip("/")

    def host(self, path: str) -> Path | None:
        if path == self.mount or path.startswith(self.mount + "/"):
            return self.root / path[len(self.mount) + 1:]
        return None

    def resolve(self, path: str) -> str | None:
        """The resolved path, or None where resolution loops or passes through /proc."""
        parts, done, hops = [p for p in path.split("/") if p], "/", 0
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                done = posixpath.dirname(done)
                continue
            candidate = posixpath.join(done, part)
            if candidate == "/proc" or candidate.startswith("/proc/"):
                return None
            target = SYSTEM_LINKS.get(candidate)
            host = self.host(candidate)
            if target is None and host is not None and os.path.islink(host):
                target = os.readlink(host)
            if target is None:
                done = candidate
                continue
            hops += 1
            if hops > 40:
                return None
            parts = [p for p in target.split("/") if p] + parts
            done = "/" if target.startswith("/") else done
        return done


def _allowed(resolved: str | None, mount: str) -> bool:
    if resolved is None or any(resolved == f or resolved.startswith(f + "/") for f in FORBIDDEN):
        return False
    inside = mount == "/" or resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
    return inside or any(resolved == a or resolved.startswith(a + "/") for a in ALLOWED_OUTSIDE)


def copy_workdir(src: Path, dest: Path, mount: str, uid: int | None) -> list[str]:
    """Copy the final work dir for the verifier; returns the symlinks removed (relative paths)."""
    count = 0
    links: list[Path] = []

    def walk(s: Path, d: Path) -> None:
        nonlocal count
        d.mkdir(mode=0o755)
        with os.scandir(s) as entries:
            for entry in entries:
                count += 1
                if count > MAX_COPY_ENTRIES:
                    raise OverflowError(f"the work directory holds more than {MAX_COPY_ENTRIES} entries")
                try:
                    copy_entry(entry, d / entry.name)
                except OSError:  # unreadable (a non-root host cannot override permissions): left out
                    continue

    def copy_entry(entry: os.DirEntry, target: Path) -> None:
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(entry.path), target)
            links.append(target)
        elif stat.S_ISDIR(mode):
            walk(Path(entry.path), target)
            os.chmod(target, stat.S_IMODE(mode) | 0o700)
        elif stat.S_ISREG(mode):  # O_NOFOLLOW: never a path swapped for a link; FIFOs and devices are skipped
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as fin, open(target, "wb") as fout:
                shutil.copyfileobj(fin, fout)
            os.chmod(target, stat.S_IMODE(mode) | 0o600)
        else:
            return
        st = entry.stat(follow_symlinks=False)  # times kept: verifiers and queries may test them (find -mtime)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)

    walk(src, dest)
    resolver = _Resolver(dest, mount)
    dropped = []
    for link in links:
        rel = link.relative_to(dest).as_posix()
        if not _allowed(resolver.resolve(posixpath.join(mount, rel)), mount):
            dropped.append(rel)
    for rel in dropped:
        os.unlink(dest / rel)
    if uid is not None:
        for dirpath, dirnames, filenames in os.walk(dest):
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                os.lchown(name, uid, uid)
    return dropped


def read_reward(logs: Path, exit_code: int | None) -> float:
    """Harbor's reward: reward.txt, else reward.json, else the verifier's exit status (0 -> 1.0)."""
    for name in ("reward.txt", "reward.json"):
        path = logs / name
        if path.is_file() and not path.is_symlink():
            raw = path.read_bytes()[:4096].decode(errors="replace").strip()
            try:
                value = json.loads(raw) if name.endswith("json") else float(raw.split()[0])
                if isinstance(value, dict):
                    value = value.get("reward")
                value = float(value)
            except (ValueError, TypeError, IndexError):
                return 0.0
            return value if math.isfinite(value) else 0.0
    return 1.0 if exit_code == 0 else 0.0


def run_verifier(task, workdir: Path, scratch: Path, uid: int, answer: str | None) -> Verdict:
    """Score the episode whose final work dir is ``workdir``; ``scratch`` is an empty host folder."""
    copy = scratch / "work"
    try:
        dropped = copy_workdir(workdir, copy, task.workdir, uid if os.geteuid() == 0 else None)
    except OverflowError as exc:
        return Verdict(0.0, False, detail=str(exc))
    tests = task.write_tests(scratch / "tests")
    logs, agent = scratch / "logs", scratch / "agent"
    for d in (logs, agent):
        d.mkdir()
    (agent / "answer.txt").write_text(answer or "")
    if os.geteuid() == 0:
        os.chown(logs, uid, uid)
    limits = Limits(**{**task.limits.__dict__, "output_chars": 20_000})
    binds = [(str(copy), task.workdir, True), (str(tests), "/tests", False), (str(logs), "/logs/verifier", True),
             (str(agent), "/logs/agent", False)]
    code, output = run_script("bash /tests/test.sh", uid, binds, task.start_dir, limits=limits, env=dict(task.env),
                              timeout=task.verifier_timeout)
    if code is None:
        return Verdict(0.0, False, output, dropped, detail=f"the verifier did not finish in {task.verifier_timeout} s")
    return Verdict(read_reward(logs, code), True, output, dropped, detail=f"test.sh exited {code}")
