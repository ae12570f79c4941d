"""Asynchronous IMPALA (``max_policy_lag``): versions travel with unrolls, stale ones are dropped, V-trace is fed
the behaviour log-probabilities of the version that acted, and the in-process actor process trains."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.environments.minigrid_vector import make_vector_env
from echo_rl.vector.actor_process import ProcessActor
from echo_rl.vector.async_actors import LockstepSource, StalenessGate, Unroll, UnrollBatch, gather_batch
from echo_rl.vector.impala_agent import IMPALAAgent
from echo_rl.vector.rollout import EpisodeStats, evaluate_policy, torch_generator

ENV = "minigrid:MiniGrid-Empty-5x5-v0"
CPU = torch.device("cpu")


def make_agent(num_actors=4, batch_size=64, max_policy_lag=1, **overrides):
    cfg = TrainingConfig(env_name=ENV, agent="impala", num_actors=num_actors, batch_size=batch_size,
                         total_timesteps=100_000, max_policy_lag=max_policy_lag).with_overrides(overrides)
    return IMPALAAgent(cfg, make_vector_env(ENV, num_actors), CPU)


def fake_unroll(version: int, num_envs: int = 2, steps: int = 3, fill: float = 0.0) -> Unroll:
    arrays = {"obs": np.full((steps, num_envs, 7, 7, 3), fill, np.uint8), "actions": np.zeros((steps, num_envs), np.int64),
              "logprobs": np.full((steps, num_envs), fill, np.float32)}
    for name in ("values", "rewards", "final_values"):
        arrays[name] = np.zeros((steps, num_envs), np.float32)
    for name in ("terminated", "truncated"):
        arrays[name] = np.zeros((steps, num_envs), bool)
    stats = EpisodeStats()
    stats.add(1.0, 5, True)
    return Unroll(arrays, np.full((num_envs, 7, 7, 3), fill, np.uint8), version, stats)


# -- the staleness gate and batches ------------------------------------------------------------------

def test_gather_drops_unrolls_older_than_the_lag_and_counts_every_step():
    gate = StalenessGate(2)
    arriving = iter([fake_unroll(7, fill=1), fake_unroll(10, fill=2), fake_unroll(8, fill=3), fake_unroll(9, fill=4)])
    batch, steps, m = gather_batch(lambda: next(arriving), gate, learner_version=10, width=4)
    # version 7 is 3 updates old: dropped; 10 (lag 0) and 8 (lag 2) fill the 4 columns; 9 is never taken
    assert batch.num_envs == 4 and list(batch.versions) == [10, 10, 8, 8]
    assert batch.obs[0, :, 0, 0, 0].tolist() == [2, 2, 3, 3] and batch.next_obs[:, 0, 0, 0].tolist() == [2, 2, 3, 3]
    assert steps == 3 * 3 * 2  # the dropped unroll's steps were taken too
    assert m["async/dropped_stale"] == 1 and gate.dropped_steps == 6
    assert m["async/policy_lag_mean"] == 1.0 and m["async/policy_lag_max"] == 2.0
    assert m["episode/count"] == 3  # episodes that ended in the dropped unroll happened all the same
    assert isinstance(batch, UnrollBatch) and next(arriving).version == 9


def test_gate_refuses_nonsense():
    with pytest.raises(ValueError, match="max_policy_lag=0 is invalid"):
        StalenessGate(0)
    with pytest.raises(RuntimeError, match="newer than the learner"):
        StalenessGate(1).admit(fake_unroll(5), 4)


def test_max_policy_lag_is_refused_for_agents_that_collect_synchronously():
    with pytest.raises(ConfigError, match=r"^TrainingConfig.max_policy_lag=2 is invalid: .*agent='ppo' collects "
                                          r"synchronously$"):
        TrainingConfig(env_name=ENV, agent="ppo", max_policy_lag=2)
    assert TrainingConfig(env_name=ENV, agent="ppo", max_policy_lag=0).max_policy_lag == 0  # 0: synchronous
    with pytest.raises(ConfigError, match="intrinsic_reward='rnd' is invalid with max_policy_lag=1"):
        make_agent(intrinsic_reward="rnd")


# -- a forced lag, deterministic -----------------------------------------------------------------------

def test_forced_lag_stale_unrolls_dropped_and_vtrace_sees_the_acting_versions_logprobs(monkeypatch):
    import echo_rl.vector.impala_agent as mod

    agent = make_agent(max_policy_lag=1, **{"ppo_config.batch_size": 32})  # 4 envs x 16 steps, unrolls of 8
    lags = [0, 0, 1, 3, 2, 1, 0]
    source = LockstepSource(agent.collector, agent.network, agent.generator, 0, lambda k: lags[k])
    monkeypatch.setattr(agent, "unroll_source", lambda: source)
    seen = []
    real = mod.vtrace

    def spy(behavior, target, *args, **kwargs):
        seen.append((behavior.clone(), target.clone()))
        return real(behavior, target, *args, **kwargs)

    monkeypatch.setattr(mod, "vtrace", spy)
    learned = []
    real_learn = agent.learn
    monkeypatch.setattr(agent, "learn", lambda buf: learned.append(copy.deepcopy(buf)) or real_learn(buf))
    rows = [agent.train_iteration() for _ in range(5)]
    # updates 0,1: lag 0 (version 0, 1); update 2: lag 1 (version 1); update 3: lag 3 dropped, lag 2 dropped,
    # then lag 1 (version 2); update 4: lag 0 (version 4)
    assert [int(b.versions[0]) for b in learned] == [0, 1, 1, 2, 4]
    assert [r["async/dropped_stale"] for r in rows] == [0, 0, 0, 2, 2]
    assert rows[3]["async/policy_lag_max"] == 1.0 and rows[4]["async/policy_lag_max"] == 0.0
    assert agent.env_steps == 7 * 64 and agent.updates == 5  # dropped unrolls count as env steps
    # V-trace's behaviour log-probs are those of the version that acted, recomputed here from its weights
    net = copy.deepcopy(agent.network)
    for k, buf in enumerate(learned):
        net.load_state_dict(source.history[int(buf.versions[0])])
        with torch.no_grad():
            logits, _ = net(torch.as_tensor(buf.obs).reshape(-1, *buf.obs.shape[2:]))
        logp = torch.log_softmax(logits, -1).gather(-1, torch.as_tensor(buf.actions).reshape(-1, 1)).view(16, 4)
        torch.testing.assert_close(logp, torch.as_tensor(buf.logprobs), rtol=0, atol=1e-5)
        behaviour = torch.cat([b for b, _ in seen[2 * k: 2 * k + 2]])  # two unrolls of 8 steps per update
        torch.testing.assert_close(behaviour, torch.as_tensor(buf.logprobs))
    # with a lag, the learner's policy differs from the behaviour one at the first unroll: V-trace has work to do
    first_target_gap = [(t - b).abs().max().item() for b, t in seen[::2]]
    assert first_target_gap[0] == 0.0 and first_target_gap[2] > 0 and first_target_gap[3] > 0


def test_synchronous_default_never_starts_an_actor_thread():
    agent = make_agent(max_policy_lag=None)
    try:
        m = agent.train_iteration()
        assert agent._actor is None and agent.gate is None and not any(k.startswith("async/") for k in m)
    finally:
        agent.close()


# -- the actor process ---------------------------------------------------------------------------------

def test_actor_process_acts_one_version_behind_and_checkpoints_mid_run():
    """One rollout in flight, sent the newest weights as the learner takes the last: unroll k acts with version
    k-1, the schedule LockstepSource replays in the learner's thread (same envs, sampler, weights: same run).
    A checkpoint between updates brings the actor's envs and sampler back without changing the run."""
    agent = make_agent(max_policy_lag=2)
    twin = make_agent(max_policy_lag=2)
    source = LockstepSource(twin.collector, twin.network, twin.generator, 0, lambda k: min(k, 1))
    twin.unroll_source = lambda: source
    try:
        rows = [(agent.train_iteration(), twin.train_iteration()) for _ in range(3)]
        actor = agent._actor
        assert isinstance(actor, ProcessActor) and actor._proc.is_alive()
        first_collector = agent.collector
        collector = agent.rollout_state()  # the actor's envs mid-episode, after the unroll it had in flight
        assert collector is agent.collector is not first_collector and actor._pending is not None
        synced_obs, synced_sampler = np.array(collector.next_obs), agent.state_dict()["generator"]
        rows.append((agent.train_iteration(), twin.train_iteration()))
        # the lockstep twin collects that in-flight unroll in its 4th iteration
        np.testing.assert_array_equal(synced_obs, source.collector.next_obs)
        assert synced_sampler.equal(twin.generator.get_state())
        rows.append((agent.train_iteration(), twin.train_iteration()))
        assert [r["async/policy_lag_max"] for r, _ in rows] == [0.0, 1.0, 1.0, 1.0, 1.0]
        assert [r["loss/policy"] for r, _ in rows] == [t["loss/policy"] for _, t in rows]
        for name, value in agent.network.state_dict().items():
            assert torch.equal(value, twin.network.state_dict()[name]), name
        assert agent.env_steps == 5 * 64 and agent.updates == 5
    finally:
        agent.close()
        twin.close()
    assert not actor._proc.is_alive()


