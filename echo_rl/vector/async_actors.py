"""Asynchronous collection with bounded staleness (IMPALA's actor/learner split, Espeholt et al. 2018).

Actors keep collecting while the learner updates. Each *unroll* (one actor's
rollout of ``T`` steps over its envs) carries the policy version that acted
(the learner's update count when the actor loaded the weights) and that
version's behaviour log-probabilities, so V-trace corrects exactly the lag it
has. The learner builds each batch from whichever unrolls arrive first, drops
those more than ``max_policy_lag`` updates old (counted: ``async/dropped_stale``)
and reports the lag of the ones it learns from (``async/policy_lag_mean`` /
``_max``). Actors pull the newest weights before each unroll.

Sources of unrolls (``take() -> Unroll``, ``publish(network, version)``,
``pause()`` / ``resume()``, ``close()``):

- ``actor_process.ProcessActor`` — in-process backend: one spawned worker process
  owns the envs, one rollout in flight (a thread would share the GIL with the learner).
- ``ray_backend.AsyncRemoteCollector`` — Ray workers, one rollout in flight each.
- :class:`LockstepSource` — no concurrency: acts with the weights of a given
  schedule of lags, so a lag's effect can be studied (and tested) without timing noise.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from echo_rl.vector.rollout import EpisodeStats, RolloutBuffer, VectorRolloutCollector, sample_policy

#: per-step arrays an unroll carries (RolloutBuffer's fields)
UNROLL_FIELDS = ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated", "final_values")


@dataclass
class Unroll:
    """One actor's rollout ``[T, n]``, the observation after it (the bootstrap), and the version that acted."""

    arrays: dict[str, np.ndarray]
    next_obs: np.ndarray
    version: int
    stats: EpisodeStats = field(default_factory=EpisodeStats)

    @property
    def num_envs(self) -> int:
        return int(self.arrays["actions"].shape[1])

    @property
    def env_steps(self) -> int:
        return int(self.arrays["actions"].size)

    @classmethod
    def from_buffer(cls, buf: RolloutBuffer, next_obs: np.ndarray, version: int, stats: EpisodeStats) -> "Unroll":
        """A copy of ``buf``'s arrays (the collector reuses its buffer for the next rollout)."""
        return cls({name: np.array(getattr(buf, name)) for name in UNROLL_FIELDS}, np.array(next_obs), version, stats)


class UnrollBatch(RolloutBuffer):
    """Unrolls side by side on the env axis: what one learner update consumes.

    ``next_obs`` holds each column's bootstrap observation and ``versions`` the
    policy version that acted in each column.
    """

    def __init__(self, unrolls: list[Unroll]):
        if not unrolls:
            raise ValueError("an unroll batch needs at least one unroll")
        first = unrolls[0].arrays["obs"]
        width = sum(u.num_envs for u in unrolls)
        super().__init__(first.shape[0], width, first.shape[2:], first.dtype)
        start = 0
        for u in unrolls:
            cols = slice(start, start + u.num_envs)
            for name in UNROLL_FIELDS:
                getattr(self, name)[:, cols] = u.arrays[name]
            start = cols.stop
        self.next_obs = np.concatenate([u.next_obs for u in unrolls], axis=0)
        self.versions = np.concatenate([np.full(u.num_envs, u.version, np.int64) for u in unrolls])


class StalenessGate:
    """Admits unrolls at most ``max_policy_lag`` learner updates old; counts the dropped ones and the lags."""

    def __init__(self, max_policy_lag: int):
        if max_policy_lag < 1:
            raise ValueError(f"max_policy_lag={max_policy_lag} is invalid: asynchronous collection needs >= 1")
        self.max_policy_lag = max_policy_lag
        self.dropped = 0  # over the run (async/dropped_stale)
        self.dropped_steps = 0

    def admit(self, unroll: Unroll, learner_version: int) -> bool:
        lag = learner_version - unroll.version
        if lag < 0:
            raise RuntimeError(f"an unroll of policy version {unroll.version} is newer than the learner's "
                               f"{learner_version}")
        if lag > self.max_policy_lag:
            self.dropped += 1
            self.dropped_steps += unroll.env_steps
            return False
        return True


def gather_batch(take: Callable[[], Unroll], gate: StalenessGate, learner_version: int,
                 width: int) -> tuple[UnrollBatch, int, dict[str, float]]:
    """Take unrolls until the admitted ones cover ``width`` envs; returns (batch, env steps taken, metrics).

    Dropped unrolls still count as env steps (the actors took them) and their
    finished episodes still count in the episode statistics.
    """
    admitted: list[Unroll] = []
    stats = EpisodeStats()
    steps = 0
    while sum(u.num_envs for u in admitted) < width:
        unroll = take()
        steps += unroll.env_steps
        for ret, length, success in zip(unroll.stats.returns, unroll.stats.lengths, unroll.stats.successes):
            stats.add(ret, length, success)
        if gate.admit(unroll, learner_version):
            admitted.append(unroll)
    lags = [learner_version - u.version for u in admitted]
    metrics = stats.drain()
    metrics.update({"async/policy_lag_mean": float(np.mean(lags)), "async/policy_lag_max": float(max(lags)),
                    "async/dropped_stale": float(gate.dropped), "async/unrolls": float(len(admitted))})
    return UnrollBatch(admitted), steps, metrics


class LockstepSource:
    """Unrolls collected in the learner's thread, unroll ``k`` acting with the weights of ``lags(k)`` updates
    ago (at most ``keep`` updates, and no older than the run): a fixed, reproducible policy lag. A one-worker
    asynchronous run (in-process or on Ray) has the schedule ``lags = lambda k: min(k, 1)``."""

    def __init__(self, collector: VectorRolloutCollector, network: torch.nn.Module, generator: torch.Generator,
                 version: int, lags: Callable[[int], int], keep: int = 16):
        self.collector, self.generator, self.lags, self.keep = collector, generator, lags, keep
        self.network = copy.deepcopy(network).cpu().requires_grad_(False)
        self.history = {version: copy.deepcopy(self.network.state_dict())}  # the last keep+1 versions' weights
        self.version, self.taken = version, 0

    def publish(self, network: torch.nn.Module, version: int) -> None:
        self.history[version] = {k: v.detach().to("cpu", copy=True) for k, v in network.state_dict().items()}
        self.version = version
        for old in [v for v in self.history if v < version - self.keep]:
            del self.history[old]

    def take(self) -> Unroll:
        version = max(min(self.history), self.version - self.lags(self.taken))
        self.taken += 1
        self.network.load_state_dict(self.history[version])
        buf = self.collector.collect(lambda obs: sample_policy(self.network, self.generator, torch.as_tensor(obs)),
                                     lambda obs: self.network.value(torch.as_tensor(obs)).detach().numpy())
        stats, self.collector.stats = self.collector.stats, EpisodeStats()
        return Unroll.from_buffer(buf, self.collector.next_obs, version, stats)

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def close(self) -> None:
        pass
