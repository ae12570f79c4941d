"""``--agent dqn --backend ray``: Ray workers act and push transitions to the learner's replay server.

Each worker is a Ray actor owning a contiguous slice of the ``num_actors`` envs (seeded as the
in-process agent seeds them), a copy of the Q network and a
:class:`~echo_rl.distributed.client.ReplayClient` to the learner's
:class:`~echo_rl.distributed.server.ReplayServer` at the address it was handed: shared memory when
the server is on loopback (a local Ray), TCP with a shared secret when it listens on the node's IP
(``ray_address``: a cluster). The learner makes that secret and hands it to each worker as an argument
of its ``reset`` call (as it hands over the weights each iteration): an actor's constructor arguments
are kept by Ray's control store (GCS) for restarts, a method call's arguments go to the actor alone. Per iteration the learner sends the weights and epsilon once
(``ray.put``); the workers step their envs and stream every transition into the server while the
learner draws batches from it and trains — gradient steps follow the env steps the server has stored
(``train_frequency``) or the rate limiter (``samples_per_insert``) — and the learner collects the
workers' episode statistics at the end. Learning is the in-process :class:`DQNAgent`'s code.

Unlike the in-process agent, a run is not a function of its seed: when the learner draws depends on
how far the workers' writes have got. A checkpoint holds every worker's envs mid-episode (pickled,
signed by ``state_codec``), their restart counts and the replay's contents as the local agent's do.

Faults, as the on-policy backend (:mod:`ray_backend`: ``MAX_RESTARTS``, ``RESTART_TIMEOUT_S``,
``RESEED_STRIDE``): a worker that dies is restarted by Ray (``max_restarts``), re-seeded from (run
seed, slot, restart count) and re-connected with a fresh :class:`ReplayClient` (a new stream), then
asked for its iteration's env steps again. What the dead worker had handed the server stays stored
once (the server's exactly-once acks: nothing acknowledged is lost or stored twice); its transitions
not yet handed over and its unfinished episodes' statistics are lost. ``env_steps`` counts what the
server stored, so an iteration with a restart spans more env steps than ``steps_per_update``.
"""

from __future__ import annotations

import logging
import os
import pickle
import time

import numpy as np
import torch

from echo_rl.config import TrainingConfig
from echo_rl.distributed.client import ReplayClient
from echo_rl.vector.ray_backend import (MAX_RESTARTS, RESEED_STRIDE, RESTART_TIMEOUT_S, Slice, WorkerNotReady,
                                             check_ray_rollout_state, default_num_workers, reseed_restarted,
                                             restart_error, worker_slices, worker_states)
from echo_rl.distributed.ray_cluster import _init_ray, _ray
from echo_rl.environments.minigrid_vector import actor_seeds, make_vector_env
from echo_rl.vector.dqn_agent import DQNAgent, EpsilonGreedy, build_q_network
from echo_rl.vector.offpolicy_replay import ReplayFeed, rollout_transitions, transition_example
from echo_rl.vector.rollout import EpisodeStats, VectorRolloutCollector

log = logging.getLogger("echo_rl.ray_offpolicy")

POLL_S = 0.005  # how long the learner waits for workers when it owes no gradient step
ACK_COUNT_WAIT_S = 10.0  # how long the server's per-client counts may trail the acks workers saw


