"""The replay ingestion server: many writers push samples, the buffer stores them, learners sample.

One listening TCP socket serves every peer; the first frame (HELLO) says who it is:

* a **TCP writer** streams DATA frames; a thread per connection reads large chunks, checks a run
  of one-sample frames as one structured array, adds each run with one ``buffer.add`` and answers
  one ACK per chunk (windowed acks);
* a **shared-memory writer** (same host) gets a ring of its own (:mod:`shm_ring`); its socket stays
  open only to tell the server when the writer is gone. One reader thread drains every ring;
* a **learner** asks for batches (SAMPLE) and sends priorities back (PRIORITIES).

A learner in the server's own process calls :meth:`ReplayServer.sample` directly: it blocks
without the GIL (a condition wait) until the buffer is ready and returns the buffer's batch arrays
as they are — no copy beyond the buffer's gather.

Exactly-once: each writer stream (a random id per ``ReplayClient``) has a next expected sequence
number that survives reconnects; a sample is added only when its seq is the expected one, resends
of stored seqs are skipped, and a gap closes the connection. An ACK is sent only after the add.

Rooms: this module holds the storing and serving core (lifecycle, the learner API, stores through
the rate limiter and checkpoint lock, metrics); :mod:`connections` accepts peers, runs the handshake
and hands each to its role — :mod:`tcp_ingest` (TCP writers), :mod:`shm_ingest` (shared-memory
writers), :mod:`learner_serving` (remote learners).

Per-stream records: a writer stream's position (and a client's counters) is kept while it is connected
and, after it disconnects, among the ``max_idle_streams`` most recently active ones, so a writer that
reconnects soon keeps exactly-once; the oldest idle records are freed beyond that (a writer returning
after its record was freed resumes from the position it sends). Many short-lived writers cost a bounded
amount of memory.

Limits (:mod:`limits`): a connection cap (over it: a retryable ERROR, no thread), a whole-handshake
deadline, an idle timeout (a TCP writer or learner must complete a frame every ``idle_timeout``
seconds: idle peers and slow-loris partial frames are dropped), receive buffers that grow only as
bytes arrive (a DATA frame announcing 2^20 records is stored record by record as they come, so one
connection never buffers more than ~4 MiB), shared-memory ring quotas, an optional shared-secret
handshake (HMAC-SHA256 challenge-response, ``hmac.compare_digest``) and a warning when the server
listens on a non-loopback address. All are checked per connection or per frame, not per sample.

Backpressure: a TCP connection is read only as fast as its samples are stored, so a slow server
fills the socket buffers and then the client's ack window, which blocks the writer; a shm writer
blocks when its ring is full. A buffer with a rate limiter (samples per insert) adds one more
source: stores wait for the limiter's permission, so writers slow to the learner's pace.

Checkpoints (:mod:`checkpoint`): ``checkpoint_path`` restores the buffer and the writer streams'
positions at start when the file exists, and ``checkpoint_every`` seconds (or
:meth:`ReplayServer.checkpoint`) writes them atomically — a server killed with SIGKILL restarts
with every sample acknowledged before its last checkpoint.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import socket
import threading
import time

import numpy as np

from echo_rl.replay.buffer import Batch
from echo_rl.replay.rate_limiter import RateLimited, RateLimiterCancelled
from echo_rl.replay.samplers import ReplayNotReadyError
from echo_rl.distributed import checkpoint as ckpt
from echo_rl.distributed import protocol as P
from echo_rl.distributed import shm_ingest
from echo_rl.distributed.client_handshake import new_stream_id  # noqa: F401 (its old home; clients name streams)
from echo_rl.distributed.connections import accept_loop, shutdown
from echo_rl.distributed.limits import Closed as _Closed
from echo_rl.distributed.limits import Refuser, ServerLimits, bind_warning
from echo_rl.distributed.shm_ring import SHM_DIR, RingReader
from echo_rl.distributed.tcp_ingest import ClientStats, Stream

log = logging.getLogger("echo_rl.replay_server")


class ReplayServer:
    """Feeds ``buffer`` (a PrioritizedReplayBuffer / HotColdBuffer built with ``example=``) from remote writers.

    ``host``/``port``: where to listen (default loopback, an ephemeral port — see :attr:`address`).
    ``shm_capacity``: records per shared-memory ring (rounded up to a power of two).
    ``max_run``: most samples stored by one ``buffer.add``; ``coalesce``: below this many pending
    shared-memory samples the ring thread waits ~200 µs once to batch them. ``logger``: optional metrics logger
    (``log(metrics, step)``) called with every batch's metrics.
    ``secret``: a shared secret (str/bytes) every client must prove it knows (HMAC challenge); None: no
    authentication. It is kept in memory only, never logged. ``max_connections``, ``handshake_timeout``,
    ``idle_timeout``, ``max_rings``, ``max_rings_per_client``, ``max_reply_bytes``: see
    :class:`~echo_rl.distributed.limits.ServerLimits`.
    ``checkpoint_path``: restore from it at start if it exists; ``checkpoint_every``: seconds between
    automatic checkpoints to it (None: only explicit :meth:`checkpoint` calls).
    ``max_idle_streams``: records of disconnected writer streams (and of clients with no connection) kept;
    the least recently active beyond it are freed.
    """

    def __init__(self, buffer, host: str = "127.0.0.1", port: int = 0, *, shm_capacity: int = 1 << 16,
                 max_run: int = 4096, coalesce: int = 256, logger=None, secret: str | bytes | None = None,
                 max_connections: int = 256, handshake_timeout: float = 10.0, idle_timeout: float | None = 600.0,
                 max_rings: int = 64, max_rings_per_client: int = 4, max_reply_bytes: int = 1 << 30,
                 checkpoint_path: str | os.PathLike | None = None, checkpoint_every: float | None = None,
                 max_idle_streams: int = 1024):
        if getattr(buffer, "schema", None) is None:
            raise ValueError("buffer has no schema yet: build it with example=<one sample> before serving it")
        if not 0 <= int(port) <= 65535:
            raise ValueError(f"port={port!r} is invalid: must be in [0, 65535]")
        self.buffer = buffer
        self.schema = buffer.schema
        self.rec = P.record_dtype(self.schema)
        self.frame = P.frame_dtype(self.rec)
        self.host, self.port = host, int(port)
        self.shm_capacity = int(shm_capacity)
        self.max_run = int(max_run)
        self.coalesce = int(coalesce)
        self.logger = logger
        self.limits = ServerLimits(max_connections, handshake_timeout, idle_timeout, max_rings, max_rings_per_client,
                                   max_reply_bytes)
        self._secret = P.as_secret(secret)
        self._refuser = Refuser()
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        if isinstance(max_idle_streams, bool) or not isinstance(max_idle_streams, int) or max_idle_streams < 0:
            raise ValueError(f"max_idle_streams={max_idle_streams!r} is invalid: must be an integer >= 0")
        self.max_idle_streams = max_idle_streams
        self._streams: dict[str, Stream] = {}
        self._stats: dict[str, ClientStats] = {}
        self._idle_streams: collections.OrderedDict[str, None] = collections.OrderedDict()  # oldest first
        self._idle_clients: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._retired = ClientStats()  # totals of clients whose records were freed
        self._rings: dict[int, tuple[RingReader, str]] = {}
        self._ring_gone: set[int] = set()
        self._segments: set[str] = set()  # every /dev/shm segment this server created (removed on close)
        self._lock = threading.Lock()
        self._ready = threading.Condition()
        self._stop = threading.Event()
        self._batches = 0
        self._became_ready = False
        self._started = 0.0
        self.last_batch_metrics: dict[str, float] = {}
        self.closed_reasons: collections.deque = collections.deque(maxlen=1000)  # why connections were dropped
        self._closed_count = 0
        if checkpoint_every is not None and (checkpoint_path is None or not float(checkpoint_every) > 0):
            raise ValueError(f"checkpoint_every={checkpoint_every!r} is invalid: needs checkpoint_path and a number > 0")
        self.checkpoint_path = None if checkpoint_path is None else os.fspath(checkpoint_path)
        self.checkpoint_every = checkpoint_every
        self._ckpt_lock = threading.Lock()  # held around every store + stream position update
        self._checkpointer: ckpt.Checkpointer | None = None
        self._restored = False

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "ReplayServer":
        if self._sock is not None:
            raise RuntimeError("ReplayServer is already started")
        self._stop.clear()
        if self.checkpoint_path is not None and os.path.exists(self.checkpoint_path) and not self._restored:
            ckpt.restore(self, self.checkpoint_path)
            with self._lock:
                self._idle_streams = collections.OrderedDict.fromkeys(self._streams)
                self._trim_idle()
            self._note_stored()
        sock = socket.create_server((self.host, self.port), backlog=128)
        sock.settimeout(0.2)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._started = time.monotonic()
        for target, name in ((accept_loop, "replay-accept"), (shm_ingest.ring_loop, "replay-shm")):
            t = threading.Thread(target=target, args=(self,), name=name, daemon=True)
            t.start()
            self._threads.append(t)
        if self.checkpoint_every is not None:
            self._checkpointer = ckpt.Checkpointer(self, self.checkpoint_path, self.checkpoint_every)
            self._checkpointer.start()
        log.info("replay server listening on %s:%d (schema: %s; %s)", self.host, self.port, self.schema.describe(),
                 "shared-secret authentication on" if self._secret else "no authentication")
        warning = bind_warning(sock.getsockname()[0], self.port, self._secret is not None)
        if warning:
            log.warning(warning)
        return self

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def close(self) -> None:
        """Stop accepting, drain shared-memory rings, close every connection, join threads."""
        if self._sock is None:
            return
        self._stop.set()
        with self._lock:
            for c in list(self._conns):
                shutdown(c)
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()
        if self._checkpointer is not None:  # a last checkpoint of everything stored
            self._checkpointer.join(timeout=10)
            self._checkpointer.tick()
            self._checkpointer = None
        self._sock.close()
        self._sock = None
        self._refuser.close()
        with self._lock:
            for reader, _ in self._rings.values():
                reader.mark_closed()
                reader.ring.close()
            self._rings.clear()
            for name in self._segments:  # also any ring a stuck thread did not get to remove
                try:
                    os.unlink(os.path.join(SHM_DIR, name))
                except FileNotFoundError:
                    pass
            self._segments.clear()
        with self._ready:
            self._ready.notify_all()

    def __enter__(self) -> "ReplayServer":
        return self.start() if self._sock is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ learner API
    def sample(self, n: int, timeout: float | None = None, beta: float | None = None, out=None,
               copy: bool = True) -> Batch:
        """Draw a batch of n once the buffer is ready; waits (GIL released) up to ``timeout`` seconds.

        ``out``: the learner's preallocated (or pinned) arrays, filled in place (see the buffer's
        ``sample``); ``Batch.data`` is then ``out``. ``copy=False``: a FIFO batch that does not wrap
        is returned as views into the ring (see the buffer's ``sample`` and ``view_valid``)."""
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        with self._ready:
            if not self._ready.wait_for(lambda: self.buffer.ready or self._stop.is_set(), timeout=timeout):
                raise TimeoutError(f"replay buffer not ready after {timeout}s ({len(self.buffer)} samples stored, "
                                   f"needs {self.buffer.min_experiences})")
        t1 = time.monotonic()
        limited = self.buffer.rate_limiter is not None
        while True:  # a rate limiter or a FIFO sampler may still say "not yet": wait in slices, watching stop
            if self._stop.is_set():
                raise RuntimeError("replay server was closed while waiting for samples")
            left = None if deadline is None else deadline - time.monotonic()
            try:
                kw = {"timeout": max(0.0, min(0.2, left if left is not None else 0.2))} if limited else {}
                batch = self.buffer.sample(n, beta=beta, out=out, copy=copy, **kw)
                break
            except RateLimited:
                if left is not None and left <= 0.2:
                    raise
            except ReplayNotReadyError as exc:
                if left is not None and left <= 0:
                    raise TimeoutError(f"no batch of {n} after {timeout}s: {exc}") from None
                with self._ready:
                    self._ready.wait(min(0.05, left) if left is not None else 0.05)
        t2 = time.monotonic()
        self._batches += 1
        m = {"replay/batch_wait_s": t1 - t0, "replay/batch_latency_s": t2 - t0,
             "replay/queue_depth": float(self.queue_depth()), "replay/buffer_size": float(len(self.buffer)),
             "replay/ingest_samples_per_s": self.ingest_rate()}
        for cid, st in list(self._stats.items()):
            m[f"replay/client/{cid}/samples_per_s"] = st.rate
        self.last_batch_metrics = m
        if self.logger is not None:
            self.logger.log(m, step=self._batches)
        return batch

    def batches(self, n: int, prefetch: int = 1, timeout: float | None = None):
        """Yield batches of n forever. With ``prefetch`` >= 1 a thread draws up to that many batches ahead
        while the caller trains; such a batch was drawn before the priorities of the batches still
        being trained on were updated (one batch of staleness per prefetched batch)."""
        if prefetch < 1:
            while True:
                yield self.sample(n, timeout=timeout)
        q: queue.Queue = queue.Queue(maxsize=prefetch)
        done = threading.Event()

        def fill():
            while not done.is_set() and not self._stop.is_set():
                try:
                    item = self.sample(n, timeout=timeout)
                except Exception as exc:  # handed to the consumer, which raises it
                    item = exc
                while not done.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if isinstance(item, Exception):
                    return

        t = threading.Thread(target=fill, name="replay-prefetch", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            done.set()
            t.join(timeout=5)

    def update_priorities(self, indices, priorities) -> int:
        return self.buffer.update_priorities(indices, priorities)

    # ------------------------------------------------------------ metrics
    def queue_depth(self) -> int:
        """Samples published in shared-memory rings but not yet stored."""
        with self._lock:
            return sum(r.pending() for r, _ in self._rings.values())

    def ingest_rate(self) -> float:
        return float(sum(st.rate for st in self._stats.values()))

    def metrics(self) -> dict[str, float]:
        """Flat counters: totals and per-client samples, rates, duplicates skipped, connections."""
        m = {"replay/buffer_size": float(len(self.buffer)), "replay/samples_added": float(self.samples_added),
             "replay/queue_depth": float(self.queue_depth()), "replay/ingest_samples_per_s": self.ingest_rate(),
             "replay/connections": float(len(self._conns)), "replay/batches": float(self._batches),
             "replay/closed_connections": float(self._closed_count),
             "replay/refused_connections": float(self._refuser.refused)}
        for cid, st in list(self._stats.items()):
            for k in ("samples", "frames", "bytes", "duplicates", "connections"):
                m[f"replay/client/{cid}/{k}"] = float(getattr(st, k))
            m[f"replay/client/{cid}/samples_per_s"] = st.rate
        return m

    @property
    def samples_added(self) -> int:
        return int(self._retired.samples + sum(st.samples for st in list(self._stats.values())))

    # ------------------------------------------------------------ per-stream records
    def _take_stream(self, stream_id: str, cid: str, next_seq: int) -> Stream:
        """The stream's record (a new one if unknown or freed); no longer idle. Call under ``_lock``."""
        self._idle_streams.pop(stream_id, None)
        st = self._streams.get(stream_id)
        if st is None:
            st = self._streams[stream_id] = Stream(cid, next_seq)
        return st

    def _stream_left(self, stream_id: str, st: Stream) -> None:
        """Its connection ended: the record becomes idle, and the oldest idle ones beyond the cap are freed."""
        with self._lock:
            if st.conn is None and self._streams.get(stream_id) is st:
                self._idle_streams[stream_id] = None
                self._trim_idle()

    def _client_joined(self, cid: str) -> ClientStats:
        with self._lock:
            self._idle_clients.pop(cid, None)
            stats = self._stats.setdefault(cid, ClientStats())
            stats.live += 1
            stats.connections += 1
            return stats

    def _client_left(self, cid: str, stats: ClientStats) -> None:
        with self._lock:
            stats.live -= 1
            if stats.live <= 0 and self._stats.get(cid) is stats:
                self._idle_clients[cid] = None
                self._trim_idle()

    def _trim_idle(self) -> None:
        """Free the least recently active idle records beyond ``max_idle_streams``. Call under ``_lock``."""
        cap = self.max_idle_streams
        while len(self._idle_streams) > cap:
            sid, _ = self._idle_streams.popitem(last=False)
            st = self._streams.get(sid)
            if st is not None and st.conn is None and not st.lock.locked():
                del self._streams[sid]
        ringed = {c for _, c in self._rings.values()}  # a ring being drained still counts into its client
        for _ in range(len(self._idle_clients)):
            if len(self._idle_clients) <= cap:
                break
            cid, _ = self._idle_clients.popitem(last=False)
            st = self._stats.get(cid)
            if st is None or st.live > 0:
                continue
            if cid in ringed:
                self._idle_clients[cid] = None  # freed on a later pass, once its ring is gone
                continue
            del self._stats[cid]
            r = self._retired
            r.samples, r.frames, r.bytes = r.samples + st.samples, r.frames + st.frames, r.bytes + st.bytes
            r.duplicates, r.connections = r.duplicates + st.duplicates, r.connections + st.connections

    def stream_next_seq(self, stream: str) -> int | None:
        """Next sequence number expected from a TCP writer stream (None if unknown)."""
        s = self._streams.get(stream)
        return None if s is None else s.next_seq

    def checkpoint(self, path: str | os.PathLike | None = None) -> dict:
        """Write the buffer and the writer streams' positions to ``path`` (default ``checkpoint_path``)
        atomically; every sample acknowledged before this call is in it. Returns ``samples``, ``streams``."""
        path = path if path is not None else self.checkpoint_path
        if path is None:
            raise ValueError("checkpoint() needs a path: pass one or build the server with checkpoint_path=")
        return ckpt.save(self, path)

    # ------------------------------------------------------------ internals
    def _note_stored(self) -> None:
        """Wake learners waiting for the buffer to become ready or, FIFO, for unread samples."""
        if self._became_ready or self.buffer.ready or self.buffer.sampler.contiguous:
            self._became_ready = self._became_ready or self.buffer.ready
            with self._ready:
                self._ready.notify_all()

    def _add_limited(self, part, n: int, st=None, stored=None) -> None:
        """Store n samples (``part(lo, hi)`` gives samples lo..hi as a batch pytree) as the buffer's
        rate limiter allows, waiting in slices so a closing server is not held up. Each piece is stored
        and acknowledged — its stream position recorded, or ``stored(k)`` (shared-memory tails) —
        under the checkpoint lock, so a checkpoint holds exactly the acknowledged samples."""
        lim = self.buffer.rate_limiter
        first = None if st is None else st.next_seq - n
        done = 0
        while done < n:
            k = n - done
            if lim is not None:
                try:
                    k = lim.acquire_inserts(n - done, timeout=0.2)
                except (RateLimited, RateLimiterCancelled):
                    if not self._stop.is_set():
                        continue
                    if st is not None:  # not stored: the writer resends from here
                        st.next_seq = first + done
                    raise _Closed() from None
            with self._ckpt_lock:
                try:
                    self.buffer.add_granted(part(done, done + k))
                except BaseException:
                    if lim is not None:
                        lim.refund(inserts=k)
                    raise
                if lim is not None:
                    lim.commit(k)
                if st is not None:
                    st.stored_seq = first + done + k
                if stored is not None:
                    stored(k)
            done += k
            self._note_stored()  # after every piece: the learner's draws are what admits the next one

    def _store_runs(self, runs: list, stats: ClientStats, st=None) -> None:
        """One buffer.add for several runs of records (the per-call cost of add dwarfs a small copy)."""
        records = runs[0] if len(runs) == 1 else np.concatenate(runs)
        self._add_limited(lambda lo, hi: P.records_to_tree(self.schema, records[lo:hi]), len(records), st)
        stats.note(len(records), records.nbytes)
