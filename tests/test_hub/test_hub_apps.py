"""The one-line app trains with the project's recipe: its config is configs/minigrid_doorkey5x5.yaml."""

import argparse
from pathlib import Path

from echo_rl.cli import build_parser
from echo_rl.commands.train import build_config
from echo_rl.config import TrainingConfig
from echo_rl.hub.apps.ppo_minigrid import argv_for

ROOT = Path(__file__).resolve().parents[2]


def test_ppo_minigrid_app_is_the_demo_recipe():
    args = argparse.Namespace(env_id="MiniGrid-DoorKey-5x5-v0", timesteps=150_000, seed=0, run_dir=None)
    config = build_config(build_parser().parse_args(argv_for(args)))
    assert config.to_dict() == TrainingConfig.load_yaml(ROOT / "configs" / "minigrid_doorkey5x5.yaml").to_dict()


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
