"""Token trajectories in the hot/cold prioritized replay buffer, with staleness bounded by policy version.

The buffer stores fixed-shape records, so a trajectory is padded to
``max_len`` tokens and ``max_turns`` rewards and restored exactly on the way
out. The GRPO advantage is computed from the whole group when the group is
added and stored with each member: a sample of the buffer rarely holds a
whole group. Samples from a policy more than ``max_staleness`` versions old
are dropped on sampling (their priority set to 0 so they are not drawn again)
rather than trained on; and before each draw every stored sample that has
become too old is expired the same way (the buffer keeps each id's policy
version), so draws are not wasted on them. A record also keeps what the learner needs besides
the tokens: the actor's plan noise ε per turn (latent plans) and whether the
episode was cut by a time limit (PPO-RLHF bootstraps those).
"""

from __future__ import annotations

import os
import tempfile
from typing import Sequence

import numpy as np

from echo_rl.config import ReplayConfig
from echo_rl.replay import HotColdBuffer
from echo_rl.types import TokenTrajectory


def trajectory_record(traj: TokenTrajectory, advantage: float, max_len: int, max_turns: int,
                      plan_dim: int = 0) -> dict:
    n, k = len(traj), traj.num_turns
    if n > max_len or k > max_turns:
        raise ValueError(f"trajectory has {n} tokens / {k} turns; the replay holds at most max_len={max_len} "
                         f"tokens and max_turns={max_turns} turns")
    ids = np.zeros(max_len, np.int64)
    ids[:n] = traj.token_ids
    roles = np.zeros(max_len, np.int8)
    roles[:n] = traj.roles
    blp = np.zeros(max_len, np.float32)
    blp[:n] = traj.behavior_logprobs
    rewards = np.zeros(max_turns, np.float32)
    rewards[:k] = traj.rewards
    scalars = dict(length=n, num_turns=k, prompt_length=traj.prompt_length, env_output_count=traj.env_output_count,
                   group_id=traj.group_id, episode_id=traj.episode_id, policy_version=traj.policy_version)
    rec = {"token_ids": ids, "roles": roles, "behavior_logprobs": blp, "rewards": rewards,
           "advantage": np.asarray(advantage, np.float32),
           "truncated": np.asarray(bool(traj.info.get("truncated")), np.int8),
           **{name: np.asarray(v, np.int64) for name, v in scalars.items()}}
    if plan_dim:
        eps = traj.info.get("plan_eps")
        if eps is None:
            raise ValueError(f"trajectory {traj.episode_id} has no info['plan_eps']; this replay stores plans "
                             f"(plan_dim={plan_dim})")
        eps = np.asarray(eps, np.float32)
        if eps.shape != (k, plan_dim):
            raise ValueError(f"info['plan_eps'] has shape {eps.shape}; expected ({k}, {plan_dim})")
        rec["plan_eps"] = np.zeros((max_turns, plan_dim), np.float32)
        rec["plan_eps"][:k] = eps
    return rec


def record_trajectory(rec: dict, i: int) -> tuple[TokenTrajectory, float]:
    """Row ``i`` of a batched record back to a trajectory and its stored advantage."""
    n, k = int(rec["length"][i]), int(rec["num_turns"][i])
    traj = TokenTrajectory([int(x) for x in rec["token_ids"][i, :n]], [int(x) for x in rec["roles"][i, :n]],
                           [float(x) for x in rec["behavior_logprobs"][i, :n]],
                           [float(x) for x in rec["rewards"][i, :k]], int(rec["prompt_length"][i]),
                           int(rec["env_output_count"][i]), group_id=int(rec["group_id"][i]),
                           episode_id=int(rec["episode_id"][i]), policy_version=int(rec["policy_version"][i]),
                           info={"truncated": True} if rec["truncated"][i] else {})
    if "plan_eps" in rec:
        traj.info["plan_eps"] = np.array(rec["plan_eps"][i, :k], np.float32)
    return traj, float(rec["advantage"][i])


