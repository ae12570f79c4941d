"""Samplers (prioritized / uniform / FIFO), the samples-per-insert rate limiter, and FIFO views into the ring.

Rate-limiter cases are counted by hand from Reverb's rules (see rate_limiter's module docstring).
"""

import threading

import numpy as np
import pytest

from echo_rl.replay import PrioritizedReplayBuffer, RateLimited, RateLimiter, ReplayNotReadyError
from echo_rl.replay.rate_limiter import RateLimiterCancelled


def batch_of(ids):
    ids = np.asarray(ids)
    return {"obs": np.repeat(ids[:, None], 3, 1).astype(np.float32), "action": ids[:, None].astype(np.int64)}


def example():
    return {"obs": np.zeros(3, np.float32), "action": np.zeros(1, np.int64)}


# ----------------------------------------------------------------- the limiter alone
def test_sample_to_insert_ratio_counts_by_hand():
    # spi 2, min size 3, error buffer 4: band [6 - 4, 6 + 4] = [2, 10]
    lim = RateLimiter.sample_to_insert_ratio(2.0, 3, 4.0).bind(capacity=100)
    assert (lim.min_diff, lim.max_diff) == (2.0, 10.0)
    assert not lim.can_sample(1)  # empty
    # item k is allowed while k <= 3 (min size) or 2k - 0 <= 10: k <= 5
    assert lim.acquire_inserts(10, timeout=0) == 5
    assert not lim.can_sample(1)  # admitted, not yet stored
    lim.commit(5)
    assert lim.cursor == 10
    # a draw of n needs 10 - n >= 2: n <= 8
    assert lim.can_sample(8) and not lim.can_sample(9)
    lim.acquire_samples(8, timeout=0)
    assert lim.cursor == 2 and not lim.can_sample(1)
    with pytest.raises(RateLimited, match=r"refused sample\(1\).*min_diff=2"):
        lim.acquire_samples(1, timeout=0)
    # (5 + k) * 2 - 8 <= 10: k <= 4
    assert lim.acquire_inserts(100, timeout=0) == 4
    lim.commit(4)
    with pytest.raises(RateLimited, match="would exceed max_diff=10"):
        lim.acquire_inserts(1, timeout=0)
    assert lim.state() == {"inserts": 9, "samples": 8}
    assert lim.blocked_inserts == 1 and lim.blocked_samples == 1


def test_min_size_and_size_counts_evictions():
    lim = RateLimiter.min_size(4).bind(capacity=5)
    lim.commit(lim.acquire_inserts(3, timeout=0))
    with pytest.raises(RateLimited, match="3 items stored, min_size_to_sample=4"):
        lim.acquire_samples(1, timeout=0)
    assert lim.acquire_inserts(1000, timeout=0) == 1000  # MinSize never limits inserts
    lim.commit(1000)
    assert lim.size == 5  # a ring of 5 holds 5 whatever was inserted
    lim.acquire_samples(10_000, timeout=0)


def test_queue_limiter_and_min_size_free_inserts():
    lim = RateLimiter.queue(4).bind(capacity=100)  # spi 1, band [0, 4]
    assert lim.acquire_inserts(9, timeout=0) == 4
    lim.commit(4)
    lim.acquire_samples(3, timeout=0)
    assert lim.acquire_inserts(9, timeout=0) == 3
    # below min_size inserts are free even when the ratio says no: spi 1, band [5-2, 5+2] = [3, 7] with min size 5
    lim = RateLimiter.sample_to_insert_ratio(1.0, 5, 2.0).bind(capacity=100)
    assert lim.acquire_inserts(20, timeout=0) == 7  # k <= 5 free, k <= 7 by the ratio


@pytest.mark.parametrize("kwargs, match", [
    (dict(samples_per_insert=4.0, min_size_to_sample=10, error_buffer=3.0), "must be >= 2 \\* max\\(1, samples_per_insert\\) = 8"),
    (dict(samples_per_insert=1.0, min_size_to_sample=10, error_buffer=(20.0, 30.0)), "draws would never be allowed"),
    (dict(samples_per_insert=-1.0, min_size_to_sample=10, error_buffer=3.0), "samples_per_insert=-1.0 is invalid"),
    (dict(samples_per_insert=1.0, min_size_to_sample=0, error_buffer=3.0), "min_size_to_sample=0 is invalid"),
])
def test_bad_limiter_parameters_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RateLimiter.sample_to_insert_ratio(**kwargs)


