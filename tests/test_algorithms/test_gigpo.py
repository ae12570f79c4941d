"""GiGPO's equations (arXiv 2505.10978, Eqs. 3-8) on groups computed by hand."""

import math

import numpy as np
import pytest
import torch

from echo_rl.algorithms.gigpo import anchor_groups, discounted_returns, gigpo_advantages, token_advantages


def _std(xs):
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def test_discounted_returns_run_backwards_from_the_last_reward():
    np.testing.assert_allclose(discounted_returns([0.0, 0.0, 1.0], 0.5), [0.25, 0.5, 1.0])
    np.testing.assert_allclose(discounted_returns([1.0, 2.0], 1.0), [3.0, 2.0])
    assert discounted_returns([], 0.9).shape == (0,)


def test_repeated_states_and_a_state_seen_once():
    # one task group of three episodes; s0 is everyone's start, s1 is reached by two episodes, s2 by one
    rewards = [[0.0, 1.0], [0.0, 0.0, 0.0], [1.0]]
    states = [["s0", "s1"], ["s0", "s2", "s1"], ["s0"]]
    a = gigpo_advantages(rewards, [7, 7, 7], states, gamma=0.95, omega=1.0)
    # episode level: returns 1, 0, 1 normalised by their sample std
    ret = [1.0, 0.0, 1.0]
    ep = [(r - 2 / 3) / _std(ret) for r in ret]
    np.testing.assert_allclose(a.episode.numpy(), ep, rtol=1e-5)
    # step level: s0 holds the discounted returns 0.95, 0, 1; s1 holds 1 (episode 0, step 1) and 0 (episode 1, step 2)
    s0 = [0.95, 0.0, 1.0]
    m0, sd0 = sum(s0) / 3, _std(s0)
    np.testing.assert_allclose(a.step_only[0], [(0.95 - m0) / sd0, (1 - 0.5) / _std([1, 0])], rtol=1e-5)
    np.testing.assert_allclose(a.step_only[1], [(0 - m0) / sd0, 0.0, (0 - 0.5) / _std([1, 0])], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(a.step_only[2], [(1 - m0) / sd0], rtol=1e-5)
    assert a.step_only[1][1] == 0.0  # s2 was seen once: a group of one has no step-level credit
    # A = A_E + ω·A_S per step
    for i in range(3):
        np.testing.assert_allclose(a.steps[i], ep[i] + a.step_only[i], rtol=1e-5)
    assert a.anchored_share == pytest.approx(5 / 6) and a.anchor_groups == 3


def test_groups_do_not_mix_and_omega_weights_the_step_term():
    # the same state text in two task groups is two anchor groups
    rewards = [[1.0, 0.0], [0.0, 0.0], [1.0], [0.0]]
    states = [["a", "b"], ["a", "b"], ["a"], ["a"]]
    a = gigpo_advantages(rewards, [0, 0, 1, 1], states, gamma=1.0, omega=0.5, scale="none")
    # group 0: returns 1, 0 -> ±0.5; state "a" returns 1, 0 -> ±0.5; state "b" returns 0, 0 -> 0
    np.testing.assert_allclose(a.steps[0], [0.5 + 0.5 * 0.5, 0.5 + 0.0])
    np.testing.assert_allclose(a.steps[1], [-0.5 - 0.5 * 0.5, -0.5 + 0.0])
    # group 1: returns 1, 0 -> ±0.5 at both levels
    np.testing.assert_allclose(a.steps[2], [0.5 + 0.25])
    np.testing.assert_allclose(a.steps[3], [-0.5 - 0.25])
    assert a.anchor_groups == 3


def test_all_equal_returns_give_zero_at_both_levels():
    a = gigpo_advantages([[0.5, 0.5], [0.5, 0.5]], [3, 3], [["x", "y"], ["x", "y"]], gamma=0.9)
    assert a.episode.abs().max() == 0
    for s in a.steps:
        np.testing.assert_array_equal(s, 0.0)


def test_truncated_episodes_count_only_the_rewards_they_saw():
    # episode 1 was cut after two steps (a time limit): no bootstrap, its step returns are its own rewards
    rewards = [[0.0, 0.0, 1.0], [0.0, 0.0]]
    states = [["s", "t", "u"], ["s", "t"]]
    a = gigpo_advantages(rewards, [0, 0], states, gamma=0.5, scale="none")
    # s: 0.25 vs 0 -> ±0.125; t: 0.5 vs 0 -> ±0.25; u: seen once -> 0
    np.testing.assert_allclose(a.step_only[0], [0.125, 0.25, 0.0])
    np.testing.assert_allclose(a.step_only[1], [-0.125, -0.25])
    np.testing.assert_allclose(a.episode.numpy(), [0.5, -0.5])


def test_similarity_threshold_merges_near_identical_states():
    states = ["You are in room 1. A key.", "You are in room 1. A key!", "Somewhere else entirely."]
    assert len(set(anchor_groups(states, [0, 0, 0]))) == 3  # identity: three groups
    merged = anchor_groups(states, [0, 0, 0], similarity=0.9)
    assert merged[0] == merged[1] != merged[2]
    assert len(set(anchor_groups(states, [0, 0, 0], similarity=1.0))) == 3  # ratio 1 is identity
    assert len(set(anchor_groups(states[:2], [0, 1], similarity=0.5))) == 2  # never across task groups


def test_token_advantages_land_on_each_steps_action_tokens():
    out = token_advantages([np.array([1.0, -2.0])], [[(2, 4), (6, 7)]], (1, 8))
    torch.testing.assert_close(out, torch.tensor([[0, 0, 1, 1, 0, 0, -2, 0]], dtype=torch.float32))
    with pytest.raises(ValueError, match="row 0 has 2 action turns but 1 step advantages"):
        token_advantages([np.array([1.0])], [[(0, 1), (2, 3)]], (1, 4))


@pytest.mark.parametrize("kwargs, match", [
    ({"scale": "mad"}, "scale='mad' is invalid: allowed: std, none"),
    ({"gamma": 1.5}, "gamma=1.5, omega=1.0 are invalid"),
    ({"omega": float("inf")}, "omega=inf are invalid"),
    ({"similarity": 0.0}, "similarity=0.0 is invalid"),
])
def test_bad_settings_are_one_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gigpo_advantages([[1.0]], [0], [["s"]], **kwargs)


def test_states_must_match_the_steps():
    with pytest.raises(ValueError, match="trajectory 0 has 2 step rewards but 1 anchor states"):
        gigpo_advantages([[1.0, 0.0]], [0], [["s"]])
