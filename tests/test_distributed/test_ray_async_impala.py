"""Asynchronous IMPALA on Ray (``--backend ray --set max_policy_lag=N``): workers collect through the learner's
updates, unrolls carry their version, the trainer runs, checkpoints and resumes it, killed workers come back."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal

import numpy as np
import pytest
import torch

from echo_rl.config import TrainingConfig
from echo_rl.environments.minigrid_vector import make_vector_env
from echo_rl.vector.async_actors import LockstepSource
from echo_rl.vector.impala_agent import IMPALAAgent

ENV = "minigrid:MiniGrid-Empty-5x5-v0"
CPU = torch.device("cpu")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="Ray is not installed: pip install 'echo-rl[distributed]'")


def config(**changes) -> TrainingConfig:
    base = dict(env_name=ENV, agent="impala", num_actors=4, batch_size=256, total_timesteps=4096, seed=3,
                backend="ray", max_policy_lag=1)
    return TrainingConfig(**{**base, **changes})



def test_one_worker_is_the_in_process_learner_with_a_lag_of_one(local_ray):
    """One worker has one rollout in flight, sent the newest weights as the learner takes the last: unroll k
    acts with version k-1. The in-process learner fed that schedule (LockstepSource) learns the same weights."""
    from echo_rl.vector.ray_backend import AsyncRemoteCollector, build_ray_agent

    cfg = config()
    remote = build_ray_agent(cfg, CPU, num_workers=1)
    local = IMPALAAgent(cfg.replace(backend="local"), make_vector_env(ENV, cfg.num_actors), CPU)
    source = LockstepSource(local.collector, local.network, local.generator, 0, lambda k: min(k, 1))
    local.unroll_source = lambda: source
    try:
        assert isinstance(remote.collector, AsyncRemoteCollector)
        rows = [(remote.train_iteration(), local.train_iteration()) for _ in range(4)]
        assert [r["async/policy_lag_max"] for r, _ in rows] == [0.0, 1.0, 1.0, 1.0]
        for r, s in rows:
            assert r["loss/policy"] == s["loss/policy"] and r["loss/rho_mean"] == s["loss/rho_mean"]
        assert rows[-1][0]["loss/rho_mean"] != 1.0  # the lag is real and V-trace corrected it
        for name, value in remote.state_dict()["network"].items():
            assert torch.equal(value, local.state_dict()["network"][name]), name
        assert remote.env_steps == local.env_steps == 4 * cfg.batch_size
    finally:
        remote.close()
        local.close()


@pytest.mark.slow  # ~16 s under load: waits for Ray to report and restart the killed worker
def test_two_workers_keep_the_lag_bounded_and_survive_a_killed_worker(local_ray):
    from echo_rl.vector.ray_backend import build_ray_agent

    agent = build_ray_agent(config(max_policy_lag=2), CPU, num_workers=2)
    try:
        rows = [agent.train_iteration() for _ in range(3)]
        os.kill(agent.collector.worker_pids()[1], signal.SIGKILL)
        # the learner goes on with worker 0's unrolls; once Ray reports worker 1's rollout failed, it is
        # restarted, re-seeded and recollects that rollout
        while rows[-1]["ray/worker_restarts"] < 1.0 and len(rows) < 200:
            rows.append(agent.train_iteration())
        rows += [agent.train_iteration() for _ in range(2)]
        assert rows[-1]["ray/worker_restarts"] == 1.0
        assert all(r["async/policy_lag_max"] <= 2 for r in rows) and agent.updates == len(rows)
        assert all(np.isfinite(r["loss/policy"]) for r in rows)
        # dropped unrolls count as env steps too; every kept unroll is half a batch
        assert agent.env_steps == len(rows) * 256 + agent.gate.dropped_steps
    finally:
        agent.close()


def test_trainer_runs_checkpoints_and_resumes_async_impala_on_ray(local_ray, tmp_path):
    """``echo-rl train --agent impala --backend ray --set max_policy_lag=1``, a checkpoint, ``--resume``."""
    import shutil

    from echo_rl.training.trainer import EchoRLTrainer

    cfg = config(total_timesteps=1536, evaluation_frequency=0, evaluation_episodes=2, save_frequency=512,
                 ray_num_workers=2)
    first = EchoRLTrainer(cfg, run_dir=tmp_path / "run", show_progress=False)
    result = asyncio.run(first.train())
    assert result.total_timesteps >= 1536 and type(first.agent).__name__ == "RayIMPALAAgent"
    shutil.rmtree(first.run.checkpoints()[0])  # resume from the one before the last
    second = EchoRLTrainer(cfg.replace(total_timesteps=2048), run_dir=tmp_path / "run", resume=True,
                           show_progress=False)
    assert asyncio.run(second.train()).total_timesteps >= 2048
    rows = [line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if "async/" in line]
    assert len(rows) >= 6
