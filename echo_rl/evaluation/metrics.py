"""Per-cell metrics: Success@1, reward, length, tokens, ETPS, KV reuse, time, cost.

Definitions (also in docs/evaluation.md):
- ``success_at_1``: share of evaluation episodes won on the first attempt
  (one episode per attempt; no retries, no best-of-k).
- ``etps``: effective tokens per second — LM tokens processed (prompt +
  completion) per second of episode wall time (of the episode loop when
  episodes ran concurrently); None for policies without tokens.
- ``kv_reuse``: share of prompt tokens served from a reused KV prefix, when the
  backbone reports it.
- ``cost_usd``: API cost reported by the backbone plus local compute priced at
  ``cpu_hour_usd`` per CPU-hour of measured process CPU time (and
  ``gpu_hour_usd`` per GPU wall-hour when the cell used a GPU). Both prices
  are configuration, stated in the report next to the figures they price.
- ``cost_per_success``: ``cost_usd`` / successes; None when nothing succeeded.
  API calls to a model without a price are not counted as free: the cell's
  cost is None (shown as n/a) rather than an underestimate.
"""

from __future__ import annotations

from typing import Any

from echo_rl.evaluation.records import CellOutcome

METRIC_NAMES = ("success_at_1", "avg_reward", "avg_episode_length", "tokens_per_episode", "etps", "kv_reuse",
                "wall_time_s", "cost_usd", "cost_per_success")


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def cell_metrics(outcome: CellOutcome, resources: dict[str, float], cpu_hour_usd: float,
                 gpu_hour_usd: float) -> dict[str, Any]:
    """Turn what a runner measured plus the monitor's summary into the cell's metrics."""
    eps = outcome.episodes
    if eps:
        n = len(eps)
        success = _mean([float(e.success) for e in eps])
        reward = _mean([float(e.reward) for e in eps])
        length = _mean([float(e.length) for e in eps])
    else:
        if outcome.success_rate is None or not outcome.num_episodes:
            raise ValueError("a runner returned neither episodes nor success_rate with num_episodes")
        n, success, reward, length = (outcome.num_episodes, float(outcome.success_rate), outcome.mean_reward,
                                      outcome.mean_length)
    tok = [e.tokens for e in eps if e.tokens is not None]
    tokens_per_episode = _mean([float(t) for t in tok]) if tok and len(tok) == len(eps) else None
    ep_time = sum(e.wall_time_s for e in eps)
    # concurrent episodes overlap: tokens per second of the loop's wall time, not of the summed episode times
    span = outcome.episodes_wall_s if outcome.episodes_wall_s is not None else ep_time
    etps = (sum(tok) / span) if tokens_per_episode is not None and span > 0 else None
    prompt = [e for e in eps if e.prompt_tokens is not None and e.kv_reused_tokens is not None]
    total_prompt = sum(e.prompt_tokens for e in prompt)
    kv_reuse = (sum(e.kv_reused_tokens for e in prompt) / total_prompt) if total_prompt > 0 else None

    api: float | None = outcome.api_cost_usd
    if api is None:
        uses_tokens = [e for e in eps if e.tokens is not None]
        if any(e.cost_usd is None for e in uses_tokens):
            api = None  # a model without a price-table entry: the cost is unknown, not zero
        else:
            api = sum(e.cost_usd for e in uses_tokens)
    cpu_s = float(resources.get("cpu_time_s", 0.0))
    wall = float(resources.get("wall_time_s", 0.0))
    used_gpu = any(k.startswith("gpu") and k.endswith("memory_allocated_mb_peak") and v > 0
                   for k, v in resources.items())
    compute = cpu_s / 3600.0 * cpu_hour_usd + (wall / 3600.0 * gpu_hour_usd if used_gpu else 0.0)
    cost = None if api is None else api + compute
    successes = success * n
    return {
        "num_episodes": n,
        "success_at_1": success,
        "successes": successes,
        "avg_reward": reward,
        "avg_episode_length": length,
        "tokens_per_episode": tokens_per_episode,
        "etps": etps,
        "kv_reuse": kv_reuse,
        "wall_time_s": wall,
        "cpu_time_s": cpu_s,
        "episode_wall_time_s": ep_time if eps else None,
        "env_steps_per_s": (sum(e.length for e in eps) / span) if eps and span > 0 else None,
        "api_cost_usd": api,
        "compute_cost_usd": compute,
        "cost_usd": cost,
        "cost_per_success": cost / successes if cost is not None and successes > 0 else None,
        "used_gpu": used_gpu,
        "env_steps_trained": outcome.env_steps_trained,
    }
