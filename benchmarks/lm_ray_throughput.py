"""LM rollout throughput on Ray workers: env steps (turns) per second of rollout time, 1 vs N workers.

Tiny backbone on MiniGrid-Empty-Random-5x5 as text, synchronous (``max_policy_lag`` unset). Each run
starts its own local Ray; the first update (workers warming up) is not timed.

    nice .venv/bin/python benchmarks/lm_ray_throughput.py --workers 1 2
"""

from __future__ import annotations

import argparse
import asyncio

import torch

from echo_rl.config import TrainingConfig
from echo_rl.lm.loop import LMAgent


def config(workers: int, actors: int, updates: int) -> TrainingConfig:
    return TrainingConfig().with_overrides({
        "env_name": "minigrid:MiniGrid-Empty-Random-5x5-v0", "env_config": {"max_steps": 4}, "backbone": "tiny",
        "agent": "ppo", "backend": "ray", "ray_num_workers": workers, "num_actors": actors, "batch_size": 4 * actors,
        "total_timesteps": 10**6, "lm_config.group_size": 2, "lm_config.max_new_tokens": 8,
        "lm_config.sft_episodes": 0, "lm_config.heldout_pool": 0, "lm_config.max_updates": updates + 1})


async def measure(workers: int, actors: int, updates: int) -> float:
    agent = LMAgent(config(workers, actors, updates), torch.device("cpu"))
    await agent.start()
    try:
        await agent.train_iteration()
        steps = seconds = 0.0
        for _ in range(updates):
            before = agent.env_steps
            await agent.train_iteration()
            steps, seconds = steps + agent.env_steps - before, seconds + agent.timings["time/rollout_s"]
    finally:
        await agent.close()
    return steps / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--actors", type=int, default=8, help="concurrent episodes per update (all workers)")
    p.add_argument("--updates", type=int, default=3, help="timed updates per run")
    a = p.parse_args()
    torch.set_num_threads(1)
    for w in a.workers:
        print(f"workers={w}: {asyncio.run(measure(w, a.actors, a.updates)):.1f} env steps/s of rollout")


if __name__ == "__main__":
    main()
