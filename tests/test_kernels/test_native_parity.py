"""The compiled batch kernels equal their numpy references (and fail with the same errors)."""

import copy

import numpy as np
import pytest

from echo_rl.kernels import (
    EMAPlanTracker,
    attention_bandwidth_cost_batch,
    bandwidth_aware_priorities,
    bandwidth_efficiency,
    effective_bandwidth_cost,
    kernels_available,
    plan_surprise_batch,
    prefix_match,
    prefix_match_batch,
    priority_sample,
)

pytestmark = pytest.mark.skipif(not kernels_available(), reason="compiled kernels not built")
SIZES = [0, 1, 2, 7, 8, 9, 129, 1000, 5003]
RTOL = 1e-12


def both(fn, *args, **kw):
    return fn(*args, use_native=True, **kw), fn(*args, use_native=False, **kw)


def error_of(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def same_error(fn, *args, **kw):
    a = error_of(fn, *args, use_native=True, **kw)
    assert a is not None and a == error_of(fn, *args, use_native=False, **kw)


@pytest.mark.parametrize("n", SIZES)
def test_bandwidth_costs_match(n):
    rng = np.random.default_rng(n)
    t = rng.integers(0, 10**6, n).astype(np.float64)
    t[: n // 4] = 0
    tp = np.floor(t * rng.random(n))
    for scale in (1.0, 0.37, 1e-9):
        a, b = both(attention_bandwidth_cost_batch, t, scale)
        np.testing.assert_array_equal(a, b)  # same operations, same order: bit for bit
        a, b = both(effective_bandwidth_cost, t, tp, scale)
        np.testing.assert_array_equal(a, b)
    a, b = both(effective_bandwidth_cost, seq_len=t.astype(np.int64), reuse_len=tp.astype(np.int64))
    np.testing.assert_array_equal(a, b)


def test_bandwidth_costs_scalars_and_shapes():
    for kw in ({"t": 5}, {"t": 0}, {"t": 2.0 ** 40}):
        a, b = both(attention_bandwidth_cost_batch, **kw)
        assert a == b and np.ndim(a) == np.ndim(b) == 0
    a, b = both(effective_bandwidth_cost, seq_len=128, reuse_len=96)
    assert a == b == 3600.0 and isinstance(a, float)
    grid = np.arange(12.0).reshape(3, 4)
    a, b = both(effective_bandwidth_cost, grid, np.zeros((3, 4)))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (3, 4)
    a, b = both(effective_bandwidth_cost, grid[:, ::2] + 1, np.ones((3, 2)))  # non-contiguous
    np.testing.assert_array_equal(a, b)
    a, b = both(effective_bandwidth_cost, grid + 1, 1)  # broadcasting: numpy path either way
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", [[1, -2, 3], [1, 2.5], [np.nan], [np.inf, 1]])
def test_bandwidth_cost_errors_match(bad):
    same_error(attention_bandwidth_cost_batch, bad)
    same_error(effective_bandwidth_cost, bad, np.zeros(len(bad)))
    same_error(effective_bandwidth_cost, np.full(len(bad), 10.0), bad)
    same_error(attention_bandwidth_cost_batch, [1, 2], scale=0.0)
    same_error(attention_bandwidth_cost_batch, bad, scale=np.nan)  # t is named first on both paths
    same_error(effective_bandwidth_cost, bad, 0, scale=-1.0)


@pytest.mark.filterwarnings("ignore:overflow encountered")  # numpy's inf, same as the compiled one
def test_large_values_match():
    t = np.array([0.0, 1.0, 2.0 ** 52, 1e154, 1e200])  # the last overflows to inf on both paths
    a, b = both(attention_bandwidth_cost_batch, t)
    np.testing.assert_array_equal(a, b)
    a, b = both(bandwidth_aware_priorities, [1e300, -1e300, 1.0], [1e308, 0.0, 1e-300], [1e308, 0.0, 0.0])
    np.testing.assert_array_equal(a, b)
    plans = np.array([[1e200, 0.0], [1e-200, -1e150]])
    a, b = both(plan_surprise_batch, plans, np.zeros(2), [1e300, 1.0])
    np.testing.assert_array_equal(a, b)
    a, b = both(bandwidth_efficiency, [1e300, 1e300], [1e300, 1e300])
    assert a == pytest.approx(b, rel=RTOL)
    p = np.array([1e300, 1e-300, 1e300, 0.0])
    a, b = both(priority_sample, p, 64, 1)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_prefix_longer_than_sequence_fails_alike():
    same_error(effective_bandwidth_cost, [5, 3], [2, 4])


@pytest.mark.parametrize("n", SIZES)
def test_bandwidth_aware_priorities_match(n):
    rng = np.random.default_rng(100 + n)
    r = rng.normal(size=n) * 1e3
    b = rng.exponential(size=n) * 1e6
    q = rng.exponential(size=n) * 1e6
    b[: n // 3] = 0
    q[: n // 5] = 0
    for eps in (1e-6, 1.0):
        a, c = both(bandwidth_aware_priorities, r, b, q, eps)
        np.testing.assert_array_equal(a, c)
    a, c = both(bandwidth_aware_priorities, 1.5, 2.0, 0.0)
    assert a == c and np.ndim(a) == 0


def test_bandwidth_aware_priorities_errors_match():
    same_error(bandwidth_aware_priorities, [1.0, np.nan], [1, 1], [0, 0])
    same_error(bandwidth_aware_priorities, [1.0, 1.0], [1, -1], [0, 0])
    same_error(bandwidth_aware_priorities, [1.0, 1.0], [1, 1], [0, np.inf])
    same_error(bandwidth_aware_priorities, [1.0], [1], [0], eps=0.0)


@pytest.mark.parametrize("n", [1, 2, 9, 130, 4097, 100_000])
def test_bandwidth_efficiency_matches(n):
    rng = np.random.default_rng(200 + n)
    r = rng.normal(size=n) * 10
    b = rng.exponential(size=n) * 1e5
    lo = rng.normal(size=max(1, n // 3))
    w = rng.random(lo.size)
    for args in ((r, b), (r, b, lo), (r, b, lo, 0.25), (r, b, lo, w), (r, b, [], 1.0)):
        a, c = both(bandwidth_efficiency, *args)
        assert a == pytest.approx(c, rel=RTOL, abs=0.0)


def test_bandwidth_efficiency_errors_match():
    same_error(bandwidth_efficiency, [], [1.0])
    same_error(bandwidth_efficiency, [1.0], [])
    same_error(bandwidth_efficiency, [1.0, np.nan], [1.0, 1.0])
    same_error(bandwidth_efficiency, [1.0], [-1.0])
    same_error(bandwidth_efficiency, [1.0], [0.0])  # zero denominator
    same_error(bandwidth_efficiency, [1.0], [1.0], [np.inf])
    same_error(bandwidth_efficiency, [1.0], [1.0], [1.0], -1.0)
    same_error(bandwidth_efficiency, [1.0], [1.0], [1.0, 2.0], [1.0, 2.0, 3.0])
    same_error(bandwidth_efficiency, [], [1.0], [[1.0]])  # the empty rewards are named first
    same_error(bandwidth_efficiency, [1.0], [1.0], [1.0], "heavy")
    assert both(bandwidth_efficiency, [2.0], [1.0], [], "ignored with no losses") == (2.0, 2.0)


@pytest.mark.parametrize("n,d", [(1, 1), (2, 3), (17, 4), (64, 7), (1000, 32), (3, 1000)])
def test_plan_surprise_batch_matches(n, d):
    rng = np.random.default_rng(n * 1000 + d)
    plans = rng.normal(size=(n, d)) * 1e3
    mean = rng.normal(size=d)
    rewards = rng.normal(size=n)
    for kw in ({}, {"rewards": rewards}, {"rewards": rewards, "surprise_weight": 0.3, "reward_weight": 2.0}):
        a, b = both(plan_surprise_batch, plans, mean, **kw)
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=0)
    a, b = both(plan_surprise_batch, plans[:, ::-1], mean[::-1])  # non-contiguous views
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=0)
    a, b = both(plan_surprise_batch, np.zeros((0, d)), mean)
    assert a.shape == b.shape == (0,)


def test_plan_surprise_batch_errors_match():
    plans = np.ones((3, 2))
    bad = plans.copy()
    bad[1, 1] = np.nan
    same_error(plan_surprise_batch, bad, np.zeros(2))
    same_error(plan_surprise_batch, plans, np.zeros(2), [0.0, np.inf, 1.0])
    same_error(plan_surprise_batch, plans, np.zeros(3))
    same_error(plan_surprise_batch, plans, np.zeros(2), [1.0])


@pytest.mark.parametrize("decay", [0.0, 0.5, 0.99, 1.0])
@pytest.mark.parametrize("n,d", [(1, 1), (5, 3), (300, 8), (2000, 2)])
def test_ema_update_batch_matches(decay, n, d):
    rng = np.random.default_rng(n + d)
    plans = rng.normal(size=(n, d)) * 100
    nat = EMAPlanTracker(decay, use_native=True)
    ref = EMAPlanTracker(decay, use_native=False)
    one = EMAPlanTracker(decay)
    for chunk in (plans[: n // 2], plans[n // 2:]):
        if not len(chunk):  # an empty batch before any plan is an error on both paths
            continue
        np.testing.assert_allclose(nat.update_batch(chunk), ref.update_batch(chunk), rtol=1e-10, atol=1e-10)
    for p in plans:
        one.update(p)
    np.testing.assert_array_equal(nat.mean, one.mean)  # compiled batch == N single updates, bit for bit
    assert nat.count == ref.count == one.count == n and nat.dim == d


def test_ema_bad_batch_leaves_state_untouched():
    for start in (None, np.ones(2)):
        nat, ref = EMAPlanTracker(0.9, use_native=True), EMAPlanTracker(0.9, use_native=False)
        if start is not None:
            nat.update(start)
            ref.update(start)
        bad = np.ones((3, 2))
        bad[0 if start is None else 2, 0] = np.nan
        errs = []
        for tr in (nat, ref):
            with pytest.raises(ValueError) as info:
                tr.update_batch(bad)
            errs.append(str(info.value))
            assert tr.count == (0 if start is None else 1)
        assert errs[0] == errs[1]
        with pytest.raises(ValueError, match="dimension 3, expected 2"):
            nat.update_batch(np.ones((2, 3))) if start is not None else (nat.update(np.ones(2)),
                                                                          nat.update_batch(np.ones((2, 3))))
    tr = EMAPlanTracker(0.9, use_native=True)
    tr.update_batch(np.ones((2, 2)))
    copy.deepcopy(tr)  # holds a flag, not the module


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.uint8])
def test_prefix_match_batch_matches(dtype):
    rng = np.random.default_rng(7)
    q = rng.integers(0, 50, 300).astype(dtype)
    cands = []
    for _ in range(200):
        k = int(rng.integers(0, 400))
        c = np.concatenate([q[: int(rng.integers(0, 300))], rng.integers(0, 50, 100).astype(dtype)])[:k]
        cands.append(c.astype(rng.choice([np.int64, np.int32, np.int8])))
    cands += [[], list(q[:5].tolist()) + [999], np.array([], np.float64), q[:1].astype(np.int64), q[::2]]
    a, b = both(prefix_match_batch, q, cands)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.int64
    np.testing.assert_array_equal(a, [prefix_match(q, c) for c in cands])
    a = prefix_match_batch(q, (c for c in cands[:10]), use_native=True)  # any iterable
    np.testing.assert_array_equal(a, prefix_match_batch(q, (c for c in cands[:10]), use_native=False))
    a, b = both(prefix_match_batch, q, np.stack([q, q[::-1]]))
    np.testing.assert_array_equal(a, b)
    assert both(prefix_match_batch, q, [])[0].shape == (0,)


def test_prefix_match_batch_errors_match():
    q = np.arange(5)
    same_error(prefix_match_batch, q, [q, np.array([1.5, 2.0])])
    same_error(prefix_match_batch, q, [q, np.ones((2, 2), np.int64)])
    same_error(prefix_match_batch, np.ones((2, 2), np.int64), [q])


@pytest.mark.parametrize("n_items", [1, 2, 9, 1000, 20000])
@pytest.mark.parametrize("mode", ["proportional", "softmax"])
def test_priority_sample_same_draws(n_items, mode):
    rng = np.random.default_rng(n_items)
    p = rng.exponential(size=n_items) * (rng.random(n_items) > 0.4)
    p[0] = max(p[0], 0.1)
    p[-3:] = 0.0 if n_items > 3 else p[-3:]  # a zero tail: rounding must step back from it
    for n, stratified, alpha in ((1, True, 1.0), (64, True, 0.6), (1000, False, 1.0), (7, True, 0.0)):
        a = priority_sample(p, n, 5, mode=mode, alpha=alpha, stratified=stratified, use_native=True)
        b = priority_sample(p, n, 5, mode=mode, alpha=alpha, stratified=stratified, use_native=False)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        assert a[0].dtype == np.int64 and np.all(a[1] > 0)


def test_priority_sample_lands_on_last_positive_at_the_top():
    p = np.array([1.0, 2.0, 0.0, 0.0])
    for use in (True, False):
        idx, _ = priority_sample(p, 1000, 3, use_native=use)
        assert set(idx.tolist()) <= {0, 1}
    same_error(priority_sample, [0.0, 0.0], 3)
    same_error(priority_sample, [1.0, -1.0], 3)
