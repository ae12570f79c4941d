"""What OpenEnv's wire costs a text task: MiniGrid-as-text stepped in-process against the same task served by
``echo-rl serve-env``'s app (OpenEnv's server, the guard) and played through the ``openenv`` task (OpenEnv's
client) on loopback.

    nice -n 10 .venv/bin/python benchmarks/openenv_bench.py --steps 2000 --reps 5

Both sides take the expert's actions of an in-process twin (so neither pays for planning; the served episodes
are other layouts of the same task, as the ``openenv`` task draws its own server seeds, so some actions bump
into walls) and are timed in interleaved repetitions; printed: env steps/s of each, the
ratio per repetition, and the median per-step overhead in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from echo_rl.environments.openenv_server import build_app
from echo_rl.environments.registry import make_env
from echo_rl.serve.server import ModelServer

CONFIG = {"env_id": "MiniGrid-DoorKey-5x5-v0"}


def play(env, twin, steps: int) -> float:
    """Seconds for ``steps`` env steps of ``env`` (episodes back to back), the actions from ``twin``'s expert."""
    done, seed, elapsed = True, 0, 0.0
    for _ in range(steps):
        if done:
            seed += 1
            twin.reset(seed=seed)
            t = time.perf_counter()
            env.reset(seed=seed)
            elapsed += time.perf_counter() - t
        action = twin.expert_action()
        twin_end = twin.step(action)[2:4]
        t = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        elapsed += time.perf_counter() - t
        done = terminated or truncated or any(twin_end)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    server = ModelServer(build_app("minigrid", CONFIG), uvicorn_options={"lifespan": "on"}).start()
    try:
        remote = make_env("openenv", url=f"http://127.0.0.1:{server.port}")
        local, twin = make_env("minigrid", **CONFIG), make_env("minigrid", **CONFIG)
        play(remote, twin, 100), play(local, twin, 100)  # warm up both paths
        rows = []
        for _ in range(args.reps):
            rows.append({"in_process": args.steps / play(local, twin, args.steps),
                         "openenv": args.steps / play(remote, twin, args.steps)})
        remote.close()
    finally:
        server.stop()
    ratios = [r["openenv"] / r["in_process"] for r in rows]
    med = {k: statistics.median(r[k] for r in rows) for k in ("in_process", "openenv")}
    print(json.dumps({"steps_per_s": med, "ratio_per_rep": [round(x, 3) for x in ratios],
                      "overhead_ms_per_step": round(1e3 * (1 / med["openenv"] - 1 / med["in_process"]), 3),
                      "load_avg": os.getloadavg(), "machine": platform.processor() or platform.machine()}, indent=1))


if __name__ == "__main__":
    main()
