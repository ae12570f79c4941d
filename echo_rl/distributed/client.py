"""Clients of the replay server: writers (:class:`ReplayClient`, here) and remote learners
(:class:`~echo_rl.distributed.learner_client.LearnerClient`, re-exported here with the handshake's errors).

A writer sends pytree samples (``send``) or whole trajectories / batches (``send_batch``: every
leaf with a leading axis). On the server's host it writes into a shared-memory ring; elsewhere it
streams DATA frames over TCP:

* one-sample frames are staged in a preallocated frame array and written when ``flush_bytes`` of
  them are pending (or on :meth:`flush`) — one ``send`` per chunk, each sample still its own
  message with its own sequence number;
* every chunk written is kept until the server acknowledges it; at most ``max_unacked`` samples
  may be in flight (then ``send`` blocks: backpressure);
* on a broken connection the client reconnects (within ``reconnect_timeout`` seconds), learns the
  next sequence number the server expects and resends from there — the server skips anything it
  already stored, so no acknowledged sample is lost or duplicated.
"""

from __future__ import annotations

import collections
import socket
import time
from typing import Any

import numpy as np

from echo_rl.distributed import protocol as P
from echo_rl.replay.schema import Schema
from echo_rl.distributed.client_handshake import (
    ReplayServerBusy,
    ReplayServerError,
    handshake,
    new_stream_id,
    parse_address,
    refusal,
)
from echo_rl.distributed.learner_client import LearnerClient
from echo_rl.distributed.shm_ring import RingWriter, ShmRing, check_platform
from echo_rl.kernels._backend import native_module

