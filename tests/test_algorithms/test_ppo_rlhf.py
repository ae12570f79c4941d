"""PPO-RLHF: turn rewards on turn ends, GAE over tokens and over turns by hand, the clipped value loss."""

import pytest
import torch

from echo_rl.algorithms.ppo_rlhf import ValueHead, ppo_rlhf_loss, rewards_at_turn_ends, rlhf_advantages

# action tokens at 2, 3 (turn 0) and 6 (turn 1)
MASK = torch.tensor([[0.0, 0, 1, 1, 0, 0, 1, 0]])
VALUES = torch.tensor([[0.0, 0, 0.5, 0.6, 0, 0, 0.8, 0]])


def test_turn_rewards_land_on_turn_ends():
    r = rewards_at_turn_ends(MASK, [[0.25, 1.0]])
    assert r.tolist() == [[0, 0, 0, 0.25, 0, 0, 1.0, 0]]
    with pytest.raises(ValueError, match="2 action turns but 1 turn rewards"):
        rewards_at_turn_ends(MASK, [[1.0]])


def test_token_level_gae_by_hand():
    r = rewards_at_turn_ends(MASK, [[0.0, 1.0]])
    adv, ret, vm = rlhf_advantages(r, VALUES, MASK, gamma=0.9, lam=0.5)
    # d2 = 1 - 0.8 = 0.2; d1 = 0.9*0.8 - 0.6 = 0.12, A1 = 0.12 + 0.45*0.2 = 0.21;
    # d0 = 0.9*0.6 - 0.5 = 0.04, A0 = 0.04 + 0.45*0.21 = 0.1345
    assert adv[0, [2, 3, 6]].tolist() == pytest.approx([0.1345, 0.21, 0.2])
    assert ret[0, [2, 3, 6]].tolist() == pytest.approx([0.6345, 0.81, 1.0])
    assert vm.tolist() == MASK.tolist() and adv[0, [0, 1, 4, 5, 7]].abs().sum() == 0


def test_turn_level_gae_by_hand():
    r = rewards_at_turn_ends(MASK, [[0.0, 1.0]])
    adv, ret, vm = rlhf_advantages(r, VALUES, MASK, gamma=0.9, lam=0.5, level="turn")
    # V0 = 0.5 (turn 0's first token), V1 = 0.8: d1 = 0.2; d0 = 0.9*0.8 - 0.5 = 0.22, A0 = 0.22 + 0.45*0.2 = 0.31
    assert adv[0, [2, 3, 6]].tolist() == pytest.approx([0.31, 0.31, 0.2])
    assert ret[0, 2].item() == pytest.approx(0.81) and ret[0, 6].item() == pytest.approx(1.0)
    assert vm[0].tolist() == [0, 0, 1, 0, 0, 0, 1, 0]


def test_kl_penalty_and_truncation_bootstrap():
    r = torch.zeros(1, 8)
    lp = torch.zeros(1, 8)
    ref = torch.full((1, 8), -0.5)  # logp - ref = 0.5 on every action token
    adv, _, _ = rlhf_advantages(r, torch.zeros(1, 8), MASK, gamma=1.0, lam=1.0, logprobs=lp, ref_logprobs=ref,
                                kl_coef=0.2, last_values=torch.tensor([2.0]))
    # each action token earns -0.1; the return from token k is -0.1 * (steps left) + 2 (bootstrap)
    assert adv[0, [2, 3, 6]].tolist() == pytest.approx([1.7, 1.8, 1.9])


def test_value_head_alignment_and_loss_by_hand():
    head = ValueHead(4)
    with torch.no_grad():
        head.proj.bias.fill_(0.5)
    v = head(torch.randn(1, 8, 4))
    assert v[0, 0] == 0 and torch.allclose(v[0, 1:], torch.full((7,), 0.5))
    lp = torch.zeros(1, 8)
    values = torch.tensor([[0.0, 0, 1.0, 0, 0, 0, 0.0, 0]])
    old = torch.tensor([[0.0, 0, 0.5, 0, 0, 0, 0.0, 0]])
    returns = torch.tensor([[0.0, 0, 2.0, 0, 0, 0, 1.0, 0]])
    vmask = torch.tensor([[0.0, 0, 1, 0, 0, 0, 1, 0]])
    t = ppo_rlhf_loss(lp, lp, values, old, torch.zeros(1, 8), returns, MASK, vmask, value_clip=0.2, vf_coef=0.5,
                      normalize_advantages=False)
    # pos 2: unclipped (1-2)^2 = 1, clipped (0.7-2)^2 = 1.69 -> 1.69; pos 6: 1 -> mean 1.345, x0.5
    assert t.value_loss.item() == pytest.approx(0.5 * (1.69 + 1.0) / 2)
    assert t.policy_loss.item() == 0.0 and t.loss.item() == pytest.approx(0.5 * t.value_loss.item())


def test_importance_weights_scale_both_terms():
    g = torch.Generator().manual_seed(0)
    mask = torch.cat([MASK, MASK])
    lp, blp = -torch.rand(2, 8, generator=g), -torch.rand(2, 8, generator=g)
    values, old = torch.rand(2, 8, generator=g), torch.rand(2, 8, generator=g)
    adv, ret = torch.randn(2, 8, generator=g), torch.rand(2, 8, generator=g)
    kw = dict(normalize_advantages=False, value_clip=None)
    plain = ppo_rlhf_loss(lp, blp, values, old, adv, ret, mask, mask, **kw)
    ones = ppo_rlhf_loss(lp, blp, values, old, adv, ret, mask, mask, weights=torch.ones(2), **kw)
    assert ones.loss.item() == plain.loss.item()
    w = ppo_rlhf_loss(lp, blp, values, old, adv, ret, mask, mask, weights=torch.tensor([2.0, 0.0]), **kw)
    only0 = ppo_rlhf_loss(lp[:1], blp[:1], values[:1], old[:1], adv[:1], ret[:1], MASK, MASK, **kw)
    # row 1 weighs 0 and row 0 counts twice, over the same token count (2 rows x 3 action tokens)
    assert w.policy_loss.item() == pytest.approx(only0.policy_loss.item())
    assert w.value_loss.item() == pytest.approx(only0.value_loss.item())
