"""Pooled execution of untrusted Python snippets inside an OS-level (bubblewrap) sandbox.

A :class:`SandboxPool` keeps ``workers`` sandboxes alive. Each is one
``bwrap`` container whose PID 1 is a small stdlib-only interpreter
(``_sandbox_worker.py``); every check runs in a fresh fork of it, so a check
costs a fork, not an interpreter start. The boundary (docs/environments.md,
"Sandbox") is the kernel's, not Python's:

- a real unprivileged uid (65534): started as root, bwrap keeps only
  CAP_SETUID/CAP_SETGID and the worker drops to it before any check runs;
  started as a normal user, bwrap maps the user to 65534 in a user namespace;
- new PID, network (loopback only), IPC and UTS namespaces: no host process is
  visible or signalable, no host port reachable;
- a private root: read-only /usr, /lib*, the Python prefix and the worker file;
  a fresh /proc and /dev; the only writable places are a size-capped tmpfs
  /tmp and /dev/shm, emptied after every check; no host file, /etc or $HOME;
- a clean environment (``--clearenv``): no host variables, no API keys;
- no new user namespaces inside (a user namespace would hand the check a full
  capability set over its own mounts and namespaces): ``--disable-userns``
  where bwrap makes one, and a seccomp filter that refuses ``unshare`` /
  ``clone`` with CLONE_NEWUSER (and ``clone3``, so libc falls back to
  ``clone``) in every case, which also covers a host running as root;
- ``--die-with-parent``: a killed host takes its sandboxes with it;
- per check: rlimits on CPU, address space, file size, open files and
  processes (RLIMIT_NPROC = 0 holds, as the uid is unprivileged), and, at the
  end or on timeout, ``kill(-1, SIGKILL)`` from PID 1 removes every process of
  the check, setsid'd or re-parented ones too.

Where bubblewrap is missing or cannot create the namespaces the pool refuses
(:class:`SandboxUnavailable`, saying how to install it); it never falls back to
running code unconfined. Nothing starts in the constructor; the pool starts on
first use (or ``start()``) and stops on ``close()`` / context exit / exit.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import platform
import queue
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKER_FILE = Path(__file__).with_name("_sandbox_worker.py")
STATUSES = ("passed", "failed", "error", "timeout", "crashed")
SANDBOX_UID = SANDBOX_GID = 65534  # nobody / nogroup
SCRATCH_BYTES = 16 << 20  # size of the sandbox's /tmp and /dev/shm (tmpfs, so it is memory)
START_TIMEOUT = 30.0
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`, as root; Fedora: `dnf install "
                "bubblewrap`; `make setup-test` does it when run as root) and allow user namespaces if not root")


class SandboxUnavailable(RuntimeError):
    """The OS-level sandbox cannot run here; untrusted code is refused rather than run unconfined."""


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one snippet, as reported from inside the sandbox.

    ``passed``: it ran to the end without an exception. ``value``: the ``repr``
    of the requested result expression. Both come from the sandboxed code's
    own process, so code that is itself untrusted can forge them; callers that
    score untrusted code must not rely on them (CRUXEval only runs trusted
    functions on literal arguments, and parses ``value`` as a literal).
    """

    status: str
    detail: str = ""
    value: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"


# seccomp_data: nr at 0, arch at 4, args[0] (low 32 bits, little-endian) at 16.
# machine -> (AUDIT_ARCH, unshare, clone, clone3) syscall numbers.
_SYSCALLS = {"x86_64": (0xC000003E, 272, 56, 435), "aarch64": (0xC00000B7, 97, 220, 435)}
CLONE_NEWUSER = 0x10000000


