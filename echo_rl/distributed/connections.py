"""One connection's life in the replay server: accept, handshake, hand-off by role, drop.

The accept thread admits peers up to ``max_connections`` (over it: a retryable ERROR from the
:class:`~echo_rl.distributed.limits.Refuser`, no thread) and gives each a thread that runs
:func:`serve_conn`: the magic bytes and HELLO under one whole-handshake deadline, the optional
HMAC challenge before the HELLO is even parsed, then the peer's role — a TCP writer
(:func:`serve_tcp_writer`, then :mod:`tcp_ingest`), a shared-memory writer (:mod:`shm_ingest`) or a
learner (:mod:`learner_serving`). Whatever ends the connection is turned into one ERROR line for the
peer (retryable for timeouts) and one entry in ``ReplayServer.closed_reasons``.

These are functions of the server (``server`` is a :class:`~echo_rl.distributed.server.ReplayServer`),
like :mod:`tcp_ingest` and :mod:`shm_ingest`: the server owns the state, this module the protocol.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from echo_rl.distributed import protocol as P
from echo_rl.distributed import shm_ingest
from echo_rl.distributed.learner_serving import serve_learner
from echo_rl.distributed.limits import Closed as _Closed
from echo_rl.distributed.limits import Timeout, recv_exact
from echo_rl.distributed.tcp_ingest import ClientStats, read_stream

log = logging.getLogger("echo_rl.replay_server")


def shutdown(conn: socket.socket) -> None:
    """Shut both directions down, so a thread blocked on the socket wakes; errors mean it is gone already."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def accept_loop(server) -> None:
    """Admit peers until the server stops; each admitted one gets a thread running :func:`serve_conn`."""
    cap = server.limits.max_connections
    while not server._stop.is_set():
        server._refuser.tick()
        try:
            conn, peer = server._sock.accept()
        except (TimeoutError, socket.timeout):
            continue
        except OSError:
            break
        with server._lock:
            n = len(server._conns)
            if n < cap:
                server._conns.add(conn)
        if n >= cap:  # no thread for it: an ERROR the client retries on, then a close
            msg = f"too many connections ({n} open, max_connections={cap})"
            log.warning("refusing replay connection from %s:%d: %s", peer[0], peer[1], msg)
            server._refuser.refuse(conn, P.json_frame(P.ERROR, {"reason": msg, "retry": True}))
            continue
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t = threading.Thread(target=serve_conn, args=(server, conn, peer), name=f"replay-conn-{peer}", daemon=True)
        t.start()
        server._threads = [x for x in server._threads if x.is_alive()]
        server._threads.append(t)


def drop(server, conn: socket.socket, peer, reason: str | None, retry: bool = False) -> None:
    """Close a connection; with a ``reason``, log it, keep it in ``closed_reasons`` and send it as an ERROR."""
    if reason:
        msg = f"closing replay connection from {peer[0]}:{peer[1]}: {reason}"
        log.warning(msg)
        server.closed_reasons.append(msg)
        server._closed_count += 1
        try:
            conn.settimeout(0.5)
            conn.sendall(P.json_frame(P.ERROR, {"reason": reason, "retry": retry} if retry else {"reason": reason}))
        except OSError:
            pass
    with server._lock:
        server._conns.discard(conn)
    shutdown(conn)
    conn.close()


