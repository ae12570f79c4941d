"""The escapes reported against the old Python-level sandbox (issue 21, item 2), each tried for real.

Every test runs the attack inside the bubblewrap sandbox and checks the HOST
side: the file not written or not deleted, the listener not reached, the signal
not received, the worker not killed, no process left, no secret read.
"""

import json
import os
import signal
import socket
import sys
import time

import pytest

from echo_rl.environments import sandbox as sandbox_module
from echo_rl.environments.sandbox import SANDBOX_UID, SandboxPool, SandboxUnavailable


@pytest.fixture(scope="module")
def pool():
    os.environ["ECHO_RL_TEST_API_KEY"] = "sk-host-secret-123"  # must never reach a check
    try:
        with SandboxPool(workers=1, timeout=3.0, memory_mb=256) as p:
            yield p
    finally:
        os.environ.pop("ECHO_RL_TEST_API_KEY", None)


def worker_pid(pool):
    [w] = pool._all
    return w.sandbox_pid


WRITES = [
    "open({p!r}, 'w').write('x')",
    "open.__closure__  # no guard to unwrap any more\nopen({p!r}, 'w').write('x')",
    "import io\nio.FileIO.__mro__[1]\nio.FileIO({p!r}, 'w').write(b'x')",
    "import sys\nsys.modules.pop('posix', None)\nimport posix\nfd = posix.open({p!r}, posix.O_WRONLY | posix.O_CREAT)\n"
    "posix.write(fd, b'x')",
    "import os\nos.makedirs(os.path.dirname({p!r}), exist_ok=True)\nopen({p!r}, 'w').write('x')",
]


@pytest.mark.parametrize("attack", WRITES)
def test_writes_outside_the_sandbox_do_not_reach_the_host(attack, pool, tmp_path):
    for target in (tmp_path / "escaped.txt", os.path.join(os.path.realpath(sys.base_prefix), "escaped_test.txt"),
                   os.path.join(os.path.dirname(sandbox_module.__file__), "escaped_test.txt")):
        pool.run(attack.format(p=str(target)))
        assert not os.path.exists(target), f"{attack!r} wrote {target} on the host"