def userns_filter() -> bytes | None:
    """A classic-BPF seccomp program refusing new user namespaces (None on an architecture not listed).

    ``unshare``/``clone`` with CLONE_NEWUSER get EPERM; ``clone3`` (flags in
    memory BPF cannot read) gets ENOSYS, on which libc falls back to ``clone``;
    any syscall of a foreign ABI (32-bit calls on a 64-bit host) gets EPERM.
    """
    nums = _SYSCALLS.get(platform.machine())
    if nums is None:
        return None
    arch, unshare, clone, clone3 = nums
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    prog = [(ld, 0, 0, 4), (jeq, 0, 8, arch),          # 0-1: a foreign ABI -> 10
            (ld, 0, 0, 0), (jeq, 7, 0, clone3),        # 2-3: clone3 -> 11
            (jeq, 2, 0, unshare), (jeq, 1, 0, clone),  # 4-5: -> 7
            (ret, 0, 0, allow),                        # 6
            (ld, 0, 0, 16), (jset, 1, 0, CLONE_NEWUSER),  # 7-8: flags & CLONE_NEWUSER -> 10
            (ret, 0, 0, allow),                        # 9
            (ret, 0, 0, eperm), (ret, 0, 0, enosys)]   # 10, 11
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def seccomp_fd() -> int | None:
    """A readable fd holding :func:`userns_filter` for ``bwrap_command(seccomp_fd=...)``; the caller passes it
    to the child (``pass_fds``) and closes it after the start. None where no filter exists for this machine."""
    prog = userns_filter()
    if prog is None:
        return None
    r, w = os.pipe()
    try:
        os.write(w, prog)  # a few hundred bytes: fits the pipe buffer, no reader needed yet
    finally:
        os.close(w)
    return r


