"""The TCP writer path of the replay server: per-stream state and the loop that reads DATA frames.

A chunk read from the socket is parsed in place: a run of one-sample frames (fixed size) is viewed
as one structured array and its headers checked at once; a multi-record frame is stored record by
record as its bytes arrive. Each run is stored with one ``buffer.add`` and one ACK goes back per
chunk — after the add, so an acknowledged sample is in the buffer (exactly-once with the stream's
next expected sequence number, which survives reconnects).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from echo_rl.distributed import protocol as P
from echo_rl.distributed.limits import Closed, Timeout

RECV_START = 1 << 16  # a TCP connection's receive buffer starts at 64 KiB ...
RECV_CHUNK = 1 << 22  # ... and doubles while reads fill it, up to 4 MiB


@dataclass
class Stream:
    """Per writer-stream state that survives reconnects: the next expected sequence number, and
    ``stored_seq``, the seq after the last sample in the buffer (what a checkpoint records)."""

    client_id: str
    next_seq: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    conn: socket.socket | None = None
    stored_seq: int = -1

    def __post_init__(self):
        if self.stored_seq < 0:
            self.stored_seq = self.next_seq


@dataclass
class ClientStats:
    samples: int = 0
    frames: int = 0
    bytes: int = 0
    duplicates: int = 0
    connections: int = 0
    window_start: float = field(default_factory=time.monotonic)
    window_samples: int = 0
    rate: float = 0.0
    live: int = 0  # open connections of this client

    def note(self, n: int, nbytes: int) -> None:
        self.samples += n
        self.bytes += nbytes
        self.window_samples += n
        now = time.monotonic()
        dt = now - self.window_start
        if dt >= 1.0:
            self.rate = self.window_samples / dt
            self.window_start, self.window_samples = now, 0


def read_stream(server, conn: socket.socket, st: Stream, stats: ClientStats) -> None:
    """Read chunks, store every complete record, ACK once per chunk.

    Memory follows the bytes received, not the counts announced: the buffer starts at 64 KiB and
    doubles only while reads fill it (up to max(4 MiB, 4 frames)); a multi-record DATA frame is
    stored record by record as its bytes arrive (``left`` records to go, next seq ``fseq``), so
    nothing beyond one partial record or header is ever carried over."""
    rsz = server.rec.itemsize
    fsz = server.frame.itemsize
    cap = max(RECV_CHUNK, 4 * fsz)
    buf = bytearray(min(cap, max(RECV_START, 4 * fsz)))
    view = memoryview(buf)
    end = 0
    left = fseq = 0
    max_run = server.max_run
    idle = server.limits.idle_timeout
    deadline = None if idle is None else time.monotonic() + idle
    while True:
        if deadline is not None:
            conn.settimeout(max(1e-3, deadline - time.monotonic()))
        try:
            got = conn.recv_into(view[end:])
        except (TimeoutError, socket.timeout):
            raise Timeout(f"no complete frame in {idle:g}s (idle_timeout)") from None
        if got == 0:
            raise Closed()
        full = end + got == len(buf)
        end += got
        pos = 0
        runs: list[np.ndarray] = []  # record views into buf, stored before buf is reused
        nrun = 0
        acked = False
        while True:
            if nrun >= max_run:
                server._store_runs(runs, stats, st)
                runs.clear()
                nrun, acked = 0, True
            if left:  # inside a multi-record frame: take the whole records that are here
                k = min(left, (end - pos) // rsz)
                if k == 0:
                    break
                skip = min(st.next_seq - fseq, k)  # >= 0: checked at the frame's header
                if skip < k:
                    runs.append(np.frombuffer(buf, dtype=server.rec, count=k - skip, offset=pos + skip * rsz))
                    nrun += k - skip
                    st.next_seq = fseq + k
                stats.duplicates += skip
                pos += k * rsz
                left -= k
                fseq += k
                continue
            if end - pos < P.HEADER_SIZE:
                break
            ftype, _, count, seq = P.unpack_header(buf, pos)
            if ftype == P.BYE:
                if runs:
                    server._store_runs(runs, stats, st)
                if runs or acked:
                    conn.sendall(P.pack_header(P.ACK, 0, st.next_seq))
                raise Closed()
            if ftype != P.DATA:
                raise P.ProtocolError(f"unexpected {P.TYPE_NAMES[ftype]} frame from a writer")
            if not 0 < count <= P.MAX_FRAME_SAMPLES:
                raise P.ProtocolError(f"DATA frame count={count} is invalid: must be in [1, {P.MAX_FRAME_SAMPLES}]")
            if seq > st.next_seq:
                raise P.ProtocolError(f"sequence gap: expected {st.next_seq}, got {seq}")
            if count > 1:
                stats.frames += 1
                left, fseq = count, seq
                pos += P.HEADER_SIZE
                continue
            k = min((end - pos) // fsz, max_run)
            if k == 0:
                break
            frames = np.frombuffer(buf, dtype=server.frame, count=k, offset=pos)
            h = frames["h"]
            ok = (h["magic"] == P.MAGIC) & (h["type"] == P.DATA) & (h["count"] == 1)
            if not ok.all():
                k = int(np.argmin(ok))  # >= 1: the first frame was checked above
            seqs = h["seq"][:k]
            skip = int(np.searchsorted(seqs, st.next_seq)) if seqs[0] < st.next_seq else 0
            if skip < k:
                want = st.next_seq + np.arange(k - skip, dtype=np.uint64)
                if not np.array_equal(seqs[skip:], want):
                    bad = skip + int(np.argmin(seqs[skip:] == want))
                    raise P.ProtocolError(f"sequence gap: expected {st.next_seq + bad - skip}, "
                                          f"got {int(seqs[bad])}")
                runs.append(frames["r"][skip:k])
                nrun += k - skip
                st.next_seq += k - skip
            stats.frames += k
            stats.duplicates += skip
            del frames, h, seqs
            pos += k * fsz
        if runs:
            server._store_runs(runs, stats, st)
            runs.clear()
            acked = True
        if acked:
            conn.sendall(P.pack_header(P.ACK, 0, st.next_seq))
        if pos:
            if deadline is not None:  # a frame or record completed: the peer is not idle
                deadline = time.monotonic() + idle
            rest = end - pos
            if rest:
                buf[:rest] = bytes(view[pos:end])
            end = rest
        if full and len(buf) < cap:  # the socket had more than fit: read bigger chunks
            nbuf = bytearray(min(cap, 2 * len(buf)))
            nbuf[:end] = view[:end]
            view.release()
            buf, view = nbuf, memoryview(nbuf)
