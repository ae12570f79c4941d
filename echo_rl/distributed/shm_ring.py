"""Single-producer single-consumer rings of records in shared memory (one ring per writer process).

Layout: a 256-byte header of int64 counters, each on its own cache line — ``head`` (records ever
published by the writer), ``tail`` (records ever consumed by the server), then capacity, record
size and a ``closed`` flag — followed by one region per leaf (struct of arrays, each region
64-byte aligned) of ``capacity`` rows (power of two, so slot = i & mask). Per-leaf contiguous rows
let a writer store a whole sample with one compiled call (``add_one`` of the replay kernels) and
let the server hand contiguous leaf runs to the buffer without repacking.
The writer fills slots, then stores ``head``; the server reads up to ``head``, adds the records to
the buffer, then stores ``tail``. No serialisation, no syscall, no per-message ack: ``tail`` *is*
the acknowledgement — a record below it is in the buffer.

Memory ordering: each counter is one aligned 8-byte numpy element, written and read by a single
machine store/load (numpy's aligned scalar path). On x86-64 (total store order) the record bytes,
stored before ``head`` in program order, are visible to the reader before ``head`` is, and the
reader's loads are not reordered either — so no fence is needed there. Weaker memory models (ARM)
would need real acquire/release atomics; :func:`check_platform` refuses them with a clear error
(use the TCP transport there).

Waiting: a full ring (writer) or an empty one (server) waits with a short spin then sleeps of
growing length (50 µs .. 1 ms) — ``time.sleep`` releases the GIL. An eventfd doorbell would cut
idle latency further; the sleep bound keeps it under ~1 ms.
"""

from __future__ import annotations

import os
import platform
import time
import uuid
import mmap

import numpy as np

HEADER_BYTES = 256
_HEAD, _TAIL, _CAP, _REC, _CLOSED = 0, 8, 16, 17, 18  # int64 indices (head/tail on separate cache lines)


SHM_DIR = "/dev/shm"


def check_platform() -> None:
    if not os.path.isdir(SHM_DIR):
        raise RuntimeError(f"the shared-memory transport needs {SHM_DIR} (Linux): use transport='tcp'")
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        raise RuntimeError(f"the shared-memory transport relies on x86-64 store ordering; this machine is "
                           f"{machine!r}: use transport='tcp'")