class DQNWorker:
    """One Ray actor: envs ``[part.start, part.stop)`` acting epsilon-greedily, writing to the replay server.

    Built unseeded and unconnected: :meth:`reset` seeds it and opens its writer, so a worker Ray
    restarted behind the learner's back refuses to collect (:class:`WorkerNotReady`) until re-seeded."""

    def __init__(self, config: TrainingConfig, part: Slice, address: str):
        torch.set_num_threads(max(1, config.torch_threads))
        self.config, self.part, self.address = config, part, address
        self.envs = make_vector_env(config.env_name, part.size, **config.env_config)
        space = self.envs.single_observation_space
        self.example = transition_example(tuple(space.shape), space.dtype)
        self.q = build_q_network(config, tuple(space.shape), space.dtype, int(self.envs.single_action_space.n))
        self.actor = EpsilonGreedy(self.q, int(self.envs.single_action_space.n), 0)  # seeded by reset()
        self.collector: VectorRolloutCollector | None = None
        self.writer = None
        self.token: int | None = None  # restart count it was seeded for; None until reset()

    def pid(self) -> int:
        return os.getpid()

    def reset(self, token: int, secret: str | None = None) -> None:
        """Seed the envs and the epsilon sampler for restart count ``token`` (0: the in-process agent's seeds
        for this slice) and connect a fresh writer: a new stream, so nothing of a predecessor's is resent.

        ``secret``: the replay server's shared secret, handed over here as a method argument (sent to this
        actor alone, kept nowhere) rather than to the constructor, whose arguments the GCS keeps."""
        seed = self.config.seed + RESEED_STRIDE * token
        self.actor.rng = np.random.default_rng(seed + 1 + 10_000 * self.part.start)
        seeds = actor_seeds(seed, self.config.num_actors)[self.part.start:self.part.stop]
        self.collector = VectorRolloutCollector(self.envs, 1, seeds, next_observations=True)
        if self.writer is not None:
            self.writer.close()
        client_id = f"ray-worker-{self.part.start}" + (f"-restart{token}" if token else "")
        self.writer = ReplayClient(self.address, self.example, client_id=client_id, secret=secret).connect()
        self.token = token

    def transport(self) -> str:
        return self.writer.transport

    def collect(self, weights: dict, epsilon: float, steps: int) -> dict:
        """``steps`` env steps of every env, each written to the server (acknowledged before returning)."""
        if self.token is None:
            raise WorkerNotReady("dqn worker was (re)started and not seeded yet")
        self.q.load_state_dict(weights)
        self.actor.epsilon = epsilon
        for _ in range(steps):
            self.writer.send_batch(rollout_transitions(self.collector.run(self.actor)))
        if not self.writer.flush(wait=True, timeout=60.0):
            raise RuntimeError("the replay server did not acknowledge this worker's transitions within 60s")
        stats, self.collector.stats = self.collector.stats, EpisodeStats()
        return {"returns": stats.returns, "lengths": stats.lengths, "successes": stats.successes,
                "client": self.writer.client_id, "acked": self.writer.acked}

    def rollout_state(self) -> bytes:
        return pickle.dumps({"collector": self.collector, "rng": self.actor.rng.bit_generator.state,
                             "token": self.token}, protocol=pickle.HIGHEST_PROTOCOL)

    def load_rollout_state(self, blob: bytes) -> None:
        state = pickle.loads(blob)  # from the driver, which took it Signed only (check_ray_rollout_state)
        self.envs.close()
        self.collector = state["collector"]
        self.envs = self.collector.envs
        self.actor.rng.bit_generator.state = state["rng"]
        self.token = state.get("token", 0)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.envs.close()


