"""PPO on continuous (Box) actions: the diagonal Gaussian's maths, clipping only in the env, automatic
selection by action space, a short run that resumes bit-exactly, reward scaling, and the one-line refusals."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from echo_rl.algorithms.ppo import ppo_loss
from echo_rl.algorithms.reward_scaling import RewardScaler
from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.environments.gym_vector import ClipToBounds, make_gym_env
from echo_rl.models.distributions import DiagGaussian, is_continuous
from echo_rl.models.policies import EpsilonCategorical
from echo_rl.training.agents import build_agent
from echo_rl.vector.rollout import sample_policy, torch_generator
from tests.resume_helpers import cut_and_resume

CPU = torch.device("cpu")
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


pytestmark = pytest.mark.usefixtures("one_thread")


def small_config(**changes) -> TrainingConfig:
    overrides = changes.pop("overrides", {})
    base = dict(env_name="Pendulum-v1", agent="ppo", num_actors=2, batch_size=64, total_timesteps=512, seed=3,
                evaluation_episodes=2, loggers=[])
    return TrainingConfig(**{**base, **changes}).with_overrides({"ppo_config.batch_size": 32, **overrides})


# -- the distribution ------------------------------------------------------------------------------------
def test_gaussian_log_prob_and_entropy_match_hand_computed_values():
    dist = DiagGaussian(2)
    with torch.no_grad():
        dist.log_std.copy_(torch.tensor([math.log(2.0), 0.0]))
    params = dist(torch.tensor([[0.5, -1.0]]))
    assert params[0].tolist() == pytest.approx([0.5, -1.0, math.log(2.0), 0.0])
    # dim 0: z = (1.5 - 0.5) / 2 = 0.5; dim 1: z = (-1.0 - -1.0) / 1 = 0
    expected = (-0.5 * 0.25 - math.log(2.0) - HALF_LOG_2PI) + (-0.0 - 0.0 - HALF_LOG_2PI)
    assert dist.log_prob(params, torch.tensor([[1.5, -1.0]])).item() == pytest.approx(expected, abs=1e-6)
    expected_entropy = (0.5 + HALF_LOG_2PI + math.log(2.0)) + (0.5 + HALF_LOG_2PI)
    assert dist.entropy(params).item() == pytest.approx(expected_entropy, abs=1e-6)
    normal = torch.distributions.Normal(torch.tensor([0.5, -1.0]), torch.tensor([2.0, 1.0]))
    assert dist.log_prob(params, torch.tensor([[3.0, 0.25]])).item() == \
        pytest.approx(normal.log_prob(torch.tensor([3.0, 0.25])).sum().item(), abs=1e-6)
    assert dist.mode(params).tolist() == [[0.5, -1.0]]


def test_gaussian_samples_follow_mean_and_std_and_are_seeded():
    dist = DiagGaussian(1, init_log_std=math.log(0.5))
    params = dist(torch.full((20000, 1), 3.0))
    draws = dist.sample(params, torch_generator(0))
    assert torch.equal(draws, dist.sample(params, torch_generator(0)))
    assert draws.mean().item() == pytest.approx(3.0, abs=0.02) and draws.std().item() == pytest.approx(0.5, abs=0.02)


def test_ppo_loss_reads_the_gaussian_and_its_log_std_gets_a_gradient():
    dist = DiagGaussian(1)
    mean = torch.zeros(4, 1, requires_grad=True)
    params = dist(mean)
    actions = torch.tensor([[0.5], [-0.5], [2.0], [0.0]])
    old = dist.log_prob(params, actions).detach()
    terms = ppo_loss(params, torch.zeros(4), actions, old, torch.zeros(4), torch.tensor([1.0, -1.0, 2.0, 0.5]),
                     torch.zeros(4), clip_epsilon=0.2, value_loss_coef=0.5, entropy_coef=0.01,
                     distribution=dist)
    assert terms.approx_kl.item() == 0.0 and terms.entropy.item() == pytest.approx(0.5 + HALF_LOG_2PI)
    terms.loss.backward()
    assert dist.log_std.grad is not None and dist.log_std.grad.abs().item() > 0


# -- clipping happens in the env only ----------------------------------------------------------------------
def test_actions_are_clipped_to_the_bounds_only_when_sent_to_the_env():
    env = make_gym_env("Pendulum-v1")
    assert isinstance(env.env, ClipToBounds) and env.action_space == gym.make("Pendulum-v1").action_space
    raw = gym.make("Pendulum-v1")
    env.reset(seed=1), raw.reset(seed=1)
    clipped, *_ = env.step(np.array([5.0], dtype=np.float32))
    at_bound, *_ = raw.step(np.array([2.0], dtype=np.float32))
    assert np.array_equal(clipped, at_bound)
    env.close(), raw.close()

    agent = build_agent(small_config(), CPU)
    try:
        agent.set(distribution=DiagGaussian(1, init_log_std=math.log(5.0)))  # wide: most draws leave [-2, 2]
        buf = agent.collector.collect(agent._policy, agent._value)
        assert buf.actions.shape == (32, 2, 1) and buf.actions.dtype == np.float32
        assert np.abs(buf.actions).max() > 2.0  # the buffer keeps the unclipped draw ...
        params, _ = agent.network(torch.as_tensor(buf.obs.reshape(-1, 3)))
        logp = agent.network.distribution.log_prob(params, torch.as_tensor(buf.actions.reshape(-1, 1)))
        assert np.allclose(buf.logprobs.reshape(-1), logp.detach().numpy(), atol=1e-5)  # ... and its log-probability
    finally:
        agent.close()


# -- selection by action space, and the user's own distribution --------------------------------------------
def test_the_distribution_follows_the_action_space_and_a_user_may_set_their_own():
    agent = build_agent(small_config(), CPU)
    try:
        assert isinstance(agent.network.distribution, DiagGaussian) and agent.network.distribution.action_dim == 1
        assert any(p is agent.network.distribution.log_std for g in agent.optimizer.param_groups for p in g["params"])
        mine = DiagGaussian(1, init_log_std=-1.0)
        agent.set(distribution=mine)
        assert agent.network.distribution is mine
        assert any(p is mine.log_std for g in agent.optimizer.param_groups for p in g["params"])  # optimised
        agent.set(encoder="mlp")  # fresh heads keep the distribution
        assert agent.network.distribution is mine
        with pytest.raises(ValueError, match="EpsilonCategorical does not fit a Box action space"):
            agent.set(distribution=EpsilonCategorical(0.1))
        with pytest.raises(ValueError, match="action_dim=2; the action space has 1 dimensions"):
            agent.set(distribution=DiagGaussian(2))
    finally:
        agent.close()
    discrete = build_agent(small_config(env_name="CartPole-v1"), CPU)
    try:
        assert discrete.network.distribution is None and discrete.collector.buffer.actions.dtype == np.int64
        with pytest.raises(ValueError, match="DiagGaussian does not fit a Discrete action space"):
            discrete.set(distribution=DiagGaussian(2))
    finally:
        discrete.close()


def test_sampled_log_probs_are_the_gaussians():
    agent = build_agent(small_config(env_name="MountainCarContinuous-v0"), CPU)
    try:
        obs = torch.as_tensor(agent.collector.next_obs)
        actions, logprobs, values = sample_policy(agent.network, torch_generator(0), obs)
        params, _ = agent.network(obs)
        assert is_continuous(agent.network.distribution) and actions.shape == (2, 1)
        assert np.allclose(logprobs, agent.network.distribution.log_prob(params, torch.as_tensor(actions)).detach().numpy())
        assert agent.act(agent.collector.next_obs, torch_generator(0)).shape == (2, 1)
    finally:
        agent.close()


# -- a short run trains, checkpoints and resumes bit-exactly ------------------------------------------------
@pytest.mark.parametrize("scale", [False, True])
def test_a_resumed_continuous_run_equals_an_uninterrupted_one(tmp_path, scale):
    config = small_config(overrides={"ppo_config.scale_rewards": scale})
    whole = build_agent(config, CPU)
    try:
        start = {k: v.clone() for k, v in whole.network.state_dict().items()}
        rows_whole = [whole.train_iteration() for _ in range(4)]
        weights_whole = {k: v.clone() for k, v in whole.network.state_dict().items()}
    finally:
        whole.close()
    assert not torch.equal(start["distribution.log_std"], weights_whole["distribution.log_std"])  # it learns
    assert all(np.isfinite(r["loss/policy"]) and np.isfinite(r["loss/value"]) for r in rows_whole)


    def check(resumed, rows):
        assert rows == rows_whole
        for k, v in resumed.network.state_dict().items():
            assert torch.equal(v, weights_whole[k]), k

    cut_and_resume(config, tmp_path / "run", 2, 2, check)


def test_a_checkpoint_with_other_reward_scaling_is_refused_in_one_line():
    scaled = build_agent(small_config(overrides={"ppo_config.scale_rewards": True}), CPU)
    plain = build_agent(small_config(), CPU)
    try:
        with pytest.raises(ConfigError, match="this checkpoint's run scaled its rewards; resume it with the same"):
            plain.load_state_dict(scaled.state_dict())
    finally:
        scaled.close(), plain.close()


def test_reward_scaler_divides_by_the_running_std_of_the_discounted_return():
    scaler = RewardScaler(num_envs=1, gamma=0.5)
    rewards = np.array([[2.0], [2.0], [2.0], [2.0]], dtype=np.float32)
    dones = np.array([[False], [True], [False], [False]])
    # discounted returns: 2, 3 (episode ends), 2, 3
    seen = np.array([2.0, 3.0, 2.0, 3.0])
    count = 1e-4 + 4
    mean = seen.mean() * 4 / count
    var = (1.0 * 1e-4 + seen.var() * 4 + seen.mean() ** 2 * 1e-4 * 4 / count) / count
    out = scaler.scale(rewards, dones)
    assert scaler.mean == pytest.approx(mean) and scaler.var == pytest.approx(var)
    assert np.allclose(out, rewards / np.sqrt(var + 1e-8)) and out.dtype == np.float32
    assert scaler.returns.tolist() == [3.0]  # the unfinished episode carries into the next rollout
    assert np.abs(RewardScaler(1, 0.99).scale(np.full((1, 1), 1e6, np.float32), np.zeros((1, 1), bool))).max() <= 10
    other = RewardScaler(num_envs=3, gamma=0.5)  # another env count (export, evaluation): statistics only
    other.load_state_dict(scaler.state_dict())
    assert (other.mean, other.var, other.count) == (scaler.mean, scaler.var, scaler.count)
    assert other.returns.tolist() == [0.0, 0.0, 0.0]


# -- the agents that cannot act in a Box refuse in one line -----------------------------------------------------
@pytest.mark.parametrize("agent", ["impala", "dqn", "echo-rl"])
def test_discrete_agents_refuse_continuous_actions_in_one_line(agent):
    with pytest.raises(ConfigError, match=rf"task 'Pendulum-v1' has continuous \(Box\) actions; --agent {agent} acts "
                                          rf"in discrete action spaces only; use --agent ppo"):
        build_agent(small_config(agent=agent), CPU)


def test_the_cli_refuses_with_exit_2():
    proc = subprocess.run([sys.executable, "-m", "echo_rl.cli", "train", "--task", "Pendulum-v1", "--agent",
                           "impala", "--timesteps", "64", "--no-progress", "--run-dir", "/nonexistent/never"],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "echo-rl train: error: task 'Pendulum-v1' has continuous (Box) actions; --agent impala acts in discrete "
        "action spaces only; use --agent ppo for continuous actions"]


def test_a_trained_run_resumes_from_the_cli_and_export_refuses_in_one_line(tmp_path):
    import echo_rl

    def train(run, *extra):
        return subprocess.run([sys.executable, "-m", "echo_rl.cli", "train", "--task", "Pendulum-v1", "--num-actors",
                               "2", "--batch-size", "64", "--seed", "1", "--set", "ppo_config.scale_rewards=true",
                               "--set", "evaluation_episodes=2", "--set", "ppo_config.anneal_lr=false",  # the LR
                               "--run-dir", str(run), "--no-progress", *extra],  # schedule must not see the budget
                              capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})

    def training_rows(run):  # the first run's final evaluation at 128 steps is its own
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if not any(k.startswith("eval/") for k in r)]

    ref, run = tmp_path / "ref", tmp_path / "run"
    assert train(ref, "--timesteps", "256").returncode == 0
    assert train(run, "--timesteps", "128").returncode == 0
    resumed = subprocess.run([sys.executable, "-m", "echo_rl.cli", "train", "--resume", "--run-dir", str(run),
                              "--timesteps", "256", "--no-progress"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert len(training_rows(ref)) == 4 and training_rows(run) == training_rows(ref)
    with pytest.raises(ConfigError, match=r"acts in a continuous \(Box\) action space; exported policies act by "
                                          r"logits \(discrete actions\) only"):
        echo_rl.load_policy(str(run))


def test_reward_scaling_with_several_learners_is_refused_in_one_line():
    from echo_rl.distributed.data_parallel import check_config

    check_config(small_config(num_actors=4, num_learners=2))  # continuous PPO itself runs data-parallel
    with pytest.raises(ConfigError, match=r"num_learners=2 is invalid with ppo_config.scale_rewards=True: each "
                                          r"learner would scale by its own envs' return statistics"):
        check_config(small_config(num_actors=4, num_learners=2, overrides={"ppo_config.scale_rewards": True}))