def _round_pow2(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


class Backoff:
    """Spin a little, then sleep 50 µs doubling to 1 ms (GIL released while sleeping)."""

    __slots__ = ("n",)

    def __init__(self):
        self.n = 0

    def reset(self) -> None:
        self.n = 0

    def wait(self) -> None:
        self.n += 1
        if self.n < 4:
            return
        time.sleep(min(1e-3, 5e-5 * (1 << min(self.n - 4, 5))))


class _Segment:
    """A named POSIX shared-memory segment (a file under /dev/shm) mapped into this process.

    Plain ``mmap`` rather than ``multiprocessing.shared_memory``: its resource tracker (shared
    by spawned children) would unlink a segment when any attaching process exits.
    """

    def __init__(self, name: str, size: int | None):
        self.name = name
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if size is not None else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if size is not None:
                os.ftruncate(fd, size)
            self.size = os.fstat(fd).st_size
            self.buf = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:  # numpy views still alive: the mapping goes with the last one
            pass

    def unlink(self) -> None:
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass


def _leaf_layout(rec: np.dtype, capacity: int) -> tuple[list[int], int]:
    """Byte offset of each leaf's region (64-byte aligned) and the segment size."""
    offsets, pos = [], HEADER_BYTES
    for name in rec.names:
        sub = rec.fields[name][0]
        offsets.append(pos)
        pos += -(-capacity * sub.itemsize // 64) * 64
    return offsets, pos


class ShmRing:
    """One ring; ``create`` on the server side, ``attach`` in the writer process."""

    def __init__(self, shm: _Segment, rec: np.dtype, owner: bool):
        self.shm = shm
        self.rec = rec
        self.owner = owner
        self.ctr = np.ndarray((HEADER_BYTES // 8,), dtype=np.int64, buffer=shm.buf)
        self.capacity = int(self.ctr[_CAP])
        if self.ctr[_REC] != rec.itemsize:
            raise ValueError(f"ring record size {int(self.ctr[_REC])} != schema record size {rec.itemsize}")
        offsets, size = _leaf_layout(rec, self.capacity)
        if shm.size < size:
            raise ValueError(f"shared-memory segment {shm.name} is too small for its capacity")
        self.mask = self.capacity - 1
        self.fields = []
        for name, off in zip(rec.names, offsets):
            sub = rec.fields[name][0]
            self.fields.append(np.ndarray((self.capacity, *sub.shape), dtype=sub.base, buffer=shm.buf, offset=off))
        self.fields_t = tuple(self.fields)

    @property
    def name(self) -> str:
        return self.shm.name

    @classmethod
    def create(cls, rec: np.dtype, capacity: int) -> "ShmRing":
        check_platform()
        cap = _round_pow2(max(2, int(capacity)))
        shm = _Segment(f"echorl_{os.getpid()}_{uuid.uuid4().hex[:12]}", _leaf_layout(rec, cap)[1])
        ctr = np.ndarray((HEADER_BYTES // 8,), dtype=np.int64, buffer=shm.buf)
        ctr[:] = 0
        ctr[_CAP] = cap
        ctr[_REC] = rec.itemsize
        del ctr
        return cls(shm, rec, owner=True)

    @classmethod
    def attach(cls, name: str, rec: np.dtype) -> "ShmRing":
        check_platform()
        if not name.startswith("echorl_") or "/" in name:
            raise ValueError(f"shm_name={name!r} is invalid: not an EchoRL replay ring")
        return cls(_Segment(name, None), rec, owner=False)

    # ------------------------------------------------------------- counters
    @property
    def head(self) -> int:
        return int(self.ctr[_HEAD])

    @property
    def tail(self) -> int:
        return int(self.ctr[_TAIL])

    @property
    def closed(self) -> bool:
        return bool(self.ctr[_CLOSED])

    def depth(self) -> int:
        return int(self.ctr[_HEAD]) - int(self.ctr[_TAIL])

    def rows(self, lo: int, hi: int) -> list[np.ndarray]:
        """Copies of records [lo, hi) (absolute record numbers, hi - lo <= capacity), per leaf."""
        idx = np.arange(lo, hi) & self.mask
        return [f[idx] for f in self.fields]

    def close(self) -> None:
        """Release the mapping (and, on the owner side, remove the segment)."""
        self.fields = []
        self.fields_t = ()
        self.ctr = None
        self.shm.close()
        if self.owner:
            self.shm.unlink()


class RingWriter:
    """Writer side: copies samples into slots and publishes ``head``; waits while the ring is full."""

    def __init__(self, ring: ShmRing, timeout: float | None = None, alive=None):
        self.ring = ring
        self.alive = alive  # optional callable: False once the server is known to be gone
        self.ctr = ring.ctr
        self.fields = ring.fields
        self.fields_t = ring.fields_t
        self.mask = ring.mask
        self.cap = ring.capacity
        self._head = ring.head
        self._tail = ring.tail
        self.timeout = timeout
        self.blocked = 0  # times a write found the ring full (backpressure)

    def _room(self, need: int) -> int:
        """Free slots (>= 1, at most need), waiting while the ring is full."""
        free = self.cap - (self._head - self._tail)
        if free > 0:
            return min(free, need)
        self.blocked += 1
        back = Backoff()
        start = time.monotonic()
        while True:
            self._tail = int(self.ctr[_TAIL])
            free = self.cap - (self._head - self._tail)
            if free > 0:
                return min(free, need)
            if self.ctr[_CLOSED]:
                raise ConnectionError("replay server closed this shared-memory ring")
            if self.alive is not None and back.n % 64 == 0 and not self.alive():
                raise ConnectionError("replay server is gone")
            if self.timeout is not None and time.monotonic() - start > self.timeout:
                raise TimeoutError(f"shared-memory ring stayed full for {self.timeout}s (server not draining)")
            back.wait()

    def write_one(self, leaves) -> int:
        """Write one sample's leaves (already checked); returns its sequence number."""
        h = self._head
        if h - self._tail >= self.cap:
            self._room(1)
        slot = h & self.mask
        for f, x in zip(self.fields, leaves):
            f[slot] = x
        self._head = h + 1
        self.ctr[_HEAD] = h + 1  # publish (aligned 8-byte store, after the record bytes)
        return h

    def write_many(self, leaves, n: int) -> int:
        """Write n samples (each leaf with a leading axis n); returns the first sequence number."""
        first = self._head
        done = 0
        while done < n:
            k = self._room(n - done)
            slot = self._head & self.mask
            k = min(k, self.cap - slot)  # no wrap inside one copy
            for f, x in zip(self.fields, leaves):
                f[slot: slot + k] = x[done: done + k]
            done += k
            self._head += k
            self.ctr[_HEAD] = self._head
        return first

    @property
    def published(self) -> int:
        return self._head

    @property
    def acked(self) -> int:
        """Samples the server has taken into its buffer."""
        self._tail = int(self.ctr[_TAIL])
        return self._tail

    def wait_drained(self, timeout: float | None = None) -> bool:
        """True once the server has stored everything published; False on timeout; ConnectionError
        when the server closed the ring or is gone (the caller republishes elsewhere)."""
        back = Backoff()
        start = time.monotonic()
        while self.acked < self._head:
            if self.ctr[_CLOSED]:
                raise ConnectionError("replay server closed this shared-memory ring")
            if self.alive is not None and back.n % 64 == 0 and not self.alive():
                raise ConnectionError("replay server is gone")
            if timeout is not None and time.monotonic() - start > timeout:
                return False
            back.wait()
        return True


class RingReader:
    """Server side: hands out runs of published records (views) and moves ``tail`` after they are stored."""

    def __init__(self, ring: ShmRing):
        self.ring = ring
        self.ctr = ring.ctr
        self.cap = ring.capacity
        self.mask = ring.mask
        self._tail = ring.tail

    def pending(self) -> int:
        return int(self.ctr[_HEAD]) - self._tail

    def peek(self, max_records: int) -> list[np.ndarray] | None:
        """Up to max_records published records as contiguous per-leaf views (stops at the wrap)."""
        h = int(self.ctr[_HEAD])
        n = h - self._tail
        if n <= 0:
            return None
        if n > self.cap:
            raise RuntimeError(f"shared-memory ring corrupt: head {h} is {n} records past tail {self._tail}")
        slot = self._tail & self.mask
        k = min(n, max_records, self.cap - slot)
        return [f[slot: slot + k] for f in self.ring.fields]

    def consume(self, k: int) -> None:
        self._tail += k
        self.ctr[_TAIL] = self._tail

    def mark_closed(self) -> None:
        self.ctr[_CLOSED] = 1
