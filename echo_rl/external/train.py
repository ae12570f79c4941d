"""``echo-rl train --task external``: train the policy on a user's own agent program.

One loop, the LM path's parts: the learner (:class:`~echo_rl.lm.trainer.LMTrainer`: the objective
``lm_config.objective`` names, GRPO / GiGPO / ECHO) updates on each batch of recorded episodes, grouped by
the task the program reported, and the served engine loads the new weights under the learner's version
before the next batch (:meth:`ExternalRunner.sync`). A batch is ``episodes`` runs of the command,
``concurrency`` at a time. Each update appends one JSON line to ``<run_dir>/metrics.jsonl``.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from echo_rl.config import BandwidthConfig, ConfigError, TrainingConfig
from echo_rl.external.runner import ExternalRunner
from echo_rl.lm.policy import is_tiny, load_policy, resolve_lm_defaults
from echo_rl.lm.trainer import LMTrainer
from echo_rl.models.local import LocalBackbone
from echo_rl.models.resolve import resolve_backbone
from echo_rl.training.bandwidth import BandwidthEfficiencyTracker


def _checkpoint(backbone: str, seed: int) -> Path:
    ref = resolve_backbone(backbone, strict=False)
    return ref.checkpoint(seed=seed) if ref is not None else Path(backbone).expanduser()


def train_external(config: TrainingConfig, command: Sequence[str], *, episodes: int, concurrency: int,
                   episode_timeout: float, updates: int, run_dir: str | Path,
                   log: Callable[[str], Any] = print) -> list[dict[str, float]]:
    """Run ``updates`` learner updates on batches of ``episodes`` episodes of ``command``; returns the rows."""
    if episodes < 1 or updates < 1:
        raise ConfigError(f"episodes={episodes} and updates={updates} are invalid: both must be >= 1")
    torch.manual_seed(config.seed)
    model, tokenizer = load_policy(config.backbone, config.seed)
    config = resolve_lm_defaults(config, is_tiny(model))
    model = model.to(config.device)  # the learner's copy; the served engine loads its own on the same device
    served = LocalBackbone(_checkpoint(config.backbone, config.seed), device=config.device,  # the learner's precision
                           dtype=config.lm_config.compute_dtype, name="policy")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    trainer = LMTrainer(config, model, None, pad, config.lm_config.env_loss_coef
                        if config.agent == "echo-rl" else 0.0,
                        BandwidthEfficiencyTracker(BandwidthConfig(scale=config.execution_config.bandwidth_scale)))
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with ExternalRunner(served, command, concurrency=concurrency, episode_timeout=episode_timeout,
                        max_policy_lag=0) as runner, \
            open(run_dir / "metrics.jsonl", "a") as out:
        for update in range(1, updates + 1):
            t0 = time.perf_counter()
            batch = asyncio.run(runner.batch(episodes))
            row = {"update": float(update), **batch.metrics(), "time/rollout_s": time.perf_counter() - t0}
            if batch.last_error:
                log(f"update {update}: {batch.last_error}")
            if batch.trajectories:
                m, _ = trainer.step(batch.trajectories)
                weights = trainer.weight_update()
                runner.sync(weights.model, weights.version)
                row.update({f"lm/{k}": float(v) for k, v in m.items()})
                row["episode/return"] = sum(t.total_reward for t in batch.trajectories) / len(batch.trajectories)
            else:
                log(f"update {update}: no episode of this batch can be trained on ({batch.counts}); no update")
            out.write(json.dumps(row) + "\n")
            out.flush()
            rows.append(row)
            log(f"update {update}: {int(batch.counts.get('episodes', 0))}/{episodes} episodes, "
                f"{batch.steps} turns, return {row.get('episode/return', float('nan')):.3f}, "
                f"splits {batch.counts.get('splits', 0)}, dropped "
                f"{sum(batch.counts[k] for k in ('crashed', 'timed_out', 'no_reward', 'no_turns', 'stale'))}")
    return rows
