import io

import numpy as np
import pytest
import torch

from echo_rl.config import TrainingConfig
from echo_rl.environments.minigrid_vector import make_vector_env
from echo_rl.vector.impala_agent import IMPALAAgent, unroll_slices
from echo_rl.vector.rollout import evaluate_policy, torch_generator

ENV = "minigrid:MiniGrid-Empty-5x5-v0"


def make_agent(num_actors=4, batch_size=64, **overrides):
    cfg = TrainingConfig(env_name=ENV, agent="impala", num_actors=num_actors, batch_size=batch_size,
                         total_timesteps=100_000).with_overrides(overrides)
    return IMPALAAgent(cfg, make_vector_env(ENV, num_actors), torch.device("cpu"))


def test_unroll_slices_cover_the_rollout_in_time_order():
    assert unroll_slices(16, 10, 64) == [slice(0, 6), slice(6, 12), slice(12, 16)]
    assert unroll_slices(3, 128, 64) == [slice(0, 1), slice(1, 2), slice(2, 3)]  # more envs than the batch: L = 1


def test_single_pass_first_unroll_on_policy_later_ones_corrected(monkeypatch):
    import echo_rl.vector.impala_agent as mod

    seen = []
    real = mod.vtrace

    def spy(behavior, target, *args, **kwargs):
        seen.append((target - behavior).abs().max().item())
        return real(behavior, target, *args, **kwargs)

    monkeypatch.setattr(mod, "vtrace", spy)
    agent = make_agent(**{"ppo_config.batch_size": 16, "ppo_config.num_epochs": 4})
    m = agent.train_iteration()
    # 4 envs x 16 steps in unrolls of 16 // 4 = 4 steps: 4 gradient steps, one pass whatever num_epochs says;
    # the first unroll is exactly on-policy, later ones see the learner's moved policy
    assert m["loss/minibatches"] == 4 and len(seen) == 4
    assert seen[0] == 0.0 and all(d > 0 for d in seen[1:])
    assert m["loss/rho_mean"] != 1.0
    assert np.isfinite(m["loss/value"]) and agent.env_steps == 64 and agent.updates == 1


def test_rejects_a_train_frequency_other_than_the_batch():
    with pytest.raises(ValueError, match="train_frequency"):
        make_agent(train_frequency=16)


def test_checkpoint_round_trip_weights_only():
    a = make_agent()
    a.train_iteration()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = make_agent()
    b.load_state_dict(torch.load(buf, weights_only=True))
    obs = np.stack([make_vector_env(ENV, 1).reset(seed=[5])[0][0]] * 3)
    assert np.array_equal(a.act(obs, torch_generator(1)), b.act(obs, torch_generator(1)))


@pytest.mark.slow
def test_impala_learns_empty_5x5():
    # single pass: 8 unrolls of 16 steps x 8 actors per rollout
    agent = make_agent(num_actors=8, batch_size=1024, **{"ppo_config.batch_size": 128, "ppo_config.learning_rate": 1e-3})
    while agent.env_steps < 40_000:
        agent.train_iteration()
    gen = torch_generator(0)
    out = evaluate_policy(lambda n: make_vector_env(ENV, n), lambda o: agent.act(o, gen), 32, 11)
    assert out["success_rate"] >= 0.9


@pytest.mark.slow
def test_impala_leaves_the_uniform_policy_on_sparse_doorkey():
    # regression: raw sparse-reward advantages (~1e-2) against the shared entropy bonus kept the policy
    # uniform (entropy 1.94-1.95 throughout; ln 7 = 1.946) and DoorKey never learned; normalised advantages
    # let it move. The bound sits between that and what the fix reaches on any CPU at 100k steps
    # (docs/results.md: 1.58 by 147k on the box it was written on; 1.87 at 100k on an AMD EPYC).
    env = "minigrid:MiniGrid-DoorKey-5x5-v0"
    cfg = TrainingConfig(env_name=env, agent="impala", num_actors=16, batch_size=2048, total_timesteps=150_000,
                         seed=0).with_overrides({"ppo_config.learning_rate": 1e-3, "ppo_config.batch_size": 256})
    agent = IMPALAAgent(cfg, make_vector_env(env, 16), torch.device("cpu"))
    while agent.env_steps < 100_000:
        m = agent.train_iteration()
    assert m["loss/entropy"] < 1.90
