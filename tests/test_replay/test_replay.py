"""Prioritized / hot-cold replay: storage, validation, ids and ages, persistence, threads.

Every test runs on the numpy path and, when built, on the compiled kernels.
"""

import threading

import numpy as np
import pytest

from echo_rl.config import ReplayConfig
from echo_rl.replay import (
    HotColdBuffer,
    PrioritizedReplayBuffer,
    ReplayNotReadyError,
    SchemaError,
    SurpriseCalculator,
)
from echo_rl.kernels import kernels_available, plan_surprise

BACKENDS = [False] + ([True] if kernels_available() else [])


@pytest.fixture(params=BACKENDS, ids=lambda b: "native" if b else "numpy")
def native(request):
    return request.param


def transition(i, d=4):
    return {"obs": np.full(d, i, np.float32), "action": np.array([i], np.int64),
            "reward": np.array([0.5 * i], np.float32), "done": np.array([i % 2 == 0])}


def batch_of(ids, d=4):
    ids = np.asarray(ids)
    return {"obs": np.repeat(ids[:, None], d, 1).astype(np.float32), "action": ids[:, None].astype(np.int64),
            "reward": (0.5 * ids[:, None]).astype(np.float32), "done": (ids[:, None] % 2 == 0)}


def check_trees(buf):
    """Every internal node equals the sum of its children; leaves past the capacity are 0."""
    for tree in buf._trees:
        tree.check_sums()


def test_ring_overwrite_and_ids(native):
    buf = PrioritizedReplayBuffer(10, seed=0, use_native=native)
    assert buf.native == native
    for i in range(7):
        assert buf.add_one(transition(i)) == i
    ids = buf.add(batch_of(np.arange(7, 23)))
    np.testing.assert_array_equal(ids, np.arange(7, 23))
    assert len(buf) == 10 and buf.ids_issued == 23
    b = buf.sample(64)
    assert set(b.indices.tolist()) <= set(range(13, 23))
    np.testing.assert_array_equal(b.data["obs"][:, 0], b.indices)  # data belong to their id
    np.testing.assert_array_equal(b.data["action"][:, 0], b.indices)
    assert b.data["done"].dtype == np.bool_ and b.data["obs"].dtype == np.float32
    check_trees(buf)
    # a batch larger than the ring keeps its last `capacity` rows
    buf.add(batch_of(np.arange(100, 125)))
    assert sorted(set(buf.sample(200).indices.tolist())) == list(range(38, 48))
    assert sorted(set(buf.sample(200).data["action"][:, 0].tolist())) == list(range(115, 125))
    check_trees(buf)


def test_nested_pytree_schema(native):
    ex = {"obs": {"image": np.zeros((2, 3), np.uint8), "pos": np.zeros(2, np.float64)},
          "plan": (np.zeros(3, np.float32), np.float32(0)), "reward": 0.0}
    buf = PrioritizedReplayBuffer(8, example=ex, use_native=native, seed=1)
    assert buf.schema.names == ["obs/image", "obs/pos", "plan/0", "plan/1", "reward"]
    for i in range(5):
        buf.add_one({"reward": float(i), "obs": {"pos": np.full(2, i, np.float64),
                                                 "image": np.full((2, 3), i, np.uint8)},
                     "plan": (np.full(3, i, np.float32), np.float32(i))})
    b = buf.sample(16)
    assert isinstance(b.data["plan"], tuple) and b.data["obs"]["image"].shape == (16, 2, 3)
    np.testing.assert_array_equal(b.data["obs"]["image"][:, 0, 0], b.indices)
    np.testing.assert_array_equal(b.data["reward"], b.indices.astype(np.float64))