def test_actor_process_errors_and_death_reach_the_learner():
    import os
    import signal

    agent = make_agent()
    try:
        agent.train_iteration()
        agent._actor.publish(torch.nn.Linear(1, 1), 7)  # weights that do not fit: sent with the next request
        agent.train_iteration()
        with pytest.raises(RuntimeError, match=r"^the actor process failed: RuntimeError: Error\(s\) in loading"):
            agent.train_iteration()
        os.kill(agent._actor._proc.pid, signal.SIGINT)  # Ctrl-C: the learner decides, the actor keeps serving
        agent.train_iteration()
        os.kill(agent._actor._proc.pid, signal.SIGKILL)
        agent._actor._proc.join()
        with pytest.raises(RuntimeError, match=r"^the actor process died \(exit code -9\)"):
            for _ in range(2):  # the unroll it sent before it died may still be in the pipe
                agent.train_iteration()
    finally:
        agent.close()


def _train_and_evaluate(steps: int) -> tuple[dict, dict, list]:
    """The synchronous learning test's recipe (test_impala_agent) with the actor one update ahead."""
    agent = make_agent(num_actors=8, batch_size=1024, max_policy_lag=1,
                       **{"ppo_config.batch_size": 128, "ppo_config.learning_rate": 1e-3})

    def evaluate() -> dict:
        gen = torch_generator(0)
        return evaluate_policy(lambda n: make_vector_env(ENV, n), lambda o: agent.act(o, gen), 32, 11)

    try:
        before, lags = evaluate(), []
        while agent.env_steps < steps:
            lags.append(agent.train_iteration()["async/policy_lag_max"])
        return before, evaluate(), lags
    finally:
        agent.close()


