"""``HotColdBuffer``: the product's replay — recent (hot) and older (cold) samples by age.

Age is counted in adds: a sample's age is the number of samples added after it. A sample is
**hot** while ``age < min(hot_buffer_size, age_threshold)``, **cold** until
``age < max_replay_age`` (and the cold capacity), and then evicted — it is never sampled again.
So hot holds at most ``H = min(hot_buffer_size, age_threshold, max_replay_age)`` samples and cold
at most ``min(cold_buffer_size, max_replay_age - H)``; storage is preallocated for exactly that.
Migration moves a sample's sum-tree leaf from the hot tree to the cold tree (data stay put).

Each batch draws ``hot_sample_ratio`` of its samples from hot and the rest from cold (randomized
rounding keeps the expected split exact; an empty side gives its share to the other). Within a
side, draws follow the buffer's rule (softmax of score / T by default). Importance weights use
the overall probability ``P(i) = ratio_side * p_i / total_side``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from echo_rl.config import ReplayConfig
from echo_rl.replay.buffer import PrioritizedReplayBuffer
from echo_rl.replay.surprise import SurpriseCalculator


class HotColdBuffer(PrioritizedReplayBuffer):
    """Hot/cold prioritized replay built from a :class:`ReplayConfig` (see module docstring)."""

    def __init__(self, config: ReplayConfig | None = None, *, example: Any = None, seed: int | None = None,
                 use_native: bool | None = None):
        config = config if config is not None else ReplayConfig()
        if not isinstance(config, ReplayConfig):
            raise TypeError(f"config must be a ReplayConfig, got {type(config).__name__}")
        self.config = config
        hot = min(config.hot_buffer_size, config.age_threshold, config.max_replay_age)
        cold = max(0, min(config.cold_buffer_size, config.max_replay_age - hot))
        lengths, ratios = [hot], [1.0]
        if cold > 0:
            lengths.append(cold)
            ratios = [config.hot_sample_ratio, 1.0 - config.hot_sample_ratio]
        self._init(region_lengths=lengths, region_ratios=ratios, mode=config.sampling_mode,
                   alpha=config.priority_alpha, beta=config.importance_sampling_beta,
                   temperature=config.temperature, priority_epsilon=config.priority_epsilon,
                   min_experiences=config.min_experiences, example=example, seed=seed,
                   use_native=use_native, surprise=SurpriseCalculator.from_config(config))

    @property
    def hot_capacity(self) -> int:
        return self._lengths[0]

    @property
    def cold_capacity(self) -> int:
        return self._lengths[1] if len(self._lengths) > 1 else 0

    @property
    def hot_size(self) -> int:
        lo, hi = self._windows(self._next_id)[0]
        return hi - lo

    @property
    def cold_size(self) -> int:
        if len(self._lengths) < 2:
            return 0
        lo, hi = self._windows(self._next_id)[1]
        return hi - lo

    def age(self, indices) -> np.ndarray:
        """Age (samples added since) of the given ids: ``ids_issued - 1 - id``."""
        return self._next_id - 1 - np.asarray(indices, dtype=np.int64)
