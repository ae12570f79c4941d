"""Short real training runs to export: two PPO / EchoRL updates on DoorKey-5x5 (seconds, not minutes)."""

import asyncio

import pytest


def _train(run_dir, agent, **extra):
    import torch

    from echo_rl.config import TrainingConfig
    from echo_rl.training.trainer import EchoRLTrainer

    base = {"env_name": "minigrid:MiniGrid-DoorKey-5x5-v0", "agent": agent, "total_timesteps": 512, "num_actors": 4,
            "batch_size": 256, "evaluation_frequency": 0, "evaluation_episodes": 1, "save_frequency": 0, "seed": 3,
            "ppo_config.learning_rate": 3e-3, "env_config": {"max_steps": 40}}  # short episodes: fast evaluations
    cfg = TrainingConfig().with_overrides({**base, **extra})
    threads = torch.get_num_threads()
    try:
        asyncio.run(EchoRLTrainer(cfg, run_dir=run_dir, show_progress=False).train())
    finally:
        torch.set_num_threads(threads)
    return run_dir


@pytest.fixture(scope="session")
def ppo_run(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("export") / "ppo", "ppo")


@pytest.fixture(scope="session")
def echo_run(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("export") / "echo", "echo-rl", **{
        "echo_config.latent_plan": True,  # the plan path is what the export tests check, whatever the default
        "echo_config.sequence_length": 16, "replay_config.max_replay_age": 256,
        "echo_config.self_imitation_updates": 2})


@pytest.fixture
def train_run():
    """``train_run(run_dir, agent, **overrides)``: one more short run, for a test of its own."""
    return _train
