"""The dqn agent: transitions reach the learner only through the replay server, priorities become |TD|,
a resumed run equals an uninterrupted one, bad config is one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.training.agents import AGENTS, build_agent
from echo_rl.training.run_dir import RunDirectory
from tests.resume_helpers import cut_and_resume

EMPTY = "minigrid:MiniGrid-Empty-5x5-v0"
CPU = torch.device("cpu")


def small_config(**changes) -> TrainingConfig:
    overrides = changes.pop("overrides", {})
    base = dict(env_name=EMPTY, agent="dqn", num_actors=4, batch_size=64, total_timesteps=2048, seed=5,
                learning_starts=64, evaluation_episodes=4)
    config = TrainingConfig(**{**base, **changes})
    return config.with_overrides({"replay_config.min_experiences": 64, "dqn_config.minibatch_size": 16,
                                  "dqn_config.target_network_frequency": 5, **overrides})


pytestmark = pytest.mark.usefixtures("one_thread")


def test_dqn_is_registered():
    assert AGENTS["dqn"] == "echo_rl.vector.dqn_agent:DQNAgent"


def test_every_env_step_goes_through_the_server_over_shared_memory():
    agent = build_agent(small_config(), CPU)
    try:
        assert agent.writer.transport == "shm"
        for _ in range(3):
            metrics = agent.train_iteration()
        assert agent.env_steps == 192
        assert agent.feed.server.samples_added == 192
        assert len(agent.feed.buffer) == 192
        assert metrics["replay/samples_added"] == 192.0
        # learning started after learning_starts=64 env steps: one gradient step per train_frequency=4 env steps
        assert agent.updates == (192 - 64) // 4
        assert metrics["loss/minibatches"] == 16.0
    finally:
        agent.close()


def test_the_learner_sets_each_drawn_transitions_priority_to_its_abs_td_error(monkeypatch):
    agent = build_agent(small_config(), CPU)
    server = agent.feed.server
    calls = []
    real = server.update_priorities

    def spy(indices, priorities):
        calls.append((np.array(indices), np.array(priorities)))
        return real(indices, priorities)

    monkeypatch.setattr(server, "update_priorities", spy)
    try:
        agent.train_iteration()
        agent.train_iteration()
        assert len(calls) == agent.updates > 0
        indices, priorities = calls[-1]
        assert indices.shape == (16,) and (priorities >= 0).all() and priorities.max() > 0
        # the buffer's leaf of a drawn sample is now (|td| + eps)^alpha, no longer the default priority 1
        buf = agent.feed.buffer
        once = [i for i, idx in enumerate(indices) if (indices == idx).sum() == 1][0]  # drawn once in the batch
        slot = int(indices[once]) % buf.capacity
        want = (priorities[once] + buf.priority_epsilon) ** buf.alpha
        assert float(buf._trees[0].get(np.array([slot]))[0]) == pytest.approx(want, rel=1e-6)
        assert agent.target is not agent.q
    finally:
        agent.close()


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    config = small_config()
    whole = build_agent(config, CPU)
    try:
        rows_whole = [whole.train_iteration() for _ in range(4)]
        weights_whole = {k: v.clone() for k, v in whole.q.state_dict().items()}
    finally:
        whole.close()

    def check(resumed, rows):
        assert resumed.updates == (256 - 64) // 4
        for k, v in resumed.q.state_dict().items():
            assert torch.equal(v, weights_whole[k]), k
        drop = ("replay/samples_added",)  # counted per server: the resumed one saw only its own writes
        assert [{k: v for k, v in r.items() if k not in drop} for r in rows] == \
               [{k: v for k, v in r.items() if k not in drop} for r in rows_whole]

    def loaded(resumed):
        assert len(resumed.feed.buffer) == 128

    cut_and_resume(config, tmp_path / "run", 2, 2, check, loaded)


def test_with_a_rate_limiter_the_learner_draws_as_the_limiter_allows():
    config = small_config(overrides={"replay_config.samples_per_insert": 2.0, "replay_config.rate_error_buffer": 64.0})
    agent = build_agent(config, CPU)
    try:
        for _ in range(3):
            agent.train_iteration()
        limiter = agent.feed.buffer.rate_limiter
        assert limiter is not None and limiter.inserts == 192
        # the learner keeps samples within the band around 2 samples per insert
        assert abs(limiter.inserts * 2.0 - limiter.samples) <= 64 + 16
        assert agent.updates == limiter.samples // 16 > 0
    finally:
        agent.close()


@pytest.mark.parametrize("overrides, message", [
    ({"dqn_config.loss": "l1"}, "DQNConfig.loss='l1' is invalid: allowed: huber, mse"),
    ({"dqn_config.end_e": 0.9, "dqn_config.start_e": 0.5}, "DQNConfig.end_e=0.9 is invalid: must be <= start_e=0.5"),
    ({"replay_config.sampler": "lifo"}, "ReplayConfig.sampler='lifo' is invalid: allowed: prioritized, uniform, fifo"),
    ({"replay_config.samples_per_insert": 4.0, "replay_config.rate_error_buffer": 8.0},
     "ReplayConfig.rate_error_buffer=8 is invalid"),
    ({"intrinsic_reward": "rnd"}, "TrainingConfig.intrinsic_reward='rnd' is invalid with agent='dqn'"),
])
def test_bad_config_is_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        build_agent(small_config(overrides=overrides), CPU)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_cartpole_vectors_get_an_mlp_q_network():
    agent = build_agent(small_config(env_name="CartPole-v1"), CPU)
    try:
        agent.train_iteration()
        assert {lf.name: lf.dtype for lf in agent.feed.buffer.schema.leaves}["obs"] == np.float32
        assert agent.feed.server.samples_added == agent.env_steps == 64
    finally:
        agent.close()


def test_a_resume_with_a_larger_budget_keeps_the_first_runs_epsilon_and_beta_schedule(tmp_path):
    """The schedules span the first run's budget (512 env steps): cut at 128 and resumed with 1024, epsilon
    and beta follow the 512-step plan at every step, then stay at end_e and 1 past it."""
    from echo_rl.algorithms.dqn import annealed_beta, linear_epsilon

    first_config = small_config(total_timesteps=512)
    run = RunDirectory(tmp_path / "run", first_config)
    run.create()
    seen = []  # (env steps, epsilon, beta) at the end of each iteration
    first = build_agent(first_config, CPU)
    try:
        for _ in range(2):
            row = first.train_iteration()
            seen.append((first.env_steps, row["dqn/epsilon"], row["dqn/beta"]))
        run.save_checkpoint(first.env_steps, first.state_dict(), first.rollout_state())
    finally:
        first.close()
    resumed = build_agent(small_config(total_timesteps=1024), CPU)
    try:
        run.load_newest(lambda payload, rollout: (resumed.load_state_dict(payload["state"]),
                                                  resumed.load_rollout_state(rollout)))
        acted = []  # the epsilon the actors were given before each collection step
        collect = resumed.collector.run
        resumed.collector.run = lambda actor: (acted.append((resumed.env_steps, actor.epsilon)), collect(actor))[1]
        for _ in range(8):
            row = resumed.train_iteration()
            seen.append((resumed.env_steps, row["dqn/epsilon"], row["dqn/beta"]))
        kept = resumed.state_dict().get("schedule_timesteps")
    finally:
        resumed.close()
    d = first_config.dqn_config
    planned = lambda step: (linear_epsilon(d.start_e, d.end_e, d.exploration_fraction * 512, step),  # noqa: E731
                            annealed_beta(first_config.replay_config.importance_sampling_beta, 512, step))
    assert [s for s, _, _ in seen] == list(range(64, 641, 64))
    assert [(e, b) for _, e, b in seen] == [planned(s) for s, _, _ in seen]
    assert [e for _, e in acted] == [planned(s)[0] for s, _ in acted] and len(acted) == 8 * 64 // 4
    assert seen[-1][1:] == (d.end_e, 1.0) and seen[1][1] > d.end_e  # decayed on the first run's plan, then held
    assert kept == 512  # and a checkpoint of the resumed run keeps it for the next resume
