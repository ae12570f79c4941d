"""LM rollouts on Ray workers (lm/ray_lm.py): exactness against the in-process run, two workers,
bounded staleness, resume, and the config rules."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
import torch

pytest.importorskip("ray")
pytest.importorskip("transformers")

from echo_rl.config import ConfigError, TrainingConfig  # noqa: E402
from echo_rl.lm.ray_lm import BandwidthRecorder, replay_bandwidth, split  # noqa: E402
from echo_rl.training.bandwidth import BandwidthEfficiencyTracker  # noqa: E402
from echo_rl.lm.loop import LMAgent  # noqa: E402
from echo_rl.training.trainer import EchoRLTrainer  # noqa: E402

CPU = torch.device("cpu")


def _cfg(**over) -> TrainingConfig:
    base = {"env_name": "minigrid:MiniGrid-Empty-Random-5x5-v0", "env_config": {"max_steps": 2},
            "backbone": "tiny", "agent": "echo-rl", "num_actors": 2, "batch_size": 2, "total_timesteps": 8,
            "evaluation_episodes": 1, "evaluation_frequency": 0, "save_frequency": 0, "backend": "ray",
            "lm_config.group_size": 2, "lm_config.max_new_tokens": 4, "lm_config.sft_episodes": 1,
            "lm_config.sft_steps": 1, "lm_config.heldout_pool": 1, "lm_config.eval_every_updates": 1,
            "lm_config.max_updates": 2, "echo_config.latent_plan": True, "planning_config.embedding_dim": 8,
            "planning_config.state_window_size": 2}
    return TrainingConfig().with_overrides({**base, **over})


def _rows(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(agent: LMAgent) -> dict:
    return {k: v.clone() for k, v in agent.model.state_dict().items()}


def test_one_worker_reproduces_the_in_process_run(local_ray, tmp_path):
    """The guard: synchronous (max_policy_lag unset), one worker = the local generator, row for row."""
    local, remote = tmp_path / "local", tmp_path / "ray"
    asyncio.run(EchoRLTrainer(_cfg(backend="local"), local, show_progress=False).train())
    asyncio.run(EchoRLTrainer(_cfg(ray_num_workers=1), remote, show_progress=False).train())
    a, b = _rows(local), _rows(remote)
    assert len(a) == len(b) >= 3 and [r.get("train/updates") for r in b][-1] == 2.0
    for x, y in zip(a, b):
        assert x == y


def _iterations(agent: LMAgent, n: int, between=None) -> list[dict]:
    async def go() -> list[dict]:
        await agent.start()
        rows = []
        try:
            for _ in range(n):
                rows.append(await agent.train_iteration())
                if between is not None:
                    await between(agent)
        finally:
            await agent.close()
        return rows

    return asyncio.run(go())


def test_two_workers_split_the_groups_and_train(local_ray):
    cfg = _cfg(num_actors=4, batch_size=4, total_timesteps=16, ray_num_workers=2)
    agent = LMAgent(cfg, CPU)
    before = _weights(agent)
    rows = _iterations(agent, 2)
    assert agent.updates == 2 and agent.learner.version == 2
    assert all(r["episode/count"] >= 4 for r in rows)
    assert rows[-1]["engine/policy_version"] == 2.0  # both workers loaded the second update
    assert agent.bandwidth.steps == agent.env_steps  # every worker turn reached the learner's η_bw tracker
    assert any(not torch.equal(before[k], v) for k, v in agent.model.state_dict().items())
    assert "async/dropped_stale" not in rows[0]  # synchronous: every batch from the current version


def test_generating_ahead_drops_what_is_older_than_the_lag(local_ray):
    """With max_policy_lag=1 the workers generate the next batch during the update; a forced jump of the
    learner's version makes that batch too old: it is dropped, counted, and fresh trajectories replace it."""
    cfg = _cfg(total_timesteps=40, max_policy_lag=1, ray_num_workers=1, **{"lm_config.max_updates": 3})
    agent = LMAgent(cfg, CPU)

    async def force_lag(a: LMAgent) -> None:
        if a.updates == 1:  # republish the learner's weights 3 versions ahead of the batch in flight
            a.learner.version += 2
            await a.generator.sync(a.trainer.weight_update())

    rows = _iterations(agent, 3, force_lag)
    assert rows[0]["async/dropped_stale"] == 0.0 and rows[0]["async/policy_lag_max"] == 0.0
    assert rows[1]["async/dropped_stale"] >= 2 and rows[1]["async/policy_lag_max"] == 3.0
    assert rows[2]["async/dropped_stale"] == 0.0 and rows[2]["async/policy_lag_max"] == 1.0  # one update behind
    assert all(r["episode/count"] >= 2 for r in rows)


