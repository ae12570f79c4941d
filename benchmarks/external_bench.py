"""Recording + serving over HTTP vs the in-process generator, on the same MiniGrid-as-text episodes.

Both sides play the same seeds with the same model, turn cap and token budget, ``--concurrency`` episodes at
a time, at temperature 1, rounds interleaved (in-process, HTTP, in-process, ...) so the box's load hits both
alike. In-process: ``LMRolloutWorker`` on an ``AsyncExecutionEngine``. HTTP: a program on the official
``openai`` client (threads in this process, so the program's start-up is not counted) against the trainer's
loopback server, every turn recorded (``echo_rl.external``). Reports env steps/s (turns) and sampled
tokens/s (action tokens of the recorded trajectories) per side, and their ratio.

    python benchmarks/external_bench.py --backbone tiny --episodes 16 --concurrency 8 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import platform
import time
from typing import Any

import numpy as np


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backbone", default="tiny")
    ap.add_argument("--env-id", default="MiniGrid-Empty-5x5-v0")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()

    import openai
    import torch

    from echo_rl.config import ExecutionConfig, LMConfig
    from echo_rl.engine.engine import AsyncExecutionEngine
    from echo_rl.environments.registry import make_env
    from echo_rl.external.runner import ExternalRunner
    from echo_rl.external.train import _checkpoint
    from echo_rl.lm.chat_delta import ChatRenderer
    from echo_rl.lm.rollout import LMRolloutWorker
    from echo_rl.models.local import LocalBackbone
    from echo_rl.serve import ModelServer, create_app
    from echo_rl.types import ACTION

    torch.manual_seed(0)
    backbone = LocalBackbone(_checkpoint(args.backbone, 0), device="cpu", name="policy")
    system = "You play a grid world. Reply with one action from the list."
    env = lambda: make_env("minigrid", env_id=args.env_id)  # noqa: E731
    env()  # the task registry loads its built-ins here, once, before any thread asks for a task
    seeds = list(range(args.episodes))

    def count(trajs: list) -> tuple[int, int]:
        return sum(t.num_turns for t in trajs), sum(int((t.role_array() == ACTION).sum()) for t in trajs)

    async def in_process() -> tuple[int, int, float]:
        cfg = LMConfig(max_turns=args.max_turns, max_new_tokens=args.max_tokens, temperature=1.0,
                       system_prompt=system)
        async with AsyncExecutionEngine(ExecutionConfig(max_concurrent_rollouts=args.concurrency),
                                        backbone.model) as engine:
            worker = LMRolloutWorker(engine, ChatRenderer(backbone.tokenizer), cfg, task="minigrid")
            slots = asyncio.Semaphore(args.concurrency)

            async def one(s: int) -> object:
                async with slots:
                    return await worker.episode(env(), seed=s, episode_id=s, sample_seed=s)

            t0 = time.perf_counter()
            trajs = await asyncio.gather(*(one(s) for s in seeds))
            return (*count(trajs), time.perf_counter() - t0)

    def over_http(runner: ExternalRunner, plain: Any = None) -> tuple[int, int, float]:
        """Episodes through the recording server, or (``plain``: a ModelServer of ``create_app``) through plain
        ``serve``, nothing recorded (tokens then counted from the replies' usage)."""
        def play(s: int) -> Any:
            rid = f"bench{s}-{time.monotonic_ns()}"
            if plain is None:
                runner.recorder.start(rid)
                client = openai.OpenAI(base_url=f"{runner.root}/rollout/{rid}/v1", api_key=runner.key,
                                       max_retries=0)
            else:
                client = openai.OpenAI(base_url=plain.url, api_key="-", max_retries=0)
            sampled = turns = 0
            e = env()
            _, info = e.reset(seed=s)
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": "".join(x.text for x in info["segments"])}]
            total = 0.0
            for _ in range(args.max_turns):
                reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=args.max_tokens,
                                                       seed=s)
                text = reply.choices[0].message.content or ""
                sampled, turns = sampled + reply.usage.completion_tokens, turns + 1
                messages.append({"role": "assistant", "content": text})
                _, r, done, trunc, info = e.step(text)
                total += r
                if done or trunc:
                    break
                messages.append({"role": "user", "content": "".join(x.text for x in info["segments"])})
            if plain is not None:
                return turns, sampled
            runner.recorder.report(rid, total, f"seed-{s}")
            return count(runner.recorder.finish(rid)[1])

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            got = list(pool.map(play, seeds))
        return sum(g[0] for g in got), sum(g[1] for g in got), time.perf_counter() - t0

    rows = {"in-process": [], "http": [], "serve-only": []}
    with ExternalRunner(backbone, ["true"], concurrency=args.concurrency) as runner, \
            ModelServer(create_app(backbone, model_name="policy", max_concurrent=args.concurrency)) as plain:
        over_http(runner)  # warm-up: the servers' engines, the client
        over_http(runner, plain)
        asyncio.run(in_process())
        for _ in range(args.rounds):
            rows["in-process"].append(asyncio.run(in_process()))
            rows["http"].append(over_http(runner))
            rows["serve-only"].append(over_http(runner, plain))
        splits = runner.recorder.counts.get("splits", 0)
    print(f"CPU: {_cpu()} ({torch.get_num_threads()} torch threads); backbone {args.backbone}; {args.episodes} "
          f"episodes x {args.rounds} rounds, concurrency {args.concurrency}, <= {args.max_turns} turns, "
          f"<= {args.max_tokens} tokens/turn; http splits {splits}")
    rate = {}
    for side, rs in rows.items():
        steps, toks, wall = (np.array([r[i] for r in rs], dtype=float) for i in range(3))
        rate[side] = (steps.sum() / wall.sum(), toks.sum() / wall.sum())
        print(f"{side:>11}: {rate[side][0]:7.2f} env steps/s  {rate[side][1]:8.1f} tokens/s  "
              f"({int(steps.sum())} steps, {int(toks.sum())} tokens, {wall.sum():.1f} s)")
    for side in ("http", "serve-only"):
        print(f"{side} / in-process: {rate[side][0] / rate['in-process'][0]:.2f}x env steps/s, "
              f"{rate[side][1] / rate['in-process'][1]:.2f}x tokens/s")


if __name__ == "__main__":
    main()
