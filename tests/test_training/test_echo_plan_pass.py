"""``echo_config.plan_pass=rollout``: the plan and world model learn in one pass over whole-env chunks."""

import numpy as np
import pytest
import torch

from echo_rl.config import ConfigError

from test_echo_agent import make_agent


def _per_step_terms(agent, roll):
    """Plan KL and world-model CE of every rollout step the way the minibatch pass computes them."""
    T, N, m = agent.num_steps, agent.num_envs, agent.model
    full_obs, full_ep = (torch.as_tensor(a) for a in roll.full())
    idx = np.arange(T * N)
    win, mask = m.gather_windows(full_obs, full_ep, idx // N, idx % N, m.k + 1)
    plan, kl = m.plan_and_kl(win, mask)
    _, _, wm_in = m.heads(torch.as_tensor(roll.obs.reshape(T * N, -1)), plan,
                          torch.as_tensor(roll.eps.reshape(T * N, -1)))
    wm = m.wm_head.loss(wm_in, torch.as_tensor(roll.actions.reshape(-1)),
                        torch.as_tensor(roll.wm_target.reshape(T * N, -1)))
    return kl, wm


def test_chunk_terms_equal_the_per_step_windows():
    """Each state embedded once, neighbouring windows as each other's previous plan: the same KL and CE as
    k+1-state windows per step, episode boundaries inside the rollout included."""
    agent = make_agent(env_kwargs={"max_steps": 6})
    agent.train_iteration()
    roll = agent.collect()
    assert roll.terminated.any() or roll.truncated.any(), "test needs an episode boundary inside the rollout"
    m, k, T = agent.model, agent.model.k, agent.num_steps
    full_obs, full_ep = (torch.as_tensor(a) for a in roll.full())
    with torch.no_grad():
        kl_ref, wm_ref = _per_step_terms(agent, roll)
        kl, wm = m.chunk_plan_terms(full_obs[:k + T], full_ep[:k + T], torch.as_tensor(roll.eps),
                                    torch.as_tensor(roll.actions), torch.as_tensor(roll.wm_target))
    torch.testing.assert_close(kl, kl_ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(wm, wm_ref, atol=1e-6, rtol=1e-5)
    assert kl > 0 and wm > 0


def test_chunk_kl_ignores_pairs_across_episodes():
    """A plan is never pulled towards the last plan of the previous episode."""
    agent = make_agent()
    m, k = agent.model, agent.model.k
    T, G = 6, 1
    obs = torch.as_tensor(agent.collect().obs[:k + T, :G])  # real observations (the trunk embeds their tokens)
    eps, actions = torch.zeros(T, G, m.latent), torch.zeros(T, G, dtype=torch.long)
    target = torch.zeros(T, G, agent.obs_dim, dtype=torch.uint8)
    one_episode = torch.zeros(k + T, G, dtype=torch.long)
    new_each_step = torch.arange(k + T)[:, None].expand(k + T, G).contiguous()  # every step starts an episode
    with torch.no_grad():
        kl_one, _ = m.chunk_plan_terms(obs, one_episode, eps, actions, target)
        kl_none, _ = m.chunk_plan_terms(obs, new_each_step, eps, actions, target)
    assert kl_one > 0 and kl_none == 0


def test_rollout_pass_trains_the_plan_from_its_own_pass_and_the_policy_from_the_acting_plans():
    agent = make_agent(**{"echo_config.plan_pass": "rollout", "echo_config.self_imitation_updates": 0,
                          "echo_config.replay_updates": 0})
    calls = []
    real = agent.model.chunk_plan_terms
    agent.model.chunk_plan_terms = lambda *a: calls.append(a[0].shape) or real(*a)
    agent.model.plan_and_kl_states = lambda *a: pytest.fail("the PPO pass computed a plan")
    encoder = [p.clone() for p in agent.lpo.encoder.parameters()]
    metrics = agent.train_iteration()
    k, T, N = agent.model.k, agent.num_steps, agent.num_envs
    width = agent.config.ppo_config.batch_size // T
    assert calls == [(k + T, width, agent.obs_dim)] * (N // width)  # whole envs, every env once
    assert metrics["loss/world_model"] > 0 and metrics["loss/plan_kl"] >= 0
    assert any(not torch.equal(p, q) for p, q in zip(encoder, agent.lpo.encoder.parameters()))


def test_rollout_pass_policy_reads_the_plans_it_acted_with():
    """Before any update the PPO pass's log-probs are the behaviour's: the stored plan means are its input."""
    agent = make_agent(**{"echo_config.plan_pass": "rollout"})
    roll = agent.collect()
    T, N, m = agent.num_steps, agent.num_envs, agent.model
    with torch.no_grad():
        logits, _ = m.heads_on_plan_means(torch.as_tensor(roll.obs.reshape(T * N, -1)),
                                          torch.as_tensor(roll.plan_mean.reshape(T * N, -1)))
    logp = torch.log_softmax(logits, -1).gather(-1, torch.as_tensor(roll.actions.reshape(-1, 1))).squeeze(-1)
    np.testing.assert_allclose(logp.numpy(), roll.logprobs.reshape(-1), atol=1e-5)


@pytest.mark.parametrize("override", [{"echo_config.latent_plan": False}, {"echo_config.world_model_coef": 0.0},
                                      {"planning_config.kl_weight": 0.0}])
def test_rollout_pass_with_parts_off_runs(override):
    agent = make_agent(**{"echo_config.plan_pass": "rollout", **override})
    for _ in range(2):
        metrics = agent.train_iteration()
    assert np.isfinite(metrics["loss/policy"])


def test_unknown_plan_pass_is_one_line_error():
    with pytest.raises((ConfigError, ValueError), match="plan_pass"):
        make_agent(**{"echo_config.plan_pass": "epoch"})


def test_epoch_refresh_recomputes_the_plans_once_per_epoch_from_the_current_encoder():
    """``plan_refresh=epoch``: before any update the recomputed plans are the acting ones; then one no-grad pass
    per PPO epoch, and the policy reads those plans."""
    agent = make_agent(**{"echo_config.plan_pass": "rollout", "echo_config.plan_refresh": "epoch",
                          "ppo_config.num_epochs": 3})
    m, k, T, N = agent.model, agent.model.k, agent.num_steps, agent.num_envs
    roll = agent.collect()
    full_obs, full_ep = (torch.as_tensor(a) for a in roll.full())
    means = m.rollout_plan_means(full_obs[:k + T], full_ep[:k + T])
    assert not means.requires_grad
    torch.testing.assert_close(means, torch.as_tensor(roll.plan_mean.reshape(T * N, -1)), atol=1e-6, rtol=1e-5)
    calls, real = [], m.rollout_plan_means
    m.rollout_plan_means = lambda *a: calls.append(1) or real(*a)
    encoder = [p.clone() for p in agent.lpo.encoder.parameters()]
    agent.train_iteration()
    assert len(calls) == 3  # one per epoch, not per minibatch
    assert any(not torch.equal(p, q) for p, q in zip(encoder, agent.lpo.encoder.parameters()))


def test_epoch_refresh_needs_the_rollout_plan_pass():
    with pytest.raises(ConfigError, match="plan_refresh='epoch' is invalid: needs plan_pass=rollout") as err:
        make_agent(**{"echo_config.plan_refresh": "epoch"})
    assert "\n" not in str(err.value)
