"""Property tests: the compiled kernels agree with the numpy reference on random inputs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_rl.kernels import kernels_available
from echo_rl.kernels import sumtree_ref as ref
from echo_rl.kernels._backend import native_module
from echo_rl.kernels.sumtree import SumTree
from echo_rl.replay import PrioritizedReplayBuffer

pytestmark = pytest.mark.skipif(not kernels_available(), reason="compiled kernels not built")
nat = native_module()
SETTINGS = settings(max_examples=60, deadline=None)


def random_tree(rng, capacity, zero_frac=0.3):
    offs, n = ref.make_layout(capacity)
    t = ref.aligned_zeros(n)
    t[offs[-1]: offs[-1] + capacity] = rng.exponential(size=capacity) * (rng.random(capacity) > zero_frac)
    ref.tree_build(t, offs)
    return t, offs


@SETTINGS
@given(st.integers(1, 5000), st.integers(1, 300), st.integers(0, 2**32 - 1))
def test_tree_set_matches(cap, k, seed):
    rng = np.random.default_rng(seed)
    t, offs = random_tree(rng, cap)
    leaves = rng.permutation(cap)[: min(k, cap)].astype(np.int64)
    vals = rng.exponential(size=leaves.size)
    a, b = t.copy(), t.copy()
    ref.tree_set(a, offs, leaves, vals)
    nat.tree_set(b, offs, leaves, vals)
    np.testing.assert_array_equal(a, b)
    c = a.copy()
    ref.tree_build(c, offs)  # incremental refresh == full rebuild
    np.testing.assert_array_equal(a, c)


@SETTINGS
@given(st.integers(1, 5000), st.data())
def test_tree_set_range_matches(cap, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    start = data.draw(st.integers(0, cap - 1))
    n = data.draw(st.integers(0, cap - start))
    t, offs = random_tree(rng, cap)
    vals = rng.exponential(size=n)
    a, b = t.copy(), t.copy()
    ref.tree_set_range(a, offs, start, vals)
    nat.tree_set_range(b, offs, start, vals)
    np.testing.assert_array_equal(a, b)
    c = a.copy()
    ref.tree_build(c, offs)
    np.testing.assert_array_equal(a, c)


@SETTINGS
@given(st.integers(1, 40000), st.integers(1, 512), st.integers(0, 2**32 - 1), st.floats(0.0, 0.95))
def test_tree_sample_and_find_match(cap, n, seed, zero_frac):
    rng = np.random.default_rng(seed)
    t, offs = random_tree(rng, cap, zero_frac)
    if t[0] == 0:
        t[offs[-1]] = 1.0
        ref.tree_build(t, offs)
    u = rng.random(n)
    la, va = ref.tree_sample(t, offs, u)
    lb, vb = np.empty(n, np.int64), np.empty(n)
    assert nat.tree_sample(t, offs, u, lb, vb) == t[0]
    np.testing.assert_array_equal(la, lb)
    np.testing.assert_array_equal(va, vb)
    assert np.all(vb > 0) and np.all(lb < cap)  # zero and padding leaves are never drawn
    masses = rng.random(n) * t[0] * 1.01  # includes masses past the total
    out = np.empty(n, np.int64)
    nat.tree_find(t, offs, masses, out)
    np.testing.assert_array_equal(ref.tree_find(t, offs, masses), out)
    assert np.all(t[offs[-1] + out] > 0)


def test_descent_matches_cumulative_sums():
    """find(m) is the leaf whose cumulative-sum interval holds m (checked against searchsorted)."""
    rng = np.random.default_rng(5)
    t, offs = random_tree(rng, 3000, 0.5)
    leaves = t[offs[-1]: offs[-1] + 3000]
    cdf = np.cumsum(leaves)
    masses = rng.random(2000) * cdf[-1] * (1 - 1e-12)
    expect = np.searchsorted(cdf, masses, side="right")
    out = np.empty(2000, np.int64)
    nat.tree_find(t, offs, masses, out)
    close = np.abs(cdf[np.minimum(expect, 2999)] - masses) < 1e-9 * cdf[-1]  # rounding at boundaries
    assert np.all((out == expect) | close)


def test_malformed_layout_is_rejected():
    t, offs = random_tree(np.random.default_rng(0), 100)
    with pytest.raises(ValueError, match="offs"):
        nat.tree_set(t, np.array([1, 8], np.int64), np.array([0]), np.array([1.0]))
    with pytest.raises(IndexError, match="out of range"):
        nat.tree_set(t, offs, np.array([10**6]), np.array([1.0]))


@SETTINGS
@given(st.integers(1, 64), st.integers(0, 2**32 - 1))
def test_gather_matches_take(n, seed):
    rng = np.random.default_rng(seed)
    srcs = (rng.normal(size=(100, 84)).astype(np.float32), rng.integers(0, 9, (100, 1)),
            rng.random((100, 1)) > 0.5, rng.normal(size=(100, 3, 5)))
    rows = rng.integers(0, 100, n)
    outs = tuple(np.empty((n, *s.shape[1:]), s.dtype) for s in srcs)
    nat.gather(srcs, rows, outs)
    for s, o in zip(srcs, outs):
        np.testing.assert_array_equal(s[rows], o)
    with pytest.raises(IndexError, match=r"rows\[0\]=100"):
        nat.gather(srcs, np.array([100]), tuple(np.empty((1, *s.shape[1:]), s.dtype) for s in srcs))


def test_first_invalid_matches():
    for v in ([1.0, 2.0], [0.0, -0.0, np.nan], [1.0, np.inf], [3.0, -1e-300, 2.0], []):
        a = np.asarray(v, dtype=np.float64)
        assert nat.first_invalid(a) == ref.first_invalid(a)


def test_sumtree_class_backends_agree():
    rng = np.random.default_rng(0)
    a, b = SumTree(1000, use_native=False), SumTree(1000, use_native=True)
    for _ in range(20):
        leaves = rng.choice(1000, size=64, replace=False)
        vals = rng.exponential(size=64)
        a.set(leaves, vals)
        b.set(leaves, vals)
        start = int(rng.integers(0, 1000))
        rv = rng.exponential(size=int(rng.integers(1, 200)))
        a.set_range(start, rv)  # wraps past the end
        b.set_range(start, rv)
        np.testing.assert_array_equal(a.tree, b.tree)
        a.check_sums()
        u = rng.random(256)
        for x, y in zip(a.sample(u), b.sample(u)):
            np.testing.assert_array_equal(x, y)


def run_ops(use_native, alpha, mode):
    rng = np.random.default_rng(42)
    buf = PrioritizedReplayBuffer(300, mode=mode, alpha=alpha, temperature=0.7, seed=3, use_native=use_native)
    out = []
    for step in range(60):
        k = int(rng.integers(1, 40))
        ids = np.arange(buf.ids_issued, buf.ids_issued + k)
        batch = {"obs": rng.normal(size=(k, 8)).astype(np.float32), "a": ids[:, None]}
        if step % 3 == 0:
            for j in range(k):
                buf.add_one({"obs": batch["obs"][j], "a": batch["a"][j]},
                            priority=None if j % 2 else float(rng.uniform(0, 4)))
        else:
            buf.add(batch, priorities=rng.uniform(0, 4, k) if step % 2 else None)
        b = buf.sample(64)
        out.append((b.indices, b.weights, b.data["obs"]))
        buf.update_priorities(b.indices[:32], rng.uniform(0, 4, 32))
    return buf, out


@pytest.mark.parametrize("mode,alpha", [("proportional", 1.0), ("proportional", 0.6), ("softmax", 1.0)])
def test_buffer_backends_agree(mode, alpha):
    a, oa = run_ops(False, alpha, mode)
    b, ob = run_ops(True, alpha, mode)
    np.testing.assert_allclose(a._trees[0].tree, b._trees[0].tree, rtol=1e-12)
    a._trees[0].check_sums()
    b._trees[0].check_sums()
    if mode == "softmax":
        np.testing.assert_array_equal(a._raw, b._raw)
    else:  # a single proportional ring keeps no raw priorities (nothing reads them)
        assert a._raw is None and b._raw is None
    for s_a, s_b in zip(a._storage, b._storage):
        np.testing.assert_array_equal(s_a, s_b)
    mismatch = sum(int((x[0] != y[0]).sum()) for x, y in zip(oa, ob))
    if mode == "proportional" and alpha == 1.0:
        assert mismatch == 0  # bit-identical arithmetic: identical draws
        for x, y in zip(oa, ob):
            np.testing.assert_array_equal(x[1], y[1])
            np.testing.assert_array_equal(x[2], y[2])
    else:  # pow/exp may differ in the last ulp between numpy and libm: near-identical draws
        assert mismatch <= 0.001 * 64 * 60


def test_set_one_matches_across_backends():
    rng = np.random.default_rng(9)
    a, b = SumTree(3000, use_native=False), SumTree(3000, use_native=True)
    for _ in range(200):
        leaf, v = int(rng.integers(0, 3000)), float(rng.exponential())
        a.set_one(leaf, v)
        b.set_one(leaf, v)
    np.testing.assert_array_equal(a.tree, b.tree)
    a.check_sums()


@SETTINGS
@given(st.integers(0, 3000), st.integers(0, 2**32 - 1))
def test_write_rows_matches_slice_assignment(n, seed):
    rng = np.random.default_rng(seed)
    dsts = (np.zeros((4000, 84), np.float32), np.zeros((4000, 1), np.int64), np.zeros((4000, 3, 5), np.float64),
            np.zeros((4000, 1), bool))
    srcs = (rng.normal(size=(n, 84)).astype(np.float32), rng.integers(0, 9, (n, 1)), rng.normal(size=(n, 3, 5)),
            rng.random((n, 1)) > 0.5)
    start = int(rng.integers(0, 4000 - n + 1))
    expect = tuple(d.copy() for d in dsts)
    for e, x in zip(expect, srcs):
        e[start: start + n] = x
    nat.write_rows(dsts, start, srcs)  # n*336 bytes crosses the streaming threshold for n >= 196
    for d, e in zip(dsts, expect):
        np.testing.assert_array_equal(d, e)
    with pytest.raises(ValueError, match="does not fit"):
        nat.write_rows(dsts, 4000 - n + 1, srcs)