def test_checkpoint_resumes_exactly(local_ray):
    """state_dict into a fresh agent (fresh workers, loaded from its weights) continues the run."""
    cfg = _cfg(ray_num_workers=1, **{"lm_config.max_updates": 0})
    first = LMAgent(cfg, CPU)
    state: dict = {}

    async def save(a: LMAgent) -> None:
        if a.updates == 1:
            state.update(copy.deepcopy(a.state_dict()))

    _iterations(first, 2, save)
    second = LMAgent(cfg, CPU)
    second.load_state_dict(state)
    _iterations(second, 1)
    assert second.updates == 2 and second.env_steps == first.env_steps
    assert all(torch.equal(v, second.model.state_dict()[k]) for k, v in first.model.state_dict().items())


def test_bandwidth_events_replay_into_the_tracker_in_order():
    direct, replayed, rec = BandwidthEfficiencyTracker(), BandwidthEfficiencyTracker(), BandwidthRecorder()
    for t in (direct, rec):
        t.record_rollout_step(1.0, 40, 10)
        t.record_rollout_step(0.0, 60, 40, episode_end=True)
        t.record_rollout_step(0.5, 20, 0)
        t.end_episode()
    replay_bandwidth(replayed, rec.drain())
    assert replayed.snapshot() == direct.snapshot() and rec.events == []


def test_split_and_config_rules():
    assert split(7, [1, 1]) == [3, 4] and split(4, [2, 1, 1]) == [2, 1, 1] and sum(split(9, [1, 1, 1])) == 9
    with pytest.raises(ConfigError, match="ray_num_workers"):
        _cfg(ray_num_workers=2)  # one GRPO group: one worker at most
    with pytest.raises(ConfigError, match="backend=ray"):
        _cfg(backend="local", max_policy_lag=1)
    with pytest.raises(ConfigError, match="max_staleness"):
        _cfg(max_policy_lag=2)


def test_batches_joined_after_a_drop_keep_their_groups_apart():
    """A batch filled from two worker calls (the first partly stale) renumbers the second call's groups."""
    from types import SimpleNamespace

    import numpy as np

    from echo_rl.lm.ray_lm import RayLMGenerator
    from echo_rl.lm.generator import RolloutBatch

    def traj(group: int, version: int) -> SimpleNamespace:
        return SimpleNamespace(group_id=group, episode_id=group, policy_version=version, num_turns=1)

    gen = RayLMGenerator(_cfg(max_policy_lag=1), BandwidthEfficiencyTracker(), 1)
    gen.version = 3
    calls = iter([RolloutBatch([traj(0, 3), traj(1, 0)], [], 2), RolloutBatch([traj(0, 3), traj(1, 3)], [], 2)])
    gen._launch = lambda rng, **kw: [(0, None)]

    async def collect(launched, rng):
        return next(calls)

    gen._collect = collect
    batch = asyncio.run(gen.rollouts(np.random.default_rng(0), num_actors=2, group_size=1, batch_size=3, budget=4,
                                     update=1, held_out_seed_base=10))
    assert [t.group_id for t in batch.trajectories] == [0, 1, 2]
    assert batch.metrics["async/dropped_stale"] == 1.0 and batch.steps == 4


def test_a_worker_reads_the_shipped_lm_config_itself():
    """Ray ships the run's TrainingConfig alone; each worker's rollouts read its lm_config (no copied fields)."""
    import pickle

    from echo_rl.lm.ray_lm import LMRolloutActor

    cfg = _cfg(**{"lm_config.temperature": 0.6, "lm_config.eval_temperature": 0.3,
                  "lm_config.system_prompt": "''"})  # YAML's empty string: no system message
    shipped = pickle.loads(pickle.dumps(cfg))
    actor = LMRolloutActor(shipped)
    gen = actor.generator
    assert gen.lm_config is shipped.lm_config and gen.lm_config == cfg.lm_config and gen.task == cfg.env_name
    assert gen.eval_config.temperature == 0.3 and gen.eval_config.system_prompt == ""
