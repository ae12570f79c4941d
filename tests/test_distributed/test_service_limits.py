"""The ingestion server with a rate-limited FIFO buffer and periodic checkpoints (in process)."""

import threading
import time

import numpy as np
import pytest
from dist_helpers import example, make, make_batch

from echo_rl.distributed import LearnerClient, ReplayClient, ReplayServer
from echo_rl.replay import PrioritizedReplayBuffer, RateLimiter


def test_rate_limited_server_holds_writers_to_the_learners_pace():
    lim = RateLimiter.queue(64)  # at most 64 stored and not yet drawn
    buf = PrioritizedReplayBuffer(1 << 12, example=example(), sampler="fifo", rate_limiter=lim)
    peak = []
    with ReplayServer(buf) as srv:
        errors = []

        def write():
            try:
                with ReplayClient(srv.address, example(), transport="tcp", flush_bytes=256) as c:
                    for i in range(500):
                        c.send(make(3, i))
                    assert c.flush(wait=True, timeout=30)
            except Exception as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=write)
        t.start()
        seen = []
        while len(seen) < 500:
            batch = srv.sample(50, timeout=30)
            peak.append(lim.cursor + lim.pending)
            seen.extend(batch.data["action"][:, 0].tolist())
        t.join(30)
    assert not t.is_alive() and not errors, errors
    assert seen == [3_000_000 + i for i in range(500)]  # every sample exactly once, in order
    assert max(peak) <= 64 and lim.blocked_inserts > 0


def test_closing_a_server_whose_writer_waits_on_the_limiter_returns():
    lim = RateLimiter.queue(16)
    buf = PrioritizedReplayBuffer(1 << 10, example=example(), sampler="fifo", rate_limiter=lim)
    srv = ReplayServer(buf).start()
    c = ReplayClient(srv.address, example(), transport="shm").connect()
    c.send_batch(make_batch(4, 0, 100))  # 16 stored, the rest held back by the limiter
    deadline = time.monotonic() + 10
    while lim.inserts < 16 and time.monotonic() < deadline:
        time.sleep(0.01)
    closer = threading.Thread(target=srv.close)  # must return although the writer waits on the limiter
    closer.start()
    closer.join(60)
    assert not closer.is_alive() and buf.ids_issued == 16
    c._close_sock()


def test_periodic_checkpoint_restores_into_a_new_server(tmp_path):
    path = tmp_path / "ckpt.npz"
    buf = PrioritizedReplayBuffer(1 << 10, example=example(), seed=0)
    with ReplayServer(buf, checkpoint_path=path, checkpoint_every=0.05) as srv:
        with ReplayClient(srv.address, example(), transport="tcp") as c:
            c.send_batch(make_batch(5, 0, 40))
            assert c.flush(wait=True, timeout=20)
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert path.exists()
    buf2 = PrioritizedReplayBuffer(1 << 10, example=example(), sampler="fifo")
    with ReplayServer(buf2, checkpoint_path=path) as srv2:  # restores at start
        assert buf2.ids_issued == 40
        with LearnerClient(srv2.address, example()) as learner:
            np.testing.assert_array_equal(learner.sample(40).data["action"][:, 0], 5_000_000 + np.arange(40))


def test_bad_checkpoint_settings_are_refused():
    buf = PrioritizedReplayBuffer(8, example=example())
    with pytest.raises(ValueError, match="needs checkpoint_path"):
        ReplayServer(buf, checkpoint_every=1.0)
    with pytest.raises(ValueError, match="checkpoint_every=0 is invalid"):
        ReplayServer(buf, checkpoint_path="x.npz", checkpoint_every=0)
    with pytest.raises(ValueError, match="needs a path"):
        ReplayServer(buf).checkpoint()


def test_server_hands_fifo_batches_to_the_learner_as_views_into_the_ring():
    buf = PrioritizedReplayBuffer(256, example=example(), sampler="fifo")
    with ReplayServer(buf) as srv:
        with ReplayClient(srv.address, example(), transport="shm") as c:
            c.send_batch(make_batch(6, 0, 100))
            assert c.flush(wait=True, timeout=20)
        b = srv.sample(64, timeout=10, copy=False)
        assert b.view and buf.view_valid(b)
        assert any(np.shares_memory(b.data["obs"], leaf) for leaf in buf._storage)
        np.testing.assert_array_equal(b.data["action"][:, 0], 6_000_000 + np.arange(64))
        np.testing.assert_array_equal(b.data["obs"][:, 1], np.arange(64, dtype=np.float32))
