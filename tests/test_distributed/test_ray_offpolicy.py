"""--agent dqn --backend ray: Ray workers push every transition to the learner's replay server while it learns."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import threading
import time

import pytest
import torch

from echo_rl.config import TrainingConfig
from echo_rl.training.agents import build_agent

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed: pip install 'echo-rl[distributed]'")
CPU = torch.device("cpu")



def ray_config(**changes) -> TrainingConfig:
    base = dict(env_name="minigrid:MiniGrid-Empty-5x5-v0", agent="dqn", backend="ray", num_actors=4,
                ray_num_workers=2, batch_size=128, total_timesteps=4096, seed=1, learning_starts=64)
    return TrainingConfig(**{**base, **changes}).with_overrides(
        {"replay_config.min_experiences": 64, "dqn_config.minibatch_size": 16})


def test_a_restarted_worker_is_reseeded_from_run_seed_slot_and_restart_count():
    """Restart 0 gives the slice the in-process env seeds; restart t the same seeds + RESEED_STRIDE·t, every time."""
    import numpy as np

    from echo_rl.vector.ray_backend import RESEED_STRIDE, WorkerNotReady, worker_slices
    from echo_rl.vector.ray_offpolicy import DQNWorker
    from echo_rl.environments.minigrid_vector import actor_seeds, make_vector_env
    from echo_rl.vector.offpolicy_replay import ReplayFeed, transition_example
    from echo_rl.vector.rollout import VectorRolloutCollector

    cfg = ray_config(env_name="minigrid:MiniGrid-DoorKey-5x5-v0")  # random layouts: observations show the seed
    probe = make_vector_env(cfg.env_name, 4)
    space = probe.single_observation_space
    feed = ReplayFeed(cfg, transition_example(tuple(space.shape), space.dtype))
    part = worker_slices(4, 2)[1]

    def started(token: int):
        worker = DQNWorker(cfg, part, feed.address)
        try:
            worker.reset(token)
            return worker.collector.next_obs.copy(), int(worker.actor.rng.integers(1 << 30)), worker.writer.client_id
        finally:
            worker.close()

    try:
        local = VectorRolloutCollector(probe, 1, actor_seeds(cfg.seed, 4)).next_obs[2:4]
        first, again, other = started(1), started(1), started(0)
        assert np.array_equal(other[0], local) and other[2] == "ray-worker-2"
        assert np.array_equal(first[0], again[0]) and first[1] == again[1]
        assert not np.array_equal(first[0], other[0]) and first[1] != other[1]
        shifted = VectorRolloutCollector(probe, 1, actor_seeds(cfg.seed + RESEED_STRIDE, 4)).next_obs[2:4]
        assert np.array_equal(first[0], shifted) and first[2] == "ray-worker-2-restart1"
        unseeded = DQNWorker(cfg, part, feed.address)  # as Ray restarts it, before the learner re-seeds it
        try:
            with pytest.raises(WorkerNotReady, match="not seeded"):
                unseeded.collect({}, 1.0, 1)
        finally:
            unseeded.close()
    finally:
        probe.close()
        feed.close()


def _secret_feed(cfg):
    """The learner's feed as on a cluster: listening off 127.0.0.1 (127.0.0.2, still this host), so with a secret."""
    from echo_rl.environments.minigrid_vector import make_vector_env
    from echo_rl.vector.offpolicy_replay import ReplayFeed, transition_example

    probe = make_vector_env(cfg.env_name, 1)
    space = probe.single_observation_space
    probe.close()
    return ReplayFeed(cfg, transition_example(tuple(space.shape), space.dtype), host="127.0.0.2")


def test_a_worker_connects_with_the_secret_its_reset_call_hands_it():
    from echo_rl.distributed import ReplayServerError
    from echo_rl.vector.ray_backend import worker_slices
    from echo_rl.vector.ray_offpolicy import DQNWorker

    cfg = ray_config()
    feed = _secret_feed(cfg)
    worker = DQNWorker(cfg, worker_slices(4, 2)[0], feed.address)
    try:
        assert feed.secret
        with pytest.raises(ReplayServerError, match="requires a shared secret"):
            worker.reset(0)
        with pytest.raises(ReplayServerError, match="wrong shared secret"):
            worker.reset(0, "0" * 32)
        worker.reset(0, feed.secret)
        assert worker.transport() == "tcp"
    finally:
        worker.close()
        feed.close()


@needs_ray
def test_ray_workers_get_the_secret_in_a_call_not_their_creation_args(local_ray, monkeypatch):
    """A Ray actor's constructor arguments stay in the GCS; the workers' hold no secret, yet they write."""
    from dist_helpers import holds, spy_actor_creation

    from echo_rl.vector.ray_offpolicy import RayDQNAgent

    class ClusterFeedAgent(RayDQNAgent):
        def make_feed(self):
            self._owns_ray = False
            return _secret_feed(self.config)

    created = spy_actor_creation(monkeypatch, local_ray)
    agent = ClusterFeedAgent(ray_config(), CPU)
    try:
        assert agent.feed.secret and [c[0] for c in created] == ["DQNWorker", "DQNWorker"]
        assert not any(holds((args, kwargs), agent.feed.secret) for _, args, kwargs in created)
        assert local_ray.get([w.transport.remote() for w in agent.workers]) == ["tcp", "tcp"]
        agent.train_iteration()
        assert agent.env_steps == agent.feed.server.samples_added == 128
    finally:
        agent.close()


