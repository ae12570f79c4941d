"""A pooled sandbox worker: PID 1 of its own bubblewrap sandbox, one forked child per check.

Started only by ``echo_rl.environments.sandbox`` as ``bwrap ... --as-pid-1 --
python -I -S /sandbox/worker.py --uid U --gid G`` (stdlib only, never imports
the package). It refuses to run unless it is PID 1 of a PID namespace, because
it ends every check with ``kill(-1, SIGKILL)``: inside the namespace that kills
every process of the check (setsid'd and re-parented ones included) and
nothing else.

Protocol, one JSON object per line. On start, after dropping to the
unprivileged uid: ``{"ready": true, "uid": U}``. Request on stdin
``{"code", "timeout", "memory_mb", "result"}`` (``result``: an expression
evaluated after ``code`` whose ``repr`` is sent back, or null). Reply on stdout
``{"status", "detail", "value", "restart"}``; ``restart`` asks the host for a
fresh worker (something of the check could not be cleaned up).

The child's report travels on its own pipe (stdout and stderr are /dev/null),
is capped in size, and must be exactly one JSON object carrying the run's
random nonce, else the check is ``crashed``. This stops accidental output
(prints, stray writes to inherited descriptors) from counting as a report; code
running in the child can still write any report it likes, so a caller must
never trust ``status`` or ``value`` for more than the code itself could claim.
"""

import json
import os
import resource
import select
import shutil
import signal
import sys
import time

STATUSES = ("passed", "failed", "error", "timeout", "crashed")
FILE_SIZE_LIMIT = 1 << 20
OPEN_FILES_LIMIT = 64
MAX_REPORT_BYTES = 8 << 20  # a 1,000,000-character repr, JSON-escaped, fits
MAX_DETAIL = 2000
MAX_VALUE = 1_000_000
SCRATCH = ("/tmp", "/dev/shm")


def _drop_privileges(uid, gid):
    """Become ``uid``/``gid`` for real (bwrap started as root keeps CAP_SETUID/SETGID only for this)."""
    if os.getuid() != uid or os.getgid() != gid:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    if (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) != (uid, uid, gid, gid):
        raise SystemExit(f"sandbox worker: could not become uid {uid}")
    try:
        os.setuid(0)
    except OSError:  # EPERM; EINVAL in a user namespace, where uid 0 is not even mapped
        pass
    else:
        raise SystemExit("sandbox worker: could regain uid 0")
    import ctypes

    # Not dumpable: checks (same uid) can neither ptrace this worker nor open its /proc/1/mem or fds.
    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise SystemExit("sandbox worker: prctl(PR_SET_DUMPABLE, 0) failed")


def _apply_limits(timeout, memory_mb):
    cpu = max(1, int(timeout + 1))
    limits = [(resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT),
              (resource.RLIMIT_NOFILE, OPEN_FILES_LIMIT), (resource.RLIMIT_CORE, 0),
              (resource.RLIMIT_NPROC, 0)]  # holds: the uid is unprivileged outside the sandbox too
    if memory_mb:
        limits.append((resource.RLIMIT_AS, int(memory_mb) << 20))
    for which, value in limits:
        resource.setrlimit(which, (value, value))


def _child(req, nonce, wfd):
    os.setsid()
    os.chdir("/tmp")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, wfd)
    os.closerange(wfd + 1, 1 << 16)
    status, detail, value = "passed", "", None
    try:
        _apply_limits(float(req["timeout"]), req.get("memory_mb"))
        scope = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(compile(req["code"], "<sandbox>", "exec"), scope)
        if req.get("result") is not None:
            value = repr(eval(compile(req["result"], "<result>", "eval"), scope))
            if len(value) > MAX_VALUE:
                detail = f"the result's repr has {len(value)} characters (max {MAX_VALUE})"
                status, value = "error", None
    except AssertionError as exc:
        status, detail = "failed", f"AssertionError: {exc}" if str(exc) else "AssertionError"
    except MemoryError:
        status, detail = "error", "MemoryError: the memory limit was reached"
    except RecursionError:
        status, detail = "error", "RecursionError: maximum recursion depth exceeded"
    except BaseException as exc:  # noqa: BLE001 - any failure of the code is a result, not a crash
        try:
            status, detail = "error", f"{type(exc).__name__}: {exc}"
        except BaseException:  # noqa: BLE001 - an exception whose str() fails
            status, detail = "error", type(exc).__name__
    try:
        payload = json.dumps({"nonce": nonce, "status": status, "detail": detail[:MAX_DETAIL],
                              "value": value}).encode()
        while payload:
            payload = payload[os.write(wfd, payload):]
    finally:
        os._exit(0)


