"""Build the hub policies: train each recipe, export it to ONNX, evaluate it, record it in models.json.

    OMP_NUM_THREADS=1 python -m echo_rl.hub.build_models [NAME ...] [--work-dir DIR]

Run from a checkout (recipes name files under ``configs/``). Each model is an
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

from echo_rl.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
# name -> (config file, overrides): the project's recipes, unchanged
RECIPES = {
    "ppo-doorkey-5x5": ("configs/minigrid_doorkey5x5.yaml", {"seed": 0}),
}
EPISODES = 100


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def build(name: str, work_dir: Path) -> dict:
    from echo_rl.config import TrainingConfig
    from echo_rl.export.loading import load_policy
    from echo_rl.export.vector import export_vector_run
    from echo_rl.hub.models import evaluate_greedy, models_dir
    from echo_rl.training.protocol import EVAL_SEED_OFFSET
    from echo_rl.training.trainer import EchoRLTrainer

    config_file, overrides = RECIPES[name]
    config = TrainingConfig.load_yaml(ROOT / config_file).with_overrides(overrides)
    run_dir = work_dir / name
    metrics = asyncio.run(EchoRLTrainer(config, run_dir=run_dir, show_progress=False).train())
    out = models_dir() / f"{name}.onnx"
    _, meta = export_vector_run(run_dir, "onnx", out)
    seed, num_envs = config.seed + EVAL_SEED_OFFSET, min(config.num_actors, 16)
    published = evaluate_greedy(load_policy(out), config.env_name, EPISODES, seed, num_envs, config.env_config)
    torch_greedy = evaluate_greedy(load_policy(run_dir), config.env_name, EPISODES, seed, num_envs, config.env_config)
    sets = " ".join(f"--set {k}={v}" for k, v in overrides.items())
    return {"file": out.name, "sha256": hashlib.sha256(out.read_bytes()).hexdigest(), "format": "onnx",
            "agent": config.agent, "env_name": config.env_name, "env_id": meta["obs_encoding"]["env_id"],
            "env_config": dict(config.env_config), "config": config_file, "overrides": overrides,
            "total_timesteps": metrics.total_timesteps, "checkpoint": meta["checkpoint"],
            "command": f"echo-rl train --config {config_file} {sets} && echo-rl export --format onnx "
                       f"(python -m echo_rl.hub.build_models {name})",
            "commit": _commit(), "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
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
        from echo_rl.hub.models import INDEX, models_dir

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
