"""Ray backend: rollouts from Ray actors, PPO's learner, restarts of failed actors, resume."""

from __future__ import annotations

import copy
import importlib.util
import ipaddress
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.vector.ray_backend import build_ray_agent, default_num_workers, worker_slices
from echo_rl.environments.minigrid_vector import make_vector_env
from echo_rl.vector.ppo_agent import PPOAgent

DOORKEY = "minigrid:MiniGrid-DoorKey-5x5-v0"
CPU = torch.device("cpu")


def small_config(**changes) -> TrainingConfig:
    base = dict(env_name=DOORKEY, num_actors=4, batch_size=256, total_timesteps=4096, seed=3, backend="ray")
    return TrainingConfig(**{**base, **changes})


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- without Ray ------------------------------------------------------------------------------------

def test_worker_slices_cover_the_envs_in_order():
    parts = worker_slices(16, 3)
    assert [(p.start, p.stop) for p in parts] == [(0, 5), (5, 11), (11, 16)]
    assert [(p.start, p.stop) for p in worker_slices(4, 4)] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ConfigError, match="num_actors=2"):
        worker_slices(2, 3)
    assert default_num_workers(small_config(num_actors=16, batch_size=2048)) == 2
    assert default_num_workers(small_config(num_actors=4)) == 1
    assert default_num_workers(small_config(num_actors=4, ray_num_workers=4)) == 4
    with pytest.raises(ConfigError, match="ray_num_workers=5 is invalid: must be between 1 and num_actors=4"):
        small_config(num_actors=4, ray_num_workers=5)


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'echo-rl\[distributed\]'"):
        build_ray_agent(small_config(), CPU)


def test_agents_without_an_acting_half_are_refused_on_ray(monkeypatch):
    from echo_rl.training import agents

    monkeypatch.setitem(agents.AGENTS, "ppo", "echo_rl.training.protocol:VectorAgentBase")
    with pytest.raises(ConfigError, match="agent='ppo' is not supported with backend=ray yet; "
                                          "allowed: echo-rl, impala$"):
        build_ray_agent(small_config(), CPU)


# -- with a local Ray -------------------------------------------------------------------------------

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed: pip install 'echo-rl[distributed]'")



@needs_ray
def test_local_ray_listens_on_loopback_only(local_ray):
    ours = {str(os.getpid())}
    try:
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    except (FileNotFoundError, subprocess.CalledProcessError):
        pytest.skip("ss is not available to list listening sockets")
    ray_lines = [line for line in out.splitlines()
                 if any(name in line for name in ("raylet", "gcs_server", "ray::", "ray_"))
                 or any(f"pid={pid}," in line for pid in ours)]
    assert ray_lines, "found no listening Ray socket to check"
    public = [line for line in ray_lines if not is_loopback(line.split()[3])]
    assert not public, public


