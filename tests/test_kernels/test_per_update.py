"""The one-call proportional update (``per_update``): leaves equal libm's ``pow`` bit for bit, the
ancestors equal a full rebuild, whatever the batch (duplicates, stale ids, batches larger than the
upper levels of the tree)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_rl.kernels import kernels_available
from echo_rl.kernels import sumtree_ref as ref
from echo_rl.kernels._backend import native_module

pytestmark = pytest.mark.skipif(not kernels_available(), reason="compiled kernels not built")
nat = native_module()


def full_tree(rng, capacity):
    offs, n = ref.make_layout(capacity)
    t = ref.aligned_zeros(n)
    t[offs[-1]: offs[-1] + capacity] = rng.exponential(size=capacity)
    ref.tree_build(t, offs)
    return t, offs


def libm_pow(x: np.ndarray, a: float) -> np.ndarray:
    """C ``pow`` per element (what std::pow calls), not numpy's vectorised power."""
    def one(v):
        try:
            return math.pow(float(v), a)
        except OverflowError:  # C pow returns inf there
            return math.inf
    return np.array([one(v) for v in x])


def priorities(rng, n):
    """Typical TD errors plus the awkward ones: zero, tiny, huge, exactly one and its neighbours."""
    p = np.concatenate([rng.uniform(0, 2, n), np.exp(rng.uniform(-40, 40, n)), 1 + rng.normal(0, 1e-3, n),
                        [0.0, 1.0, np.nextafter(1.0, 2), np.nextafter(1.0, 0), 4.0, 0.25, 1e-300, 1e300, 5e-324]])
    return np.abs(p)


@pytest.mark.parametrize("alpha", [0.6, 0.4, 0.5, 0.7, 0.123, 0.0, 1.0, 1.7])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_leaves_are_libm_pow_bit_for_bit(alpha, eps):
    rng = np.random.default_rng(int(alpha * 1000) + int(eps > 0))
    p = priorities(rng, 20000)
    cap = p.size
    t, offs = full_tree(rng, cap)
    ids = rng.permutation(cap).astype(np.int64)
    res = nat.per_update(t, offs, None, ids, p, 0, cap, cap, cap, cap, alpha, eps)
    assert res == (-1, -1, cap, float(p.max()))
    leaves = t[offs[-1]: offs[-1] + cap]
    np.testing.assert_array_equal(leaves[ids], libm_pow(p + eps, alpha))
    rebuilt = t.copy()
    ref.tree_build(rebuilt, offs)
    np.testing.assert_array_equal(t, rebuilt)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 4000), st.sampled_from([0.6, 1.0, 0.35]), st.integers(0, 2**32 - 1))
def test_matches_sequential_updates_and_rebuild(cap, k, alpha, seed):
    """Duplicate ids (the last one wins), ids outside the live window (skipped), any batch size."""
    rng = np.random.default_rng(seed)
    t, offs = full_tree(rng, cap)
    lo = int(rng.integers(0, 3 * cap))
    hi = lo + int(rng.integers(1, cap + 1))  # live ids [lo, hi), leaf = id % cap
    ids = rng.integers(max(0, lo - cap // 4), hi, size=k).astype(np.int64)
    p = rng.exponential(size=k)
    expect = t.copy()
    leaf_off = int(offs[-1])
    live = (ids >= lo) & (ids < hi)
    for i in np.flatnonzero(live):  # one at a time, in order
        expect[leaf_off + ids[i] % cap] = math.pow(p[i] + 1e-6, alpha)
    ref.tree_build(expect, offs)
    res = nat.per_update(t, offs, None, ids, p, lo, hi, hi, cap, cap, alpha, 1e-6)
    assert res[:3] == (-1, -1, int(live.sum()))
    np.testing.assert_array_equal(t, expect)


def test_bad_input_writes_nothing_and_names_the_first_bad_position():
    rng = np.random.default_rng(3)
    t, offs = full_tree(rng, 100)
    before = t.copy()
    ids = np.arange(10, dtype=np.int64)
    for p, ids_, want in ((np.r_[np.ones(4), np.nan, -1.0, np.ones(4)], ids, (4, -1)),
                          (np.r_[np.ones(6), -0.5, np.ones(3)], np.r_[ids[:8], 100, 1], (6, -1)),
                          (np.ones(10), np.r_[ids[:3], 100, ids[4:]], (-1, 3)),
                          (np.r_[np.ones(9), np.inf], np.r_[ids[:9], -1], (9, -1))):
        res = nat.per_update(t, offs, None, ids_.astype(np.int64), p, 0, 100, 100, 100, 100, 0.6, 1e-6)
        assert res[:2] == want
        np.testing.assert_array_equal(t, before)
    # -0.0 is a valid priority (>= 0), as in the numpy path
    assert nat.per_update(t, offs, None, ids, np.full(10, -0.0), 0, 100, 100, 100, 100, 0.6, 1e-6)[:3] == (-1, -1, 10)
