"""Intrinsic rewards for exploration, each with its paper's formula (see docs/intrinsic_rewards.md).

``make_intrinsic_reward(name, observation_space, action_space, device, **kw)``
builds one; ``IntrinsicMixer`` adds its bonus to the task reward.
"""

from __future__ import annotations

import inspect

from echo_rl.intrinsic.base import IntrinsicReward
from echo_rl.intrinsic.e3b import E3B
from echo_rl.intrinsic.icm import ICM
from echo_rl.intrinsic.mixing import IntrinsicMixer
from echo_rl.intrinsic.ngu import NGU
from echo_rl.intrinsic.pseudo_counts import PseudoCounts
from echo_rl.intrinsic.re3 import RE3
from echo_rl.intrinsic.ride import RIDE
from echo_rl.intrinsic.rnd import RND

INTRINSIC_REWARDS = {"rnd": RND, "icm": ICM, "re3": RE3, "e3b": E3B, "ride": RIDE, "ngu": NGU,
                     "pseudo_counts": PseudoCounts}


def make_intrinsic_reward(name: str, observation_space, action_space, device="cpu", **kw) -> IntrinsicReward:
    """The module registered as ``name``, built with its hyperparameters as keywords."""
    key = str(name).strip().lower().replace("-", "_")
    if key not in INTRINSIC_REWARDS:
        raise ValueError(f"unknown intrinsic reward {name!r}; allowed: {', '.join(INTRINSIC_REWARDS)}")
    cls = INTRINSIC_REWARDS[key]
    allowed = [p for p in inspect.signature(cls.__init__).parameters
               if p not in ("self", "observation_space", "action_space", "device")]
    unknown = sorted(set(kw) - set(allowed))
    if unknown:
        raise ValueError(f"{key}: unknown hyperparameters {unknown}; allowed: {', '.join(allowed)}")
    return cls(observation_space, action_space, device, **kw)


__all__ = ["E3B", "ICM", "INTRINSIC_REWARDS", "IntrinsicMixer", "IntrinsicReward", "NGU", "PseudoCounts", "RE3",
           "RIDE", "RND", "make_intrinsic_reward"]
