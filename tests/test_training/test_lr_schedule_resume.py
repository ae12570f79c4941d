"""A resume with a larger budget stretches PPO's linear LR schedule over the new budget (as SB3's
``reset_num_timesteps=False``), where DQN keeps its first run's horizon (test_dqn_agent)."""

import pytest
import torch

from echo_rl.config import TrainingConfig
from echo_rl.training.agents import build_agent
from echo_rl.training.run_dir import RunDirectory


def _config(agent: str, total: int) -> TrainingConfig:
    return TrainingConfig(env_name="minigrid:MiniGrid-Empty-5x5-v0", agent=agent, num_actors=4, batch_size=64,
                          total_timesteps=total).with_overrides(
        {"ppo_config.batch_size": 32, "ppo_config.num_epochs": 1,
         **({"echo_config.sequence_length": 8, "replay_config.max_replay_age": 64} if agent == "echo-rl" else {})})


def _lrs(agent) -> list[float]:
    return [g["lr"] for g in (agent.lpo.optimizer if hasattr(agent, "lpo") else agent.optimizer).param_groups]


@pytest.mark.parametrize("agent_name", ["ppo", "echo-rl"])
def test_resume_with_a_larger_budget_stretches_the_lr_schedule(tmp_path, agent_name):
    first_config = _config(agent_name, 512)  # 8 updates
    run = RunDirectory(tmp_path / "run", first_config)
    run.create()
    first = build_agent(first_config, torch.device("cpu"))
    try:
        for _ in range(4):
            first.train_iteration()
        base = first.config.ppo_config.learning_rate
        assert _lrs(first)[0] == pytest.approx(base * (1 - 3 / 8))  # the 4th update ran at 3/8 of the way
        run.save_checkpoint(first.env_steps, first.state_dict(), first.rollout_state())
    finally:
        first.close()
    resumed = build_agent(_config(agent_name, 1024), torch.device("cpu"))  # 16 updates
    try:
        run.load_newest(lambda payload, rollout: (resumed.load_state_dict(payload["state"]),
                                                  resumed.load_rollout_state(rollout)))
        resumed.train_iteration()
        assert _lrs(resumed)[0] == pytest.approx(base * (1 - 4 / 16))  # update 5 of 16, not of 8
    finally:
        resumed.close()
