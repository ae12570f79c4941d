"""``--agent dqn --backend ray``: Ray workers act and push transitions to the learner's replay server.

Each worker is a Ray actor owning a contiguous slice of the ``num_actors`` envs (seeded as the
in-process agent seeds them), a copy of the Q network and a
:class:`~echo_rl.distributed.client.ReplayClient` to the learner's
:class:`~echo_rl.distributed.server.ReplayServer` at the address it was handed: shared memory when
the server is on loopback (a local Ray), TCP with a shared secret when it listens on the node's IP
(``ray_address``: a cluster). Per iteration the learner sends the weights and epsilon once
(``ray.put``); the workers step their envs and stream every transition into the server while the
learner draws batches from it and trains — gradient steps follow the env steps the server has stored
(``train_frequency``) or the rate limiter (``samples_per_insert``) — and the learner collects the
workers' episode statistics at the end. Learning is the in-process :class:`DQNAgent`'s code.

Unlike the in-process agent, a run is not a function of its seed: when the learner draws depends on
how far the workers' writes have got. A checkpoint holds every worker's envs mid-episode (pickled,
signed by ``state_codec``) and the replay's contents as the local agent's do.
"""

from __future__ import annotations

import os
import pickle
import time

import torch

from echo_rl.config import TrainingConfig
from echo_rl.distributed.ray_backend import Slice, check_ray_rollout_state, default_num_workers, worker_slices
from echo_rl.distributed.ray_cluster import _init_ray, _ray
from echo_rl.environments.minigrid_vector import actor_seeds, make_vector_env
from echo_rl.training.dqn_agent import DQNAgent, EpsilonGreedy, build_q_network
from echo_rl.training.offpolicy_replay import ReplayFeed, rollout_transitions, transition_example
from echo_rl.training.rollout import EpisodeStats, VectorRolloutCollector

POLL_S = 0.005  # how long the learner waits for workers when it owes no gradient step


class DQNWorker:
    """One Ray actor: envs ``[part.start, part.stop)`` acting epsilon-greedily, writing to the replay server."""

    def __init__(self, config: TrainingConfig, part: Slice, address: str, secret: str | None):
        from echo_rl.distributed.client import ReplayClient

        torch.set_num_threads(max(1, config.torch_threads))
        envs = make_vector_env(config.env_name, part.size, **config.env_config)
        space = envs.single_observation_space
        self.q = build_q_network(config, tuple(space.shape), space.dtype, int(envs.single_action_space.n))
        self.actor = EpsilonGreedy(self.q, int(envs.single_action_space.n), config.seed + 1 + 10_000 * part.start)
        seeds = actor_seeds(config.seed, config.num_actors)[part.start:part.stop]
        self.collector = VectorRolloutCollector(envs, 1, seeds, next_observations=True)
        self.writer = ReplayClient(address, transition_example(tuple(space.shape), space.dtype),
                                   client_id=f"ray-worker-{part.start}", secret=secret).connect()

    def pid(self) -> int:
        return os.getpid()

    def transport(self) -> str:
        return self.writer.transport

    def collect(self, weights: dict, epsilon: float, steps: int) -> dict:
        """``steps`` env steps of every env, each written to the server (acknowledged before returning)."""
        self.q.load_state_dict(weights)
        self.actor.epsilon = epsilon
        for _ in range(steps):
            self.writer.send_batch(rollout_transitions(self.collector.run(self.actor)))
        if not self.writer.flush(wait=True, timeout=60.0):
            raise RuntimeError("the replay server did not acknowledge this worker's transitions within 60s")
        stats, self.collector.stats = self.collector.stats, EpisodeStats()
        return {"returns": stats.returns, "lengths": stats.lengths, "successes": stats.successes}

    def rollout_state(self) -> bytes:
        return pickle.dumps({"collector": self.collector, "rng": self.actor.rng.bit_generator.state},
                            protocol=pickle.HIGHEST_PROTOCOL)

    def load_rollout_state(self, blob: bytes) -> None:
        state = pickle.loads(blob)
        self.collector.envs.close()
        self.collector = state["collector"]
        self.actor.rng.bit_generator.state = state["rng"]

    def close(self) -> None:
        self.writer.close()
        self.collector.envs.close()


class RayDQNAgent(DQNAgent):
    """:class:`DQNAgent` whose actors are Ray workers; replay server and learner stay in this process."""

    def __init__(self, config: TrainingConfig, device: torch.device, num_workers: int | None = None):
        self.num_workers = num_workers or default_num_workers(config)
        self.slices = worker_slices(config.num_actors, self.num_workers)
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
        worker = ray.remote(num_cpus=1, max_restarts=0)(DQNWorker)
        self._ray_workers = [worker.remote(self.config, part, self.feed.address, self.feed.secret)
                             for part in self.slices]
        ray.get([w.pid.remote() for w in self._ray_workers])  # built (and connected) before the first iteration

    @property
    def workers(self) -> list:
        return list(self._ray_workers)

    def train_iteration(self) -> dict[str, float]:
        ray = _ray()
        steps = max(1, self.config.steps_per_update // self.config.num_actors)  # per env
        weights = ray.put({k: v.cpu() for k, v in self.q.state_dict().items()})
        server = self.feed.server
        stored = first = server.samples_added
        pending = [w.collect.remote(weights, self.epsilon, steps) for w in self._ray_workers]
        rows: list[dict[str, float]] = []
        results = []
        while pending:  # learn from what the workers have stored so far while they keep writing
            now = server.samples_added
            new, stored = now - stored, now
            self.env_steps += new
            rows += self.learn_owed(new, timeout=POLL_S)
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0 if rows else POLL_S)
            results += ray.get(done)
        # every worker's writes are acknowledged; the server's count of them may trail its acks by a moment
        end = first + steps * self.config.num_actors
        deadline = time.monotonic() + 10.0
        while server.samples_added < end and time.monotonic() < deadline:
            time.sleep(0.001)
        self.env_steps += end - stored
        rows += self.learn_owed(end - stored, timeout=POLL_S)
        stats = EpisodeStats()
        for r in results:
            for ret, length, success in zip(r["returns"], r["lengths"], r["successes"]):
                stats.add(ret, length, success)
        return {**stats.drain(), **self.iteration_metrics(rows)}

    def rollout_state(self) -> dict:
        ray = _ray()
        return {"backend": "ray", "slices": [(s.start, s.stop) for s in self.slices],
                "workers": ray.get([w.rollout_state.remote() for w in self._ray_workers]),
                "replay_npz": self.feed.state()}

    def load_rollout_state(self, state) -> None:
        check_ray_rollout_state(state, self.slices)
        _ray().get([w.load_rollout_state.remote(b) for w, b in zip(self._ray_workers, state["workers"])])
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


def build_ray_dqn(config: TrainingConfig, device, num_workers: int | None = None) -> RayDQNAgent:
    """The trainer's dqn agent with its actors as Ray workers (``echo_rl.training.agents.build_agent``)."""
    return RayDQNAgent(config, device, num_workers=num_workers)


__all__ = ["DQNWorker", "RayDQNAgent", "build_ray_dqn"]
