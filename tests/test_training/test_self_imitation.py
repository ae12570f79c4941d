import numpy as np
import pytest
import torch

from echo_rl.vector.self_imitation import (
    SelfImitationReplay,
    discounted_returns,
    episode_windows,
    self_imitation_loss,
)


def _replay(num_envs=2, k=3, capacity=100, gamma=0.5):
    return SelfImitationReplay(num_envs, obs_dim=2, k=k, capacity=capacity, gamma=gamma, alpha=0.6, beta=0.4,
                               priority_epsilon=1e-6, seed=0)


def test_discounted_returns_by_hand():
    np.testing.assert_allclose(discounted_returns(np.array([0.0, 0.0, 1.0]), 0.5), [0.25, 0.5, 1.0])
    np.testing.assert_allclose(discounted_returns(np.array([1.0, -1.0, 2.0]), 0.9), [1 - 0.9 + 0.81 * 2, -1 + 1.8, 2])


def test_episode_windows_never_reach_before_the_episode():
    obs = np.arange(1, 9, dtype=np.uint8).reshape(4, 2)  # states 1..4 (two features each)
    w, m = episode_windows(obs, 3)
    assert w.shape == (4, 3, 2) and m.shape == (4, 3)
    np.testing.assert_array_equal(m[0], [False, False, True])
    np.testing.assert_array_equal(m[1], [False, True, True])
    assert m[2:].all()
    np.testing.assert_array_equal(w[1, -1], obs[1])  # newest slot is s_t
    np.testing.assert_array_equal(w[3], obs[1:4])
    assert (w[0, :2] == 0).all()


def _rollout(T, N):
    obs = np.zeros((T, N, 2), np.uint8)
    obs[..., 0] = np.arange(T)[:, None] + 10 * np.arange(N)[None]  # tag: 10*env + t
    return obs, np.zeros((T, N), np.int64), np.zeros((T, N), np.float32), np.zeros((T, N), bool), \
        np.zeros((T, N), bool)


def test_episodes_spanning_rollouts_are_stored_whole_with_exact_returns():
    sil = _replay()
    obs, act, rew, term, trunc = _rollout(4, 2)
    trunc[1, 1] = True  # env 1: a time-limit end (no Monte Carlo return) -> never stored
    assert sil.collect(obs, act, rew, term, trunc) is None
    obs2, act2, rew2, term2, trunc2 = _rollout(4, 2)
    obs2[..., 0] += 100
    rew2[1, 0], term2[1, 0] = 1.0, True  # env 0's episode: 4 steps of rollout 1 + 2 of rollout 2
    rew2[3, 1], term2[3, 1] = 2.0, True  # env 1's second episode: 2 steps of rollout 1 + 4 of rollout 2
    items = sil.collect(obs2, act2, rew2, term2, trunc2)
    assert sil.episodes == 2 and len(items["return"]) == 6 + 6
    np.testing.assert_allclose(items["return"][:6], 0.5 ** np.arange(5, -1, -1))
    np.testing.assert_allclose(items["return"][6:], 2 * 0.5 ** np.arange(5, -1, -1))
    newest = items["windows"][:, -1, 0]
    np.testing.assert_array_equal(newest[:6], [0, 1, 2, 3, 100, 101])
    np.testing.assert_array_equal(newest[6:], [12, 13, 110, 111, 112, 113])
    assert not items["mask"][6, :2].any()  # the episode after the truncation starts its own window
    # what is still running waits: env 0 from step 2 of rollout 2
    np.testing.assert_array_equal(sil.pending[0]["obs"][:, 0], [102, 103])
    assert len(sil.pending[1]["obs"]) == 0


def test_an_episode_longer_than_the_store_keeps_its_last_steps():
    sil = _replay(num_envs=1, capacity=3)
    obs, act, rew, term, trunc = _rollout(5, 1)
    rew[4, 0], term[4, 0] = 1.0, True
    items = sil.collect(obs, act, rew, term, trunc)
    np.testing.assert_array_equal(items["windows"][:, -1, 0], [2, 3, 4])
    np.testing.assert_allclose(items["return"], [0.25, 0.5, 1.0])


def test_loss_learns_only_where_the_return_beats_the_value():
    logits = torch.zeros(3, 4, requires_grad=True)
    values = torch.tensor([0.0, 2.0, 0.5], requires_grad=True)
    returns = torch.tensor([1.0, 1.0, 1.0])
    weights = torch.tensor([1.0, 1.0, 0.5])
    loss, adv = self_imitation_loss(logits, values, torch.tensor([1, 2, 3]), returns, weights, value_coef=0.1)
    torch.testing.assert_close(adv, torch.tensor([1.0, 0.0, 0.5]))
    # policy advantages are divided by the mean positive advantage (0.75); the value term is not
    expected = (np.log(4) * (1.0 + 0.0 + 0.5 * 0.5) / 0.75 + 0.1 * 0.5 * (1.0 + 0.0 + 0.5 * 0.25)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert logits.grad[1].abs().sum() == 0 and values.grad[1] == 0  # R < V: nothing learned
    assert logits.grad[0, 1] < 0 and values.grad[0] < 0  # raise log pi(a) and V where R > V


def test_state_round_trip_is_exact():
    sil = _replay()
    obs, act, rew, term, trunc = _rollout(4, 2)
    rew[2, 0], term[2, 0] = 1.0, True
    items = sil.collect(obs, act, rew, term, trunc)
    sil.buffer.add(items, items["return"])
    other = _replay()
    other.load_state(sil.state())
    assert len(other) == len(sil) and other.episodes == sil.episodes
    np.testing.assert_array_equal(other.pending[1]["obs"], sil.pending[1]["obs"])
    a, b = sil.buffer.sample(5), other.buffer.sample(5)
    np.testing.assert_array_equal(a.indices, b.indices)


def test_policy_term_is_invariant_to_the_scale_of_the_returns():
    logits = torch.randn(5, 3)
    actions = torch.tensor([0, 1, 2, 0, 1])
    values, returns, weights = torch.zeros(5), torch.tensor([0.2, 0.0, 0.1, 0.4, 0.3]), torch.ones(5)
    small, _ = self_imitation_loss(logits, values, actions, returns, weights, value_coef=0.0)
    big, _ = self_imitation_loss(logits, values, actions, 10 * returns, weights, value_coef=0.0)
    assert small.item() == pytest.approx(big.item(), rel=1e-6)
    none, adv = self_imitation_loss(logits, values + 1.0, actions, returns, weights, value_coef=0.5)
    assert none.item() == 0.0 and adv.sum() == 0  # no return beats the critic: nothing to learn


def test_min_scale_keeps_small_advantages_small():
    """Once the critic has caught up, leftover advantages must not be blown up to full strength."""
    logits = torch.zeros(2, 3)
    actions, values, weights = torch.tensor([0, 1]), torch.zeros(2), torch.ones(2)
    returns = torch.tensor([0.01, 0.0])
    alone, _ = self_imitation_loss(logits, values, actions, returns, weights, value_coef=0.0)
    floored, _ = self_imitation_loss(logits, values, actions, returns, weights, value_coef=0.0, min_scale=0.1)
    assert alone.item() == pytest.approx(np.log(3) * 1.0 / 2, rel=1e-6)  # 0.01 / 0.01: weight 1
    assert floored.item() == pytest.approx(np.log(3) * 0.1 / 2, rel=1e-6)  # 0.01 / 0.1: weight 0.1
