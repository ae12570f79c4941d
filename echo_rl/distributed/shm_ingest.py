"""The shared-memory writer path of the replay server: one ring per writer, one thread draining them all.

A writer on the server's host gets its own ring (:mod:`shm_ring`); its socket stays open only to
say when the writer is gone. :func:`ring_loop` takes every ring's published rows as contiguous
per-leaf runs, stores runs from all rings with one buffer add (through the server's rate limiter
and checkpoint lock) and then moves each ring's ``tail`` — the acknowledgement — ring by ring, under
the same lock as the store, so a checkpoint holds exactly the acknowledged samples.
"""

from __future__ import annotations

import logging
import socket
import time

import numpy as np

from echo_rl.distributed import protocol as P
from echo_rl.distributed.limits import Closed as _Closed
from echo_rl.distributed.shm_ring import Backoff, RingReader, ShmRing

log = logging.getLogger("echo_rl.replay_server")


def serve_shm(self, conn: socket.socket, peer, cid: str, stats) -> None:
    """A shared-memory writer: make its ring, WELCOME it, then wait on its socket for the end."""
    if peer[0] not in ("127.0.0.1", "::1"):
        raise P.ProtocolError(f"shared memory needs a client on this host; {peer[0]} is remote (use tcp)")
    lim = self.limits
    with self._lock:  # quotas count live rings (a ring being drained after its writer left is not)
        live = [c for k, (_, c) in self._rings.items() if k not in self._ring_gone]
        if len(live) >= lim.max_rings:
            raise P.ProtocolError(f"no shared-memory ring left: {len(live)} in use (max_rings={lim.max_rings}); "
                                  f"use transport='tcp'")
        if live.count(cid) >= lim.max_rings_per_client:
            raise P.ProtocolError(f"client_id={P.short(cid)} already holds {live.count(cid)} shared-memory rings "
                                  f"(max_rings_per_client={lim.max_rings_per_client}); use transport='tcp'")
        ring = ShmRing.create(self.rec, self.shm_capacity)
        self._segments.add(ring.name)
        reader = RingReader(ring)
        key = id(reader)
        self._rings[key] = (reader, cid)
    conn.sendall(P.json_frame(P.WELCOME, {"version": P.PROTOCOL_VERSION, "shm_name": ring.name,
                                          "capacity": ring.capacity, "record_size": self.rec.itemsize}))
    try:
        while True:  # the socket only signals the writer's end (EOF, BYE or anything else)
            data = conn.recv(4096)
            if not data:
                break
            ftype = P.unpack_header(data)[0] if len(data) >= P.HEADER_SIZE else None
            if ftype != P.BYE:
                raise P.ProtocolError("unexpected bytes on a shared-memory control connection")
            break
    finally:
        with self._lock:
            self._ring_gone.add(key)  # the ring thread drains what was published, then frees it

def ring_loop(self) -> None:
    """Drain every ring; runs from all rings go into one buffer.add. When little is pending the
    loop waits ~200 µs once so that per-sample writers are stored in batches, not one by one."""
    back = Backoff()
    waited = False
    while True:
        with self._lock:
            rings = list(self._rings.items())
            gone = set(self._ring_gone)
        taken = []
        total = 0
        for key, (reader, cid) in rings:
            run = reader.peek(self.max_run)
            if run is not None:
                taken.append((key, reader, cid, run))
                total += len(run[0])
        if 0 < total < self.coalesce and not waited and not gone and not self._stop.is_set():
            waited = True
            time.sleep(2e-4)
            continue
        waited = False
        if taken:
            try:
                leaves = taken[0][3] if len(taken) == 1 else [np.concatenate(parts)
                                                               for parts in zip(*(t[3] for t in taken))]
                self._add_limited(lambda lo, hi: self.schema.unflatten([x[lo:hi] for x in leaves]), total,
                                  stored=Consumer(taken, self._stats))
            except _Closed:
                return  # closing while the rate limiter held these back: they stay unacknowledged
            except Exception:
                log.exception("storing samples from shared-memory clients failed; closing their rings")
                for key, reader, _, _ in taken:
                    reader.mark_closed()
                    gone.add(key)
            leaves = None  # drop the views into the rings before one can be unmapped
            taken.clear()
        for key, (reader, cid) in rings:
            if key in gone and (reader.pending() == 0 or reader.ring.closed):
                with self._lock:
                    self._rings.pop(key, None)
                    self._ring_gone.discard(key)
                reader.mark_closed()
                reader.ring.close()
        if total:
            back.reset()
        elif self._stop.is_set():
            return
        else:
            back.wait()


class Consumer:
    """Acknowledges the next k stored samples of runs taken from several rings, ring by ring, in order."""

    def __init__(self, taken, stats):
        self.parts = [(reader, len(run[0]), sum(x.nbytes for x in run), stats[cid]) for _, reader, cid, run in taken]
        self.i = self.off = 0

    def __call__(self, k: int) -> None:
        while k > 0:
            reader, n, nbytes, st = self.parts[self.i]
            d = min(k, n - self.off)
            reader.consume(d)
            st.note(d, nbytes * d // n)
            if self.off == 0:
                st.frames += n
            self.off += d
            k -= d
            if self.off == n:
                self.i, self.off = self.i + 1, 0