def test_bad_samples_name_the_leaf_and_change_nothing(native):
    buf = PrioritizedReplayBuffer(6, use_native=native, seed=0)
    for i in range(4):
        buf.add_one(transition(i))
    assert buf._raw is None  # one proportional ring: leaves are the only priority record
    before = [a.copy() for a in buf._storage], [t.tree.copy() for t in buf._trees]

    def unchanged():
        for a, b0 in zip(buf._storage, before[0]):
            np.testing.assert_array_equal(a, b0)
        for t, t0 in zip(buf._trees, before[1]):
            np.testing.assert_array_equal(t.tree, t0)
        assert buf.ids_issued == 4

    bad = transition(9)
    bad["obs"] = bad["obs"].astype(np.float64)
    with pytest.raises(SchemaError, match="leaf 'obs' has dtype float64, schema expects float32"):
        buf.add_one(bad)
    bad = transition(9)
    bad["action"] = np.array([1, 2], np.int64)
    with pytest.raises(SchemaError, match=r"leaf 'action' has shape \(2,\)"):
        buf.add_one(bad)
    bad = transition(9)
    del bad["done"]
    with pytest.raises(SchemaError, match="missing leaf 'done'"):
        buf.add_one(bad)
    bad = transition(9)
    bad["extra"] = np.zeros(1)
    with pytest.raises(SchemaError, match="unknown leaf 'extra'"):
        buf.add_one(bad)
    bb = batch_of(np.arange(3))
    bb["reward"] = bb["reward"][:2]
    with pytest.raises(SchemaError, match="leaf 'reward' has 2 rows"):
        buf.add(bb)
    bb = batch_of(np.arange(3))
    bb["done"] = bb["done"].astype(np.float32)
    with pytest.raises(SchemaError, match="leaf 'done' has dtype float32"):
        buf.add(bb)
    with pytest.raises(ValueError, match=r"priorities\[1\]=nan"):
        buf.add(batch_of(np.arange(3)), priorities=[1.0, np.nan, 2.0])
    with pytest.raises(ValueError, match="priority=-1"):
        buf.add_one(transition(9), priority=-1.0)
    unchanged()
    # Python numbers are accepted where they cast same-kind
    buf.add_one({"obs": [1, 2, 3, 4], "action": [7], "reward": [0.5], "done": [True]})
    assert buf.ids_issued == 5


def test_update_priorities_validation(native):
    buf = PrioritizedReplayBuffer(8, use_native=native, seed=0)
    buf.add(batch_of(np.arange(12)))
    trees = [t.tree.copy() for t in buf._trees]
    for bad, pat in ((np.nan, r"priorities\[2\]=nan"), (np.inf, r"priorities\[2\]=inf"),
                     (-0.5, r"priorities\[2\]=-0.5")):
        with pytest.raises(ValueError, match=pat):
            buf.update_priorities([4, 5, 6, 7], [1.0, 2.0, bad, 1.0])
    with pytest.raises(ValueError, match=r"indices\[1\]=12 is invalid"):
        buf.update_priorities([4, 12], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"indices\[0\]=-1 is invalid"):
        buf.update_priorities([-1], [1.0])
    with pytest.raises(ValueError, match="3 entries but priorities has 2"):
        buf.update_priorities([4, 5, 6], [1.0, 2.0])
    for t, t0 in zip(buf._trees, trees):
        np.testing.assert_array_equal(t.tree, t0)
    # evicted ids (0..3) are skipped, never applied to the sample now in their slot
    assert buf.update_priorities([0, 3, 4, 11], [5.0, 5.0, 2.0, 3.0]) == 2
    assert buf.stats["stale_updates"] == 2
    leaves = buf._trees[0].get([4 % 8, 11 % 8, 0])
    np.testing.assert_allclose(leaves, [(2 + 1e-6) ** 0.6, (3 + 1e-6) ** 0.6, 1.0 ** 0.6 * (1 + 1e-6) ** 0.6],
                               rtol=1e-12)
    check_trees(buf)


def test_min_experiences(native):
    buf = PrioritizedReplayBuffer(100, min_experiences=5, use_native=native)
    with pytest.raises(ReplayNotReadyError, match="holds 0 samples; sampling needs min_experiences=5"):
        buf.sample(2)
    buf.add(batch_of(np.arange(4)))
    assert not buf.ready
    with pytest.raises(ReplayNotReadyError):
        buf.sample(2)
    buf.add_one(transition(4))
    assert buf.ready and len(buf.sample(3)) == 3


def test_constructor_validation():
    with pytest.raises(ValueError, match="capacity=0"):
        PrioritizedReplayBuffer(0)
    with pytest.raises(ValueError, match="mode='rank'"):
        PrioritizedReplayBuffer(4, mode="rank")
    with pytest.raises(ValueError, match="beta=2"):
        PrioritizedReplayBuffer(4, beta=2)
    with pytest.raises(ValueError, match="n=0"):
        b = PrioritizedReplayBuffer(4)
        b.add_one(transition(0))
        b.sample(0)


