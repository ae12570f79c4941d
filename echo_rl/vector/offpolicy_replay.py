"""The off-policy learner's replay: a :class:`ReplayServer` it owns, fed by writers, sampled in process.

Why a service and not a list: the same path serves one process and a cluster. Actors (the
in-process collector, or Ray workers) write transitions with a
:class:`~echo_rl.distributed.client.ReplayClient` — shared memory on the server's host, TCP
elsewhere, exactly-once acks — and the learner draws batches from the server in its own process
(:meth:`ReplayServer.sample`: the buffer's gather, no further copy) and hands the new priorities
back (:meth:`ReplayServer.update_priorities`).

The buffer follows ``replay_config``: capacity ``min(hot_buffer_size + cold_buffer_size,
max_replay_age)``, ``sampler`` (prioritized / uniform / fifo), PER's proportional rule
``P(i) ∝ (|δ_i| + priority_epsilon)^priority_alpha`` (Schaul et al. 2016; the echo-rl agent's softmax
plan-surprise rule and hot/cold split are not used here), ``min_experiences`` before the first draw
and, with ``samples_per_insert``, a rate limiter (band ± ``rate_error_buffer``).

Checkpoints carry the buffer (its own ``save`` file as a uint8 array) when its storage is at most
:data:`REPLAY_CHECKPOINT_LIMIT` bytes; a larger replay is left out and a resumed run restarts it empty.
"""

from __future__ import annotations

import logging
import secrets
import tempfile
from pathlib import Path

import numpy as np

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.distributed.client import ReplayClient
from echo_rl.distributed.server import ReplayServer
from echo_rl.replay.buffer import PrioritizedReplayBuffer
from echo_rl.replay.rate_limiter import RateLimiter
from echo_rl.utils.jail import check_npz

log = logging.getLogger("echo_rl.offpolicy")

REPLAY_CHECKPOINT_LIMIT = 64 * 2**20  # bytes of replay storage a checkpoint carries at most


def transition_example(obs_shape: tuple, obs_dtype) -> dict:
    """One transition as stored: the schema every writer and the server agree on."""
    obs = np.zeros(obs_shape, dtype=obs_dtype)
    return {"obs": obs, "action": np.int64(0), "reward": np.float32(0), "next_obs": obs.copy(),
            "terminated": np.float32(0)}


def rollout_transitions(buf) -> dict:
    """A collector's ``RolloutBuffer`` (built with ``next_observations``) as a batch of T*N transitions,
    step-major. ``next_obs`` is ``final_obs`` where an episode ended; only termination cuts the bootstrap."""
    flat = lambda a: a.reshape(-1, *a.shape[2:])  # noqa: E731
    return {"obs": flat(buf.obs), "action": flat(buf.actions), "reward": flat(buf.rewards),
            "next_obs": flat(buf.next_observations), "terminated": flat(buf.terminated).astype(np.float32)}


def build_buffer(config: TrainingConfig, example: dict) -> PrioritizedReplayBuffer:
    rc = config.replay_config
    capacity = min(rc.hot_buffer_size + rc.cold_buffer_size, rc.max_replay_age)
    limiter = None
    if rc.samples_per_insert is not None:
        need = config.dqn_config.minibatch_size + config.num_actors * rc.samples_per_insert
        if 2 * rc.rate_error_buffer < need:
            raise ConfigError(f"ReplayConfig.rate_error_buffer={rc.rate_error_buffer:g} is invalid: the band "
                              f"(2 x {rc.rate_error_buffer:g}) must hold one draw of minibatch_size plus one env step "
                              f"of every actor (>= {need:g}), or actors and learner wait on each other forever")
        limiter = RateLimiter.sample_to_insert_ratio(rc.samples_per_insert, rc.min_experiences,
                                                     rc.rate_error_buffer)
    return PrioritizedReplayBuffer(capacity, mode="proportional", alpha=rc.priority_alpha,
                                   beta=rc.importance_sampling_beta, priority_epsilon=rc.priority_epsilon,
                                   min_experiences=rc.min_experiences, example=example, seed=config.seed + 3,
                                   sampler=rc.sampler, rate_limiter=limiter)


class ReplayFeed:
    """The learner's replay server and its writers' settings. ``host``: where writers reach it (loopback:
    shared-memory rings; a node IP for a cluster, then with a shared secret over TCP)."""

    def __init__(self, config: TrainingConfig, example: dict, host: str = "127.0.0.1"):
        self.example = example
        self.buffer = build_buffer(config, example)
        self.secret = None if host in ("127.0.0.1", "localhost", "::1") else secrets.token_hex(16)
        self.server = ReplayServer(self.buffer, host=host, port=0, secret=self.secret,
                                   idle_timeout=None).start()

    @property
    def address(self) -> str:
        host, port = self.server.address
        return f"{host}:{port}"

    def writer(self, client_id: str) -> ReplayClient:
        return ReplayClient(self.address, self.example, client_id=client_id, secret=self.secret).connect()

    # -- checkpoints ----------------------------------------------------------------
    @property
    def checkpointable(self) -> bool:
        return sum(leaf.nbytes for leaf in self.buffer._storage) <= REPLAY_CHECKPOINT_LIMIT

    def state(self) -> np.ndarray | None:
        """The buffer's own save file as uint8 (None when larger than the limit: resumed runs start empty)."""
        if not self.checkpointable:
            log.warning("replay storage exceeds %d MiB: the checkpoint leaves it out and a resumed run restarts "
                        "the replay empty", REPLAY_CHECKPOINT_LIMIT >> 20)
            return None
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "replay.npz"
            self.server.checkpoint(path)
            return np.frombuffer(path.read_bytes(), dtype=np.uint8).copy()

    def load_state(self, blob: np.ndarray | None) -> None:
        """Restore :meth:`state` (before any writer sends); None leaves the replay empty."""
        if blob is None:
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "replay.npz"
            data = np.asarray(blob, dtype=np.uint8).tobytes()
            check_npz(data, where="the checkpoint's replay")  # from a run directory: checked before it inflates
            path.write_bytes(data)
            self.buffer.load(path)

    def close(self) -> None:
        self.server.close()


__all__ = ["REPLAY_CHECKPOINT_LIMIT", "ReplayFeed", "build_buffer", "rollout_transitions", "transition_example"]
