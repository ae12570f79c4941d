import math

import numpy as np
import pytest

from echo_rl.config import BandwidthConfig, ConfigError
from echo_rl.core.bandwidth import (
    BandwidthAwareScheduler,
    BandwidthEfficiencyTracker,
    attention_bandwidth_cost,
    effective_bandwidth_cost,
)


def test_product_example_is_3600():
    # b(128) = 128*129/2 = 8256, b(96) = 96*97/2 = 4656
    assert attention_bandwidth_cost(128) == 8256
    assert effective_bandwidth_cost(seq_len=128, reuse_len=96, scale=1.0) == 3600
    assert effective_bandwidth_cost(seq_len=10, reuse_len=0, scale=2.0) == 110


def test_priority_hand_computed():
    s = BandwidthAwareScheduler(BandwidthConfig(epsilon=1e-6))
    # b_eff(4, 2) = 10 - 3 = 7 ; priority = 2 / (7 + 1 + 1e-6)
    assert s.compute_priority(reward=2.0, seq_len=4, queue_time=1.0, reuse_len=2) == pytest.approx(2 / 8.000001)
    p = s.compute_priorities([1.0, 1.0, 3.0], [4, 4, 10], [0.0, 0.0, 0.0], [0, 3, 0])
    np.testing.assert_allclose(p, [1 / (10 + 1e-6), 1 / (4 + 1e-6), 3 / (55 + 1e-6)])
    assert s.order([1.0, 1.0, 3.0], [4, 4, 10], [0.0, 0.0, 0.0], [0, 3, 0]).tolist() == [1, 0, 2]


def test_tracker_eta_bw_hand_computed():
    t = BandwidthEfficiencyTracker(BandwidthConfig(pg_loss_weight=0.5))
    assert math.isnan(t.snapshot()["eta_bw"])
    # episode 1: steps (r=0, t=2, reuse 0) b=3 ; (r=1, t=4, reuse 2) b=10-3=7 -> R=1, B=10
    t.record_rollout_step(0.0, 2, 0)
    assert t.record_rollout_step(1.0, 4, 2, episode_end=True) == 7
    # episode 2: (r=3, t=5, reuse 5) b_eff=0, b=15 -> R=3, B=0
    t.record_rollout_step(3.0, 5, 5, episode_end=True)
    t.record_learner_update(-2.0)
    t.record_learner_update(4.0)
    snap = t.snapshot()
    # eta = mean R / (mean B + mean(0.5*|l|)) = 2 / (5 + 1.5)
    assert snap["eta_bw"] == pytest.approx(2 / 6.5)
    assert snap["total_bandwidth"] == 3 + 10 + 15
    assert snap["total_bandwidth_saved"] == 3 + 15
    assert snap["kv_reuse_rate"] == pytest.approx(7 / 11)
    assert snap["episodes"] == 2


@pytest.mark.parametrize("kwargs,match", [({"seq_len": 3, "reuse_len": 4}, "reuse_len"),
                                          ({"seq_len": -1, "reuse_len": 0}, "seq_len"),
                                          ({"seq_len": 2.5, "reuse_len": 0}, "seq_len")])
def test_bad_lengths(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        effective_bandwidth_cost(**kwargs)


def test_bad_config_and_queue():
    with pytest.raises(ConfigError, match="scale"):
        BandwidthConfig(scale=0)
    with pytest.raises(ConfigError, match="queue_time"):
        BandwidthAwareScheduler().compute_priority(1.0, 3, -1.0)


def test_queue_cost_is_the_b_eff_waiting_ahead_and_matches_the_engine():
    from echo_rl.engine.scheduler import RequestScheduler

    s = BandwidthAwareScheduler()
    # b_eff = 10, 6, 3 (lengths 4, 3, 2): q = 0, 10, 16
    p = s.compute_priorities([1.0, 1.0, 1.0], [4, 3, 2])
    assert p == pytest.approx([1 / 10.000001, 1 / 16.000001, 1 / 19.000001])
    assert RequestScheduler().priorities([4, 3, 2], [0, 0, 0], [1.0, 1.0, 1.0]) == pytest.approx(p)
    # the oldest of equal-reward requests is never outranked: nothing starves
    assert list(s.order([1.0, 1.0, 1.0], [4, 3, 2])) == [0, 1, 2]
