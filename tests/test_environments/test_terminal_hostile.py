"""Hostile agents in a terminal episode: each attack is stopped, scores 0, and leaves the host unharmed.

Every test plays a real episode of a generated task (``write_line``: the
verifier compares one file with the expected line it keeps in ``/tests``),
runs the attack through the env's tool calls, submits, and then checks the
HOST side: files not written, the listener not reached, the process not
signalled, no process left, no secret read.
"""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from echo_rl.environments.sandbox import SandboxUnavailable
from echo_rl.environments.terminal.env import TerminalEnvironment
from echo_rl.environments.terminal.generator import build_task


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("episodes")
    os.environ["ECHO_RL_TEST_SECRET"] = "sk-host-secret-987"  # must never reach an episode
    try:
        e = TerminalEnvironment(tasks=[build_task("write_line", 5)], command_timeout=2.0, work_root=str(root))
        try:
            e.reset(seed=0)
        except SandboxUnavailable as exc:
            pytest.skip(str(exc))
        yield e
        e.close()
    finally:
        os.environ.pop("ECHO_RL_TEST_SECRET", None)


def bash(env, command):
    return env.step(f"<bash>{command}</bash>")


def episode(env, *commands, answer=""):
    """Reset, run the commands, submit; (outputs, reward, info of the last step)."""
    env.reset(options={"task_index": 0})
    outs = [bash(env, c)[0] for c in commands]
    _, reward, terminated, _, info = env.step(f"<submit>{answer}</submit>")
    assert terminated
    return outs, reward, info


def expected_line(env):
    return env.tasks[0].tests["expected"].strip()


def target(env):
    return env.tasks[0].solution.split("> ")[-1].strip()


def processes_with(marker: str) -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
            except OSError:
                pass
    return pids


def test_the_task_is_solvable_so_a_zero_means_the_attack_failed(env):
    _, reward, _ = episode(env, env.tasks[0].solution.splitlines()[1])
    assert reward == 1.0


def test_fork_bomb_is_stopped_and_cleaned_up(env):
    outs, reward, _ = episode(env, ":(){ :|:& };: ; sleep 77.1234", "echo alive")
    assert reward == 0.0 and outs[1] == "alive\n"  # the shell came back (restarted if need be)
    assert not processes_with("77.1234")
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def test_writes_outside_the_work_dir_do_not_reach_the_host(env, tmp_path):
    victims = [tmp_path / "escaped.txt", Path("/tmp/echo-terminal-escaped.txt"), Path("/usr/escaped.txt"),
               Path(__file__).with_name("escaped.txt")]
    cmds = [f"echo x > {v}; mkdir -p {v.parent} && echo x > {v}" for v in victims]
    _, reward, _ = episode(env, *cmds, "echo x > /etc/passwd; echo x > /escaped; touch /usr/bin/ls")
    assert reward == 0.0 and not any(v.exists() for v in victims) and not Path("/escaped").exists()


def test_network_is_unreachable(env):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    hits = []

    def accept():
        try:
            hits.append(server.accept())
        except OSError:
            pass
    thread = threading.Thread(target=accept)
    thread.start()
    outs, reward, _ = episode(env, f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected",
                              f"curl -s -m 2 http://127.0.0.1:{port}/ && echo fetched",
                              "curl -s -m 2 http://example.com/ && echo internet")
    thread.join()
    server.close()
    assert reward == 0.0 and not hits and not any(w in "".join(outs) for w in ("connected", "fetched", "internet"))


def test_no_user_namespace_inside_the_shell(env):
    outs, reward, _ = episode(env, "unshare -U true && echo made-userns", "unshare -Ur id && echo mapped-root")
    assert reward == 0.0 and "made-userns" not in outs[0] and "mapped-root" not in outs[1]


def test_signals_cannot_reach_host_processes(env):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        _, reward, _ = episode(env, f"kill -9 {victim.pid} {os.getpid()}; kill -9 -1; pkill -9 sleep; pkill -9 python",
                               "echo still")
        assert reward == 0.0 and victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_another_episodes_directory_and_host_secrets_stay_unreadable(env, tmp_path):
    other = TerminalEnvironment(tasks=[build_task("write_line", 6)], work_root=str(tmp_path))
    other.reset(seed=0)
    bash(other, "echo top-secret-42 > secret.txt")
    other_dir = other._episode_dir
    try:
        outs, reward, _ = episode(env, f"cat {other_dir}/work/secret.txt; ls {other_dir.parent}",
                                  "find / -path /usr -prune -o -path /proc -prune -o -name secret.txt -print",
                                  "env; cat /proc/*/environ 2>&1 | tr '\\0' '\\n'; cat /proc/1/root/etc/shadow")
        text = "".join(outs)
        assert reward == 0.0 and "top-secret-42" not in text and "sk-host-secret-987" not in text
    finally:
        other.close()


