"""Cut a vector-agent run at a checkpoint and resume it in a fresh agent: the shared shape of resume tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from echo_rl.training.agents import build_agent
from echo_rl.training.run_dir import RunDirectory

CPU = torch.device("cpu")


def cut_and_resume(config: Any, run_dir: Path, before: int, after: int,
                   check: Callable[[Any, list[dict]], None],
                   loaded: Callable[[Any], None] | None = None) -> None:
    """Train ``before`` iterations, checkpoint, load the checkpoint into a new agent (``loaded(agent)`` sees it
    before it trains), train ``after`` more, then ``check(resumed_agent, rows_of_both_parts)`` while the resumed
    agent is still open."""
    run = RunDirectory(run_dir, config)
    run.create()
    first = build_agent(config, CPU)
    try:
        rows = [first.train_iteration() for _ in range(before)]
        run.save_checkpoint(first.env_steps, first.state_dict(), first.rollout_state())
    finally:
        first.close()
    resumed = build_agent(config, CPU)
    try:
        run.load_newest(lambda payload, rollout: (resumed.load_state_dict(payload["state"]),
                                                  resumed.load_rollout_state(rollout)))
        if loaded is not None:
            loaded(resumed)
        rows += [resumed.train_iteration() for _ in range(after)]
        check(resumed, rows)
    finally:
        resumed.close()
