import threading
import time

import numpy as np
import pytest
from dist_helpers import example, make_batch

from echo_rl.distributed import protocol as P
from echo_rl.distributed.shm_ring import RingReader, RingWriter, ShmRing
from echo_rl.replay.schema import Schema

pytestmark = pytest.mark.skipif(
    not __import__("os").path.isdir("/dev/shm"), reason="shared-memory transport needs /dev/shm (Linux)")


@pytest.fixture
def ring():
    rec = P.record_dtype(Schema.from_example(example()))
    r = ShmRing.create(rec, 6)  # rounded up to 8
    yield r
    r.close()


def _keys(run):  # leaf 0 is "action" (schema leaves are sorted by name), which holds the sample's key
    return list(run[0][:, 0])


def test_capacity_rounds_to_power_of_two_and_attach_sees_writes(ring):
    assert ring.capacity == 8
    other = ShmRing.attach(ring.name, ring.rec)
    w, r = RingWriter(other), RingReader(ring)
    schema = Schema.from_example(example())
    _, leaves = schema.check_batch(make_batch(1, 0, 5))
    w.write_many(leaves, 5)
    run = r.peek(100)
    assert len(run) == len(ring.fields) and all(len(x) == 5 and x.flags.c_contiguous for x in run)  # per leaf
    assert _keys(run) == [1_000_000 + i for i in range(5)]
    r.consume(5)
    assert w.acked == 5
    other.close()


def test_wraparound_keeps_order_and_full_ring_blocks_until_consumed(ring):
    schema = Schema.from_example(example())
    w, r = RingWriter(ring, timeout=0.3), RingReader(ring)
    _, leaves = schema.check_batch(make_batch(2, 0, 8))
    w.write_many(leaves, 8)
    with pytest.raises(TimeoutError, match="full"):  # backpressure: no room, nobody draining
        w.write_many(leaves, 1)
    assert w.blocked == 1
    got = []

    def drain():
        while len(got) < 20:
            run = r.peek(3)
            if run is None:
                time.sleep(0.001)
                continue
            got.extend(_keys(run))
            r.consume(len(run[0]))

    t = threading.Thread(target=drain)
    t.start()
    w.timeout = 10
    _, more = schema.check_batch(make_batch(2, 8, 12))
    w.write_many(more, 12)  # wraps the 8-slot ring; waits for the drainer
    t.join(10)
    assert got == [2_000_000 + i for i in range(20)]


def test_closed_ring_fails_a_blocked_writer(ring):
    schema = Schema.from_example(example())
    w, r = RingWriter(ring, timeout=5), RingReader(ring)
    _, leaves = schema.check_batch(make_batch(0, 0, 8))
    w.write_many(leaves, 8)
    r.mark_closed()
    with pytest.raises(ConnectionError, match="closed"):
        w.write_many(leaves, 1)


def test_attach_rejects_foreign_names(ring):
    with pytest.raises(ValueError, match="shm_name"):
        ShmRing.attach("../etc/passwd", ring.rec)
