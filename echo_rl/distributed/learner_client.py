"""A learner in another process: batches drawn by the replay server, sent back as one BATCH frame each.

The server's own process samples with :meth:`ReplayServer.sample` (no copy); a learner elsewhere
uses :class:`LearnerClient`, whose batches are views over the bytes received. The server sends
nothing unasked except an ERROR before it closes the connection, so before each request the client
peeks: a retryable ERROR (dropped for idling) means reconnect and go on, any other is raised.
"""

from __future__ import annotations

import socket
from typing import Any

import numpy as np

from echo_rl.replay.buffer import Batch
from echo_rl.replay.schema import Schema
from echo_rl.distributed import protocol as P
from echo_rl.distributed.client_handshake import (
    ReplayServerBusy,
    ReplayServerError,
    handshake,
    new_stream_id,
    parse_address,
    recv_exact,
    refusal,
)


class LearnerClient:
    """A learner in another process: ``sample(n)`` returns a Batch whose data are views over the received bytes."""

    def __init__(self, address, example: Any, *, connect_timeout: float = 10.0, client_id: str = "learner",
                 secret: str | bytes | None = None):
        self.host, self.port = parse_address(address)
        self._secret = P.as_secret(secret) if secret is not None else P.secret_from_env()
        self.schema = example if isinstance(example, Schema) else Schema.from_example(example)
        self.rec = P.record_dtype(self.schema)
        self.client_id = client_id
        self.connect_timeout = connect_timeout
        self._sock: socket.socket | None = None

    def connect(self) -> "LearnerClient":
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        body = P.hello_body(self.schema, self.client_id, "tcp", 0, role="learner")
        body["stream"] = new_stream_id()
        try:
            handshake(sock, body, self._secret)
        except BaseException:
            self.close()
            raise
        sock.settimeout(None)
        return self

    def _reconnect_if_lost(self) -> None:
        """Before a request: the server sends nothing unasked but an ERROR before it closes. A retryable
        one (dropped for idling) means reconnect; any other is raised as before."""
        try:
            peek = self._sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            raise ConnectionError(f"replay server connection lost: {exc}") from exc
        if not peek:
            raise ConnectionError("replay server closed the connection")
        self._sock.settimeout(5.0)
        try:
            ftype, _, count, _ = P.unpack_header(recv_exact(self._sock, P.HEADER_SIZE))
            body = P.parse_json(ftype, recv_exact(self._sock, count)) if ftype == P.ERROR else {}
        finally:
            self._sock.settimeout(None)
        if ftype != P.ERROR:
            raise ReplayServerError(f"unexpected {P.TYPE_NAMES[ftype]} frame from the server")
        err = refusal(body, "replay server closed the connection")
        if not isinstance(err, ReplayServerBusy):
            raise err
        self.close()
        self.connect()

    def __enter__(self) -> "LearnerClient":
        return self.connect()

    def __exit__(self, *exc) -> None:
        self.close()

    def sample(self, n: int) -> Batch:
        """Ask the server for n samples (blocks until its buffer is ready)."""
        if not 0 < int(n) <= P.MAX_FRAME_SAMPLES:
            raise ValueError(f"n={n!r} is invalid: must be in [1, {P.MAX_FRAME_SAMPLES}]")
        self._reconnect_if_lost()
        try:
            return self._sample(int(n))
        except ReplayServerBusy:  # dropped for idling just as the request went out: it was not served
            self.close()
            self.connect()
            return self._sample(int(n))

    def _sample(self, n: int) -> Batch:
        self._sock.sendall(P.pack_header(P.SAMPLE, n, 0))
        ftype, _, count, _ = P.unpack_header(recv_exact(self._sock, P.HEADER_SIZE))
        if ftype == P.ERROR:
            raise refusal(P.parse_json(ftype, recv_exact(self._sock, count)), "replay server refused the request")
        if ftype != P.BATCH or count != n:
            raise ReplayServerError(f"expected a BATCH of {n}, got {P.TYPE_NAMES[ftype]} of {count}")
        body = recv_exact(self._sock, 24 * n + n * self.rec.itemsize)
        ids = np.frombuffer(body, np.int64, n, 0)
        weights = np.frombuffer(body, np.float64, n, 8 * n)
        probs = np.frombuffer(body, np.float64, n, 16 * n)
        recs = np.frombuffer(body, self.rec, n, 24 * n)
        return Batch(P.records_to_tree(self.schema, recs), ids, weights, probs)

    def update_priorities(self, indices, priorities) -> None:
        ids = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        pr = np.ascontiguousarray(priorities, dtype=np.float64).reshape(-1)
        if ids.shape != pr.shape:
            raise ValueError(f"indices has {ids.size} entries, priorities {pr.size}")
        self._reconnect_if_lost()
        self._sock.sendall(P.pack_header(P.PRIORITIES, ids.size, 0) + ids.tobytes() + pr.tobytes())

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.sendall(P.pack_header(P.BYE, 0, 0))
            except OSError:
                pass
            self._sock.close()
            self._sock = None
