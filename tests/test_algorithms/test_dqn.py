"""DQN's pure pieces on hand-computed cases: TD targets (DQN, Double DQN), weighted Huber/MSE, epsilon, beta."""

from __future__ import annotations

import pytest
import torch

from echo_rl.algorithms.dqn import annealed_beta, dqn_loss, linear_epsilon, td_targets

REWARDS = torch.tensor([1.0, 0.0, 0.5])
TERMINATED = torch.tensor([0.0, 1.0, 0.0])
NEXT_TARGET = torch.tensor([[2.0, 3.0], [10.0, -1.0], [0.0, 4.0]])
NEXT_ONLINE = torch.tensor([[5.0, 1.0], [0.0, 9.0], [1.0, 0.0]])


def test_dqn_target_takes_the_target_networks_max_and_termination_cuts_it():
    y = td_targets(REWARDS, TERMINATED, NEXT_TARGET, gamma=0.5)
    # 1 + 0.5*3 ; 0 + 0 (terminated) ; 0.5 + 0.5*4
    assert torch.allclose(y, torch.tensor([2.5, 0.0, 2.5]))


def test_double_dqn_target_values_the_online_argmax_with_the_target_network():
    y = td_targets(REWARDS, TERMINATED, NEXT_TARGET, gamma=0.5, next_q_online=NEXT_ONLINE)
    # online argmax: 0, 1, 0 -> target values 2, (-1, cut), 0
    assert torch.allclose(y, torch.tensor([2.0, 0.0, 0.5]))


def test_huber_loss_is_quadratic_near_zero_and_linear_beyond_one_and_weighted():
    q = torch.tensor([[0.0, 1.0], [3.0, 0.0], [0.0, 0.0]], requires_grad=True)
    actions = torch.tensor([1, 0, 1])
    targets = torch.tensor([1.5, 0.0, 0.0])
    weights = torch.tensor([1.0, 0.5, 2.0])
    out = dqn_loss(q, actions, targets, weights, "huber")
    # deltas (y - q): 0.5, -3, 0 ; huber: 0.5*0.25=0.125, 3-0.5=2.5, 0 ; weighted mean (0.125 + 1.25 + 0) / 3
    assert out.loss.item() == pytest.approx((0.125 + 1.25) / 3)
    assert torch.allclose(out.td_errors, torch.tensor([0.5, -3.0, 0.0]))
    out.loss.backward()
    # d/dq: -(w * clip(delta)) / B at the taken actions only
    expected = torch.tensor([[0.0, -0.5 / 3], [0.5 / 3, 0.0], [0.0, 0.0]])
    assert torch.allclose(q.grad, expected)
    assert not out.td_errors.requires_grad


def test_mse_loss_is_half_the_squared_error_and_unweighted_without_weights():
    q = torch.tensor([[0.0, 1.0], [3.0, 0.0]])
    out = dqn_loss(q, torch.tensor([1, 0]), torch.tensor([1.5, 0.0]), kind="mse")
    assert out.loss.item() == pytest.approx((0.5 * 0.25 + 0.5 * 9.0) / 2)


def test_bad_inputs_are_one_line_errors():
    with pytest.raises(ValueError, match="kind='l1' is invalid: allowed: huber, mse"):
        dqn_loss(torch.zeros(1, 2), torch.zeros(1), torch.zeros(1), kind="l1")
    with pytest.raises(ValueError, match=r"next_q_target must be \[B, A\] with B=3"):
        td_targets(REWARDS, TERMINATED, torch.zeros(2, 2), 0.9)
    with pytest.raises(ValueError, match="differ in shape"):
        td_targets(REWARDS, TERMINATED, NEXT_TARGET, 0.9, next_q_online=torch.zeros(3, 3))


def test_linear_epsilon_decays_then_holds():
    assert linear_epsilon(1.0, 0.1, 100, 0) == 1.0
    assert linear_epsilon(1.0, 0.1, 100, 50) == pytest.approx(0.55)
    assert linear_epsilon(1.0, 0.1, 100, 100) == pytest.approx(0.1)
    assert linear_epsilon(1.0, 0.1, 100, 1000) == pytest.approx(0.1)
    assert linear_epsilon(1.0, 0.1, 0, 0) == 0.1


def test_annealed_beta_rises_to_one_then_holds():
    assert annealed_beta(0.4, 100, 0) == 0.4
    assert annealed_beta(0.4, 100, 50) == pytest.approx(0.7)
    assert annealed_beta(0.4, 100, 100) == 1.0 and annealed_beta(0.4, 100, 1000) == 1.0
    assert annealed_beta(0.4, 0, 0) == 1.0