def is_loopback(address: str) -> bool:
    """``127.0.0.1:5``, ``[::1]:5``, ``[::ffff:127.0.0.1]:5`` -> True; ``*:5``, ``0.0.0.0:5`` -> False."""
    host = address.rsplit(":", 1)[0].strip("[]").split("%")[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


@needs_ray
@pytest.mark.parametrize("task", [DOORKEY, "Pendulum-v1", "CartPole-v1"])
def test_one_worker_reproduces_the_in_process_run(local_ray, task):
    """Same seeds, same sampler, PPO's own update: a 1-worker Ray run is the local run — on any vector task,
    PPO's Box actions (a DiagGaussian) included."""
    cfg = small_config(env_name=task)
    local = PPOAgent(cfg.replace(backend="local"), make_vector_env(task, cfg.num_actors), CPU)
    remote = build_ray_agent(cfg, CPU, num_workers=1)
    try:
        for _ in range(3):
            a, b = local.train_iteration(), remote.train_iteration()
            assert a["loss/policy"] == b["loss/policy"]
        assert remote.env_steps == local.env_steps == 3 * cfg.batch_size
        assert same_weights(local.state_dict()["network"], remote.state_dict()["network"])
    finally:
        remote.close()
        local.close()


@needs_ray
def test_impala_on_one_worker_reproduces_the_in_process_run(local_ray):
    from echo_rl.vector.impala_agent import IMPALAAgent

    cfg = small_config(agent="impala")
    local = IMPALAAgent(cfg.replace(backend="local"), make_vector_env(DOORKEY, cfg.num_actors), CPU)
    remote = build_ray_agent(cfg, CPU, num_workers=1)
    try:
        assert isinstance(remote, IMPALAAgent) and type(remote).__name__ == "RayIMPALAAgent"
        for _ in range(2):
            local.train_iteration(), remote.train_iteration()
        assert same_weights(local.state_dict()["network"], remote.state_dict()["network"])
    finally:
        remote.close()
        local.close()


@needs_ray
def test_two_workers_collect_what_their_slices_collect_in_process(local_ray):
    """Per update, the joined batch is each slice's rollout with the learner's current weights, in env order."""
    from echo_rl.vector.ray_backend import ROLLOUT_FIELDS, RolloutWorker

    cfg = small_config()
    remote = build_ray_agent(cfg, CPU, num_workers=2)
    twins = [RolloutWorker(cfg, part) for part in worker_slices(cfg.num_actors, 2)]
    try:
        for twin in twins:
            twin.reset(0)
        for version in range(3):
            weights = copy.deepcopy(remote.network.state_dict())
            remote.train_iteration()
            outs = [twin.collect(weights, version) for twin in twins]
            for name in ROLLOUT_FIELDS:
                joined = np.concatenate([out[name] for out in outs], axis=1)
                np.testing.assert_array_equal(getattr(remote.collector.buffer, name), joined, err_msg=name)
        assert remote.updates == 3
    finally:
        for twin in twins:
            twin.close()
        remote.close()


@pytest.mark.slow  # ~21 s at load average ~9 (starts 4 worker processes)
@needs_ray
def test_killed_actors_are_restarted_and_their_slices_recollected(local_ray):
    cfg = small_config()
    agent = build_ray_agent(cfg, CPU, num_workers=2)
    try:
        agent.train_iteration()
        old = agent.collector.worker_pids()
        os.kill(old[1], signal.SIGKILL)  # a crash while idle
        row = agent.train_iteration()
        assert row["ray/worker_restarts"] == 1.0
        local_ray.kill(agent.workers[0], no_restart=False)  # Ray's own kill, restart allowed
        row = agent.train_iteration()
        assert row["ray/worker_restarts"] == 2.0
        assert agent.env_steps == 3 * cfg.batch_size and agent.updates == 3
        new = agent.collector.worker_pids()
        assert new[0] != old[0] and new[1] != old[1]
        assert agent.collector.tokens == [1, 1]
    finally:
        agent.close()


@needs_ray
def test_restart_limit_stops_training_with_a_clear_error(local_ray):
    agent = build_ray_agent(small_config(), CPU, num_workers=2, max_restarts=0)
    try:
        agent.train_iteration()
        local_ray.kill(agent.workers[1], no_restart=True)
        with pytest.raises(RuntimeError, match=r"Ray worker 1 \(envs 2-3\) failed.*max_restarts=0"):
            agent.train_iteration()
    finally:
        agent.close()


@pytest.mark.slow  # ~21 s at load average ~9 (starts 4 worker processes)
@needs_ray
def test_checkpoint_resumes_exactly(local_ray):
    """state_dict + rollout_state into fresh Ray workers continue the run as if uninterrupted."""
    cfg = small_config()
    first = build_ray_agent(cfg, CPU, num_workers=2)
    try:
        first.train_iteration()
        state, rollout = copy.deepcopy(first.state_dict()), first.rollout_state()  # as written to disk
        first.train_iteration()
        expected = first.state_dict()["network"]
    finally:
        first.close()
    second = build_ray_agent(cfg, CPU, num_workers=2)
    try:
        second.load_state_dict(state)
        second.load_rollout_state(rollout)
        second.train_iteration()
        assert second.env_steps == 2 * cfg.batch_size
        assert same_weights(expected, second.state_dict()["network"])
        with pytest.raises(ConfigError, match="backend=local"):
            second.load_rollout_state(object())
    finally:
        second.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
@needs_ray
def test_ray_backend_solves_doorkey_while_actors_are_killed(local_ray, tmp_path):
    """The demo recipe (configs/minigrid_doorkey5x5.yaml) on 2 Ray actors, one killed twice mid-run.

    The in-process backend reaches evaluation return 0.95-0.96 and success 1.0 with this recipe
    (docs/benchmarks.md); the Ray run must reach the same bar as the in-process learning test.
    """
    import asyncio

    from echo_rl.training.trainer import EchoRLTrainer

    cfg = TrainingConfig.load_yaml("configs/minigrid_doorkey5x5.yaml").replace(
        backend="ray", total_timesteps=149_504, evaluation_frequency=0, save_frequency=0)
    trainer = EchoRLTrainer(cfg, run_dir=tmp_path / "run", show_progress=False)
    kills: list[str] = []

    def killer():
        deadline = time.monotonic() + 600
        while trainer.agent is None and time.monotonic() < deadline:
            time.sleep(0.05)
        agent = trainer.agent
        while agent.env_steps < 40_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # most likely mid-rollout
        local_ray.kill(agent.workers[0], no_restart=False)
        kills.append("ray.kill worker 0")
        while agent.env_steps < 80_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = local_ray.get(agent.workers[1].pid.remote())
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        kills.append("SIGKILL worker 1")

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    result = asyncio.run(trainer.train())
    thread.join(timeout=5)
    assert kills == ["ray.kill worker 0", "SIGKILL worker 1"]
    assert result.total_timesteps == 149_504 and not result.interrupted
    assert trainer.agent.collector.restarts == 2
    assert result.evaluation_results["avg_reward"] >= 0.9, result.evaluation_results
    assert result.evaluation_results["success_rate"] >= 0.95, result.evaluation_results


@needs_ray
def test_replay_service_actor_takes_samples_from_ray_writers(local_ray):
    """Writers in Ray tasks feed the service actor over its own acked path; the learner samples via Ray."""
    import numpy as np

    from echo_rl.distributed.ray_replay import start_replay_service

    example = {"obs": np.zeros(4, np.float32), "key": np.zeros(1, np.int64)}
    service, address, secret = start_replay_service(example, 4096, num_cpus=0, min_experiences=1, seed=0)
    assert address[0] == "127.0.0.1"  # the loopback-only local Ray's node address

    def write(writer: int, n: int, secret: bytes) -> int:  # the secret: a task argument, never in the GCS
        import numpy as np

        from echo_rl.distributed import ReplayClient

        with ReplayClient(address, {"obs": np.zeros(4, np.float32), "key": np.zeros(1, np.int64)},
                          secret=secret) as client:
            for i in range(n):
                client.send({"obs": np.full(4, writer, np.float32), "key": np.array([writer * 10_000 + i])})
            client.flush(wait=True, timeout=30)
            return client.acked

    writer = local_ray.remote(num_cpus=0)(write)
    try:
        assert local_ray.get([writer.remote(w, 300, secret) for w in (1, 2)], timeout=120) == [300, 300]
        m = local_ray.get(service.metrics.remote())
        assert m["replay/buffer_size"] == 600 and m["replay/samples_added"] == 600
        batch = local_ray.get(service.sample.remote(32, timeout=10))
        np.testing.assert_array_equal(batch.data["obs"][:, 0], batch.data["key"][:, 0] // 10_000)
        assert local_ray.get(service.update_priorities.remote(batch.indices, np.full(32, 3.0))) == 32
    finally:
        local_ray.get(service.close.remote())
        local_ray.kill(service)


# -- the EchoRL agent on Ray ------------------------------------------------------------------------

ECHO_SMALL = {"echo_config.latent_plan": True,  # every part on, the plan included, whatever its default
              "planning_config.embedding_dim": 8, "planning_config.state_window_size": 3,
              "echo_config.sequence_length": 8, "echo_config.replay_batch_sequences": 4,
              "echo_config.hidden_dim": 32, "replay_config.age_threshold": 16, "replay_config.max_replay_age": 64,
              "replay_config.min_experiences": 4, "ppo_config.batch_size": 32, "ppo_config.num_epochs": 1}


def echo_config(**changes) -> TrainingConfig:
    """A few seconds of echo-rl with every part on: time limits inside rollouts (truncation values, window cuts)."""
    base = dict(agent="echo-rl", batch_size=64, env_config={"max_steps": 10})
    return small_config(**{**base, **changes}).with_overrides(ECHO_SMALL)


@needs_ray
def test_echo_rl_on_one_worker_reproduces_the_in_process_run(local_ray):
    """The plan-path actor on a Ray worker, EchoAgent's learner here: the run is the in-process run."""
    from echo_rl.vector.echo import EchoAgent

    cfg = echo_config()
    local = EchoAgent(cfg.replace(backend="local"), make_vector_env(DOORKEY, cfg.num_actors, max_steps=10), CPU)
    remote = build_ray_agent(cfg, CPU, num_workers=1)
    try:
        assert isinstance(remote, EchoAgent) and type(remote).__name__ == "RayEchoAgent"
        for _ in range(3):
            a, b = local.train_iteration(), remote.train_iteration()
            b.pop("ray/worker_restarts")
            assert a == b
        assert "replay/value_loss" in a and "loss/plan_kl" in a
        for p, q in zip(local.lpo.modules().parameters(), remote.lpo.modules().parameters()):
            assert torch.equal(p, q)
    finally:
        remote.close()
        local.close()


@needs_ray
def test_echo_rl_two_workers_join_plans_windows_and_replay_state(local_ray):
    """Per update, each slice's extra fields (episode ids, plan noise and means, next observations, the k states
    before the rollout) land at its envs; the rollout state carries the workers and the replay."""
    from echo_rl.vector.ray_acting import EchoActing
    from echo_rl.vector.ray_backend import slice_config

    cfg = echo_config()
    remote = build_ray_agent(cfg, CPU, num_workers=2)
    twins = []
    for part in worker_slices(cfg.num_actors, 2):
        sub = slice_config(cfg, part)
        twins.append(EchoActing(sub, make_vector_env(DOORKEY, part.size, max_steps=10)))
    try:
        for twin in twins:
            twin.reset(twin.config.seed)
        for _ in range(2):
            weights = copy.deepcopy(remote.network.state_dict())
            remote.train_iteration()
            bufs = []
            for twin in twins:
                twin.network.load_state_dict(weights)
                bufs.append(twin.collect())
            got = remote.collector.buffer
            for name in ("ep", "eps", "plan_mean"):
                joined = np.concatenate([b.extras[name] for b in bufs], axis=1)
                np.testing.assert_array_equal(got.extras[name], joined, err_msg=name)
            np.testing.assert_array_equal(got.next_observations,
                                          np.concatenate([b.next_observations for b in bufs], axis=1))
            for name in ("ctx_obs", "ctx_ep", "next_ep"):
                joined = np.concatenate([b.context[name] for b in bufs], axis=1)
                np.testing.assert_array_equal(got.context[name], joined, err_msg=name)
        assert got.extras["ep"].max() > 0  # episodes ended inside the rollouts
        state = remote.rollout_state()
        assert state["backend"] == "ray" and len(state["workers"]) == 2
        assert state["replay"]["replay_npz"] is not None and len(remote.replay) > 0
        size = len(remote.replay)
        remote.load_rollout_state(state)
        assert len(remote.replay) == size
    finally:
        for twin in twins:
            twin.close()
        remote.close()


@needs_ray
def test_echo_rl_trains_and_resumes_exactly_through_the_trainer_on_ray(local_ray, tmp_path):
    """``train --agent echo-rl --backend ray``: the trainer's agent seam, checkpoints (workers' envs and windows,
    the replay, the self-imitation store) and a resume that continues the run exactly."""
    import asyncio
    import shutil

    from echo_rl.training.trainer import EchoRLTrainer

    cfg = echo_config(total_timesteps=192, evaluation_frequency=0, evaluation_episodes=2, save_frequency=64)
    first = EchoRLTrainer(cfg, run_dir=tmp_path / "run", show_progress=False)
    assert asyncio.run(first.train()).total_timesteps == 192
    assert type(first.agent).__name__ == "RayEchoAgent" and len(first.agent.replay) > 0
    expected = first.agent.state_dict()["lpo"]
    newest = first.run.checkpoints()[0]
    shutil.rmtree(newest)  # resume from the checkpoint before it
    second = EchoRLTrainer(cfg, run_dir=tmp_path / "run", resume=True, show_progress=False)
    assert asyncio.run(second.train()).total_timesteps == 192
    assert second.agent.updates == first.agent.updates == 3
    assert same_weights(expected["modules"], second.agent.state_dict()["lpo"]["modules"])


@pytest.mark.slow  # starts 2 worker processes and restarts one
@needs_ray
def test_echo_rl_worker_killed_is_restarted_with_fresh_windows(local_ray):
    """A restarted echo-rl worker starts new episodes with empty plan windows; the update still gets a full batch."""
    agent = build_ray_agent(echo_config(), CPU, num_workers=2)
    try:
        agent.train_iteration()
        os.kill(agent.collector.worker_pids()[1], signal.SIGKILL)
        row = agent.train_iteration()
        assert row["ray/worker_restarts"] == 1.0 and np.isfinite(row["loss/policy"])
        ctx_ep = agent.collector.buffer.context["ctx_ep"]  # [k, N]: envs 2-3 are worker 1's
        assert (ctx_ep[:, 2:] == -1).all() and (ctx_ep[:, :2] >= 0).any()
        assert agent.env_steps == 2 * agent.config.batch_size
    finally:
        agent.close()


@needs_ray
def test_set_on_a_ray_agent_refuses_acting_parts_and_takes_learner_side_ones(local_ray):
    """Workers build their networks from the config and get weights only: a network part swapped on the
    learner would leave them acting with another policy than the one learning, so it is refused."""
    from echo_rl.models.policies import TemperedCategorical

    agent = build_ray_agent(small_config(), CPU, num_workers=1)
    try:
        before = {k: v.clone() for k, v in agent.network.state_dict().items()}
        with pytest.raises(ConfigError, match=r"agent.set\(distribution=\.\.\.\) is not supported with backend=ray"):
            agent.set(distribution=TemperedCategorical(2.0))
        with pytest.raises(ConfigError, match="allowed here: augmentation, reward"):
            agent.set(encoder="mlp")
        assert agent.network.distribution is None
        assert all(torch.equal(v, before[k]) for k, v in agent.network.state_dict().items())
        agent.set(reward=None, augmentation=None)  # nothing to swap: accepted
        agent.train_iteration()
    finally:
        agent.close()