def test_a_draw_wider_than_the_band_is_refused_at_once():
    lim = RateLimiter.sample_to_insert_ratio(1.0, 1, 8.0).bind(capacity=100)
    with pytest.raises(ValueError, match="a draw of 32 samples can never be allowed.*error_buffer >= 16"):
        lim.acquire_samples(32, timeout=None)


def test_waiting_writer_is_released_by_draws_and_cancel_wakes_waiters():
    lim = RateLimiter.queue(2).bind(capacity=100)
    assert lim.acquire_inserts(5, timeout=0) == 2
    lim.commit(2)
    got = []
    t = threading.Thread(target=lambda: got.append(lim.acquire_inserts(5, timeout=10)))
    t.start()
    lim.acquire_samples(1, timeout=0)  # frees one insert
    t.join(10)
    assert got == [1]
    errors = []

    def waiter():
        try:
            lim.acquire_inserts(1, timeout=None)
        except RateLimiterCancelled as exc:
            errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    lim.cancel()
    t.join(10)
    assert len(errors) == 1 and not t.is_alive()


# ----------------------------------------------------------------- samplers
@pytest.mark.parametrize("use_native", [False, None])
def test_fifo_delivers_each_sample_once_in_order_and_counts_evictions(use_native):
    buf = PrioritizedReplayBuffer(8, example=example(), sampler="fifo", use_native=use_native)
    buf.add(batch_of(range(5)))
    b = buf.sample(3)
    np.testing.assert_array_equal(b.indices, [0, 1, 2])
    np.testing.assert_array_equal(b.data["action"][:, 0], [0, 1, 2])
    np.testing.assert_array_equal(b.weights, 1.0)
    with pytest.raises(ReplayNotReadyError, match="2 unread samples, sample\\(3\\) needs 3"):
        buf.sample(3)
    buf.add(batch_of(range(5, 15)))  # ids 5..14; the ring of 8 keeps 7..14, so 3..6 were never read
    b = buf.sample(4)
    np.testing.assert_array_equal(b.data["action"][:, 0], [7, 8, 9, 10])
    assert buf.sampler.dropped == 4