@needs_ray
def test_ray_workers_write_every_env_step_to_the_server_and_the_learner_trains(local_ray):
    from echo_rl.vector.ray_offpolicy import RayDQNAgent

    agent = build_agent(ray_config(), CPU)
    try:
        assert isinstance(agent, RayDQNAgent) and len(agent.workers) == 2
        assert local_ray.get([w.transport.remote() for w in agent.workers]) == ["shm", "shm"]
        before = {k: v.clone() for k, v in agent.q.state_dict().items()}
        for _ in range(3):
            metrics = agent.train_iteration()
        assert agent.env_steps == agent.feed.server.samples_added == 3 * 128
        clients = {k for k in agent.feed.server.metrics() if k.endswith("/samples")}
        assert len(clients) == 2  # one stream per worker
        assert agent.updates > 0 and metrics["loss/minibatches"] > 0
        assert any(not torch.equal(v, before[k]) for k, v in agent.q.state_dict().items())
        state = agent.rollout_state()
        assert state["backend"] == "ray" and len(state["workers"]) == 2 and state["replay_npz"] is not None
        assert state["tokens"] == [0, 0]
        agent.tokens = [3, 3]
        agent.load_rollout_state(state)  # envs, samplers and restart counts come back; the workers act on
        assert agent.tokens == [0, 0] and agent.train_iteration()["ray/worker_restarts"] == 0.0
    finally:
        agent.close()


@needs_ray
def test_ray_learner_draws_as_the_rate_limiter_allows_while_workers_write(local_ray):
    config = ray_config().with_overrides({"replay_config.samples_per_insert": 2.0,
                                          "replay_config.rate_error_buffer": 64.0})
    agent = build_agent(config, CPU)
    try:
        for _ in range(2):
            agent.train_iteration()
        limiter = agent.feed.buffer.rate_limiter
        assert limiter.inserts == agent.env_steps == 2 * 128
        # inserts wait for draws and draws for inserts: samples stay within the band around 2 per insert
        assert limiter.inserts * 2.0 - limiter.samples <= 64 + 2 * 4
        assert agent.updates == limiter.samples // 16 > 0
    finally:
        agent.close()


@needs_ray
def test_a_worker_killed_mid_run_is_restarted_and_the_run_finishes_its_budget(local_ray, tmp_path):
    """SIGKILL worker 1 while it writes: Ray restarts it, it is re-seeded and reconnected with a new stream,
    and the run ends on budget with every stored transition counted once (no acknowledged one resent)."""
    from echo_rl.training.trainer import EchoRLTrainer

    cfg = ray_config(batch_size=1024, total_timesteps=4096, evaluation_frequency=0, save_frequency=0,
                     evaluation_episodes=2)
    trainer = EchoRLTrainer(cfg, run_dir=tmp_path / "run", show_progress=False)
    per_iteration = 1024 // 2  # each worker: 256 steps of its 2 envs per iteration
    killed: dict = {}

    def killer():
        deadline = time.monotonic() + 50
        while trainer.agent is None and time.monotonic() < deadline:
            time.sleep(0.01)
        agent = trainer.agent
        pid = local_ray.get(agent.workers[1].pid.remote())
        while time.monotonic() < deadline:  # in its second iteration's writes
            if agent.feed.server.metrics().get("replay/client/ray-worker-2/samples", 0) >= per_iteration + 64:
                os.kill(pid, signal.SIGKILL)
                killed["pid"] = pid
                return
            time.sleep(0.001)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    result = asyncio.run(trainer.train())
    thread.join(timeout=5)
    agent = trainer.agent
    try:
        assert "pid" in killed and not result.interrupted
        assert agent.restarts == 1 and agent.tokens == [0, 1]  # the trainer has closed the workers by now
        server = agent.feed.server
        counts = {k.split("/")[2]: v for k, v in server.metrics().items() if k.startswith("replay/client/")
                  and k.endswith("/samples")}
        dups = [v for k, v in server.metrics().items() if k.endswith("/duplicates")]
        # every collect call stores exactly its 512 transitions; the dead stream keeps what it handed over
        # (m whole iterations and k of the one it died in), the restarted stream starts that iteration afresh
        iterations = agent.env_steps // 1024
        m, k = divmod(counts["ray-worker-2"], per_iteration)
        assert m >= 1 and counts["ray-worker-0"] == per_iteration * iterations
        assert counts["ray-worker-2-restart1"] == per_iteration * (iterations - m)
        assert agent.env_steps == 1024 * iterations + k
        assert sum(counts.values()) == server.samples_added == agent.env_steps == len(agent.feed.buffer)
        assert dups and not any(dups)
        assert result.total_timesteps == agent.env_steps >= cfg.total_timesteps
        rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [r["ray/worker_restarts"] for r in rows if "ray/worker_restarts" in r][-1] == 1.0
    finally:
        agent.close()


@needs_ray
def test_a_worker_past_its_restart_limit_stops_the_run_with_a_one_line_error(local_ray):
    from echo_rl.vector.ray_offpolicy import build_ray_dqn

    agent = build_ray_dqn(ray_config(), CPU, max_restarts=0)
    try:
        agent.train_iteration()
        local_ray.kill(agent.workers[1], no_restart=True)
        with pytest.raises(RuntimeError) as info:
            agent.train_iteration()
        message = str(info.value)
        assert "\n" not in message, message
        assert re.fullmatch(r"Ray worker 1 \(envs 2-3\) failed and was not restarted \(max_restarts=0\): \w+Error",
                            message), message
        assert isinstance(info.value.__cause__, local_ray.exceptions.RayActorError)
    finally:
        agent.close()
