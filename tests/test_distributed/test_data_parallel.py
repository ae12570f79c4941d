"""Data-parallel learners (num_learners=N): 2 learners on loopback match one learner's updates.

The check: two spawned learners (gloo, 127.0.0.1, a free port) each step 2 of 4 envs for 3 PPO
updates and record what they learned from; one learner then learns from the same global
batches (the two parts side by side) and must end with the same weights (allclose).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.distributed import data_parallel
from echo_rl.distributed.data_parallel import DataParallel, run_learners
from echo_rl.environments.minigrid_vector import make_vector_env
from echo_rl.vector.ppo_agent import PPOAgent
from echo_rl.training.trainer import EchoRLTrainer

ENV = "minigrid:MiniGrid-Empty-5x5-v0"
UPDATES = 3


def tiny_config(**kw) -> TrainingConfig:
    base = dict(env_name=ENV, agent="ppo", num_actors=4, batch_size=32, total_timesteps=32 * UPDATES,
                num_learners=2, seed=3, env_config={"max_steps": 12}, evaluation_episodes=2,
                evaluation_frequency=0, save_frequency=0)
    cfg = TrainingConfig(**{**base, **kw})
    # minibatches of 12 over 32: uneven shares per learner, and a short last minibatch
    return cfg.with_overrides({"ppo_config.batch_size": 12, "ppo_config.num_epochs": 2,
                               "ppo_config.target_kl": None})


def _learner_rollouts(rank: int) -> dict:
    """Learner ``rank``: 3 data-parallel updates, recording each batch it learned from."""
    dp = data_parallel.current()
    local = dp.local_config()
    agent = PPOAgent(local, make_vector_env(ENV, local.num_actors, **local.env_config), torch.device("cpu"))
    seen, learn = [], agent.learn

    def recording_learn(buf):
        seen.append((copy.deepcopy(buf), agent.collector.next_obs.copy()))
        return learn(buf)

    agent.learn = recording_learn
    metrics = [agent.train_iteration() for _ in range(UPDATES)]
    weights = {k: v.clone() for k, v in agent.network.state_dict().items()}
    agent.close()
    return {"seen": seen, "weights": weights, "metrics": metrics, "env_steps": agent.env_steps}


def _side_by_side(parts):
    """The one-learner ``[T, 4]`` batch from the learners' ``[T, 2]`` parts (env columns in rank order)."""
    merged = copy.copy(parts[0][0])
    for name, value in vars(parts[0][0]).items():
        if isinstance(value, np.ndarray) and value.ndim >= 2:
            setattr(merged, name, np.concatenate([getattr(buf, name) for buf, _ in parts], axis=1))
    merged.num_envs = sum(buf.num_envs for buf, _ in parts)
    return merged, np.concatenate([obs for _, obs in parts], axis=0)


def test_two_learners_match_one_learner_updates():
    cfg = tiny_config()
    results = run_learners(cfg, _learner_rollouts)
    for name, w in results[0]["weights"].items():  # the learners hold one model
        torch.testing.assert_close(w, results[1]["weights"][name], rtol=0, atol=0)
    assert results[0]["env_steps"] == 32 * UPDATES  # counted globally
    single = PPOAgent(tiny_config(num_learners=1), make_vector_env(ENV, 4, max_steps=12), torch.device("cpu"))
    try:
        # the same initial weights, then each global batch: the learners' parts side by side
        for i in range(UPDATES):
            buf, next_obs = _side_by_side([r["seen"][i] for r in results])
            single.collector.next_obs = next_obs
            ref = single.learn(buf)
            for key in ("loss/policy", "loss/value", "loss/entropy", "loss/clip_fraction", "loss/grad_norm",
                        "loss/explained_variance"):
                assert results[0]["metrics"][i][key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
        for name, w in single.network.state_dict().items():
            torch.testing.assert_close(results[0]["weights"][name], w, rtol=1e-4, atol=1e-5)
        fresh = PPOAgent(tiny_config(num_learners=1), make_vector_env(ENV, 4, max_steps=12), torch.device("cpu"))
        changed = [not torch.allclose(w, fresh.network.state_dict()[n]) for n, w in single.network.state_dict().items()]
        fresh.close()
        assert any(changed)  # the updates did move the weights: the comparison is not of two initial models
    finally:
        single.close()


def test_local_indices_partition_the_global_batch():
    cfg = tiny_config()
    learners = [DataParallel(r, 2, cfg) for r in range(2)]
    idx = np.random.default_rng(0).permutation(32)[:12]
    parts = [dp.local_indices(idx) for dp in learners]
    assert sum(len(p) for p in parts) == 12
    # learner r's local index t*2 + j is global t*4 + 2r + j
    back = sorted(int(t * 4 + 2 * r + j) for r, p in enumerate(parts) for t, j in (divmod(int(x), 2) for x in p))
    assert back == sorted(idx.tolist())
    assert learners[1].local_config().num_actors == 2 and learners[1].local_config().batch_size == 16


@pytest.mark.parametrize("overrides, match", [
    ({"num_actors": 3, "batch_size": 30}, "multiple of it"),
    ({"agent": "impala"}, "data-parallel learners train ppo"),
    ({"intrinsic_reward": "rnd"}, "intrinsic_reward"),
])
def test_unsupported_num_learners_is_one_line_error(overrides, match, tmp_path):
    with pytest.raises(ConfigError, match=match) as exc:
        EchoRLTrainer(tiny_config(**overrides), tmp_path / "run")
    assert "\n" not in str(exc.value)


@pytest.mark.slow  # a second spawn of two learners (~20 s on a loaded 2-core box); the CLI's path
def test_trainer_with_two_learners_writes_one_run(tmp_path):
    import asyncio

    cfg = tiny_config(total_timesteps=64)
    result = asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=False).train())
    assert result.total_timesteps == 64 and result.num_updates == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss/policy" in r] == [32, 64]
    assert set(result.evaluation_results) >= {"success_rate", "episodes"}  # learner 0 evaluated
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["num_updates"] == 2


def test_one_answer_to_am_i_a_data_parallel_learner():
    """The trainer's schedule and the PPO agent's all-reduce read the same record, set by init_learner."""
    from echo_rl.distributed import learner_rank
    from echo_rl.training import trainer
    from echo_rl.vector import ppo_agent

    assert data_parallel.current is learner_rank.current is trainer.current_learner
    assert ppo_agent.learner_rank is learner_rank and learner_rank.current() is None
    marker = object()
    learner_rank.set_current(marker)
    try:
        assert data_parallel.current() is marker
    finally:
        data_parallel.shutdown_learner()
    assert learner_rank.current() is None
