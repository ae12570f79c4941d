"""PPO training throughput: EchoRL vs Stable-Baselines3, same env and hyper-parameters, one process.

Both train on MiniGrid DoorKey-5x5 with the same flat observation wrapper
(``FlatMiniGridObs``), n_envs, n_steps, epochs and minibatch size, the same
loss (EchoRL set to SB3's: no KL penalty, no value clipping, constant learning
rate; ``--echo-defaults`` keeps EchoRL's), the same torch thread count and, by
default, the same network shape (64x64 MLP heads);
the figure is env steps per second of the whole training loop (collection +
updates). EchoRL steps its envs in-process by default (``--vector-env``
selects worker processes); SB3 runs its default in-process DummyVecEnv.
EchoRL's adapter renders MiniGrid's observation with a faster, identical
implementation (``minigrid_fast_obs``); SB3 is timed twice, with MiniGrid's own
renderer (what an SB3 user runs) and with EchoRL's (framework overhead alone). Each contender runs ``--reps``
times, interleaved within each repetition (A B C, then C B A), after an untimed warm-up of each; the medians,
their ratios and the per-repetition ratios are printed.

    python benchmarks/ppo_throughput.py --timesteps 32768 --reps 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

import torch

from echo_rl import EchoRLTrainer, PPOConfig, TrainingConfig
from echo_rl.environments.minigrid_vector import make_minigrid_env

TASK = "minigrid:MiniGrid-DoorKey-5x5-v0"
#: SB3 PPO's defaults where EchoRL's differ: no KL penalty in the loss, no value clipping, a constant learning rate
SB3_LOSS = {"kl_coef": 0.0, "value_clip": None, "anneal_lr": False}


def run_echo(args) -> float:
    cfg = TrainingConfig(env_name=TASK, total_timesteps=args.timesteps, num_actors=args.n_envs,
                         policy_network=args.network, vector_env=args.vector_env,
                         batch_size=args.n_envs * args.n_steps, evaluation_frequency=0, evaluation_episodes=1,
                         save_frequency=0, seed=0,
                         ppo_config=PPOConfig(num_epochs=args.epochs, batch_size=args.minibatch, learning_rate=3e-4,
                                              **({} if args.echo_defaults else SB3_LOSS)))
    with tempfile.TemporaryDirectory() as d:
        trainer = EchoRLTrainer(cfg, run_dir=d, show_progress=False)
        t = time.perf_counter()
        metrics = asyncio.run(trainer.train())
        # Exclude the final 1-episode evaluation + checkpoint: measure the training loop like SB3's learn().
        rows = [json.loads(x) for x in open(f"{d}/timings.jsonl")]
    elapsed = rows[-1]["time/elapsed"]
    assert metrics.total_timesteps >= args.timesteps and elapsed < time.perf_counter() - t
    return metrics.total_timesteps / elapsed


def run_sb3(args, fast_obs: bool) -> float:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(lambda: make_minigrid_env(TASK, fast_obs=fast_obs), n_envs=args.n_envs, seed=0)
    model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=args.minibatch, n_epochs=args.epochs,
                learning_rate=3e-4, gamma=0.99, gae_lambda=0.95, ent_coef=0.01, clip_range=0.2, seed=0,
                device="cpu", verbose=0)
    t = time.perf_counter()
    model.learn(total_timesteps=args.timesteps)
    return model.num_timesteps / (time.perf_counter() - t)


def env_steps_per_s(args) -> float:
    """EchoRL's MiniGrid adapter alone: ``n_envs`` in-process envs under uniform random actions, best of 3."""
    import numpy as np

    from echo_rl.environments.minigrid_vector import actor_seeds, make_vector_env

    envs = make_vector_env(TASK, args.n_envs)
    envs.reset(seed=actor_seeds(0, args.n_envs))
    actions = np.random.default_rng(0).integers(0, 7, (3000, args.n_envs))
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        for a in actions:
            envs.step(a)
        best = max(best, actions.size / (time.perf_counter() - t))
    envs.close()
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timesteps", type=int, default=32768)
    p.add_argument("--n-envs", type=int, default=8)
    p.add_argument("--n-steps", type=int, default=128)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minibatch", type=int, default=256)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads for both libraries")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--network", default="mlp", choices=["mlp", "minigrid"],
                   help="EchoRL's policy network (mlp = SB3 MlpPolicy's 64x64 shape)")
    p.add_argument("--vector-env", default="sync", choices=["sync", "async"],
                   help="EchoRL's env stepping: in-process or worker processes (SB3 uses its default DummyVecEnv)")
    p.add_argument("--echo-defaults", action="store_true",
                   help="EchoRL keeps its own PPO defaults (KL penalty 0.1, value clip 0.2, LR annealing) instead of "
                        "SB3's loss: more work per minibatch than SB3 does")
    p.add_argument("--env-only", action="store_true",
                   help="time EchoRL's env adapter alone (no learning): run it under PYTHONPATH=<other tree> to compare")
    args = p.parse_args()
    if args.env_only:
        print(f"{TASK}, {args.n_envs} envs, random actions: {env_steps_per_s(args):,.0f} env steps/s")
        return
    torch.set_num_threads(args.threads)
    warm = argparse.Namespace(**{**vars(args), "timesteps": args.n_envs * args.n_steps})
    run_echo(warm), run_sb3(warm, False)  # first-use imports and allocations out of the timed runs
    echo, sb3, sb3_fast = [], [], []
    runs = [(echo, lambda: run_echo(args)), (sb3, lambda: run_sb3(args, fast_obs=False)),
            (sb3_fast, lambda: run_sb3(args, fast_obs=True))]
    for rep in range(args.reps):  # A B C, then C B A: a drift in the box's load hits every contender alike
        for out, run in (runs if rep % 2 == 0 else runs[::-1]):
            out.append(run())
    e, s, sf = statistics.median(echo), statistics.median(sb3), statistics.median(sb3_fast)
    r_s = [a / b for a, b in zip(echo, sb3)]
    r_sf = [a / b for a, b in zip(echo, sb3_fast)]
    print(f"setup: {TASK}, n_envs={args.n_envs}, n_steps={args.n_steps}, epochs={args.epochs}, "
          f"minibatch={args.minibatch}, timesteps={args.timesteps}, torch threads={args.threads}, reps={args.reps}, "
          f"EchoRL network={args.network}, vector_env={args.vector_env}, "
          f"{'EchoRL PPO defaults' if args.echo_defaults else 'SB3 loss settings'}; SB3 MlpPolicy + DummyVecEnv")
    print(f"EchoRL PPO : {e:8.0f} env steps/s  (runs: {', '.join(f'{x:.0f}' for x in echo)})")
    print(f"SB3 PPO    : {s:8.0f} env steps/s  (runs: {', '.join(f'{x:.0f}' for x in sb3)})  MiniGrid's own observations")
    print(f"SB3 PPO    : {sf:8.0f} env steps/s  (runs: {', '.join(f'{x:.0f}' for x in sb3_fast)})  "
          "with EchoRL's fast observations")
    print(f"ratio EchoRL / SB3 (as an SB3 user runs MiniGrid): {e / s:.2f}x of medians; per repetition "
          f"{', '.join(f'{r:.2f}' for r in r_s)} (median {statistics.median(r_s):.2f}x)")
    print(f"ratio EchoRL / SB3 (both on EchoRL's env adapter: framework only): {e / sf:.2f}x of medians; per "
          f"repetition {', '.join(f'{r:.2f}' for r in r_sf)} (median {statistics.median(r_sf):.2f}x)")


if __name__ == "__main__":
    main()