def _read_report(rfd, timeout):
    chunks, size, end = [], 0, time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return None, True
        ready, _, _ = select.select([rfd, 0], [], [], left)
        if 0 in ready:
            _host_gone()
        if not ready:
            continue
        data = os.read(rfd, 65536)
        if not data:
            return b"".join(chunks), False
        size += len(data)
        if size > MAX_REPORT_BYTES:
            return b"", False
        chunks.append(data)


def _host_gone():
    """stdin is readable mid-check: EOF, as the host sends nothing until it has the reply. The host (and bwrap,
    ``--die-with-parent``) died. bwrap's death signal does not reach us when started as root (we changed uid),
    so end the check and the whole namespace now rather than at the check's timeout."""
    _kill_all_but_me()
    os._exit(0)


def _kill_all_but_me():
    """SIGKILL every other process of the namespace, then reap them; returns the wait statuses by pid."""
    statuses = {}
    for _ in range(1000):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return statuses
            if pid == 0:
                break
            statuses[pid] = status
        time.sleep(0.001)
    raise SystemExit("sandbox worker: processes of a check survive SIGKILL")


def _clean_scratch():
    """Empty the writable places; False if something could not be removed (the host then restarts us)."""
    def force(func, path, _exc):
        try:
            os.chmod(os.path.dirname(path), 0o700)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
            func(path)
        except OSError:
            pass

    clean = True
    for root in SCRATCH:
        try:
            if os.stat(root).st_uid == os.getuid():
                os.chmod(root, 0o1777)  # a check may have chmod'ed it
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            path = os.path.join(root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, onerror=force)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        clean = clean and not os.listdir(root)
    return clean


def _parse_report(raw, nonce, wait_status):
    try:
        report = json.loads(raw.decode())
        ok = (isinstance(report, dict) and set(report) == {"nonce", "status", "detail", "value"}
              and report["nonce"] == nonce and report["status"] in STATUSES
              and isinstance(report["detail"], str) and (report["value"] is None or isinstance(report["value"], str)))
    except (ValueError, UnicodeDecodeError):
        ok = False
    if ok:
        return {"status": report["status"], "detail": report["detail"][:MAX_DETAIL], "value": report["value"]}
    sig = os.WTERMSIG(wait_status) if wait_status is not None and os.WIFSIGNALED(wait_status) else None
    if sig == signal.SIGXCPU:
        return {"status": "timeout", "detail": "CPU time limit reached", "value": None}
    why = f"was killed by signal {sig}" if sig else "gave no valid report"
    return {"status": "crashed", "detail": f"the sandboxed process {why} (a resource limit?)", "value": None}


def run_one(req):
    timeout = float(req["timeout"])
    nonce = os.urandom(16).hex()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        _child(req, nonce, wfd)
    os.close(wfd)
    raw, timed_out = _read_report(rfd, timeout)
    os.close(rfd)
    if not timed_out:  # the report is in; let the child exit by itself (unreaped), its exit status matters
        end = time.monotonic() + 1.0
        while time.monotonic() < end and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            time.sleep(0.0005)
    statuses = _kill_all_but_me()
    restart = not _clean_scratch()
    if timed_out:
        result = {"status": "timeout", "detail": f"timed out after {timeout:g} s", "value": None}
    else:
        result = _parse_report(raw, nonce, statuses.get(pid))
    result["restart"] = restart
    return result


def main():
    args = sys.argv[1:]
    uid, gid = int(args[args.index("--uid") + 1]), int(args[args.index("--gid") + 1])
    if os.getpid() != 1:
        raise SystemExit("sandbox worker: must run as PID 1 of its own PID namespace (bwrap --as-pid-1)")
    _drop_privileges(uid, gid)
    # As PID 1, only signals with a handler reach us from inside the namespace: install none (SIGINT too).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for name in ("string", "math", "re", "collections", "itertools", "functools", "operator", "copy", "heapq",
                 "bisect", "random", "datetime", "decimal", "fractions", "statistics", "typing", "json",
                 "textwrap", "unicodedata", "array", "numbers", "enum", "dataclasses", "contextlib", "calendar"):
        try:
            __import__(name)  # warm modules, so a check's imports cost nothing after the fork
        except ImportError:
            pass
    _clean_scratch()
    sys.stdout.write(json.dumps({"ready": True, "uid": os.getuid()}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if line.strip():
            sys.stdout.write(json.dumps(run_one(json.loads(line))) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
