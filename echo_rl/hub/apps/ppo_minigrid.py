"""PPO on any MiniGrid env with the project's MiniGrid recipe, in one line.

    python -m echo_rl.hub.apps.ppo_minigrid --env-id MiniGrid-DoorKey-5x5-v0 [--timesteps N] [--seed S] [--run-dir DIR]

The recipe is the packaged ``echo_rl/hub/data/recipes/ppo-doorkey-5x5.yaml`` (``make demo``'s
``configs/minigrid_doorkey5x5.yaml`` links to it; rl-starter-files' shape: 16 envs x 128 steps, 4 epochs
of 256-sample minibatches, constant lr 5e-4; docs/results.md). It is ``echo-rl train --config`` on that
file underneath: a run directory, resumable, exportable with ``echo-rl export``, comparable with
``echo-rl report --against hub:...``.
"""

from __future__ import annotations

import argparse
import sys

from echo_rl.commands import train
from echo_rl.config import ConfigError
from echo_rl.hub.models import recipe_path

RECIPE = "ppo-doorkey-5x5"


def argv_for(args: argparse.Namespace) -> list[str]:
    # only the app's own arguments override the recipe: the env (any MiniGrid id), budget, seed and run dir
    out = ["train", "--config", str(recipe_path(RECIPE)), "--task", f"minigrid:{args.env_id}",
           "--timesteps", str(args.timesteps), "--seed", str(args.seed)]
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