def test_hot_cold_ages_and_split(native):
    cfg = ReplayConfig(hot_buffer_size=100, cold_buffer_size=1000, age_threshold=10, max_replay_age=35,
                       min_experiences=1, hot_sample_ratio=0.7, sampling_mode="proportional", priority_alpha=1.0)
    buf = HotColdBuffer(cfg, use_native=native, seed=3)
    assert (buf.hot_capacity, buf.cold_capacity, buf.capacity) == (10, 25, 35)
    for i in range(6):
        buf.add_one(transition(i))
    assert (buf.hot_size, buf.cold_size) == (6, 0)
    assert np.all(buf.age(buf.sample(50).indices) < 6)  # only hot exists: it takes the whole batch
    buf.add(batch_of(np.arange(6, 30)))
    assert (buf.hot_size, buf.cold_size) == (10, 20)
    b = buf.sample(1000)
    ages = buf.age(b.indices)
    assert ages.max() < 30
    assert (ages < 10).sum() == 700  # 0.7 * 1000 from hot
    buf.add(batch_of(np.arange(30, 80)))
    assert (buf.hot_size, buf.cold_size) == (10, 25)
    ages = buf.age(buf.sample(2000).indices)
    assert ages.max() < 35 and ages.min() >= 0
    check_trees(buf)
    # single adds migrate one sample at a time
    for i in range(80, 97):
        buf.add_one(transition(i))
        check_trees(buf)
        assert {int(x) for x in np.flatnonzero(buf._trees[0].leaves)} == {j % 10 for j in range(i - 9, i + 1)}
    b = buf.sample(500)
    np.testing.assert_array_equal(b.data["action"][:, 0], b.indices)
    assert buf.age(b.indices).max() < 35


def test_hot_cold_edge_configs(native):
    # no cold: everything lives in hot, evicted at min(age_threshold, max_replay_age)
    buf = HotColdBuffer(ReplayConfig(cold_buffer_size=0, age_threshold=8, min_experiences=1), use_native=native)
    assert buf.capacity == 8 and buf.cold_capacity == 0
    buf.add(batch_of(np.arange(20)))
    assert set(buf.sample(100).indices.tolist()) <= set(range(12, 20))
    # all-cold batches
    cfg = ReplayConfig(age_threshold=4, max_replay_age=12, hot_sample_ratio=0.0, min_experiences=1)
    buf = HotColdBuffer(cfg, use_native=native, seed=0)
    buf.add(batch_of(np.arange(12)))
    assert np.all(buf.age(buf.sample(200).indices) >= 4)


def test_product_api_add_experience_sample_batch(native):
    cfg = ReplayConfig(hot_buffer_size=50, cold_buffer_size=50, age_threshold=20, max_replay_age=100,
                       min_experiences=3, surprise_weight=2.0, reward_weight=0.5, ema_decay=0.9)
    buf = HotColdBuffer(cfg, use_native=native, seed=0)
    rng = np.random.default_rng(0)
    ref = SurpriseCalculator(2.0, 0.5, 0.9)
    for t in range(40):
        plan = rng.normal(size=3).astype(np.float32)
        r = float(rng.normal())
        expect = ref.score(plan, r)
        i = buf.add_experience(np.zeros(5, np.float32), plan, np.int64(t), r, np.ones(5, np.float32), False)
        assert buf._raw[i % buf.capacity] == pytest.approx(expect)
    assert buf._raw[0] == pytest.approx(0.5 * abs(buf._storage[buf.schema.names.index("reward")][0]))
    exps, weights = buf.sample_batch(16, temperature=0.5)
    assert buf.temperature == 0.5
    assert set(exps) == {"state", "latent_plan", "action", "reward", "next_state", "done", "indices"}
    np.testing.assert_array_equal(exps["action"], exps["indices"])
    assert weights.shape == (16,) and weights.max() == 1.0
    # the score formula: the first plan sees no tau_bar; later plans see the EMA before them
    calc = SurpriseCalculator(1.0, 1.0, 0.5)
    assert calc.score([1.0, 0.0], -2.0) == 2.0
    assert calc.score([0.0, 0.0], 1.0) == pytest.approx(plan_surprise([0, 0], [1, 0], 1.0))


