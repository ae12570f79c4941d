"""PPO on any MiniGrid env with the project's MiniGrid recipe, in one line.

    python -m echo_rl.hub.apps.ppo_minigrid --env-id MiniGrid-DoorKey-5x5-v0 [--timesteps N] [--seed S] [--run-dir DIR]

The recipe is ``configs/minigrid_doorkey5x5.yaml``'s (rl-starter-files' shape: 16 envs x 128 steps,
4 epochs of 256-sample minibatches, constant lr 5e-4; docs/results.md), carried here so the app
runs from an installed package. It is ``echo-rl train`` underneath: a run directory, resumable,
exportable with ``echo-rl export``, comparable with ``echo-rl report --against hub:...``.
"""

from __future__ import annotations

import argparse
import sys

from echo_rl.commands import train
from echo_rl.config import ConfigError

RECIPE = {"num_actors": 16, "batch_size": 2048, "evaluation_frequency": 30000, "evaluation_episodes": 100,
          "save_frequency": 30000, "ppo_config.learning_rate": 0.0005, "ppo_config.anneal_lr": False,
          "ppo_config.num_epochs": 4, "ppo_config.batch_size": 256, "ppo_config.entropy_coef": 0.01,
          "ppo_config.clip_epsilon": 0.2, "ppo_config.gae_lambda": 0.95, "ppo_config.gamma": 0.99}


def argv_for(args: argparse.Namespace) -> list[str]:
    out = ["train", "--task", f"minigrid:{args.env_id}", "--agent", "ppo", "--timesteps", str(args.timesteps),
           "--seed", str(args.seed)]
    for key, value in RECIPE.items():
        out += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    if args.run_dir:
        out += ["--run-dir", args.run_dir]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m echo_rl.hub.apps.ppo_minigrid", description=__doc__.splitlines()[0])
    p.add_argument("--env-id", required=True, help="a MiniGrid env id, e.g. MiniGrid-DoorKey-5x5-v0")
    p.add_argument("--timesteps", type=int, default=150_000, help="env steps (default 150k: DoorKey-5x5's budget)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-dir", default=None, help="run directory (default: echo-rl train's)")
    args = p.parse_args(argv)
    command = argparse.ArgumentParser(prog="echo-rl train")
    train.add_arguments(command)
    try:  # the train command's own function: its checks, run directory and exit codes
        return train.run(command.parse_args(argv_for(args)[1:]))
    except ConfigError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
