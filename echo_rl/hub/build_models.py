"""Build the hub policies: train each recipe, export it to ONNX, evaluate it, record it in models.json.

    OMP_NUM_THREADS=1 python -m echo_rl.hub.build_models [NAME ...] [--work-dir DIR]

Run from a checkout (it records the commit). Each model is an
ordinary ``echo-rl train`` run (its run directory is kept in ``--work-dir``),
exported with ``echo-rl export --format onnx``; the published success is the
greedy evaluation of the exported file on the run's evaluation seeds.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.hub.models import evaluate_greedy, models_dir, recipe_path

ROOT = Path(__file__).resolve().parents[2]
# the sample-efficiency study's shared settings (benchmarks/sample_efficiency.py SHARED, PPO's part)
STUDY_PPO = {"num_actors": 16, "batch_size": 2048, "ppo_config.learning_rate": 1e-3, "ppo_config.num_epochs": 4,
             "ppo_config.batch_size": 256, "ppo_config.entropy_coef": 0.01, "ppo_config.gamma": 0.99,
             "ppo_config.gae_lambda": 0.95}
# name -> (packaged recipe (hub.models.recipe_path) or None for the defaults, overrides): the project's recipes
RECIPES = {
    "ppo-doorkey-5x5": ("ppo-doorkey-5x5", {"seed": 0}),
    # the study's PPO cell (seed 0 reached 0.9 at 51k), run to its 250k budget without early stop
    "ppo-multiroom-n2-s4": (None, {"env_name": "minigrid:MiniGrid-MultiRoom-N2-S4-v0", "agent": "ppo", "seed": 0,
                                   "total_timesteps": 250_000, "evaluation_frequency": 0, "evaluation_episodes": 100,
                                   "save_frequency": 0, **STUDY_PPO}),
}
EPISODES = 100


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _machine() -> str:
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    import os

    return f"{cpu}, {os.cpu_count()} CPUs"


def recipe_config(name: str) -> TrainingConfig:
    recipe, overrides = RECIPES[name]
    return (TrainingConfig.load_yaml(recipe_path(recipe)) if recipe else TrainingConfig()).with_overrides(overrides)


def build(name: str, work_dir: Path) -> dict:
    from echo_rl.export.loading import load_policy  # torch: loaded on first use
    from echo_rl.export.vector import export_vector_run  # torch: loaded on first use
    from echo_rl.training.protocol import EVAL_SEED_OFFSET  # gymnasium, minigrid: loaded on first use
    from echo_rl.training.trainer import EchoRLTrainer  # torch, gymnasium, minigrid: loaded on first use

    recipe, overrides = RECIPES[name]
    config = recipe_config(name)
    # the recipe as a path from the checkout (or install) root: echo_rl/hub/data/recipes/<recipe>.yaml
    config_file = recipe_path(recipe).resolve().relative_to(ROOT).as_posix() if recipe else None
    run_dir = work_dir / name
    metrics = asyncio.run(EchoRLTrainer(config, run_dir=run_dir, show_progress=False).train())
    out = models_dir() / f"{name}.onnx"
    _, meta = export_vector_run(run_dir, "onnx", out)
    seed, num_envs = config.seed + EVAL_SEED_OFFSET, min(config.num_actors, 16)
    published = evaluate_greedy(load_policy(out), config.env_name, EPISODES, seed, num_envs, config.env_config)
    torch_greedy = evaluate_greedy(load_policy(run_dir), config.env_name, EPISODES, seed, num_envs, config.env_config)
    sets = " ".join(f"--set {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items())
    train = f"echo-rl train {f'--config {config_file} ' if config_file else ''}{sets}"
    return {"file": out.name, "sha256": hashlib.sha256(out.read_bytes()).hexdigest(), "format": "onnx",
            "agent": config.agent, "env_name": config.env_name, "env_id": meta["obs_encoding"]["env_id"],
            "env_config": dict(config.env_config), "config": config_file, "overrides": overrides,
            "total_timesteps": metrics.total_timesteps, "checkpoint": meta["checkpoint"],
            "command": f"{train} && echo-rl export --format onnx (python -m echo_rl.hub.build_models {name})",
            "commit": _git("rev-parse", "HEAD") or "unknown",
            "tree_clean": _git("status", "--porcelain", "--untracked-files=no", "echo_rl") == "",
            "machine": _machine(),
            "published": {**published, "actions": "greedy", "seed": seed, "num_envs": num_envs},
            "pytorch_greedy": torch_greedy, "run_evaluation": {**metrics.evaluation_results, "actions": "sampled"}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m echo_rl.hub.build_models", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"models to build (default: all): {', '.join(RECIPES)}")
    p.add_argument("--work-dir", default="runs/hub_models", help="where the training runs are kept")
    args = p.parse_args(argv)
    try:
        unknown = sorted(set(args.names) - set(RECIPES))
        if unknown:
            raise ConfigError(f"unknown hub model(s) {', '.join(unknown)}; allowed: {', '.join(RECIPES)}")
        from echo_rl.hub.models import INDEX, models_dir  # needed on this path only

        index_path = models_dir() / INDEX
        index = json.loads(index_path.read_text()) if index_path.is_file() else {}
        for name in args.names or list(RECIPES):
            index[name] = build(name, Path(args.work_dir))
            index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
            print(f"{name}: {index[name]['published']}")
    except ConfigError as exc:
        print(f"build_models: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