def test_save_load_roundtrip(tmp_path, native):
    cfg = ReplayConfig(age_threshold=6, max_replay_age=20, min_experiences=1)
    a = HotColdBuffer(cfg, use_native=native, seed=7)
    rng = np.random.default_rng(0)
    for t in range(30):
        a.add_experience(rng.normal(size=2), rng.normal(size=3), t, float(rng.normal()), rng.normal(size=2),
                         t % 5 == 0)
    b0 = a.sample(8)
    a.update_priorities(b0.indices, np.abs(rng.normal(size=8)))
    a.save(tmp_path / "replay.npz")
    b = HotColdBuffer(cfg, use_native=native, seed=123)
    b.load(tmp_path / "replay.npz")
    for x, y in ((a.sample(32), b.sample(32)), (a.sample(5), b.sample(5))):
        np.testing.assert_array_equal(x.indices, y.indices)
        np.testing.assert_array_equal(x.weights, y.weights)
        for k in x.data:
            np.testing.assert_array_equal(x.data[k], y.data[k])
    assert a.add_experience(np.zeros(2), np.ones(3), 99, 1.0, np.zeros(2), True) == \
        b.add_experience(np.zeros(2), np.ones(3), 99, 1.0, np.zeros(2), True)
    np.testing.assert_array_equal(a._raw, b._raw)
    with pytest.raises(ValueError, match="region sizes"):
        HotColdBuffer(ReplayConfig(age_threshold=5, max_replay_age=20)).load(tmp_path / "replay.npz")
    with pytest.raises(FileNotFoundError):
        b.load(tmp_path / "missing.npz")


def test_softmax_shift_survives_large_and_falling_scores(native):
    buf = PrioritizedReplayBuffer(16, mode="softmax", temperature=1.0, use_native=native, seed=0)
    buf.add(batch_of(np.arange(16)), priorities=np.linspace(0, 3, 16))
    buf.update_priorities([5], [2000.0])  # would overflow exp without a shift
    assert buf.stats["rebases"] >= 1
    b = buf.sample(100)
    assert np.all(b.indices == 5)
    buf.update_priorities([5], [0.0])  # the maximum falls away: total would underflow
    b = buf.sample(20000)
    s = np.linspace(0, 3, 16)
    s[5] = 0.0
    p = np.exp(s - s.max())
    p /= p.sum()
    counts = np.bincount(b.indices, minlength=16)
    np.testing.assert_allclose(counts / 20000, p, atol=0.01)
    np.testing.assert_allclose(b.probabilities, p[b.indices], rtol=1e-9)
    check_trees(buf)


def test_one_writer_one_sampler_threads(native):
    buf = PrioritizedReplayBuffer(512, min_experiences=64, use_native=native, seed=0)
    buf.add(batch_of(np.arange(64)))
    errors = []

    def writer():
        try:
            for i in range(64, 3000):
                if i % 50 == 0:
                    buf.add(batch_of(np.arange(i * 1000, i * 1000 + 7)))
                buf.add_one(transition(i))
        except Exception as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    def sampler():
        try:
            rng = np.random.default_rng(1)
            for _ in range(300):
                b = buf.sample(32)
                # rows are whole (no torn writes): every leaf of a row comes from one transition
                act = b.data["action"][:, 0]
                np.testing.assert_array_equal(b.data["obs"][:, 0], act.astype(np.float32))
                buf.update_priorities(b.indices, rng.uniform(0.1, 2.0, size=32))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer), threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(buf) == 512
    check_trees(buf)


def test_replay_config_fields_validate():
    from echo_rl.config import ConfigError

    with pytest.raises(ConfigError, match="ReplayConfig.sampling_mode='rank'"):
        ReplayConfig(sampling_mode="rank")
    with pytest.raises(ConfigError, match="ReplayConfig.priority_epsilon=-1"):
        ReplayConfig(priority_epsilon=-1.0)
    cfg = ReplayConfig.from_dict(ReplayConfig(sampling_mode="proportional").to_dict())
    buf = PrioritizedReplayBuffer.from_config(cfg.replace(hot_buffer_size=10, cold_buffer_size=20,
                                                          max_replay_age=25, min_experiences=2))
    assert buf.capacity == 25 and buf.mode == "proportional" and buf.min_experiences == 2


