"""The DoorKey PPO recipe is one packaged file: make demo's config, the one-line app and the hub build read it."""

import argparse
from pathlib import Path

import pytest

from echo_rl.cli import build_parser
from echo_rl.commands.train import build_config
from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.hub.apps.ppo_minigrid import argv_for
from echo_rl.hub.build_models import recipe_config
from echo_rl.hub.models import recipe_path

ROOT = Path(__file__).resolve().parents[2]
# the recipes as the app, the YAML and build_models each spelled them out before they shared one file
DOORKEY = {"env_name": "minigrid:MiniGrid-DoorKey-5x5-v0", "agent": "ppo", "total_timesteps": 150_000, "seed": 0,
           "device": "cpu", "num_actors": 16, "batch_size": 2048, "evaluation_frequency": 30000,
           "evaluation_episodes": 100, "save_frequency": 30000, "ppo_config.learning_rate": 0.0005,
           "ppo_config.anneal_lr": False, "ppo_config.num_epochs": 4, "ppo_config.batch_size": 256,
           "ppo_config.entropy_coef": 0.01, "ppo_config.clip_epsilon": 0.2, "ppo_config.gae_lambda": 0.95,
           "ppo_config.gamma": 0.99}
MULTIROOM = {"env_name": "minigrid:MiniGrid-MultiRoom-N2-S4-v0", "agent": "ppo", "seed": 0, "total_timesteps": 250_000,
             "evaluation_frequency": 0, "evaluation_episodes": 100, "save_frequency": 0, "num_actors": 16,
             "batch_size": 2048, "ppo_config.learning_rate": 1e-3, "ppo_config.num_epochs": 4,
             "ppo_config.batch_size": 256, "ppo_config.entropy_coef": 0.01, "ppo_config.gamma": 0.99,
             "ppo_config.gae_lambda": 0.95}


def test_ppo_minigrid_app_is_the_demo_recipe():
    args = argparse.Namespace(env_id="MiniGrid-DoorKey-5x5-v0", timesteps=150_000, seed=0, run_dir=None)
    argv = argv_for(args)
    assert argv[1:3] == ["--config", str(recipe_path("ppo-doorkey-5x5"))] and "--set" not in argv
    config = build_config(build_parser().parse_args(argv))
    assert config.to_dict() == TrainingConfig().with_overrides(DOORKEY).to_dict()
    assert config.to_dict() == TrainingConfig.load_yaml(ROOT / "configs" / "minigrid_doorkey5x5.yaml").to_dict()


def test_the_demo_config_is_the_packaged_recipe():
    """configs/ links to the file the wheel ships (pyproject package-data), so the recipe is written once."""
    packaged = recipe_path("ppo-doorkey-5x5")
    assert (ROOT / "configs" / "minigrid_doorkey5x5.yaml").resolve() == packaged.resolve()
    assert packaged.resolve().relative_to(ROOT / "echo_rl" / "hub") == Path("data/recipes/ppo-doorkey-5x5.yaml")
    assert '"data/recipes/*.yaml"' in (ROOT / "pyproject.toml").read_text()


def test_hub_model_builds_keep_their_configs():
    assert recipe_config("ppo-doorkey-5x5").to_dict() == TrainingConfig().with_overrides(DOORKEY).to_dict()
    assert recipe_config("ppo-multiroom-n2-s4").to_dict() == TrainingConfig().with_overrides(MULTIROOM).to_dict()


@pytest.mark.parametrize("name", ["nope", "../../pyproject", "ppo-doorkey-5x5.yaml", ""])
def test_an_unknown_recipe_is_one_clear_error(name):
    with pytest.raises(ConfigError, match=r"unknown recipe .*; allowed: ppo-doorkey-5x5$"):
        recipe_path(name)


def test_ppo_minigrid_app_takes_any_minigrid_env():
    args = argparse.Namespace(env_id="MiniGrid-Empty-8x8-v0", timesteps=4096, seed=3, run_dir="/tmp/x")
    argv = argv_for(args)
    config = build_config(build_parser().parse_args(argv))
    assert config.env_name == "minigrid:MiniGrid-Empty-8x8-v0" and config.seed == 3
    assert config.total_timesteps == 4096 and argv[-2:] == ["--run-dir", "/tmp/x"]


def test_ppo_minigrid_app_runs_the_train_command_not_the_cli(monkeypatch, capsys):
    """Library code calls the train command's function (no echo_rl.cli); bad input is one line and exit 2."""
    from echo_rl.commands import train
    from echo_rl.hub.apps import ppo_minigrid

    seen = []
    monkeypatch.setattr(train, "run", lambda args: seen.append(build_config(args)) or 0)
    assert ppo_minigrid.main(["--env-id", "MiniGrid-Empty-5x5-v0", "--timesteps", "64"]) == 0
    assert seen[0].env_name == "minigrid:MiniGrid-Empty-5x5-v0" and seen[0].total_timesteps == 64
    monkeypatch.undo()
    assert ppo_minigrid.main(["--env-id", "MiniGrid-Nope-v0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown MiniGrid env id 'MiniGrid-Nope-v0'" in err
