"""Cost and behaviour of each intrinsic reward on real rollouts: ``python -m echo_rl.intrinsic.measure``.

Collects random-policy rollouts from a vector task (MiniGrid by default), then
per module times ``compute`` and ``update`` and prints the mean bonus of each
rollout, so a user can size a module's overhead against the agent's own
update and see its bonus shrink as the same states come back. ``next_obs``
is built the way a learner must build it with same-step autoreset: the
finished episode's ``final_obs`` at a done step, the next observation
otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from echo_rl.intrinsic import INTRINSIC_REWARDS, make_intrinsic_reward


def collect(envs, steps: int, rng: np.random.Generator, obs: np.ndarray):
    """One (T, N) random-policy rollout as tensors (obs, actions, next_obs, dones) and the last observation."""
    n = envs.num_envs
    o = np.empty((steps, *obs.shape), dtype=obs.dtype)
    no, acts, dones = np.empty_like(o), np.empty((steps, n), dtype=np.int64), np.zeros((steps, n), dtype=bool)
    for t in range(steps):
        a = rng.integers(0, envs.single_action_space.n, n)
        nxt, _, term, trunc, info = envs.step(a)
        done = term | trunc
        o[t], acts[t], dones[t], no[t] = obs, a, done, nxt
        for e in np.flatnonzero(done):
            no[t, e] = info["final_obs"][e]
        obs = nxt
    return tuple(torch.as_tensor(x) for x in (o, acts, no, dones)), obs


def main(argv: list[str] | None = None) -> int:
    from echo_rl.environments.minigrid_vector import actor_seeds, make_vector_env  # minigrid: loaded on first use

    p = argparse.ArgumentParser(prog="python -m echo_rl.intrinsic.measure", description=__doc__.split("\n")[0])
    p.add_argument("--task", default="MiniGrid-DoorKey-5x5-v0")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=128, help="rollout length T")
    p.add_argument("--rollouts", type=int, default=3)
    p.add_argument("--modules", default=",".join(INTRINSIC_REWARDS), help="comma-separated names")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    names = [n.strip() for n in args.modules.split(",") if n.strip()]
    unknown = [n for n in names if n not in INTRINSIC_REWARDS]
    if unknown or args.envs < 1 or args.steps < 2 or args.rollouts < 1:
        print(f"error: bad arguments (unknown modules {unknown}; allowed: {', '.join(INTRINSIC_REWARDS)}; "
              "--envs >= 1, --steps >= 2, --rollouts >= 1)", file=sys.stderr)
        return 2
    try:
        envs = make_vector_env(args.task, args.envs)
    except Exception as exc:  # an unknown task: one line, exit 2
        print(f"error: task {args.task!r}: {exc}", file=sys.stderr)
        return 2
    obs, _ = envs.reset(seed=actor_seeds(args.seed, args.envs))
    rng = np.random.default_rng(args.seed)
    rollouts = []
    for _ in range(args.rollouts):
        batch, obs = collect(envs, args.steps, rng, obs)
        rollouts.append(batch)
    envs.close()
    print(f"task={args.task} obs={tuple(envs.single_observation_space.shape)} T={args.steps} N={args.envs} "
          f"torch_threads={torch.get_num_threads()}")
    print(f"{'module':<14}{'compute ms':>11}{'update ms':>11}  mean bonus per rollout")
    for name in names:
        module = make_intrinsic_reward(name, envs.single_observation_space, envs.single_action_space, "cpu",
                                       seed=args.seed)
        c_ms, u_ms, means = [], [], []
        for batch in rollouts:
            t0 = time.perf_counter()
            r = module.compute(*batch)
            t1 = time.perf_counter()
            module.update(*batch)
            t2 = time.perf_counter()
            c_ms.append(1e3 * (t1 - t0))
            u_ms.append(1e3 * (t2 - t1))
            means.append(float(r.mean()))
        print(f"{name:<14}{np.median(c_ms):>11.1f}{np.median(u_ms):>11.1f}  " + " ".join(f"{m:.4g}" for m in means))
    return 0


if __name__ == "__main__":
    sys.exit(main())
