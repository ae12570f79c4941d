"""The sandboxed shell of a terminal task: one long-lived bash per episode inside bubblewrap.

The boundary is the one of :mod:`echo_rl.environments.sandbox` (CRUXEval's
checks), adapted to a shell that must run real programs:

- new PID, network (loopback only), IPC and UTS namespaces, ``--die-with-parent``
  and ``--new-session``: no host process is visible or signalable, no host port
  reachable, and nothing outlives the episode (killing the sandbox's PID 1 ends
  its whole PID namespace, background jobs included);
- a private root: read-only ``/usr`` and ``/lib*`` (real bash and coreutils),
  fresh ``/proc`` and ``/dev``, a size-capped private ``/tmp``, and the task's
  work directory bound writable at its path (``/app`` by default); no host
  ``/etc``, ``$HOME`` or project tree; a cleared environment;
- an unprivileged uid: started as root, bwrap keeps only CAP_SETUID/SETGID and
  ``setpriv`` drops to a per-episode uid (so process limits and file ownership
  are the episode's own, and one episode's fork bomb cannot starve another);
  started as a normal user, a user namespace maps the user to 65534;
- rlimits on CPU seconds, address space, processes, file size and open files,
  set before bwrap starts and inherited by everything inside.

:class:`ShellSession` keeps one bash alive: commands are sent on its stdin,
NUL-terminated after a fresh random tag, and bash ``eval``s each one (stdin
``/dev/null``) and prints ``\\n<tag> <exit status> <$PWD, %q-quoted>``, so ``cd``, variables and
background jobs persist between commands while each command's output and status
are delimited exactly. A command that passes its wall-clock timeout, floods
more than ``output_bytes``, or exits the shell is stopped by killing the whole
sandbox; a fresh shell then starts in the same work directory (files persist;
the shell's state does not, and the output says so). Output is cut to
``output_chars`` with a marker, and bytes that are not UTF-8 are escaped
(``\\xff``).
"""

from __future__ import annotations

import json
import os
import random
import resource
import select
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from echo_rl.environments.sandbox import INSTALL_HINT, SANDBOX_GID, SANDBOX_UID, SandboxUnavailable, kill_sandbox, seccomp_fd

#: per-episode uids when running as root: a range no distribution allocates
UID_BASE, UID_SPAN = 3_000_000, 1 << 20
#: /etc entries the tools need (Debian's alternatives: awk, editors; the loader cache; the time zone)
ETC_ENTRIES = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/localtime", "/etc/magic", "/etc/mime.types")
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
CUT_MARKER = "\n[... output cut: {cut} more bytes; at most {limit} characters are shown]"
CD = 'cd -- "$1" || exit 111; shift; '
LOOP = CD + ("while IFS= read -r -d '' __echo_tag && IFS= read -r -d '' __echo_cmd; do "
        "eval \"$__echo_cmd\" </dev/null; builtin printf '\\n%s %d %q\\n' \"$__echo_tag\" \"$?\" \"$PWD\"; done")


@dataclass(frozen=True)
class Limits:
    """What one episode's sandbox may use (task.toml can lower or raise them per task)."""

    command_timeout: float = 10.0  # wall-clock seconds per command
    cpu_seconds: int = 30  # RLIMIT_CPU of each process
    memory_mb: int = 1024  # RLIMIT_AS of each process
    max_processes: int = 64  # RLIMIT_NPROC of the episode's uid
    file_size_mb: int = 16  # RLIMIT_FSIZE: largest file a process may write
    open_files: int = 256
    tmp_mb: int = 64  # the private /tmp (tmpfs, so it is memory)
    output_bytes: int = 4 << 20  # a command printing more is stopped
    output_chars: int = 4000  # characters of a command's output shown to the agent

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Limits.{name}={value!r} is invalid: must be a positive number")


@dataclass(frozen=True)
class ShellResult:
    output: str
    exit_code: int | None  # None: stopped (timeout, output flood) or the shell exited
    timed_out: bool = False
    flooded: bool = False
    restarted: bool = False
    cwd: str = ""  # the shell's working directory after the command ($PWD, shell-quoted if it needs quoting)


