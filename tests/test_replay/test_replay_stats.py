"""Chi-square checks: sample frequencies match the target distribution (200k draws per check).

Both modes (proportional p^alpha, softmax exp(s/T)), single ring and hot/cold, after priority
updates and after the ring wraps; importance weights equal (N P(i))^-beta / max.
"""

import numpy as np
import pytest
from scipy import stats

from echo_rl.config import ReplayConfig
from echo_rl.kernels import kernels_available
from echo_rl.replay import HotColdBuffer, PrioritizedReplayBuffer

BACKENDS = [False] + ([True] if kernels_available() else [])
DRAWS = 200_000


@pytest.fixture(params=BACKENDS, ids=lambda b: "native" if b else "numpy")
def native(request):
    return request.param


def rows(ids):
    ids = np.asarray(ids)
    return {"obs": np.repeat(ids[:, None], 3, 1).astype(np.float32), "action": ids[:, None].astype(np.int64)}


def draw(buf, total=DRAWS, batch=1000):
    idx, probs, weights = [], [], []
    for _ in range(total // batch):
        b = buf.sample(batch)
        np.testing.assert_array_equal(b.data["action"][:, 0], b.indices)
        idx.append(b.indices)
        probs.append(b.probabilities)
        weights.append(b.weights)
    return np.concatenate(idx), probs, weights


def chi2(idx, target: dict):
    ids = np.array(sorted(target))
    p = np.array([target[i] for i in ids])
    assert p.sum() == pytest.approx(1.0)
    pos = np.searchsorted(ids, idx)
    assert np.all(ids[np.minimum(pos, len(ids) - 1)] == idx), "drew an id outside the target support"
    counts = np.bincount(pos, minlength=len(ids))
    return stats.chisquare(counts, p * idx.size).pvalue


def target_single(buf, live_ids, pri):
    if buf.mode == "proportional":
        w = (pri + buf.priority_epsilon) ** buf.alpha
    else:
        w = np.exp((pri - pri.max()) / buf.temperature)
    return dict(zip(live_ids.tolist(), (w / w.sum()).tolist()))


@pytest.mark.parametrize("mode", ["proportional", "softmax"])
def test_single_ring_frequencies_weights_updates_and_wrap(native, mode):
    rng = np.random.default_rng(11)
    cap = 50  # not a power of two: padded tree leaves must never be drawn
    buf = PrioritizedReplayBuffer(cap, mode=mode, alpha=0.6, beta=0.4, temperature=0.8, seed=5,
                                  use_native=native)
    pri = rng.uniform(0.0, 3.0, size=cap)
    pri[7] = 0.0
    buf.add(rows(np.arange(cap)), priorities=pri)
    idx, probs, weights = draw(buf)
    target = target_single(buf, np.arange(cap), pri)
    assert chi2(idx, target) > 0.001
    # probabilities and importance weights equal the formulas
    for b_idx, b_p, b_w in zip(np.split(idx, len(probs)), probs, weights):
        expect_p = np.array([target[i] for i in b_idx])
        np.testing.assert_allclose(b_p, expect_p, rtol=1e-9)
        w = (cap * expect_p) ** -0.4
        np.testing.assert_allclose(b_w, w / w.max(), rtol=1e-9)

    # after priority updates
    upd = rng.choice(cap, size=20, replace=False)
    new = rng.uniform(0.0, 5.0, size=20)
    buf.update_priorities(upd, new)
    pri[upd] = new
    idx, _, _ = draw(buf)
    assert chi2(idx, target_single(buf, np.arange(cap), pri)) > 0.001

    # after the ring wraps (ids 50..79 replace 0..29)
    wrap = rng.uniform(0.0, 3.0, size=30)
    buf.add(rows(np.arange(cap, cap + 30)), priorities=wrap)
    live = np.arange(30, 80)
    live_pri = np.concatenate([pri[30:], wrap])
    idx, _, _ = draw(buf)
    assert chi2(idx, target_single(buf, live, live_pri)) > 0.001


@pytest.mark.parametrize("mode", ["proportional", "softmax"])
def test_hot_cold_frequencies_after_updates_and_wrap(native, mode):
    rng = np.random.default_rng(12)
    cfg = ReplayConfig(hot_buffer_size=100, cold_buffer_size=100, age_threshold=16, max_replay_age=56,
                       sampling_mode=mode, temperature=1.5, priority_alpha=0.7, hot_sample_ratio=0.7,
                       importance_sampling_beta=0.5, min_experiences=1)
    buf = HotColdBuffer(cfg, seed=9, use_native=native)
    n = 130  # wraps the 56-slot ring twice
    pri = rng.uniform(0.0, 4.0, size=n)
    buf.add(rows(np.arange(n)), priorities=pri)

    def target():
        hot, cold = np.arange(n - 16, n), np.arange(n - 56, n - 16)
        t = {}
        for ids, ratio in ((hot, 0.7), (cold, 0.3)):
            p = pri[ids]
            w = (p + cfg.priority_epsilon) ** 0.7 if mode == "proportional" else np.exp((p - p.max()) / 1.5)
            t.update(zip(ids.tolist(), (ratio * w / w.sum()).tolist()))
        return t

    idx, probs, weights = draw(buf)
    t = target()
    assert chi2(idx, t) > 0.001
    b_idx = idx[:1000]
    expect = np.array([t[i] for i in b_idx])
    np.testing.assert_allclose(probs[0], expect, rtol=1e-9)
    w = (56 * expect) ** -0.5
    np.testing.assert_allclose(weights[0], w / w.max(), rtol=1e-9)

    upd = rng.choice(np.arange(n - 56, n), size=25, replace=False)
    new = rng.uniform(0.0, 6.0, size=25)
    buf.update_priorities(upd, new)
    pri[upd] = new
    idx, _, _ = draw(buf)
    assert chi2(idx, target()) > 0.001

    # single adds move samples hot -> cold one at a time
    more = rng.uniform(0.0, 4.0, size=10)
    for k, p in enumerate(more):
        buf.add_one({"obs": np.full(3, n + k, np.float32), "action": np.array([n + k], np.int64)}, priority=p)
    pri = np.concatenate([pri, more])
    n += 10
    idx, _, _ = draw(buf)
    assert chi2(idx, target()) > 0.001


def test_chi_square_detects_a_wrong_distribution():
    """The check has teeth: uniform draws fail it against a skewed target."""
    rng = np.random.default_rng(0)
    target = {i: p for i, p in enumerate(np.linspace(1, 3, 20) / np.linspace(1, 3, 20).sum())}
    assert chi2(rng.integers(0, 20, size=DRAWS), target) < 1e-6
