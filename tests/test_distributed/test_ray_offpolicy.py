"""--agent dqn --backend ray: Ray workers push every transition to the learner's replay server while it learns."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from echo_rl.config import TrainingConfig
from echo_rl.training.agents import build_agent

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed: pip install 'echo-rl[distributed]'")
CPU = torch.device("cpu")



def ray_config(**changes) -> TrainingConfig:
    base = dict(env_name="minigrid:MiniGrid-Empty-5x5-v0", agent="dqn", backend="ray", num_actors=4,
                ray_num_workers=2, batch_size=128, total_timesteps=4096, seed=1, learning_starts=64)
    return TrainingConfig(**{**base, **changes}).with_overrides(
        {"replay_config.min_experiences": 64, "dqn_config.minibatch_size": 16})


@needs_ray
def test_ray_workers_write_every_env_step_to_the_server_and_the_learner_trains(local_ray):
    from echo_rl.distributed.ray_offpolicy import RayDQNAgent

    agent = build_agent(ray_config(), CPU)
    try:
        assert isinstance(agent, RayDQNAgent) and len(agent.workers) == 2
        assert local_ray.get([w.transport.remote() for w in agent.workers]) == ["shm", "shm"]
        before = {k: v.clone() for k, v in agent.q.state_dict().items()}
        for _ in range(3):
            metrics = agent.train_iteration()
        assert agent.env_steps == agent.feed.server.samples_added == 3 * 128
        clients = {k for k in agent.feed.server.metrics() if k.endswith("/samples")}
        assert len(clients) == 2  # one stream per worker
        assert agent.updates > 0 and metrics["loss/minibatches"] > 0
        assert any(not torch.equal(v, before[k]) for k, v in agent.q.state_dict().items())
        state = agent.rollout_state()
        assert state["backend"] == "ray" and len(state["workers"]) == 2 and state["replay_npz"] is not None
    finally:
        agent.close()


@needs_ray
def test_ray_learner_draws_as_the_rate_limiter_allows_while_workers_write(local_ray):
    config = ray_config().with_overrides({"replay_config.samples_per_insert": 2.0,
                                          "replay_config.rate_error_buffer": 64.0})
    agent = build_agent(config, CPU)
    try:
        for _ in range(2):
            agent.train_iteration()
        limiter = agent.feed.buffer.rate_limiter
        assert limiter.inserts == agent.env_steps == 2 * 128
        # inserts wait for draws and draws for inserts: samples stay within the band around 2 per insert
        assert limiter.inserts * 2.0 - limiter.samples <= 64 + 2 * 4
        assert agent.updates == limiter.samples // 16 > 0
    finally:
        agent.close()