def test_async_impala_learns_a_little_on_empty_5x5():
    # seeds 0-2 went from success 0.31-0.34 (return ~0.17) to 0.88-0.97 (return 0.65-0.70) in 16k steps
    before, after, lags = _train_and_evaluate(16_000)
    assert max(lags) == 1  # it learned from unrolls one update old
    assert before["success_rate"] < 0.5 and after["success_rate"] >= 0.75, (before, after)
    assert after["avg_reward"] >= before["avg_reward"] + 0.3, (before, after)


@pytest.mark.slow
def test_async_impala_solves_empty_5x5():
    """The synchronous test's bar (test_impala_learns_empty_5x5) at the same 40k steps."""
    _, after, _ = _train_and_evaluate(40_000)
    assert after["success_rate"] >= 0.9, after


def test_a_connection_reset_by_a_dead_actor_is_reported_as_its_death():
    """A worker killed with the learner's request unread resets the socket (ECONNRESET, not EOF): same one line."""
    import os
    import signal

    agent = make_agent()
    try:
        agent.train_iteration()
        os.kill(agent._actor._proc.pid, signal.SIGKILL)
        agent._actor._proc.join()

        class ResetConn:
            def poll(self, timeout):
                return True

            def recv(self):
                raise ConnectionResetError(104, "Connection reset by peer")

        real, agent._actor._conn = agent._actor._conn, ResetConn()
        try:
            with pytest.raises(RuntimeError, match=r"^the actor process died \(exit code -9\)"):
                agent._actor._receive("unroll")
        finally:
            agent._actor._conn = real
    finally:
        agent.close()