def test_hot_cold_bad_input_changes_nothing(native):
    buf = HotColdBuffer(ReplayConfig(age_threshold=4, max_replay_age=10, min_experiences=1), use_native=native)
    buf.add(batch_of(np.arange(7)), priorities=np.arange(7.0))
    snap = ([a.copy() for a in buf._storage], buf._raw.copy(), [t.tree.copy() for t in buf._trees])
    bad = transition(9)
    bad["reward"] = np.zeros((1, 1), np.float32)
    with pytest.raises(SchemaError, match="leaf 'reward' has shape"):
        buf.add_one(bad)
    with pytest.raises(ValueError, match=r"priorities\[1\]=inf"):
        buf.update_priorities([5, 6], [1.0, np.inf])
    for a, a0 in zip(buf._storage, snap[0]):
        np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(buf._raw, snap[1])
    for t, t0 in zip(buf._trees, snap[2]):
        np.testing.assert_array_equal(t.tree, t0)
    assert buf.ids_issued == 7


def test_batched_add_with_non_contiguous_leaves(native):
    buf = PrioritizedReplayBuffer(300, use_native=native, seed=0)
    big = np.arange(400 * 8, dtype=np.float32).reshape(400, 8)
    buf.add({"obs": big[:, ::2], "id": np.arange(400)[:, None]})  # strided leaf, wraps the ring
    b = buf.sample(500)
    np.testing.assert_array_equal(b.data["obs"], big[b.data["id"][:, 0]][:, ::2])
    assert set(b.data["id"][:, 0].tolist()) <= set(range(100, 400))


def test_sample_into_caller_arrays(native):
    """sample(n, out=...) gathers into the caller's arrays: the same draw, no new arrays."""
    a = PrioritizedReplayBuffer(32, seed=5, use_native=native)
    b = PrioritizedReplayBuffer(32, seed=5, use_native=native)
    for buf in (a, b):
        buf.add(batch_of(np.arange(20)))
        buf.update_priorities(np.arange(20), np.arange(20) + 1.0)
    out = {k: np.full((16, *v.shape[1:]), -1, v.dtype) for k, v in batch_of(np.arange(1)).items()}
    keep = {k: v for k, v in out.items()}
    got, ref = a.sample(16, out=out), b.sample(16)
    assert got.data is out and all(out[k] is keep[k] for k in out)  # written in place, nothing replaced
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.weights, ref.weights)
    for k in out:
        np.testing.assert_array_equal(out[k], ref.data[k])
    np.testing.assert_array_equal(out["action"][:, 0], got.indices)  # rows belong to their ids


def test_sample_out_bad_arrays_name_the_leaf_and_draw_nothing(native):
    buf = PrioritizedReplayBuffer(32, seed=5, use_native=native)
    buf.add(batch_of(np.arange(20)))
    good = {k: np.zeros((8, *v.shape[1:]), v.dtype) for k, v in batch_of(np.arange(1)).items()}
    state = buf._rng.bit_generator.state
    cases = [({**good, "obs": np.zeros((8, 4), np.float64)}, r"out leaf 'obs' is float64\[8, 4\]; expected float32"),
             ({**good, "action": np.zeros((7, 1), np.int64)}, r"out leaf 'action' is int64\[7, 1\]"),
             ({**good, "obs": np.zeros((4, 8), np.float32).T}, r"'obs' must be C-contiguous"),
             ({**good, "reward": [0.0] * 8}, r"'reward' is a list"),
             ({k: v for k, v in good.items() if k != "done"}, r"missing leaf 'done'")]
    ro = {k: v.copy() for k, v in good.items()}
    ro["done"].flags.writeable = False
    cases.append((ro, r"'done' must be C-contiguous and writable"))
    for bad, match in cases:
        with pytest.raises(SchemaError, match=match):
            buf.sample(8, out=bad)
    assert buf._rng.bit_generator.state == state  # refused before drawing
    with pytest.raises(ReplayNotReadyError):
        PrioritizedReplayBuffer(8, use_native=native).sample(2, out=good)