class RayDQNAgent(DQNAgent):
    """:class:`DQNAgent` whose actors are Ray workers; replay server and learner stay in this process."""

    def __init__(self, config: TrainingConfig, device: torch.device, num_workers: int | None = None,
                 max_restarts: int = MAX_RESTARTS, restart_timeout_s: float = RESTART_TIMEOUT_S):
        self.num_workers = num_workers or default_num_workers(config)
        self.slices = worker_slices(config.num_actors, self.num_workers)
        self.max_restarts, self.restart_timeout_s = max_restarts, restart_timeout_s
        self.tokens = [0] * self.num_workers  # restarts seen per worker
        self._ray_workers: list = []
        self._owns_ray = False
        probe = make_vector_env(config.env_name, config.num_actors, **config.env_config)  # spaces only
        super().__init__(config, probe, device)

    def make_feed(self) -> ReplayFeed:
        self._owns_ray = _init_ray(self.config, self.num_workers)
        host = "127.0.0.1" if self.config.ray_address is None else _ray().util.get_node_ip_address()
        return ReplayFeed(self.config, transition_example(self.obs_shape, self.obs_dtype), host=host)

    def start_acting(self, envs) -> None:
        envs.close()
        self.collector = None
        ray = _ray()
        worker = ray.remote(num_cpus=1, max_restarts=self.max_restarts, max_task_retries=0)(DQNWorker)
        self._ray_workers = [worker.remote(self.config, part, self.feed.address) for part in self.slices]
        # seeded and connected before the first iteration; the secret travels in the call, not the actor spec
        ray.get([w.reset.remote(0, self.feed.secret) for w in self._ray_workers])
        self._counted = self.feed.server.samples_added  # server samples already in env_steps

    @property
    def workers(self) -> list:
        """The Ray actor handles, in env order (tests kill them)."""
        return list(self._ray_workers)

    @property
    def restarts(self) -> int:
        return sum(self.tokens)

    def worker_pids(self) -> list[int]:
        return _ray().get([w.pid.remote() for w in self._ray_workers])

    def _count_stored(self) -> int:
        """Env steps the server stored since last counted (exactly once each), added to ``env_steps``."""
        now = self.feed.server.samples_added
        new, self._counted = now - self._counted, now
        self.env_steps += new
        return new

    def _restart(self, j: int, exc: BaseException, *collect_args):
        """Worker ``j`` failed: past ``max_restarts`` the one-line error, else re-seed its restarted actor
        (new envs' seeds, a fresh writer) and ask it for the iteration's env steps again."""
        if self.tokens[j] >= self.max_restarts:
            raise restart_error(j, self.slices[j], self.max_restarts, exc) from exc
        self.tokens[j] += 1
        log.warning("Ray dqn worker %d failed (%s); collecting its env steps again after restart %d",
                    j, type(exc).__name__, self.tokens[j])
        reseed_restarted(self._ray_workers[j], self.tokens[j], time.monotonic() + self.restart_timeout_s,
                         self.feed.secret)
        return self._ray_workers[j].collect.remote(*collect_args)

    def train_iteration(self) -> dict[str, float]:
        ray = _ray()
        failed = (ray.exceptions.RayActorError, WorkerNotReady)
        steps = max(1, self.config.steps_per_update // self.config.num_actors)  # per env
        collect_args = (ray.put({k: v.cpu() for k, v in self.q.state_dict().items()}), self.epsilon, steps)
        pending = {w.collect.remote(*collect_args): j for j, w in enumerate(self._ray_workers)}
        rows: list[dict[str, float]] = []
        results = []
        while pending:  # learn from what the workers have stored so far while they keep writing
            rows += self.learn_owed(self._count_stored(), timeout=POLL_S)
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0 if rows else POLL_S)
            for ref in done:
                j = pending.pop(ref)
                try:
                    results.append(ray.get(ref))
                except failed as exc:
                    pending[self._restart(j, exc, *collect_args)] = j
        # every result's writes are acknowledged; the server's per-client counts may trail its acks by a moment
        deadline = time.monotonic() + ACK_COUNT_WAIT_S
        while time.monotonic() < deadline:
            counts = self.feed.server.metrics()
            if all(counts.get(f"replay/client/{r['client']}/samples", 0) >= r["acked"] for r in results):
                break
            time.sleep(0.001)
        rows += self.learn_owed(self._count_stored(), timeout=POLL_S)
        stats = EpisodeStats()
        for r in results:
            for ret, length, success in zip(r["returns"], r["lengths"], r["successes"]):
                stats.add(ret, length, success)
        return {**stats.drain(), **self.iteration_metrics(rows), "ray/worker_restarts": float(self.restarts)}

    def rollout_state(self) -> dict:
        ray = _ray()
        return {"backend": "ray", "slices": [(s.start, s.stop) for s in self.slices],
                "workers": worker_states(ray.get([w.rollout_state.remote() for w in self._ray_workers])),
                "tokens": list(self.tokens), "replay_npz": self.feed.state()}

    def load_rollout_state(self, state) -> None:
        check_ray_rollout_state(state, self.slices)
        _ray().get([w.load_rollout_state.remote(b) for w, b in zip(self._ray_workers, state["workers"])])
        self.tokens = list(state.get("tokens", [0] * len(self.slices)))
        self.feed.load_state(state["replay_npz"])

    def close(self) -> None:
        ray = _ray()
        if self._ray_workers:
            try:
                ray.get([w.close.remote() for w in self._ray_workers], timeout=30)
            except Exception:  # a worker already gone: nothing of its to release
                pass
            for w in self._ray_workers:
                try:
                    ray.kill(w, no_restart=True)
                except Exception:
                    pass
            self._ray_workers = []
        if getattr(self, "feed", None) is not None:
            self.feed.close()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False


def build_ray_dqn(config: TrainingConfig, device, num_workers: int | None = None, **kwargs) -> RayDQNAgent:
    """The trainer's dqn agent with its actors as Ray workers (``echo_rl.training.agents.build_agent``)."""
    return RayDQNAgent(config, device, num_workers=num_workers, **kwargs)


__all__ = ["DQNWorker", "RayDQNAgent", "build_ray_dqn"]