__all__ = ["LearnerClient", "ReplayClient", "ReplayServerBusy", "ReplayServerError", "new_stream_id", "parse_address"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ReplayClient:
    """Writes samples to a :class:`~echo_rl.distributed.server.ReplayServer` at ``address`` ("host:port").

    ``example``: one sample fixing the schema (checked by the server in the handshake).
    ``transport``: "auto" (shared memory when the server is on loopback, else TCP), "tcp" or "shm".
    ``secret``: the server's shared secret, if it has one (default: ``$ECHORL_REPLAY_SECRET`` when set).
    """

    def __init__(self, address, example: Any, *, transport: str = "auto", client_id: str | None = None,
                 max_unacked: int = 1 << 16, flush_bytes: int = 1 << 16, reconnect_timeout: float = 30.0,
                 connect_timeout: float = 10.0, secret: str | bytes | None = None):
        if transport not in ("auto", "tcp", "shm"):
            raise ValueError(f"transport={transport!r} is invalid: allowed: auto, tcp, shm")
        if max_unacked < 1:
            raise ValueError(f"max_unacked={max_unacked!r} is invalid: must be >= 1")
        self.host, self.port = parse_address(address)
        self._secret = P.as_secret(secret) if secret is not None else P.secret_from_env()
        self.schema = example if isinstance(example, Schema) else Schema.from_example(example)
        self.rec = P.record_dtype(self.schema)
        self.frame = P.frame_dtype(self.rec)
        if transport == "auto":
            try:
                check_platform()
                shm_ok = True
            except RuntimeError:
                shm_ok = False
            transport = "shm" if shm_ok and self.host in _LOOPBACK else "tcp"
        self.transport = transport
        self.stream = new_stream_id()
        self.client_id = client_id or f"client-{self.stream[:8]}"
        self.max_unacked = int(max_unacked)
        self.reconnect_timeout = float(reconnect_timeout)
        self.connect_timeout = float(connect_timeout)
        # fast-path plan for flat dicts: keys, canonical dtype objects (compared by identity), shapes
        self._keys = self.schema.flat_keys or ()
        self._nkeys = len(self._keys) if self.schema.flat_keys is not None else -1
        self._dts = [np.dtype(lf.dtype.str) for lf in self.schema.leaves]
        self._shapes = [lf.shape for lf in self.schema.leaves]
        # shared memory: one compiled call stores a flat dict of exact arrays (the replay kernels' add_one)
        self._nat = native_module() if self.schema.flat_keys is not None else None
        self._sock: socket.socket | None = None
        self._writer: RingWriter | None = None
        self._shm_base = 0  # seq of the current ring's record 0 (moves on a reconnect)
        self._seq = 0  # next sequence number to assign
        self._acked = 0  # every seq below is in the server's buffer
        self._unacked: collections.deque = collections.deque()  # (end_seq, bytes, t_sent)
        self._ackbuf = bytearray(1 << 12)
        self._ack_end = 0
        k = max(1, int(flush_bytes) // self.frame.itemsize)
        self._stage = np.zeros(k, dtype=self.frame)
        self._stage["h"]["magic"] = P.MAGIC
        self._stage["h"]["type"] = P.DATA
        self._stage["h"]["count"] = 1
        self._st_seq = self._stage["h"]["seq"]
        self._st_fields = [self._stage["r"][n] for n in self.rec.names]
        self._n = 0
        self._out: list[bytes] = []  # frames staged for the next write
        self._out_bytes = 0
        self.flush_bytes = int(flush_bytes)
        self.reconnects = 0
        self.blocked = 0
        self.ack_latency_s = 0.0

    # ------------------------------------------------------------ lifecycle
    def connect(self) -> "ReplayClient":
        self._open(time.monotonic() + self.connect_timeout)
        return self

    def __enter__(self) -> "ReplayClient":
        return self.connect() if self._sock is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self, deadline: float) -> None:
        delay = 0.05
        while True:
            try:
                self._open_once()
                return
            except ReplayServerError:
                self._close_sock()
                raise
            except OSError as exc:
                self._close_sock()
                if time.monotonic() + delay > deadline:
                    raise ConnectionError(f"cannot reach the replay server at {self.host}:{self.port}: {exc}") from exc
                time.sleep(delay)
                delay = min(1.0, delay * 2)

    def _open_once(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        body = P.hello_body(self.schema, self.client_id, self.transport, self._acked)
        body["stream"] = self.stream
        info, seq = handshake(sock, body, self._secret)
        sock.settimeout(None)
        if self.transport == "shm":
            old = self._writer
            self._writer = RingWriter(ShmRing.attach(info["shm_name"], self.rec), alive=self._server_alive)
            if old is not None:  # a new server: republish what the old one never consumed
                lo, hi = old.acked, old.published
                if hi > lo:
                    self._writer.write_many(old.ring.rows(lo, hi), hi - lo)
                self._shm_base += lo
                old.ring.close()
            return
        if seq < self._acked:
            raise ReplayServerError(f"server expects seq {seq} but acknowledged up to {self._acked} before")
        self._on_ack(seq)
        for _, data, _ in list(self._unacked):  # resend; the server skips what it already holds
            sock.sendall(data)

    def _server_alive(self) -> bool:
        """False once the control socket of a shared-memory client has seen EOF or an error."""
        try:
            data = self._sock.recv(P.HEADER_SIZE, socket.MSG_DONTWAIT | socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return True
        except (OSError, AttributeError):
            return False
        return bool(data)

    def _close_sock(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def close(self) -> None:
        """Flush, wait (up to ``reconnect_timeout``) for the server to acknowledge everything, say BYE."""
        if self._sock is None:
            return
        try:
            self.flush(wait=True, timeout=self.reconnect_timeout)
            self._sock.sendall(P.pack_header(P.BYE, 0, 0))
        except OSError:
            pass
        self._close_sock()
        if self._writer is not None:
            self._writer.ring.close()
            self._writer = None

    # ------------------------------------------------------------ sending
    def _write_fields(self, fields, slot: int, sample) -> None:
        """Check and write one sample's leaves into row ``slot`` of ``fields`` in one pass (fast path:
        a flat dict of ndarrays with the schema's dtype objects and shapes); anything else is checked
        in full first. Nothing is published until the caller moves head/seq, so a rejected sample
        leaves no trace."""
        if type(sample) is dict and len(sample) == self._nkeys:
            try:
                for k, dt, shape, f in zip(self._keys, self._dts, self._shapes, fields):
                    x = sample[k]
                    if type(x) is not np.ndarray or x.dtype is not dt or x.shape != shape:
                        break
                    f[slot] = x
                else:
                    return
            except KeyError:
                pass
        for f, x in zip(fields, self.schema.check_one(sample)):
            f[slot] = x

    def send(self, sample: Any) -> int:
        """Queue one sample (a pytree matching the schema); returns its sequence number."""
        s = self._seq
        w = self._writer
        if w is not None:  # shared memory: write the slot, then publish head
            h = w._head
            if h - w._tail >= w.cap:
                try:
                    w._room(1)
                except ConnectionError:
                    self._reconnect()
                    w = self._writer
                    h = w._head
            if self._nat is None or self._nat.add_one(w.fields_t, self._keys, sample, h & w.mask, None, None, 0,
                                                      0.0) >= 0:  # not a flat dict of exact arrays: check it
                self._write_fields(w.fields, h & w.mask, sample)
            w._head = h + 1
            w.ctr[0] = h + 1  # aligned 8-byte store after the record bytes (see shm_ring)
            self._seq = s + 1
            return s
        if self._sock is None:
            raise ConnectionError("ReplayClient is not connected: call connect() first")
        i = self._n
        self._write_fields(self._st_fields, i, sample)
        self._st_seq[i] = s
        self._seq = s + 1
        self._n = i + 1
        if i + 1 == len(self._stage):
            self._flush_stage()
        return s

    def send_batch(self, batch: Any) -> int:
        """Send n samples at once (each leaf with a leading axis n, e.g. a trajectory); returns the first seq."""
        n, leaves = self.schema.check_batch(batch)
        first = self._seq
        if n == 0:
            return first
        if self._writer is not None:
            try:
                self._writer.write_many(leaves, n)
            except ConnectionError:  # republishes the part already written, then the rest
                done = self._writer.published - (first - self._shm_base)
                self._reconnect()
                self._writer.write_many([x[done:] for x in leaves], n - done)
            self._seq += n
            return first
        if self._sock is None:
            raise ConnectionError("ReplayClient is not connected: call connect() first")
        self._stage_out()
        recs = np.empty(n, dtype=self.rec)
        for name, x in zip(self.rec.names, leaves):
            recs[name] = x
        for lo in range(0, n, P.MAX_FRAME_SAMPLES):
            part = recs[lo: lo + P.MAX_FRAME_SAMPLES]
            self._out.append(P.pack_header(P.DATA, len(part), self._seq))
            self._out.append(part.tobytes())
            self._out_bytes += P.HEADER_SIZE + part.nbytes
            self._seq += len(part)
        if self._out_bytes >= self.flush_bytes:
            self._flush_stage()
        return first

    def _stage_out(self) -> None:
        """Move staged one-sample frames to the outgoing list (keeps frame order with batches)."""
        n = self._n
        if n:
            self._n = 0
            self._out.append(self._stage[:n].tobytes())
            self._out_bytes += n * self.frame.itemsize

    def _flush_stage(self) -> None:
        """Write everything staged as one chunk (kept until acknowledged)."""
        self._stage_out()
        if self._out:
            data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
            self._out.clear()
            self._out_bytes = 0
            self._write(data, self._seq)

    def _write(self, data: bytes, end_seq: int) -> None:
        self._unacked.append((end_seq, data, time.monotonic()))
        try:
            self._sock.sendall(data)
            self._poll_acks(block=False)
            while self._seq - self._acked > self.max_unacked:
                self.blocked += 1
                self._poll_acks(block=True)
        except ReplayServerError:
            raise
        except OSError:
            self._reconnect()

    def _reconnect(self) -> None:
        self._close_sock()
        self.reconnects += 1
        self._open(time.monotonic() + self.reconnect_timeout)
        while self._seq - self._acked > self.max_unacked:
            self._poll_acks(block=True)

    def _on_ack(self, seq: int) -> None:
        if seq > self._acked:
            self._acked = seq
            now = time.monotonic()
            q = self._unacked
            while q and q[0][0] <= seq:
                self.ack_latency_s = now - q.popleft()[2]

    def _poll_acks(self, block: bool) -> None:
        sock = self._sock
        view = memoryview(self._ackbuf)
        while True:
            try:
                got = sock.recv_into(view[self._ack_end:], 0, 0 if block else socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            if got == 0:
                raise ConnectionError("replay server closed the connection")
            self._ack_end += got
            pos = 0
            while self._ack_end - pos >= P.HEADER_SIZE:
                ftype, _, count, seq = P.unpack_header(self._ackbuf, pos)
                if ftype == P.ACK:
                    self._on_ack(seq)
                    pos += P.HEADER_SIZE
                elif ftype == P.ERROR:
                    if self._ack_end - pos - P.HEADER_SIZE < count:
                        break
                    body = P.parse_json(P.ERROR, bytes(self._ackbuf[pos + P.HEADER_SIZE: pos + P.HEADER_SIZE + count]))
                    raise refusal(body, "replay server closed the connection")
                else:
                    raise ReplayServerError(f"unexpected {P.TYPE_NAMES[ftype]} frame from the server")
            rest = self._ack_end - pos
            self._ackbuf[:rest] = self._ackbuf[pos: self._ack_end]
            self._ack_end = rest
            if block:
                return

    def flush(self, wait: bool = False, timeout: float | None = None) -> bool:
        """Write staged samples; with ``wait``, block until the server acknowledged all (False on timeout)."""
        if self._writer is not None:
            if not wait:
                return True
            try:
                return self._writer.wait_drained(timeout)
            except ConnectionError:
                self._reconnect()
                return self._writer.wait_drained(timeout)
        self._flush_stage()
        if not wait:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._acked < self._seq:
            if deadline is not None and time.monotonic() > deadline:
                return False
            try:
                self._sock.settimeout(None if deadline is None else max(0.01, deadline - time.monotonic()))
                self._poll_acks(block=True)
            except (TimeoutError, socket.timeout):
                return False
            except ReplayServerError:
                raise
            except OSError:
                self._reconnect()
            finally:
                if self._sock is not None:
                    self._sock.settimeout(None)
        return True

    # ------------------------------------------------------------ state
    @property
    def sent(self) -> int:
        """Samples handed to ``send``/``send_batch`` (sequence numbers issued)."""
        return self._seq

    @property
    def acked(self) -> int:
        """Samples the server has stored (every seq below this)."""
        if self._writer is not None:
            return self._shm_base + self._writer.acked
        return self._acked

    def metrics(self) -> dict[str, float]:
        blocked = self._writer.blocked if self._writer is not None else self.blocked
        return {"client/sent": float(self.sent), "client/acked": float(self.acked),
                "client/in_flight": float(self.sent - self.acked), "client/ack_latency_s": self.ack_latency_s,
                "client/reconnects": float(self.reconnects), "client/blocked": float(blocked)}
