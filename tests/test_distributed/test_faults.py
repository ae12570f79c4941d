"""Faults: a writer process killed mid-stream (the server keeps serving, others are unaffected, acked
samples stay); a replay server killed with SIGKILL restarts from its checkpoint with every sample
acknowledged before it, and its writers resume exactly-once (or are told what was lost)."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from dist_helpers import example, make

from echo_rl.distributed import LearnerClient, ReplayClient, ReplayServer, ReplayServerError

WRITER = """
import sys
sys.path.insert(0, {helpers!r})
from dist_helpers import example, make
from echo_rl.distributed import ReplayClient
c = ReplayClient(("127.0.0.1", {port}), example(), transport={transport!r}, flush_bytes=1024).connect()
i = 0
while True:
    c.send(make(7, i))
    i += 1
    if i % 50 == 0:
        c.flush()
        print(c.acked, flush=True)
"""


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_killed_writer_loses_no_acked_sample_and_others_go_on(buffer, transport):
    with ReplayServer(buffer) as srv:
        code = WRITER.format(helpers=str(Path(__file__).parent), port=srv.port, transport=transport)
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        other_done = threading.Event()
        other_err = []

        def other():
            try:
                with ReplayClient(srv.address, example(), transport=transport) as c:
                    for i in range(3000):
                        c.send(make(8, i))
                        if i % 100 == 0:
                            time.sleep(0.002)
                    assert c.flush(wait=True, timeout=30)
            except Exception as exc:  # reported below
                other_err.append(exc)
            other_done.set()

        t = threading.Thread(target=other)
        t.start()
        acked = 0
        try:
            for line in proc.stdout:  # kill it once the server has acknowledged a good share
                acked = int(line)
                if acked >= 2000:
                    break
        finally:
            proc.kill()
            proc.wait(10)
        assert acked >= 2000, "the writer process never got going"
        t.join(60)
        assert other_done.is_set() and not other_err, other_err
        # the killed writer's connection is closed; the server still takes new writers
        with ReplayClient(srv.address, example(), transport=transport) as late:
            late.send(make(9, 0))
            assert late.flush(wait=True, timeout=20)
        keys = buffer.all_keys()
        assert len(np.unique(keys)) == len(keys), "a sample was stored twice"
        killed = np.sort(keys[keys // 1_000_000 == 7]) - 7_000_000
        np.testing.assert_array_equal(killed[:acked], np.arange(acked))  # every acked sample is stored
        np.testing.assert_array_equal(np.sort(keys[keys // 1_000_000 == 8]), 8_000_000 + np.arange(3000))
        assert 9_000_000 in keys


SERVER = """
import sys
sys.path.insert(0, {helpers!r})
from dist_helpers import example
from echo_rl.distributed import ReplayServer
from echo_rl.replay import PrioritizedReplayBuffer
buf = PrioritizedReplayBuffer(1 << 12, example=example(), sampler="fifo", seed=0)
srv = ReplayServer(buf, "127.0.0.1", {port}, checkpoint_path={path!r}).start()
print(srv.port, buf.ids_issued, flush=True)
for line in sys.stdin:
    print(srv.checkpoint()["samples"], flush=True)
"""


def _server(port, path):
    code = SERVER.format(helpers=str(Path(__file__).parent), port=port, path=str(path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port, stored = (int(x) for x in proc.stdout.readline().split())
    return proc, port, stored


def _send(client, writer, first, n):
    for i in range(first, first + n):
        client.send(make(writer, i))
    assert client.flush(wait=True, timeout=60)
    assert client.acked == first + n


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_killed_server_restarts_from_checkpoint_with_every_acked_sample(tmp_path, transport):
    path = tmp_path / "replay.npz"
    proc, port, stored = _server(0, path)
    assert stored == 0
    a = ReplayClient(("127.0.0.1", port), example(), transport=transport, reconnect_timeout=60).connect()
    b = ReplayClient(("127.0.0.1", port), example(), transport="tcp", reconnect_timeout=60).connect()
    try:
        _send(a, 1, 0, 600)
        _send(b, 2, 0, 300)
        proc.stdin.write("checkpoint\n")
        proc.stdin.flush()
        assert int(proc.stdout.readline()) == 900
        _send(b, 2, 300, 100)  # acknowledged after the checkpoint: lost with the server
        proc.kill()  # SIGKILL: no cleanup, no last checkpoint
        proc.wait(10)
        for seg in Path("/dev/shm").glob(f"echorl_{proc.pid}_*"):  # what a killed server leaves behind
            seg.unlink()
        proc, port2, stored = _server(port, path)
        assert (port2, stored) == (port, 900)
        _send(a, 1, 600, 200)  # reconnects to the restarted server and goes on exactly-once
        with pytest.raises(ReplayServerError, match=r"samples \[300, 400\) of it were acknowledged; they are lost"):
            _send(b, 2, 400, 1)
        with LearnerClient(("127.0.0.1", port), example()) as learner:
            keys = learner.sample(1100).data["action"][:, 0]  # FIFO: everything stored, once, in order
        np.testing.assert_array_equal(keys[:600], 1_000_000 + np.arange(600))
        np.testing.assert_array_equal(keys[600:900], 2_000_000 + np.arange(300))
        np.testing.assert_array_equal(keys[900:], 1_000_000 + np.arange(600, 800))
    finally:
        a.close()
        b._close_sock()
        proc.kill()
        proc.wait(10)
