"""Shared by the engine demos: concurrent multi-turn MiniGrid-as-text episodes through the execution engine.

Each episode starts from one shared instruction prompt; every turn appends the
environment's text observation and generates a reply with the tiny backbone
(greedy, so two engine configurations produce the same tokens). The
environment is driven by its own expert so every configuration sees the same
observations and episode lengths; the model's replies stay in the history the
engine serves, exactly as generated.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

INSTRUCTIONS = (
    "You are an agent in a MiniGrid world. Each turn you read what you see and answer with one action: "
    "turn left, turn right, move forward, pick up, drop, toggle, done. Reach the goal; a locked door needs "
    "the key of its colour. Think about where the key, the door and the goal are before you act.\n"
)


def load_tiny(preset: str = "tiny") -> tuple[Any, Any]:
    """The tiny preset's model and tokenizer (built once and cached; no download)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()

    from echo_rl.models.tiny import tiny_checkpoint

    path = tiny_checkpoint(preset)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return model, AutoTokenizer.from_pretrained(path)


async def _episode(sessions: Any, tok: Any, eid: int, task: str, system_ids: list[int], max_turns: int,
                   max_new_tokens: int, turns: list[dict], bandwidth: list[dict]) -> list[int]:
    from echo_rl.environments.registry import make_env

    env = make_env(task)
    obs, _ = env.reset(seed=eid)
    sessions.episode(eid, system_ids, role="template")
    for turn in range(max_turns):
        ids = tok(f"Observation: {obs}\nAction:", add_special_tokens=False)["input_ids"]
        result = await sessions.submit_rollout(eid, ids, max_new_tokens=max_new_tokens, temperature=0.0,
                                             stop_token_ids=())
        obs, reward, terminated, truncated, _ = env.step(env.expert_action())
        done = terminated or truncated or turn == max_turns - 1
        b_eff = sessions.episode(eid).record_reward(reward, done=done)
        turns.append({"episode": eid, "turn": turn, "prompt_length": result.prompt_length,
                      "cached_length": result.cached_length, "latency": result.latency, "reward": reward,
                      "b_eff": b_eff, "b_full": result.prompt_length * (result.prompt_length + 1) / 2})
        bandwidth.append(dict(sessions.bandwidth.snapshot()))
        if done:
            break
    env.close()
    return sessions.end_episode(eid).token_ids


def run_rollout(model: Any, tok: Any, config: Any, task: str, episodes: int, max_turns: int,
                max_new_tokens: int) -> dict[str, Any]:
    """Run ``episodes`` concurrent episodes; returns the engine snapshot, per-turn rows, tracker history, tokens."""
    from echo_rl.core.async_execution import AsyncExecutionEngine
    from echo_rl.lm.session import EpisodeSessions

    async def main() -> dict[str, Any]:
        turns: list[dict] = []
        bandwidth: list[dict] = []
        system_ids = tok(INSTRUCTIONS, add_special_tokens=False)["input_ids"]
        t0 = time.perf_counter()
        async with AsyncExecutionEngine(config, model, device="cpu") as engine:
            sessions = EpisodeSessions(engine)  # episode histories and the eta_bw tracker
            tokens = await asyncio.gather(*[_episode(sessions, tok, i, task, system_ids, max_turns, max_new_tokens,
                                                     turns, bandwidth) for i in range(episodes)])
            snap = engine.snapshot()
        return {"snapshot": snap, "turns": turns, "bandwidth": bandwidth, "tokens": tokens,
                "wall_s": time.perf_counter() - t0}

    return asyncio.run(main())


def parse_rollout_args(description: str, argv, max_turns: int, max_new_tokens: int, out: str):
    """The command line both engine demos take (one-line error, exit 2, on a count below 1)."""
    import argparse

    import torch

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--task", default="minigrid:MiniGrid-DoorKey-5x5-v0", help="a MiniGrid task (runs as text)")
    p.add_argument("--episodes", type=int, default=8, help="concurrent episodes")
    p.add_argument("--max-turns", type=int, default=max_turns, help="turns per episode at most")
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="tokens generated per turn")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", default=out, help="PNG to write")
    args = p.parse_args(argv)
    for name in ("episodes", "max_turns", "max_new_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} is invalid: must be >= 1")
    torch.set_num_threads(max(1, args.threads))
    return args


def cache_vs_no_reuse(args) -> dict:
    """The same episodes with the radix cache and with reuse off (greedy: the tokens must match)."""
    from echo_rl.config import ExecutionConfig

    model, tok = load_tiny()
    return {label: run_rollout(model, tok, ExecutionConfig(max_cache_size=size), args.task, args.episodes,
                               args.max_turns, args.max_new_tokens)
            for label, size in (("radix cache", 1_000_000), ("no reuse", 0))}