class TrajectoryReplay:
    """A :class:`HotColdBuffer` of token trajectories (proportional priorities recommended)."""

    def __init__(self, config: ReplayConfig, *, max_len: int, max_turns: int = 64, seed: int | None = None,
                 plan_dim: int = 0) -> None:
        if max_len < 1 or max_turns < 1 or plan_dim < 0:
            raise ValueError(f"max_len={max_len}, max_turns={max_turns}, plan_dim={plan_dim} are invalid: "
                             "must be >= 1, >= 1, >= 0")
        self.buffer = HotColdBuffer(config, seed=seed)
        self.max_len, self.max_turns, self.plan_dim = max_len, max_turns, plan_dim
        self.dropped_stale = 0   # drawn, found too old, not returned
        self.expired = 0         # found too old before a draw, priority set to 0
        self._live: dict[int, int] = {}  # id -> policy version of samples not expired yet

    def fits(self, traj: TokenTrajectory) -> bool:
        return len(traj) <= self.max_len and traj.num_turns <= self.max_turns

    def __len__(self) -> int:
        return len(self.buffer)

    def add(self, trajectories: Sequence[TokenTrajectory], advantages: Sequence[float],
            priorities: Sequence[float] | None = None) -> np.ndarray:
        if len(trajectories) != len(advantages):
            raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantages")
        recs = [trajectory_record(t, a, self.max_len, self.max_turns, self.plan_dim)
                for t, a in zip(trajectories, advantages)]
        batch = {k: np.stack([r[k] for r in recs]) for k in recs[0]}
        ids = self.buffer.add(batch, None if priorities is None else np.asarray(priorities, np.float64))
        self._live.update(zip((int(i) for i in ids), (t.policy_version for t in trajectories)))
        return ids

    def expire(self, current_version: int, max_staleness: int) -> int:
        """Priority 0 for every stored sample more than ``max_staleness`` versions old; how many were expired."""
        oldest = self.buffer.ids_issued - self.buffer.capacity  # ids below it are evicted already
        stale = [i for i, v in self._live.items() if current_version - v > max_staleness and i >= oldest]
        for i in [i for i, v in self._live.items() if current_version - v > max_staleness or i < oldest]:
            del self._live[i]
        if stale:
            self.buffer.update_priorities(np.asarray(stale, np.int64), np.zeros(len(stale)))
            self.expired += len(stale)
        return len(stale)

    def sample(self, n: int, *, current_version: int, max_staleness: int
               ) -> tuple[list[TokenTrajectory], np.ndarray, np.ndarray, np.ndarray]:
        """(trajectories, advantages, importance weights, indices) of the fresh samples among ``n`` drawn."""
        self.expire(current_version, max_staleness)
        batch = self.buffer.sample(n)
        trajs, advs, keep = [], [], []
        stale = []
        for i in range(len(batch.indices)):
            if current_version - int(batch.data["policy_version"][i]) > max_staleness:
                stale.append(batch.indices[i])
                continue
            t, a = record_trajectory(batch.data, i)
            trajs.append(t)
            advs.append(a)
            keep.append(i)
        if stale:
            self.buffer.update_priorities(np.asarray(stale), np.zeros(len(stale)))
            self.dropped_stale += len(stale)
        keep_idx = np.asarray(keep, dtype=np.int64)
        return (trajs, np.asarray(advs, np.float32), np.asarray(batch.weights)[keep_idx],
                np.asarray(batch.indices)[keep_idx])

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        self.buffer.update_priorities(np.asarray(indices), np.asarray(priorities, np.float64))

    def to_bytes(self) -> bytes:
        """Contents, priorities and sampling state (the buffer's own exact ``save`` file) for a checkpoint."""
        fd, path = tempfile.mkstemp(suffix=".npz")
        os.close(fd)
        try:
            self.buffer.save(path)
            with open(path, "rb") as fh:
                return fh.read()
        finally:
            os.unlink(path)

    def load_bytes(self, data: bytes) -> None:
        fd, path = tempfile.mkstemp(suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            self.buffer.load(path)
        finally:
            os.unlink(path)

    def state(self) -> dict:
        """Everything a resumed run needs to sample exactly as this one would (picklable)."""
        return {"replay_npz": self.to_bytes(), "dropped_stale": self.dropped_stale, "expired": self.expired,
                "live_ids": np.fromiter(self._live, np.int64, len(self._live)),
                "live_versions": np.fromiter(self._live.values(), np.int64, len(self._live))}

    def load_state(self, state: dict) -> None:
        self.load_bytes(state["replay_npz"])
        self.dropped_stale, self.expired = int(state["dropped_stale"]), int(state["expired"])
        self._live = dict(zip(state["live_ids"].tolist(), state["live_versions"].tolist()))
