"""Am I one of several data-parallel learners? The one answer every part reads, without importing torch.

:func:`echo_rl.distributed.data_parallel.init_learner` records this process's
learner here; the trainer (its schedule and checkpoints) and the PPO agent (its
gradient all-reduce) both ask :func:`current`, so they cannot disagree.
"""

from __future__ import annotations

from typing import Any

_CURRENT: Any = None  # the DataParallel of this process, or None for the one learner


def current() -> Any:
    """This process's ``DataParallel`` learner when it is one of several, else None."""
    return _CURRENT


def set_current(learner: Any) -> None:
    global _CURRENT
    _CURRENT = learner