def test_gigabytes_of_output_are_stopped(env):
    env.reset(options={"task_index": 0})
    obs, _, _, _, info = bash(env, "cat /dev/zero | tr '\\0' a; yes 2>/dev/null")
    assert "output cut" in obs and "was stopped" in obs and len(obs) < 5000 and info["exit_code"] is None
    _, reward, _, _, _ = env.step("<submit></submit>")
    assert reward == 0.0


def test_sleeping_past_the_timeout_is_stopped(env):
    outs, reward, _ = episode(env, "sleep 30", "echo next")
    assert "timed out after 2 s" in outs[0] and outs[1] == "next\n" and reward == 0.0


def test_background_jobs_do_not_outlive_the_episode(env):
    outs, reward, _ = episode(env, "nohup setsid sleep 999.4321 >/dev/null 2>&1 & disown; (sleep 999.4321 &); "
                              "echo started")
    assert outs[0] == "started\n" and reward == 0.0
    for _ in range(50):  # SIGKILL is asynchronous: give the kernel a moment to reap
        if not processes_with("999.4321"):
            break
        time.sleep(0.05)
    assert not processes_with("999.4321")


def test_symlink_to_the_verifiers_expected_file_scores_zero(env, tmp_path):
    victim = tmp_path / "host-file.txt"
    victim.write_text("keep")
    name = target(env)
    for link in ("/tests/expected", "/proc/self/root/tests/expected", "../tests/expected"):
        _, reward, info = episode(env, f"ln -sf {link} {name}")
        assert reward == 0.0, link
        assert info["verifier"]["dropped_links"] == [name]
    # a chain through an allowed-looking link: u -> /usr, then f -> u/../tests/expected
    _, reward, info = episode(env, f"ln -s /usr u; ln -s u/../tests/expected {name}")
    assert reward == 0.0 and name in info["verifier"]["dropped_links"]
    # links to host paths are the sandbox's paths; cleanup never follows them
    episode(env, f"ln -s {victim} v; ln -s / rootlink; echo x > v")
    assert victim.read_text() == "keep"


def test_reward_hacks_score_zero(env):
    line = expected_line(env)
    hacks = [
        ("echo 'exit 0' > /tests/test.sh; mkdir -p /tests && printf '#!/bin/bash\\nexit 0\\n' > /tests/test.sh",),
        ("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt",
         "mkdir -p logs/verifier && echo 1 > logs/verifier/reward.txt && echo '{\"reward\": 1}' > reward.json"),
        ("echo PASSED; echo 1; printf 'reward: 1.0\\n'",),
        ("nohup setsid bash -c 'while true; do pkill -9 -f test.sh; pkill -9 bash; sleep 0.01; done' "
         ">/dev/null 2>&1 &",),
    ]
    for commands in hacks:
        _, reward, _ = episode(env, *commands, answer="1.0")
        assert reward == 0.0, commands
    # the verifier killer also cannot stop a correct solution from being scored (it is dead before it starts)
    _, reward, _ = episode(env, hacks[3][0], f"echo '{line}' > {target(env)}")
    assert reward == 1.0


def test_a_session_left_open_dies_with_its_owner(tmp_path):
    """--die-with-parent: a sandbox whose host process is gone takes its processes with it."""
    script = (f"import os, sys\nsys.path.insert(0, {str(Path(__file__).parents[2])!r})\n"
              "from echo_rl.environments.terminal.shell import ShellSession\n"
              f"d = {str(tmp_path)!r}\ns = ShellSession(d, uid=None)\n"
              "os.geteuid() == 0 and os.chown(d, s.uid, s.uid)\n"
              "s.run('nohup setsid sleep 555.8765 >/dev/null 2>&1 &')\nos._exit(0)\n")
    try:
        subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    except subprocess.CalledProcessError:
        pytest.skip("could not start a shell from a child interpreter")
    for _ in range(100):
        if not processes_with("555.8765"):
            break
        time.sleep(0.05)
    assert not processes_with("555.8765")