def episode_uid() -> int:
    """The uid an episode's processes run as: a fresh one per episode as root, else 65534 (user namespace)."""
    return UID_BASE + random.SystemRandom().randrange(UID_SPAN) if os.geteuid() == 0 else SANDBOX_UID


def sandbox_argv(uid: int, binds: list[tuple[str, str, bool]], env: dict[str, str], limits: Limits,
                 info_fd: int, seccomp: bool = False) -> list[str]:
    """The bwrap + setpriv command line before the program; ``binds`` are (host, sandbox path, writable)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"terminal tasks need bubblewrap (`bwrap` is not on PATH): {INSTALL_HINT}")
    cmd = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]
    if seccomp:  # refuses new user namespaces: as root, bwrap's --disable-userns is not available
        cmd += ["--seccomp", "{seccomp_fd}"]
    base_env = {"PATH": SANDBOX_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb", "USER": "agent"}
    for key, value in {**base_env, **env}.items():
        cmd += ["--setenv", key, value]
    root = os.geteuid() == 0
    if root:
        cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--disable-userns"]
    root_binds = [b for b in binds if b[1] == "/"]  # a task whose whole root is its work dir: mounted first
    for host, _, writable in root_binds:
        cmd += ["--bind" if writable else "--ro-bind", host, "/"]
    binds = [b for b in binds if b[1] != "/"]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            if root_binds and not _fresh_link(os.path.join(root_binds[0][0], d[1:]), os.readlink(d)):
                continue  # made by an earlier sandbox over the same root (bwrap 0.8 refuses to make it again)
            cmd += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            cmd += ["--ro-bind", d, d]
    cmd += ["--perms", "0755", "--dir", "/etc"]
    for entry in ETC_ENTRIES:  # the tools' own configuration only: no host users, secrets or network settings
        if os.path.exists(entry):
            cmd += ["--ro-bind", entry, entry]
    cmd += ["--perms", "0644", "--ro-bind-data", "{passwd_fd}", "/etc/passwd",
            "--perms", "0644", "--ro-bind-data", "{group_fd}", "/etc/group"]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    if not root_binds:  # with the root as work dir, /tmp is part of it (the task's state, as in a container)
        cmd += ["--perms", "1777", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp"]
    made = {"/", "/etc", "/tmp"}
    for host, dest, writable in binds:
        for parent in [str(p) for p in reversed(Path(dest).parents)]:
            if parent not in made:  # readable by the sandbox uid (bwrap would make them 0700)
                cmd += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        cmd += ["--bind" if writable else "--ro-bind", host, dest]
    # bwrap's own chdir runs as uid 0 without capabilities, which a 0700 work dir refuses: bash does the cd
    cmd += ["--chdir", "/", "--info-fd", str(info_fd), "--"]
    if root:
        setpriv = shutil.which("setpriv", path="/usr/bin:/bin")
        if setpriv is None:
            raise SandboxUnavailable("terminal tasks run as root need util-linux's `setpriv` to drop to an "
                                     "unprivileged uid (apt-get install -y util-linux)")
        cmd += [setpriv, "--reuid", str(uid), "--regid", str(uid), "--clear-groups", "--inh-caps=-all",
                "--no-new-privs", "--"]
    return cmd


def _fresh_link(host_path: str, target: str) -> bool:
    """Whether bwrap must create the system link ``host_path`` -> ``target`` in a task's own root.

    One the agent replaced (a folder, another target) is removed first, so the
    sandbox's /bin is always the host's.
    """
    if os.path.islink(host_path):
        if os.readlink(host_path) == target:
            return False
        os.unlink(host_path)
    elif os.path.isdir(host_path):
        shutil.rmtree(host_path, ignore_errors=True)
    elif os.path.lexists(host_path):
        os.unlink(host_path)
    return True


def _set_limits(limits: Limits):
    values = [(resource.RLIMIT_CPU, int(limits.cpu_seconds)), (resource.RLIMIT_AS, int(limits.memory_mb) << 20),
              (resource.RLIMIT_NPROC, int(limits.max_processes)),
              (resource.RLIMIT_FSIZE, int(limits.file_size_mb) << 20),
              (resource.RLIMIT_NOFILE, int(limits.open_files)), (resource.RLIMIT_CORE, 0)]

    def apply() -> None:  # runs in the forked child before exec: bwrap and all it starts inherit them
        for which, value in values:
            resource.setrlimit(which, (value, value))
    return apply


class _Sandbox:
    """One running bwrap process tree: start, pipes, kill."""

    def __init__(self, program: list[str], uid: int, binds, env: dict[str, str], limits: Limits, stdin: bool):
        info_r, info_w = os.pipe()
        files = {"{passwd_fd}": f"root:x:0:0:root:/root:/bin/bash\nagent:x:{uid}:{uid}:agent:/tmp:/bin/bash\n"
                                f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
                 "{group_fd}": f"root:x:0:\nagent:x:{uid}:\nnogroup:x:65534:\n"}
        fds = {}
        for key, text in files.items():  # tiny: fits the pipe buffer, so bwrap reads it after we close
            r, w = os.pipe()
            os.write(w, text.encode())
            os.close(w)
            fds[key] = r
        filter_fd = seccomp_fd()
        if filter_fd is not None:
            fds["{seccomp_fd}"] = filter_fd
        try:
            argv = [str(fds.get(a, a)) for a in sandbox_argv(uid, binds, env, limits, info_w,
                                                             seccomp=filter_fd is not None)] + program
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         pass_fds=(info_w, *fds.values()), start_new_session=True, cwd="/",
                                         preexec_fn=_set_limits(limits),
                                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        except OSError as exc:
            os.close(info_r)
            raise SandboxUnavailable(f"could not run bwrap ({exc}); {INSTALL_HINT}") from None
        finally:
            os.close(info_w)
            for fd in fds.values():
                os.close(fd)
        with os.fdopen(info_r, "rb") as info:
            raw = info.read()
        try:
            self.sandbox_pid = json.loads(raw or b"{}").get("child-pid")
        except ValueError:
            self.sandbox_pid = None
        if self.sandbox_pid is None:
            out = self.proc.stdout.read(2000).decode(errors="replace").strip() if self.proc.stdout else ""
            self.kill()
            raise SandboxUnavailable(f"the bubblewrap sandbox did not start ({out or 'no reason given'}); "
                                     f"{INSTALL_HINT}")

    def kill(self) -> None:
        kill_sandbox(self.proc, self.sandbox_pid)


def clean_output(raw: bytes, extra: int, limit: int) -> str:
    """Decode (non-UTF-8 bytes escaped as ``\\xNN``) and cut to ``limit`` characters with a marker."""
    text = raw.decode("utf-8", errors="backslashreplace")
    if len(text) <= limit and not extra:
        return text
    cut = len(text[limit:].encode("utf-8", errors="surrogateescape")) + extra
    return text[:limit] + CUT_MARKER.format(cut=cut, limit=limit)


def _read_until(fd: int, deadline: float, max_bytes: int, done) -> tuple[bytes, int, str]:
    """Read ``fd`` until ``done(buffer)`` finds its end, EOF, the deadline or ``max_bytes``.

    Returns (kept bytes, bytes read and dropped past the keep window, why it stopped:
    "done" / "eof" / "timeout" / "flood"). Keeps at most ``max_bytes``.
    """
    buf = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(buf), 0, "timeout"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return bytes(buf), 0, "eof"
        buf += chunk
        if done(buf):
            return bytes(buf), 0, "done"
        if len(buf) > max_bytes:
            return bytes(buf[:max_bytes]), len(buf) - max_bytes, "flood"


class ShellSession:
    """One bash for a whole episode, in a sandbox over ``workdir`` (host) mounted at ``mount``."""

    def __init__(self, workdir: str | Path, mount: str = "/app", cwd: str | None = None, *,
                 limits: Limits = Limits(), env: dict[str, str] | None = None, uid: int | None = None,
                 extra_binds: list[tuple[str, str, bool]] = ()):
        self.workdir, self.mount, self.cwd = str(workdir), mount, cwd or mount
        self.limits, self.env = limits, dict(env or {})
        self.uid = episode_uid() if uid is None else uid
        self.binds = [(self.workdir, mount, True), *extra_binds]
        self.last_cwd = self.cwd  # where the next command runs (a restarted shell starts in cwd again)
        self._box: _Sandbox | None = None

    def start(self) -> "ShellSession":
        if self._box is None:
            self._box = _Sandbox(["/usr/bin/bash", "--noprofile", "--norc", "-c", LOOP, "bash", self.cwd], self.uid,
                                 self.binds, self.env, self.limits, stdin=True)
        return self

    def run(self, command: str, timeout: float | None = None) -> ShellResult:
        """Run one command line; its combined stdout/stderr, cut and decoded, and its exit status."""
        if "\0" in command:
            raise ValueError("a command cannot contain a NUL byte")
        restarted_before = self._box is None
        self.start()
        box = self._box
        assert box is not None and box.proc.stdin is not None and box.proc.stdout is not None
        tag = "__ECHO_" + os.urandom(12).hex()
        sentinel = b"\n" + tag.encode() + b" "
        try:
            box.proc.stdin.write(tag.encode() + b"\0" + command.encode("utf-8", "surrogateescape") + b"\0")
            box.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._restart()
            return self.run(command, timeout) if not restarted_before else ShellResult(
                "[the shell could not start]", None, restarted=True)

        def done(buf: bytearray) -> bool:
            i = buf.find(sentinel, max(0, len(buf) - (1 << 16) - len(sentinel)))
            return i >= 0 and buf.find(b"\n", i + len(sentinel)) >= 0

        deadline = time.monotonic() + (timeout or self.limits.command_timeout)
        raw, extra, why = _read_until(box.proc.stdout.fileno(), deadline, self.limits.output_bytes, done)
        if why == "done":
            i = raw.rfind(sentinel)
            status, _, cwd = raw[i + len(sentinel):].split(b"\n", 1)[0].partition(b" ")
            self.last_cwd = cwd.decode("utf-8", "backslashreplace")  # %q: one line, whatever the name holds
            return ShellResult(clean_output(raw[:i], 0, self.limits.output_chars), int(status or b"-1"),
                               cwd=self.last_cwd)
        self._restart()
        note = {"timeout": f"the command timed out after {timeout or self.limits.command_timeout:g} s",
                "flood": f"the command printed more than {self.limits.output_bytes} bytes and was stopped",
                "eof": "the shell exited"}[why]
        text = clean_output(raw, extra, self.limits.output_chars)
        text += ("" if not text or text.endswith("\n") else "\n") + \
            f"[{note}; a new shell started in {self.cwd}: files are kept, variables and background jobs are not]"
        return ShellResult(text, None, timed_out=why == "timeout", flooded=why == "flood", restarted=True,
                           cwd=self.last_cwd)

    def _restart(self) -> None:
        self.close()
        self.start()
        self.last_cwd = self.cwd

    def close(self) -> None:
        """Stop the shell and everything it started."""
        if self._box is not None:
            self._box.kill()
            self._box = None

    def __enter__(self) -> "ShellSession":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_script(script: str, uid: int, binds: list[tuple[str, str, bool]], cwd: str, *, limits: Limits = Limits(),
               env: dict[str, str] | None = None, timeout: float = 60.0) -> tuple[int | None, str]:
    """Run ``bash -c script`` in a fresh sandbox to its end (setup, verifier, gold commands).

    Returns (exit status, or None on timeout; output, cut to ``limits.output_chars``).
    Everything the script started is killed when it returns.
    """
    box = _Sandbox(["/usr/bin/bash", "--noprofile", "--norc", "-c", CD + script, "bash", cwd], uid, binds,
                   dict(env or {}), limits, stdin=False)
    try:
        assert box.proc.stdout is not None
        raw, extra, why = _read_until(box.proc.stdout.fileno(), time.monotonic() + timeout, limits.output_bytes,
                                      lambda _buf: False)
        code = None
        if why == "eof":
            try:
                code = box.proc.wait(timeout=max(0.1, timeout))
            except subprocess.TimeoutExpired:
                code = None
        return code, clean_output(raw, extra, limits.output_chars)
    finally:
        box.kill()
