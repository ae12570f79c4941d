"""The replay server's limits: connection cap, handshake and idle timeouts, ring quotas, the shared-secret
handshake, the non-loopback warning, and DATA frames stored as their bytes arrive."""

import logging
import socket
import time

import numpy as np
import pytest
from dist_helpers import example, make, make_batch

from echo_rl.distributed import LearnerClient, ReplayClient, ReplayServer, ReplayServerError
from echo_rl.distributed import protocol as P
from echo_rl.distributed.limits import bind_warning


def _wait(cond, timeout=20.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def _read_until_closed(s: socket.socket, timeout: float = 10.0) -> bytes:
    s.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = s.recv(4096)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def _error_body(data: bytes) -> dict:
    ftype, _, count, _ = P.unpack_header(data)
    assert ftype == P.ERROR, P.TYPE_NAMES[ftype]
    return P.parse_json(ftype, data[P.HEADER_SIZE: P.HEADER_SIZE + count])


def _hello(srv, stream="s1", role="writer") -> bytes:
    body = P.hello_body(srv.schema, "raw", "tcp", 0, role=role)
    body["stream"] = stream
    return P.HELLO_MAGIC + P.json_frame(P.HELLO, body)


def _welcomed(srv, stream="s1", role="writer") -> socket.socket:
    s = socket.create_connection(srv.address, timeout=10)
    s.sendall(_hello(srv, stream, role))
    ftype, _, count, _ = P.unpack_header(s.recv(P.HEADER_SIZE, socket.MSG_WAITALL))
    assert ftype == P.WELCOME
    s.recv(count, socket.MSG_WAITALL)
    return s


@pytest.mark.parametrize("kw, message", [
    ({"max_connections": 0}, "max_connections=0 is invalid"),
    ({"idle_timeout": 0}, "idle_timeout=0 is invalid: must be a number > 0 or None"),
    ({"handshake_timeout": None}, "handshake_timeout=None is invalid"),
    ({"max_rings_per_client": -1}, "max_rings_per_client=-1 is invalid"),
    ({"secret": ""}, "secret is invalid"),
    ({"max_idle_streams": -1}, "max_idle_streams=-1 is invalid"),
])
def test_bad_limits_are_refused_naming_the_setting(buffer, kw, message):
    with pytest.raises(ValueError, match=message):
        ReplayServer(buffer, **kw)


def test_connection_cap_refuses_extra_peers_with_a_clear_retryable_error(buffer):
    with ReplayServer(buffer, max_connections=2) as srv:
        a, b = _welcomed(srv, "a"), _welcomed(srv, "b")
        over = socket.create_connection(srv.address, timeout=10)
        over.sendall(_hello(srv, "c"))
        body = _error_body(_read_until_closed(over))
        assert "too many connections (2 open, max_connections=2)" in body["reason"] and body["retry"] is True
        with pytest.raises(ConnectionError, match="too many connections"):  # retried until connect_timeout
            ReplayClient(srv.address, example(), transport="tcp", connect_timeout=1.0).connect()
        assert srv.metrics()["replay/refused_connections"] >= 2
        a.close()
        with ReplayClient(srv.address, example(), transport="tcp", connect_timeout=10) as c:  # a slot is free again
            c.send(make(1, 0))
            assert c.flush(wait=True, timeout=10)
        b.close()
    np.testing.assert_array_equal(buffer.all_keys(), [1_000_000])


def test_handshake_deadline_is_for_the_whole_handshake(buffer):
    with ReplayServer(buffer, handshake_timeout=0.5) as srv:
        s = socket.create_connection(srv.address, timeout=10)
        t0 = time.monotonic()
        hello = _hello(srv)
        try:
            for i in range(len(hello)):  # a byte every 50 ms: each recv is quick, the whole is not
                s.sendall(hello[i: i + 1])
                time.sleep(0.05)
        except OSError:
            pass
        took = time.monotonic() - t0
        assert took < 3.0, took
        assert _wait(lambda: any("not complete in time" in r for r in srv.closed_reasons))
        s.close()


def test_idle_and_slow_loris_writers_are_dropped(buffer):
    with ReplayServer(buffer, idle_timeout=0.5) as srv:
        idle = _welcomed(srv, "idle")
        t0 = time.monotonic()
        body = _error_body(_read_until_closed(idle))
        assert "idle_timeout" in body["reason"] and body["retry"] is True
        assert 0.4 < time.monotonic() - t0 < 3.0
        loris = _welcomed(srv, "loris")
        rec = P.record_dtype(srv.schema)
        frame = P.pack_header(P.DATA, 2, 0) + np.zeros(2, rec).tobytes()
        t0 = time.monotonic()
        try:
            for i in range(len(frame)):  # bytes keep coming, but no record completes in time
                loris.sendall(frame[i: i + 1])
                time.sleep(0.1)
        except OSError:
            pass
        assert time.monotonic() - t0 < 3.0
        idle.close()
        loris.close()


def test_idle_writer_and_learner_reconnect_transparently(buffer):
    with ReplayServer(buffer, idle_timeout=0.3) as srv:
        with ReplayClient(srv.address, example(), transport="tcp", flush_bytes=256) as c, \
                LearnerClient(srv.address, example()) as learner:
            for i in range(20):
                c.send(make(2, i))
            assert c.flush(wait=True, timeout=10)
            time.sleep(1.0)  # both dropped for idling
            for i in range(20, 40):
                c.send(make(2, i))
            assert c.flush(wait=True, timeout=10)
            assert c.reconnects >= 1
            b = learner.sample(8)
            learner.update_priorities(b.indices, np.full(8, 2.0))
            assert len(b.indices) == 8
    np.testing.assert_array_equal(np.sort(buffer.all_keys()), 2_000_000 + np.arange(40))  # exactly once


def test_ring_quotas(buffer):
    with ReplayServer(buffer, max_rings=2, max_rings_per_client=1) as srv:
        a = ReplayClient(srv.address, example(), transport="shm", client_id="w").connect()
        with pytest.raises(ReplayServerError, match=r"client_id='w' already holds 1 .*max_rings_per_client=1"):
            ReplayClient(srv.address, example(), transport="shm", client_id="w").connect()
        b = ReplayClient(srv.address, example(), transport="shm", client_id="v").connect()
        with pytest.raises(ReplayServerError, match=r"2 in use \(max_rings=2\); use transport='tcp'"):
            ReplayClient(srv.address, example(), transport="shm", client_id="u").connect()
        with ReplayClient(srv.address, example(), transport="tcp", client_id="w") as t:  # TCP is not a ring
            t.send(make(3, 0))
        a.send(make(4, 0))
        a.close()
        assert _wait(lambda: srv.queue_depth() == 0 and len(srv._rings) == 1)
        with ReplayClient(srv.address, example(), transport="shm", client_id="w") as again:  # quota freed
            again.send(make(5, 0))
        b.close()
    assert sorted(buffer.all_keys()) == [3_000_000, 4_000_000, 5_000_000]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_shared_secret_handshake(buffer, transport, caplog, monkeypatch):
    secret = "s3cret-Replay-Key-0123456789"
    monkeypatch.delenv(P.SECRET_ENV, raising=False)
    with caplog.at_level(logging.DEBUG):
        with ReplayServer(buffer, secret=secret) as srv:
            with ReplayClient(srv.address, example(), transport=transport, secret=secret) as c:
                c.send_batch(make_batch(6, 0, 10))
                assert c.flush(wait=True, timeout=10)
            with pytest.raises(ReplayServerError, match="authentication failed: wrong shared secret"):
                ReplayClient(srv.address, example(), transport=transport, secret="not-it").connect()
            with pytest.raises(ReplayServerError, match="requires a shared secret: pass secret= or set "
                                                        "\\$ECHORL_REPLAY_SECRET"):
                ReplayClient(srv.address, example(), transport=transport).connect()
            with pytest.raises(ReplayServerError, match="wrong shared secret"):
                LearnerClient(srv.address, example(), secret="nope").connect()
            monkeypatch.setenv(P.SECRET_ENV, secret)  # the default for clients
            with ReplayClient(srv.address, example(), transport=transport) as c2, \
                    LearnerClient(srv.address, example()) as learner:
                c2.send(make(7, 0))
                assert c2.flush(wait=True, timeout=10)
                assert len(learner.sample(4).indices) == 4
            s = socket.create_connection(srv.address, timeout=10)  # a raw peer learns nothing before auth
            s.sendall(_hello(srv))
            ftype, _, count, _ = P.unpack_header(s.recv(P.HEADER_SIZE, socket.MSG_WAITALL))
            assert ftype == P.AUTH
            s.recv(count, socket.MSG_WAITALL)
            s.sendall(P.json_frame(P.AUTH, {"mac": "00" * 32}))
            assert "wrong shared secret" in _error_body(_read_until_closed(s))["reason"]
            s.close()
            assert _wait(lambda: sum("authentication failed" in r for r in srv.closed_reasons) >= 4)
    assert sorted(buffer.all_keys()) == [6_000_000 + i for i in range(10)] + [7_000_000]
    logged = caplog.text + "".join(srv.closed_reasons)
    assert secret not in logged and "authentication failed" in logged


def test_non_loopback_bind_warns(buffer, caplog):
    with caplog.at_level(logging.WARNING, logger="echo_rl.replay_server"):
        with ReplayServer(buffer, "127.0.0.1"):
            pass
        assert "reachable from other hosts" not in caplog.text
        with ReplayServer(buffer, "0.0.0.0"):
            pass
    assert "0.0.0.0" in caplog.text and "reachable from other hosts" in caplog.text and "NO shared secret" in caplog.text
    assert bind_warning("::1", 1, False) is None and bind_warning("127.0.0.2", 1, False) is None
    with_secret = bind_warning("10.0.0.5", 7470, True)
    assert "shared secret" in with_secret and "NO shared secret" not in with_secret and "not encrypted" in with_secret


def test_large_frame_is_stored_as_its_bytes_arrive_and_a_resend_is_skipped(buffer):
    """A 50k-record DATA frame in small pieces: records are stored (and acked) before the frame ends;
    a reconnect that resends the whole frame stores only the rest — exactly once."""
    with ReplayServer(buffer, max_run=1000) as srv:
        rec = P.record_dtype(srv.schema)
        n = 50_000
        recs = np.zeros(n, rec)
        recs[rec.names[srv.schema.names.index("action")]][:, 0] = 8_000_000 + np.arange(n)
        frame = P.pack_header(P.DATA, n, 0) + recs.tobytes()
        s = _welcomed(srv, "big")
        half = len(frame) // 2 + 7
        for i in range(0, half, 40_000):
            s.sendall(frame[i: min(half, i + 40_000)])
        stored = (half - P.HEADER_SIZE) // rec.itemsize  # every whole record sent so far
        assert _wait(lambda: srv.stream_next_seq("big") == stored), srv.stream_next_seq("big")
        s.close()  # the connection breaks mid-frame
        s = _welcomed(srv, "big")
        s.sendall(frame)  # the client resends from its last ack: the server skips what it holds
        s.sendall(P.pack_header(P.BYE, 0, 0))
        _read_until_closed(s)
        s.close()
        assert srv.stream_next_seq("big") == n
        assert srv.metrics()["replay/client/raw/duplicates"] == stored
    np.testing.assert_array_equal(np.sort(buffer.all_keys()), 8_000_000 + np.arange(n))


def test_learner_batch_over_the_reply_limit_is_refused_clearly(buffer):
    with ReplayServer(buffer, max_reply_bytes=10_000) as srv:
        with ReplayClient(srv.address, example(), transport="tcp") as c:
            c.send_batch(make_batch(1, 0, 50))
        with LearnerClient(srv.address, example()) as learner:
            assert len(learner.sample(10).indices) == 10
            with pytest.raises(ReplayServerError, match="SAMPLE count=1000 asks for .* max_reply_bytes=10000"):
                learner.sample(1000)


def test_records_of_gone_streams_are_freed_beyond_the_cap(buffer):
    """Many short-lived writers, each with a new stream and client id, leave at most the cap of records."""
    with ReplayServer(buffer, max_idle_streams=8) as srv:
        for i in range(300):
            with ReplayClient(srv.address, example(), transport="tcp", client_id=f"c{i}") as c:
                c.send(make(i, 0))
                c.flush(wait=True, timeout=20)
        assert _wait(lambda: not srv._conns)
        assert len(srv._streams) <= 8 and len(srv._stats) <= 8, (len(srv._streams), len(srv._stats))
        assert srv.samples_added == 300  # counters of freed clients are kept in the total
        recent = next(reversed(srv._idle_streams))
        assert srv.stream_next_seq(recent) == 1  # the most recent idle streams keep their position


def test_a_reconnecting_recent_stream_keeps_its_position(buffer):
    with ReplayServer(buffer, max_idle_streams=2) as srv:
        _welcomed(srv, "keep").close()
        assert _wait(lambda: not srv._conns)
        srv._streams["keep"].next_seq = 5  # as if 5 samples had been stored
        s = socket.create_connection(srv.address, timeout=10)
        s.sendall(_hello(srv, "keep"))
        ftype, _, count, seq = P.unpack_header(s.recv(P.HEADER_SIZE, socket.MSG_WAITALL))
        s.close()
        assert ftype == P.WELCOME and seq == 5