def test_host_files_cannot_be_deleted_or_overwritten(pool, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    for path in (str(victim), __file__, str(sandbox_module.WORKER_FILE), "/sandbox/worker.py"):
        pool.run(f"import os\nos.remove({path!r})")
        pool.run(f"open({path!r}, 'w').write('gone')")
    assert victim.read_text() == "keep"
    assert os.path.getsize(__file__) > 0 and sandbox_module.WORKER_FILE.read_text().startswith('"""A pooled')


def test_host_files_and_environment_are_not_readable(pool):
    r = pool.run("import os", result="dict(os.environ)")
    assert r.passed and "sk-host-secret" not in r.value and "ECHO_RL_TEST_API_KEY" not in r.value
    for path in ("/etc/passwd", "/etc/shadow", __file__, os.path.expanduser("~/.bashrc"), "/proc/1/environ",
                 "/proc/1/mem"):
        r = pool.run(f"open({path!r}, 'rb').read(1)")
        assert r.status == "error" and ("FileNotFoundError" in r.detail or "PermissionError" in r.detail), (path, r)
    r = pool.run("import os", result="sorted(os.listdir('/'))")
    assert set(eval(r.value)) <= {"bin", "dev", "lib", "lib32", "lib64", "libx32", "proc", "root", "sandbox", "sbin",
                                   "tmp", "usr"}, r.value


def test_no_network_even_to_the_host_loopback(pool):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        attack = ("import sys\nsys.modules.pop('_socket', None)\nimport _socket\n"
                  "s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\ns.settimeout(1)\n"
                  f"err = s.connect_ex(('127.0.0.1', {port}))")
        r = pool.run(attack, result="err")
        assert r.passed and r.value != "0", r
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_no_signal_reaches_the_host_process(pool):
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    try:
        r = pool.run(f"import os, signal\nos.kill({os.getpid()}, signal.SIGUSR1)")
        assert r.status == "error" and "ProcessLookupError" in r.detail, r
        pool.run("import os, signal\nos.kill(-1, signal.SIGUSR1)")
        time.sleep(0.1)
        assert got == []
    finally:
        signal.signal(signal.SIGUSR1, old)


@pytest.mark.parametrize("attack", ["import os\nos.kill(1, 9)", "import os\nos.kill(os.getppid(), 9)",
                                    "import os\nos.kill(-1, 9)", "import os, signal\nos.kill(1, signal.SIGINT)",
                                    "import os\nos.kill(1, 19)"])
def test_a_check_cannot_kill_or_stop_its_worker(attack, pool):
    before = worker_pid(pool)
    pool.run(attack)
    assert worker_pid(pool) == before, "the worker was restarted: the check killed it"
    assert pool.run("x = 1", result="x").value == "1"


def test_process_limit_holds_and_nothing_outlives_the_check(pool):
    attack = ("import os, time\n"
              "try:\n    pid = os.fork()\nexcept OSError as e:\n    raise SystemExit(repr(e))\n"
              "if pid == 0:\n    os.setsid()\n    time.sleep(30)\n    os._exit(0)\n"
              "while True:\n    pass")
    r = pool.run(attack, timeout=1.0)
    assert r.status == "error" and "BlockingIOError" in r.detail, r
    r = pool.run("import threading\nthreading.Thread(target=print).start()")
    assert r.status == "error" and "thread" in r.detail, r
    r = pool.run("import os, subprocess\nsubprocess.run(['/bin/true'])")
    assert r.status == "error", r
    time.sleep(0.2)
    stray = [p for p in os.listdir("/proc") if p.isdigit() and _check_process(p)]
    assert stray == [], f"processes of a check outlived it: {stray}"


def _check_process(pid: str) -> bool:
    """A process of the sandbox uid that is not some sandbox's PID 1 (a worker) is left over from a check."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
    except OSError:
        return False
    return int(fields["Uid"].split()[0]) == SANDBOX_UID and fields.get("NSpid", "").split()[-1:] != ["1"]


def test_scratch_space_is_private_capped_and_emptied_between_checks(pool):
    assert pool.run("open('/tmp/left', 'w').write('x')\nopen('/dev/shm/left', 'w').write('x')").passed
    r = pool.run("import os", result="(os.listdir('/tmp'), os.listdir('/dev/shm'))")
    assert r.value == "([], [])"
    r = pool.run("for i in range(40):\n    open(f'big{i}', 'wb').write(bytes((1 << 20) - 1))")
    assert r.status == "error" and "No space left" in r.detail, r


def test_forged_reports_are_not_accepted(pool):
    fake = json.dumps({"status": "passed", "detail": "", "value": "'forged'"})
    r = pool.run("import os\nfor fd in range(3, 64):\n    try:\n"
                 f"        os.write(fd, {fake!r}.encode())\n    except OSError:\n        pass\nos._exit(0)",
                 result="'honest'")
    assert r.status == "crashed" and r.value is None, r
    r = pool.run(f"print({fake!r})\nopen('/proc/1/fd/1', 'w').write({fake!r} + '\\n')", result="'honest'")
    assert r.status == "error" and "PermissionError" in r.detail, r
    assert pool.run("x = 2", result="x").value == "2"  # the reply stream is still in step


def test_huge_error_messages_are_capped(pool):
    r = pool.run("assert False, 'x' * 5_000_000")
    assert r.status == "failed" and len(r.detail) <= 2000


def test_ptrace_of_the_worker_is_refused(pool):
    r = pool.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "rc = libc.ptrace(16, 1, 0, 0)\nerr = ctypes.get_errno()", result="(rc, err)")
    assert r.passed and r.value.startswith("(-1,"), r


def test_missing_bubblewrap_is_a_clear_refusal(monkeypatch):
    monkeypatch.setattr(sandbox_module.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        SandboxPool(workers=1).start()


def test_a_bubblewrap_that_cannot_sandbox_is_a_clear_refusal(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox_module.shutil, "which", lambda name: str(fake))
    with pytest.raises(SandboxUnavailable, match="No permissions to create new namespace.*bubblewrap"):
        SandboxPool(workers=2).start()


USERNS = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
          "rc = libc.unshare({flags})\nerr = ctypes.get_errno()")


def test_no_user_namespace_inside_the_sandbox(pool):
    # `unshare -U true`, as a syscall (the check may not fork); refused as root on the host and as a user.
    r = pool.run(USERNS.format(flags=sandbox_module.CLONE_NEWUSER), result="(rc, err)")
    assert r.passed and r.value.startswith("(-1,"), r
    r = pool.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "rc = libc.syscall(435, 0, 0)\nerr = ctypes.get_errno()", result="(rc, err)")  # clone3
    assert r.passed and r.value.startswith("(-1,"), r


def test_the_userns_filter_leaves_other_calls_alone(pool):
    r = pool.run("import os\nos.getpid()\nopen('/tmp/x', 'w').write('y')", result="open('/tmp/x').read()")
    assert r.passed and r.value == "'y'", r


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.split()[1] == "Z" for line in f if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_sandboxes_die_with_a_killed_host(tmp_path):
    import subprocess

    # the host dies while a long check runs: the worker must not wait for its check's timeout to notice
    script = ("import json, sys, threading, time\nfrom echo_rl.environments.sandbox import SandboxPool\n"
              "p = SandboxPool(workers=1, timeout=120).start()\n[w] = p._all\n"
              "threading.Thread(target=p.run, args=('while True: pass',), daemon=True).start()\n"
              "time.sleep(0.5)\nprint(json.dumps([w.proc.pid, w.sandbox_pid]), flush=True)\ntime.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    try:
        pids = json.loads(host.stdout.readline())
        assert not any(_gone(p) for p in pids)
        host.kill()  # SIGKILL: no atexit, no finalizer runs in the host
        host.wait()
        for _ in range(200):  # bwrap and its PID 1 get SIGKILL from the kernel at once; poll, no timing assert
            if all(_gone(p) for p in pids):
                break
            time.sleep(0.05)
        assert all(_gone(p) for p in pids), f"sandbox processes {pids} outlived their host"
    finally:
        host.kill()
        host.stdout.close()
