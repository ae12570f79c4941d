"""End-to-end: writers over TCP and shared memory, exactly-once under reconnects, learner sampling."""

import socket
import time

import numpy as np
import pytest
from dist_helpers import example, make, make_batch

from echo_rl.distributed import LearnerClient, ReplayClient, ReplayServer, ReplayServerError
from echo_rl.distributed import protocol as P

TRANSPORTS = ["tcp", "shm"]


def _wait(cond, timeout=20.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_sample_arrives_once_in_order(buffer, transport):
    with ReplayServer(buffer, shm_capacity=64) as srv:  # small ring: the writer waits on it (backpressure)
        with ReplayClient(srv.address, example(), transport=transport, flush_bytes=512) as c:
            for i in range(500):
                assert c.send(make(3, i)) == i
            assert c.send_batch(make_batch(3, 500, 300)) == 500  # a whole trajectory in one message
            assert c.flush(wait=True, timeout=20)
            assert c.acked == c.sent == 800
        keys = buffer.all_keys()
        np.testing.assert_array_equal(keys, 3_000_000 + np.arange(800))
        assert len(buffer) == 800
        m = srv.metrics()
        client_keys = [k for k in m if k.endswith("/samples") and k.startswith("replay/client/")]
        assert [m[k] for k in client_keys] == [800.0]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_send_checks_every_sample_and_stores_unusual_but_valid_ones(buffer, transport):
    """The one-call fast path takes exact arrays; anything else is checked in full (and converted
    or refused naming the leaf) — a refused sample is never published."""
    from echo_rl.replay.schema import SchemaError

    with ReplayServer(buffer) as srv:
        with ReplayClient(srv.address, example(), transport=transport) as c:
            c.send(make(4, 0))
            odd = make(4, 1)
            odd["obs"] = np.ascontiguousarray(np.stack([odd["obs"], odd["obs"]], 1))[:, 0]  # strided view
            assert not odd["obs"].flags.c_contiguous
            c.send(odd)
            c.send({"obs": [4.0, 2.0, 0, 0, 0, 0], "action": [4_000_002], "done": [False]})  # Python numbers
            for bad, leaf in (({**make(4, 9), "obs": np.zeros(6, np.float64)}, "obs"),
                              ({**make(4, 9), "action": np.zeros(2, np.int64)}, "action"),
                              ({k: v for k, v in make(4, 9).items() if k != "done"}, "done")):
                with pytest.raises(SchemaError, match=f"'{leaf}'"):
                    c.send(bad)
            c.send(make(4, 3))
            assert c.flush(wait=True, timeout=20) and c.sent == 4
        np.testing.assert_array_equal(buffer.all_keys(), 4_000_000 + np.array([0, 1, 2, 3]))
        got = buffer.sample(64)
        np.testing.assert_array_equal(got.data["obs"][:, 1], got.data["action"][:, 0] - 4_000_000)


def test_schema_mismatch_is_refused_naming_the_leaf(buffer):
    with ReplayServer(buffer) as srv:
        bad = {**example(), "obs": np.zeros(5, np.float32)}
        with pytest.raises(ReplayServerError, match="schema mismatch.*obs"):
            ReplayClient(srv.address, bad, transport="tcp").connect()
        with ReplayClient(srv.address, example(), transport="tcp") as c, pytest.raises(ValueError, match="obs"):
            c.send({**example(), "obs": np.zeros(5, np.float32)})  # checked before anything is sent


def test_tcp_reconnect_resends_only_unacked(buffer):
    with ReplayServer(buffer) as srv:
        c = ReplayClient(srv.address, example(), transport="tcp", flush_bytes=256).connect()
        for i in range(300):
            c.send(make(1, i))
        c.flush()
        for conn in list(srv._conns):  # the network drops the connection mid-stream
            conn.shutdown(socket.SHUT_RDWR)
        for i in range(300, 600):
            c.send(make(1, i))
        assert c.flush(wait=True, timeout=20)
        assert c.reconnects >= 1
        np.testing.assert_array_equal(np.sort(buffer.all_keys()), 1_000_000 + np.arange(600))
        c.close()


def test_tcp_client_survives_a_server_restart_without_duplicates(buffer):
    srv = ReplayServer(buffer).start()
    port = srv.port
    c = ReplayClient(("127.0.0.1", port), example(), transport="tcp", reconnect_timeout=20).connect()
    for i in range(200):
        c.send(make(2, i))
    assert c.flush(wait=True, timeout=20)
    srv.close()
    srv2 = ReplayServer(buffer, port=port).start()  # same buffer (e.g. restored), new process state
    try:
        for i in range(200, 400):
            c.send(make(2, i))
        assert c.flush(wait=True, timeout=20)
        np.testing.assert_array_equal(np.sort(buffer.all_keys()), 2_000_000 + np.arange(400))
        c.close()
    finally:
        srv2.close()


@pytest.mark.parametrize("payload", [b"GET / HTTP/1.1\r\n\r\n", bytes(range(256)) * 8])
def test_random_bytes_close_that_connection_only(buffer, payload):
    with ReplayServer(buffer) as srv, ReplayClient(srv.address, example(), transport="tcp") as good:
        good.send(make(0, 0))
        s = socket.create_connection(srv.address)
        s.sendall(payload)
        s.settimeout(10)
        reply = s.recv(4096)
        assert reply[:2] == P.pack_header(P.ERROR, 0, 0)[:2]  # an ERROR frame with the reason, then close
        assert b"not an EchoRL replay client" in reply
        s.close()
        good.send(make(0, 1))
        assert good.flush(wait=True, timeout=10)
        assert _wait(lambda: any("not an EchoRL replay client" in r for r in srv.closed_reasons))
        np.testing.assert_array_equal(buffer.all_keys(), [0, 1])


def _handshaken(srv) -> socket.socket:
    s = socket.create_connection(srv.address)
    body = P.hello_body(srv.schema, "evil", "tcp", 0)
    body["stream"] = "evil-stream"
    s.sendall(P.HELLO_MAGIC + P.json_frame(P.HELLO, body))
    s.settimeout(10)
    ftype, _, count, seq = P.unpack_header(s.recv(P.HEADER_SIZE, socket.MSG_WAITALL))
    assert ftype == P.WELCOME
    s.recv(count, socket.MSG_WAITALL)
    return s


@pytest.mark.parametrize("frame, reason", [
    (b"\x00\x01" + b"\x00" * 14, "bad frame magic"),
    (P.pack_header(P.DATA, 0, 0), "count=0"),
    (P.pack_header(P.SAMPLE, 1, 0), "unexpected SAMPLE"),
    ("gap", "sequence gap: expected 0, got 5"),
])
def test_malformed_frames_close_that_connection_with_a_reason(buffer, frame, reason, caplog):
    with ReplayServer(buffer) as srv, ReplayClient(srv.address, example(), transport="tcp") as good:
        s = _handshaken(srv)
        if frame == "gap":
            rec = P.record_dtype(srv.schema)
            frame = P.pack_header(P.DATA, 1, 5) + np.zeros(1, rec).tobytes()
        with caplog.at_level("WARNING", logger="echo_rl.replay_server"):
            s.sendall(frame)
            data = b""
            while True:  # the server answers ERROR and closes
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            assert reason in data.decode(errors="replace")
            assert _wait(lambda: any(reason in r.getMessage() for r in caplog.records))
        s.close()
        for i in range(50):
            good.send(make(4, i))
        assert good.flush(wait=True, timeout=10)
        np.testing.assert_array_equal(buffer.all_keys(), 4_000_000 + np.arange(50))  # nothing from the bad peer


def test_server_sample_waits_without_data_then_serves_batches_and_metrics(buffer):
    buffer.min_experiences = 64
    with ReplayServer(buffer) as srv:
        with pytest.raises(TimeoutError, match="not ready"):
            srv.sample(8, timeout=0.05)
        with ReplayClient(srv.address, example(), transport="tcp") as c:
            c.send_batch(make_batch(5, 0, 100))
            c.flush(wait=True, timeout=10)
        batch = srv.sample(16, timeout=10)
        assert batch.data["obs"].shape == (16, 6) and batch.weights.shape == (16,)
        assert set(batch.data["obs"][:, 0]) == {5.0}
        assert srv.update_priorities(batch.indices, np.full(16, 2.0)) == 16
        m = srv.last_batch_metrics
        for key in ("replay/batch_wait_s", "replay/batch_latency_s", "replay/queue_depth", "replay/buffer_size"):
            assert key in m
        assert m["replay/buffer_size"] == 100
        out = {k: np.zeros((16, *v.shape[1:]), v.dtype) for k, v in make_batch(0, 0, 1).items()}
        batch = srv.sample(16, out=out)  # the learner's own arrays, filled in place
        assert batch.data is out and set(out["obs"][:, 0]) == {5.0}


def test_learner_client_samples_views_and_sends_priorities(buffer):
    with ReplayServer(buffer) as srv:
        with ReplayClient(srv.address, example(), transport="tcp") as c:
            c.send_batch(make_batch(6, 0, 40))
            c.flush(wait=True, timeout=10)
        with LearnerClient(srv.address, example()) as learner:
            b = learner.sample(10)
            assert b.data["obs"].shape == (10, 6) and not b.data["obs"].flags.owndata
            np.testing.assert_array_equal(b.data["action"][:, 0], 6_000_000 + b.data["obs"][:, 1].astype(np.int64))
            learner.update_priorities(b.indices, np.full(10, 1e-6))
            learner.update_priorities([10**9], [1.0])  # an id never issued: that learner is cut off
            with pytest.raises((ReplayServerError, ConnectionError)):
                for _ in range(50):
                    learner.sample(1)
                    time.sleep(0.01)
        assert any("bad PRIORITIES" in r for r in srv.closed_reasons)


def test_shm_client_republishes_unconsumed_samples_after_a_server_restart(buffer):
    srv = ReplayServer(buffer).start()
    port = srv.port
    c = ReplayClient(("127.0.0.1", port), example(), transport="shm", reconnect_timeout=20).connect()
    for i in range(100):
        c.send(make(5, i))
    assert c.flush(wait=True, timeout=20)
    srv.close()  # drains what was published, then closes the ring
    for i in range(100, 150):  # written into the closed ring: not acknowledged, republished later
        c.send(make(5, i))
    srv2 = ReplayServer(buffer, port=port).start()
    try:
        assert c.flush(wait=True, timeout=20)
        assert c.reconnects == 1 and c.acked == 150
        np.testing.assert_array_equal(np.sort(buffer.all_keys()), 5_000_000 + np.arange(150))
        c.close()
    finally:
        srv2.close()


def test_tcp_writer_blocks_on_its_ack_window_while_the_server_is_slow():
    """The writer stops at its window while the learner host stores nothing, and goes on once it stores again
    (a gate, not a sleep: on a loaded box a slow client may never outrun a merely slow server)."""
    import threading

    from dist_helpers import RecordingBuffer

    gate = threading.Event()

    class StuckBuffer(RecordingBuffer):
        def add_granted(self, batch, priorities=None):  # the server stores through it
            gate.wait(30)  # a busy learner host: nothing is stored until the test lets it
            return super().add_granted(batch, priorities)

    buf = StuckBuffer(1 << 12, example=example())
    with ReplayServer(buf) as srv:
        with ReplayClient(srv.address, example(), transport="tcp", max_unacked=8, flush_bytes=64) as c:
            in_flight: list[int] = []

            def send_all():
                for i in range(120):
                    c.send(make(1, i))
                    in_flight.append(c.sent - c.acked)

            sender = threading.Thread(target=send_all, daemon=True)
            sender.start()
            deadline = time.monotonic() + 30
            while c.blocked == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert c.blocked > 0 and len(in_flight) <= 9  # waiting on its window, not sending on
            gate.set()
            sender.join(30)
            assert not sender.is_alive() and len(in_flight) == 120
            assert max(in_flight) <= 8 + 1  # never more than the window (+ the sample staged now)
            assert c.flush(wait=True, timeout=30)
        np.testing.assert_array_equal(buf.all_keys(), 1_000_000 + np.arange(120))


@pytest.mark.parametrize("prefetch", [0, 2])
def test_batches_iterator_prefetches_and_surfaces_errors(buffer, prefetch):
    with ReplayServer(buffer) as srv:
        with ReplayClient(srv.address, example(), transport="tcp") as c:
            c.send_batch(make_batch(2, 0, 64))
            c.flush(wait=True, timeout=10)
        it = srv.batches(8, prefetch=prefetch, timeout=5)
        seen = [next(it) for _ in range(5)]
        assert all(b.data["obs"].shape == (8, 6) for b in seen)
        assert len({id(b.data["obs"]) for b in seen}) == 5  # distinct batches, none overwritten
        it.close()
    buffer2 = type(buffer)(64, example=example(), min_experiences=10)
    with ReplayServer(buffer2) as srv2:
        with pytest.raises(TimeoutError, match="not ready"):
            next(srv2.batches(4, prefetch=prefetch, timeout=0.05))