def serve_conn(server, conn: socket.socket, peer) -> None:
    """Handshake, serve the peer in its role, then drop the connection with the reason it ended (if any)."""
    reason, retry = None, False
    try:
        deadline = time.monotonic() + server.limits.handshake_timeout  # for the whole handshake
        magic = recv_exact(conn, len(P.HELLO_MAGIC), deadline, "the handshake")
        if magic != P.HELLO_MAGIC:
            raise P.ProtocolError(f"not an EchoRL replay client (first bytes {magic[:8]!r})")
        ftype, _, count, _ = P.unpack_header(recv_exact(conn, P.HEADER_SIZE, deadline, "HELLO"))
        if ftype != P.HELLO:
            raise P.ProtocolError(f"expected HELLO, got {P.TYPE_NAMES[ftype]}")
        if count > P.MAX_JSON_BYTES:
            raise P.ProtocolError(f"HELLO body of {count} bytes exceeds {P.MAX_JSON_BYTES}")
        raw = recv_exact(conn, count, deadline, "HELLO")
        if server._secret is not None:  # before the HELLO is even parsed
            authenticate(conn, server._secret, deadline)
        body = P.parse_json(P.HELLO, raw)
        cid, transport, next_seq, role = P.check_hello(body, server.schema)
        stream = body.get("stream")
        if not isinstance(stream, str) or not 0 < len(stream) <= 64:
            raise P.ProtocolError(f"stream={P.short(stream)} is invalid: must be a non-empty string of <= 64 chars")
        conn.settimeout(None)
        stats = server._client_joined(cid)
        try:
            if role == "learner":
                serve_learner(server, conn)
            elif transport == "shm":
                shm_ingest.serve_shm(server, conn, peer, cid, stats)
            else:
                serve_tcp_writer(server, conn, cid, stream, next_seq, stats)
        finally:
            server._client_left(cid, stats)
    except _Closed:
        pass
    except P.ProtocolError as exc:
        reason = str(exc)
    except Timeout as exc:
        reason, retry = str(exc), True
    except (TimeoutError, socket.timeout):
        reason, retry = "timed out sending to the peer", True
    except OSError as exc:
        if not server._stop.is_set():
            log.info("replay connection from %s:%d ended: %s", peer[0], peer[1], exc)
    except Exception as exc:  # a bug or a buffer error must not take the server down
        reason = f"internal error: {exc!r}"
        log.exception("replay connection from %s:%d failed", *peer[:2])
    drop(server, conn, peer, reason, retry)


def authenticate(conn: socket.socket, secret: bytes, deadline: float) -> None:
    """HMAC challenge-response: the client answers HMAC(secret, label + nonce); compared in constant time."""
    nonce = P.new_nonce()
    conn.sendall(P.json_frame(P.AUTH, {"nonce": nonce.hex(), "alg": "hmac-sha256"}))
    try:
        ftype, _, count, _ = P.unpack_header(recv_exact(conn, P.HEADER_SIZE, deadline, "the AUTH reply"))
        if ftype != P.AUTH:
            raise P.ProtocolError(f"authentication failed: expected AUTH, got {P.TYPE_NAMES[ftype]}")
        if count > P.MAX_AUTH_BYTES:
            raise P.ProtocolError(f"authentication failed: AUTH body of {count} bytes exceeds {P.MAX_AUTH_BYTES}")
        body = P.parse_json(P.AUTH, recv_exact(conn, count, deadline, "the AUTH reply"))
    except _Closed:
        raise P.ProtocolError("authentication failed: the client closed the connection instead of answering "
                              "the challenge (it has no shared secret?)") from None
    if not P.check_mac(secret, nonce, body.get("mac")):
        raise P.ProtocolError("authentication failed: wrong shared secret")


def serve_tcp_writer(server, conn: socket.socket, cid: str, stream_id: str, client_next: int,
                     stats: ClientStats) -> None:
    """Take over the writer stream (a reconnect stops the lingering old connection first), WELCOME the
    writer with the sequence number to resume from, then read its DATA frames (:mod:`tcp_ingest`)."""
    with server._lock:
        st = server._take_stream(stream_id, cid, client_next)
        old = st.conn
    if old is not None:  # a reconnect while the old connection lingers: it must stop first
        shutdown(old)
    if not st.lock.acquire(timeout=30):
        raise P.ProtocolError(f"stream {stream_id} is still being served by another connection")
    try:
        st.conn = conn
        if client_next > st.next_seq:
            raise P.ProtocolError(f"next_seq={client_next} is ahead of the server's {st.next_seq} for this stream: "
                                  f"the server restarted from a checkpoint taken before samples [{st.next_seq}, "
                                  f"{client_next}) of it were acknowledged; they are lost")
        conn.sendall(P.json_frame(P.WELCOME, {"version": P.PROTOCOL_VERSION, "record_size": server.rec.itemsize},
                                  seq=st.next_seq))
        read_stream(server, conn, st, stats)
    finally:
        if st.conn is conn:
            st.conn = None
        st.lock.release()
        server._stream_left(stream_id, st)
