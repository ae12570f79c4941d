import os
import subprocess
import sys

import numpy as np
import pytest

from echo_rl.distributed import LearnerClient, ReplayClient, ReplayServerError


def _cli(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "echo_rl.cli", "replay-server", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_replay_server_command_serves_writers_and_learners(tmp_path):
    metrics = tmp_path / "m.jsonl"
    proc = _cli("--leaf", "obs:float32:3", "--leaf", "done:bool:", "--port", "0", "--capacity", "1000",
                "--min-experiences", "10", "--duration", "8", "--metrics-every", "0.5", "--metrics-jsonl", str(metrics))
    try:
        line = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in line, line + proc.stderr.read()
        port = int(line.split("127.0.0.1:")[1].split()[0])
        ex = {"obs": np.zeros(3, np.float32), "done": np.zeros((), bool)}
        with ReplayClient(("127.0.0.1", port), ex, transport="tcp") as c:
            c.send_batch({"obs": np.arange(60, dtype=np.float32).reshape(20, 3), "done": np.zeros(20, bool)})
            assert c.flush(wait=True, timeout=20)
        with LearnerClient(("127.0.0.1", port), ex) as learner:
            b = learner.sample(5)
            assert b.data["obs"].shape == (5, 3) and set(b.data["obs"][:, 0] % 3) == {0.0}
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert "stored 20 samples" in out
        assert metrics.read_text().count("replay/samples_added") >= 1
    finally:
        proc.kill()


@pytest.mark.parametrize("args, message", [
    (["--leaf", "obs:float31:3"], "dtype 'float31'"),
    (["--leaf", "obs:float32:0"], "shape must be positive"),
    ([], "--leaf NAME:DTYPE:SHAPE"),
    (["--leaf", "obs:float32:3", "--capacity", "0"], "--capacity=0 is invalid"),
    (["--leaf", "obs:float32:3", "--max-connections", "0"], "--max-connections=0 is invalid: must be >= 1"),
    (["--leaf", "obs:float32:3", "--idle-timeout", "-1"], "--idle-timeout=-1.0 is invalid: must be > 0 (or 0: none)"),
    (["--leaf", "obs:float32:3", "--secret-file", "/nonexistent/secret"], "--secret-file='/nonexistent/secret' cannot"),
    (["--leaf", "obs:float32:3", "--samples-per-insert", "4"], "--samples-per-insert and --error-buffer go together"),
    (["--leaf", "obs:float32:3", "--samples-per-insert", "4", "--error-buffer", "1"], "error_buffer=1.0 is too small"),
    # argparse's own errors would print the whole usage: a bad choice or number is one line too
    (["--leaf", "obs:float32:3", "--sampler", "lifo"], "--sampler='lifo' is invalid: allowed: prioritized, uniform, fifo"),
    (["--leaf", "obs:float32:3", "--sampling-mode", "rank"], "--sampling-mode='rank' is invalid: allowed: proportional"),
    (["--leaf", "obs:float32:3", "--capacity", "1e6"], "--capacity='1e6' is invalid: expected an integer"),
    (["--leaf", "obs:float32:3", "--idle-timeout", "soon"], "--idle-timeout='soon' is invalid: expected a number"),
])
def test_bad_arguments_give_one_line_errors(args, message):
    proc = _cli(*args, "--duration", "1")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_secret_file_makes_clients_authenticate(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("cli-secret-0123456789\n")
    proc = _cli("--leaf", "obs:float32:3", "--port", "0", "--min-experiences", "1", "--duration", "6",
                "--secret-file", str(secret), env={**os.environ, "ECHORL_REPLAY_SECRET": ""})
    try:
        line = proc.stdout.readline()
        assert "shared-secret authentication" in line, line + proc.stderr.read()
        port = int(line.split("127.0.0.1:")[1].split()[0])
        ex = {"obs": np.zeros(3, np.float32)}
        with pytest.raises(ReplayServerError, match="requires a shared secret"):
            ReplayClient(("127.0.0.1", port), ex, transport="tcp", secret=None).connect()
        with ReplayClient(("127.0.0.1", port), ex, transport="tcp", secret="cli-secret-0123456789") as c:
            c.send({"obs": np.ones(3, np.float32)})
            assert c.flush(wait=True, timeout=20)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "stored 1 samples" in out
        assert "cli-secret" not in out + err
    finally:
        proc.kill()