def test_fifo_views_are_the_ring_itself_and_report_when_overwritten():
    buf = PrioritizedReplayBuffer(8, example=example(), sampler="fifo")
    buf.add(batch_of(range(6)))
    b = buf.sample(4, copy=False)
    assert b.view and buf.view_valid(b)
    assert any(np.shares_memory(b.data["obs"], leaf) for leaf in buf._storage)
    np.testing.assert_array_equal(b.data["action"][:, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(b.data["obs"], np.repeat(np.arange(4.0)[:, None], 3, 1))
    buf.add(batch_of(range(6, 10)))  # ids 8, 9 overwrite slots 0, 1
    assert not buf.view_valid(b)
    c = buf.sample(4, copy=False)  # ids 4..7: slots 4..7, no wrap: views again
    assert c.view
    np.testing.assert_array_equal(c.data["action"][:, 0], [4, 5, 6, 7])
    d = buf.sample(2, copy=False)  # ids 8, 9 sit in slots 0, 1
    np.testing.assert_array_equal(d.data["action"][:, 0], [8, 9])
    buf.add(batch_of(range(10, 17)))  # next read starts at slot 2 and ... ids 10..16 -> slots 2..7, 0
    e = buf.sample(7, copy=False)  # wraps around the ring end: gathered, not a view
    assert not e.view
    np.testing.assert_array_equal(e.data["action"][:, 0], np.arange(10, 17))


def test_prioritized_and_uniform_batches_are_copies_even_with_copy_false():
    for name in ("prioritized", "uniform"):
        buf = PrioritizedReplayBuffer(8, example=example(), sampler=name, seed=0)
        buf.add(batch_of(range(8)))
        b = buf.sample(16, copy=False)
        assert not b.view and not any(np.shares_memory(b.data["obs"], leaf) for leaf in buf._storage)
        np.testing.assert_array_equal(b.data["action"][:, 0], b.indices)


def test_uniform_sampler_is_uniform_over_live_samples():
    buf = PrioritizedReplayBuffer(16, example=example(), sampler="uniform", seed=0)
    buf.add(batch_of(range(20)))  # live ids 4..19
    buf.update_priorities(np.array([19]), np.array([1e6]))  # priorities do not matter to it
    b = buf.sample(16_000)
    assert b.indices.min() == 4 and b.indices.max() == 19
    counts = np.bincount(b.indices - 4, minlength=16)
    assert counts.min() > 850 and counts.max() < 1150  # ~1000 each (binomial sd ~30)
    np.testing.assert_allclose(b.probabilities, 1 / 16)
    np.testing.assert_array_equal(b.weights, 1.0)


def test_bad_sampler_name_and_hot_cold_combination():
    with pytest.raises(ValueError, match="sampler='lifo' is invalid: allowed: prioritized, uniform, fifo"):
        PrioritizedReplayBuffer(8, sampler="lifo")


# ----------------------------------------------------------------- the limiter in the buffer
def test_buffer_admits_inserts_in_pieces_and_draws_by_the_ratio():
    lim = RateLimiter.sample_to_insert_ratio(2.0, 3, 4.0, timeout=0)  # band [2, 10]
    buf = PrioritizedReplayBuffer(100, example=example(), sampler="fifo", rate_limiter=lim)
    with pytest.raises(RateLimited) as info:
        buf.add(batch_of(range(10)))
    assert info.value.done == 5 and buf.ids_issued == 5  # ids 0..4 stored, the rest refused
    b = buf.sample(2)
    np.testing.assert_array_equal(b.indices, [0, 1])
    buf.add_one({"obs": np.zeros(3, np.float32), "action": np.array([5])})
    assert lim.state() == {"inserts": 6, "samples": 2}  # cursor 6*2 - 2 = 10 = max_diff
    with pytest.raises(RateLimited):
        buf.add_one({"obs": np.zeros(3, np.float32), "action": np.array([6])})
    with pytest.raises(ReplayNotReadyError):  # FIFO has 4 unread; the refused draw is refunded
        buf.sample(5)
    assert lim.samples == 2
    buf.sample(2)  # cursor 12 - 4 = 8: room for one insert
    with pytest.raises(ValueError):  # a bad sample is refunded too
        buf.add_one({"obs": np.zeros(4, np.float32), "action": np.array([6])})
    assert (lim.inserts, lim.pending) == (6, 0)
    assert buf.add_one({"obs": np.zeros(3, np.float32), "action": np.array([6])}) == 6


def test_blocked_writer_thread_proceeds_as_the_learner_draws():
    lim = RateLimiter.sample_to_insert_ratio(1.0, 4, 4.0)  # band [0, 8]: at most 8 undrawn
    buf = PrioritizedReplayBuffer(64, example=example(), sampler="fifo", rate_limiter=lim)
    writer = threading.Thread(target=lambda: buf.add(batch_of(range(40)), timeout=20))
    writer.start()
    seen = []
    while len(seen) < 40:
        seen.extend(buf.sample(4, timeout=20).data["action"][:, 0].tolist())
        assert lim.cursor <= 8
    writer.join(20)
    assert seen == list(range(40))


def test_limiter_and_fifo_state_survive_save_and_load(tmp_path):
    lim = RateLimiter.sample_to_insert_ratio(1.0, 2, 6.0, timeout=0)
    buf = PrioritizedReplayBuffer(32, example=example(), sampler="fifo", rate_limiter=lim)
    buf.add(batch_of(range(8)))
    buf.sample(3)
    buf.save(tmp_path / "r.npz", extra={"who": "test"})
    lim2 = RateLimiter.sample_to_insert_ratio(1.0, 2, 6.0, timeout=0)
    buf2 = PrioritizedReplayBuffer(32, example=example(), sampler="fifo", rate_limiter=lim2)
    assert buf2.load(tmp_path / "r.npz") == {"who": "test"}
    assert lim2.state() == {"inserts": 8, "samples": 3}
    np.testing.assert_array_equal(buf2.sample(2).indices, [3, 4])