def bwrap_command(python: str | None = None, *, seccomp_fd: int | None = None) -> list[str]:
    """The bubblewrap command line of one worker (raises SandboxUnavailable without ``bwrap``).

    ``seccomp_fd`` (from :func:`seccomp_fd`) adds the filter that refuses new
    user namespaces; without it a sandbox started as root can still make one.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"the code sandbox needs bubblewrap (`bwrap` is not on PATH): {INSTALL_HINT}")
    python = os.path.realpath(python or sys.executable)
    cmd = [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try",
           "--as-pid-1", "--new-session", "--clearenv", "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", "/tmp",
           "--setenv", "PATH", "/usr/bin:/bin", "--hostname", "sandbox"]
    if os.geteuid() == 0:  # no user namespace: the worker becomes a real unprivileged uid itself
        cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--disable-userns"]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            cmd += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            cmd += ["--ro-bind", d, d]
    for d in {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(python))}:
        if not (d + "/").startswith("/usr/"):
            parents = [str(a) for a in reversed(Path(d).parents) if str(a) != "/"]
            for a in parents:  # traversable by the sandbox uid even where the host's (e.g. /root) is not
                cmd += ["--perms", "0755", "--dir", a]
            cmd += ["--ro-bind", d, d]
    cmd += ["--ro-bind", str(WORKER_FILE), "/sandbox/worker.py", "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(SCRATCH_BYTES), "--tmpfs", "/tmp",
            "--perms", "1777", "--size", str(SCRATCH_BYTES), "--tmpfs", "/dev/shm",
            "--chdir", "/tmp", "--info-fd", "{info_fd}", "--",
            python, "-I", "-S", "/sandbox/worker.py", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    return cmd


def _read_line(stream, deadline: float) -> bytes:
    fd = stream.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("sandbox worker did not answer")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            return stream.readline()


class _Worker:
    def __init__(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        info_r, info_w = os.pipe()
        filter_fd = seccomp_fd()
        cmd = [str(info_w) if a == "{info_fd}" else a for a in bwrap_command(seccomp_fd=filter_fd)]
        self.sandbox_pid: int | None = None
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                         start_new_session=True, cwd="/", close_fds=True,
                                         pass_fds=(info_w,) if filter_fd is None else (info_w, filter_fd),
                                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        except OSError as exc:
            os.close(info_r)
            self.stderr.close()
            raise SandboxUnavailable(f"could not run {cmd[0]} ({exc}); {INSTALL_HINT}") from None
        finally:
            os.close(info_w)
            if filter_fd is not None:
                os.close(filter_fd)
        try:
            with os.fdopen(info_r, "rb") as info:
                self.sandbox_pid = json.loads(info.read() or b"{}").get("child-pid")
            line = _read_line(self.proc.stdout, time.monotonic() + START_TIMEOUT)
            hello = json.loads(line) if line else {}
            if hello.get("ready") is not True or hello.get("uid") != SANDBOX_UID:
                raise RuntimeError(f"unexpected greeting {line[:200]!r}")
        except (OSError, ValueError, RuntimeError, TimeoutError) as exc:
            self.stderr.seek(0)
            why = self.stderr.read()[-2000:].decode(errors="replace").strip() or str(exc)
            self.kill()
            raise SandboxUnavailable(f"the bubblewrap sandbox did not start ({why}); {INSTALL_HINT}") from None

    def run(self, code: str, timeout: float, memory_mb: int | None, result: str | None) -> tuple[ExecResult, bool]:
        req = json.dumps({"code": code, "timeout": timeout, "memory_mb": memory_mb, "result": result}) + "\n"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(req.encode())
        self.proc.stdin.flush()
        line = _read_line(self.proc.stdout, time.monotonic() + timeout + 10.0)  # a backstop: the worker enforces it
        if not line:
            raise RuntimeError("sandbox worker exited")
        data = json.loads(line)
        return ExecResult(data["status"], data.get("detail", ""), data.get("value")), bool(data.get("restart"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        kill_sandbox(self.proc, self.sandbox_pid, self.stderr)


def kill_sandbox(proc: subprocess.Popen, sandbox_pid: int | None, *streams: Any) -> None:
    """Kill one bwrap tree and close its pipes (and ``streams``): the code and terminal sandboxes' one way."""
    # PID 1 of the sandbox dies -> the kernel kills its whole PID namespace; then bwrap itself.
    # The sandbox pid cannot have been reused while bwrap, its parent, has not exited and reaped it.
    for pid in (sandbox_pid if proc.poll() is None else None, proc.pid):
        if pid:
            try:
                os.kill(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for stream in (proc.stdin, proc.stdout, *streams):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass


class SandboxPool:
    """``run(code)`` / ``run_many(codes)`` over ``workers`` persistent sandbox workers."""

    def __init__(self, workers: int = 2, timeout: float = 3.0, memory_mb: int | None = 512):
        if workers < 1:
            raise ValueError(f"workers={workers!r} is invalid: must be >= 1")
        if timeout <= 0:
            raise ValueError(f"timeout={timeout!r} is invalid: must be > 0")
        self.workers = workers
        self.timeout = float(timeout)
        self.memory_mb = memory_mb
        self._idle: queue.Queue[_Worker] | None = None
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._finalizer = weakref.finalize(self, SandboxPool._shutdown, self._all)

    def start(self) -> "SandboxPool":
        with self._lock:
            if self._idle is None:
                try:
                    for _ in range(self.workers):
                        self._all.append(_Worker())
                except SandboxUnavailable:
                    SandboxPool._shutdown(self._all)
                    raise
                self._idle = queue.Queue()
                for w in self._all:
                    self._idle.put(w)
        return self

    def run(self, code: str, timeout: float | None = None, result: str | None = None) -> ExecResult:
        """Run ``code``; with ``result``, also evaluate that expression and return its ``repr`` as ``value``."""
        self.start()
        assert self._idle is not None
        worker = self._idle.get()
        restart = False
        try:
            out, restart = worker.run(code, timeout or self.timeout, self.memory_mb, result)
        except (TimeoutError, RuntimeError, OSError, ValueError, KeyError) as exc:
            out = ExecResult("crashed", f"sandbox worker failed ({exc}); restarted")
            restart = True
        try:
            if restart or not worker.alive():
                worker = self._replace(worker)
        finally:
            self._idle.put(worker)
        return out

    def run_many(self, codes: list[str], timeout: float | None = None,
                 results: list[str | None] | None = None) -> list[ExecResult]:
        """Run snippets concurrently on the pool; results in input order."""
        self.start()
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
        exprs = results if results is not None else [None] * len(codes)
        if len(exprs) != len(codes):
            raise ValueError(f"results has {len(exprs)} entries for {len(codes)} codes: must be equal")
        return list(self._executor.map(lambda c, e: self.run(c, timeout, e), codes, exprs))

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        new = _Worker()
        with self._lock:
            self._all[self._all.index(worker)] = new
        return new

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        SandboxPool._shutdown(self._all)
        self._idle = None

    @staticmethod
    def _shutdown(workers: list[_Worker]) -> None:
        for w in workers:
            w.kill()
        workers.clear()

    def __enter__(self) -> "SandboxPool":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


_SHARED: dict[tuple, SandboxPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(workers: int, timeout: float, memory_mb: int | None) -> SandboxPool:
    """One pool per (workers, timeout, memory) per process, so many environments share workers."""
    key = (workers, float(timeout), memory_mb)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = SandboxPool(workers, timeout, memory_mb)
        return _SHARED[key]


@atexit.register
def _close_shared() -> None:
    for pool in _SHARED.values():
        pool.close()
