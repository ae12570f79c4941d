import io

import numpy as np
import pytest
import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.environments.minigrid_vector import make_vector_env
from echo_rl.training.agents import agent_class, check_agent_name
from echo_rl.vector.echo import EchoAgent, unfold_windows
from echo_rl.vector.self_imitation import SelfImitationReplay

ENV = "minigrid:MiniGrid-Empty-5x5-v0"


def make_agent(num_actors=4, batch_size=64, env=ENV, env_kwargs=None, total_timesteps=10_000, **overrides):
    base = {"echo_config.latent_plan": True,  # these tests measure the plan path, whatever the default
            "planning_config.embedding_dim": 8, "planning_config.state_window_size": 3,
            "echo_config.sequence_length": 8, "echo_config.replay_batch_sequences": 4,
            "echo_config.hidden_dim": 32, "replay_config.age_threshold": 16, "replay_config.max_replay_age": 64,
            "replay_config.min_experiences": 4, "ppo_config.batch_size": 32, "ppo_config.num_epochs": 1}
    cfg = TrainingConfig(env_name=env, agent="echo-rl", num_actors=num_actors, batch_size=batch_size,
                         total_timesteps=total_timesteps).with_overrides({**base, **overrides})
    return EchoAgent(cfg, make_vector_env(cfg.env_name, num_actors, **(env_kwargs or {})), torch.device("cpu"))


def test_registered_and_unknown_agent_is_one_line_error():
    assert agent_class("echo-rl") is EchoAgent
    assert agent_class("impala").__name__ == "IMPALAAgent"
    with pytest.raises(ConfigError) as e:
        check_agent_name("echo")
    assert "allowed" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="agent"):
        TrainingConfig(agent="nope")


def test_unfold_windows_masks_other_episodes():
    seq = torch.arange(6).view(6, 1, 1)  # [S, B=1, D=1]
    ep = torch.tensor([-1, 0, 0, 1, 1, 1]).view(6, 1)
    w, m = unfold_windows(seq, ep, 3)
    assert w.shape == (4, 1, 3, 1)
    assert w[:, 0, :, 0].tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]]
    assert m[:, 0].tolist() == [[False, True, True], [False, False, True], [False, True, True], [True, True, True]]


def test_learner_rebuilds_the_actors_plans_and_logprobs():
    agent = make_agent(env_kwargs={"max_steps": 6})  # time limits inside the rollout
    agent.train_iteration()  # so the next rollout starts with a non-empty history
    roll = agent.collect()
    T, N, m = agent.num_steps, agent.num_envs, agent.model
    assert roll.terminated.any() or roll.truncated.any(), "test needs an episode boundary inside the rollout"
    full_obs, full_ep = (torch.as_tensor(a) for a in roll.full())
    t_idx, e_idx = np.repeat(np.arange(T), N), np.tile(np.arange(N), T)
    win, mask = m.gather_windows(full_obs, full_ep, t_idx, e_idx, m.k)
    # no window holds a state of another episode (nor padding)
    ep_windows = full_ep[torch.as_tensor(t_idx[:, None] + 1 + np.arange(m.k)), torch.as_tensor(e_idx)[:, None]]
    own = torch.as_tensor(roll.ep.reshape(-1))[:, None]
    assert torch.equal(mask, ep_windows == own)
    with torch.no_grad():
        plan = m.plan(win, mask)
        # the actors (incremental embeddings) used exactly these plans
        np.testing.assert_allclose(plan.mean.numpy(), roll.plan_mean.reshape(T * N, -1), atol=1e-5)
        # the learner's policy (stored eps) gives exactly the behaviour log-probs before any update
        logits, _, _ = m.heads(torch.as_tensor(roll.obs.reshape(T * N, -1)), plan,
                                    torch.as_tensor(roll.eps.reshape(T * N, -1)))
        logp = torch.log_softmax(logits, -1).gather(-1, torch.as_tensor(roll.actions.reshape(-1, 1))).squeeze(-1)
    np.testing.assert_allclose(logp.numpy(), roll.logprobs.reshape(-1), atol=1e-5)


def test_replayed_sequences_match_the_rollout_forward_pass():
    agent = make_agent(env_kwargs={"max_steps": 6})
    roll = agent.collect()
    full_obs, full_ep = roll.full()
    items = agent.adder.sequence_items(roll, full_obs, full_ep)
    L, T, N, model = agent.echo.sequence_length, agent.num_steps, agent.num_envs, agent.model
    assert items["obs"].shape[0] == (T // L) * N
    with torch.no_grad():
        logits_seq, _, _, _ = model.sequence_forward(items, L)  # [L+1, B, A]
        fo, fe = torch.as_tensor(full_obs), torch.as_tensor(full_ep)
        # sequence b = chunk c, env n: step t = c*L + j
        b = np.arange(items["obs"].shape[0])
        c, n = b // N, b % N
        for j in (0, L - 1):
            t = c * L + j
            w, m = model.gather_windows(fo, fe, t, n, model.k)
            logits, _, _ = model.heads(torch.as_tensor(roll.obs[t, n]), model.plan(w, m),
                                        torch.as_tensor(roll.eps[t, n]).half().float())
            torch.testing.assert_close(logits_seq[j], logits, atol=1e-5, rtol=1e-5)


def test_iteration_runs_every_part_and_replay_learns_off_policy():
    agent = make_agent()
    for _ in range(3):
        m = agent.train_iteration()
    assert m["loss/world_model"] > 0 and m["loss/plan_kl"] >= 0
    assert m["replay/size"] == 3 * (agent.num_steps // 8) * agent.num_envs
    assert np.isfinite(m["replay/value_loss"]) and m["replay/rho_mean"] > 0
    assert 0 < m["replay/importance_weight_mean"] <= 1


@pytest.mark.parametrize("override,check", [
    ({"echo_config.latent_plan": False}, lambda a, m: all(p.grad is None for p in a.lpo.encoder.parameters())),
    ({"planning_config.kl_weight": 0.0}, lambda a, m: m["loss/plan_kl"] == 0),
    ({"echo_config.world_model_coef": 0.0}, lambda a, m: m["loss/world_model"] == 0),
    ({"echo_config.replay_updates": 0}, lambda a, m: a.replay is None and not any(k.startswith("replay/") for k in m)),
    ({"echo_config.self_imitation_updates": 0},
     lambda a, m: a.sil is None and not any(k.startswith("self_imitation/") for k in m)),
])
def test_each_part_switches_off(override, check):
    agent = make_agent(**override)
    m = agent.train_iteration()
    assert check(agent, m)


def test_bad_sequence_length_is_config_error():
    with pytest.raises(ConfigError, match="sequence_length"):
        make_agent(**{"echo_config.sequence_length": 5})


def test_checkpoint_round_trip_weights_only():
    a = make_agent()
    a.train_iteration()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    b = make_agent()
    b.load_state_dict(state)
    assert b.env_steps == a.env_steps
    for p, q in zip(a.lpo.modules().parameters(), b.lpo.modules().parameters()):
        assert torch.equal(p, q)


def test_evaluate_with_episode_starts():
    agent = make_agent()
    out = agent.evaluate(lambda n: make_vector_env(ENV, n), episodes=4, seed=3, num_envs=2)
    assert out["episodes"] == 4 and 0.0 <= out["success_rate"] <= 1.0


@pytest.mark.slow
def test_echo_agent_learns_empty_5x5():
    agent = make_agent(num_actors=8, batch_size=1024, total_timesteps=40_000, **{  # LR anneals to 0 at 40k
        "planning_config.embedding_dim": 64, "planning_config.state_window_size": 8, "echo_config.hidden_dim": 128,
        "echo_config.sequence_length": 32, "echo_config.replay_batch_sequences": 16, "ppo_config.batch_size": 256,
        "ppo_config.num_epochs": 4, "replay_config.age_threshold": 1000, "replay_config.max_replay_age": 2000,
        "replay_config.min_experiences": 64})
    while agent.env_steps < 40_000:
        agent.train_iteration()
    out = agent.evaluate(lambda n: make_vector_env(ENV, n), episodes=32, seed=7)
    assert out["success_rate"] >= 0.9


def test_all_parts_off_is_ppo():
    """With every part off the agent is PPO: same initial weights, actions and updates."""
    from echo_rl.vector.ppo_agent import PPOAgent

    cfg = TrainingConfig(env_name=ENV, agent="ppo", num_actors=4, batch_size=64, total_timesteps=10_000,
                         seed=3).with_overrides({"ppo_config.batch_size": 32, "ppo_config.num_epochs": 2})
    ppo = PPOAgent(cfg, make_vector_env(ENV, 4), torch.device("cpu"))
    echo = make_agent(**{"seed": 3, "ppo_config.num_epochs": 2, "echo_config.latent_plan": False,
                         "echo_config.replay_updates": 0, "echo_config.world_model_coef": 0.0,
                         "echo_config.self_imitation_updates": 0,
                         "planning_config.kl_weight": 0.0, "echo_config.hidden_dim": 128})
    for _ in range(3):
        a, b = ppo.train_iteration(), echo.train_iteration()
        for key in ("loss/policy", "loss/value", "loss/entropy", "loss/grad_norm", "episode/return"):
            if key in a:
                assert a[key] == b[key], key


def test_resume_from_checkpoint_is_exact():
    """state_dict + rollout_state (envs, windows, replay contents) -> the same next iterations."""
    import pickle

    a = make_agent(env_kwargs={"max_steps": 10})
    for _ in range(2):
        a.train_iteration()
    _store_made_up_episode(a)
    assert len(a.sil) > 0 and any(len(p["obs"]) for p in a.sil.pending)  # stored and in-progress episodes
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    rollout = pickle.loads(pickle.dumps(a.rollout_state()))
    b = make_agent(env_kwargs={"max_steps": 10})
    b.load_state_dict(torch.load(buf, weights_only=True))
    b.load_rollout_state(rollout)
    for _ in range(2):
        ma, mb = a.train_iteration(), b.train_iteration()
        assert "replay/value_loss" in ma and "self_imitation/loss" in ma
        assert ma == mb
    for p, q in zip(a.lpo.modules().parameters(), b.lpo.modules().parameters()):
        assert torch.equal(p, q)


def _heads_on_a_fresh_rollout(agent):
    """(rollout, logits, values, world-model input) for every state of one collected rollout."""
    roll = agent.collect()
    T, N, m = agent.num_steps, agent.num_envs, agent.model
    full_obs, full_ep = (torch.as_tensor(a) for a in roll.full())
    idx = np.arange(T * N)
    win, mask = m.gather_windows(full_obs, full_ep, idx // N, idx % N, m.k)
    logits, values, wm_in = m.heads(torch.as_tensor(roll.obs.reshape(T * N, -1)), m.plan(win, mask),
                                         torch.as_tensor(roll.eps.reshape(T * N, -1)))
    return roll, logits, values, wm_in


def test_world_model_trains_the_plan_not_the_trunk():
    agent = make_agent()
    roll, _, _, wm_in = _heads_on_a_fresh_rollout(agent)
    loss = agent.model.wm_head.loss(wm_in, torch.as_tensor(roll.actions.reshape(-1)),
                              torch.as_tensor(roll.wm_target.reshape(-1, roll.wm_target.shape[-1])))
    loss.backward()
    assert all(p.grad is None for p in agent.lpo.policy.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in agent.lpo.encoder.parameters())
    groups = {g["name"]: g for g in agent.lpo.optimizer.param_groups}
    assert set(groups) == {"policy", "encoder", "aux"}  # the world model is clipped on its own
    assert {id(p) for p in groups["aux"]["params"]} == {id(p) for p in agent.model.wm_head.parameters()}


def test_replay_learns_values_and_plans_not_the_policy_head():
    """Replayed data never take a policy-gradient step: the actor head is untouched, the critic learns."""
    agent = make_agent()
    agent.train_iteration()
    roll = agent.collect()
    agent.adder.add(roll)
    actor = [p.clone() for p in agent.lpo.policy.policy_head.parameters()]
    critic = [p.clone() for p in agent.lpo.policy.value_head.parameters()]
    encoder = [p.clone() for p in agent.lpo.encoder.parameters()]
    m = agent.learner.replay_update()
    assert "replay/value_loss" in m and not any("policy" in k for k in m)
    assert all(torch.equal(p, q) for p, q in zip(actor, agent.lpo.policy.policy_head.parameters()))
    assert any(not torch.equal(p, q) for p, q in zip(critic, agent.lpo.policy.value_head.parameters()))
    assert any(not torch.equal(p, q) for p, q in zip(encoder, agent.lpo.encoder.parameters()))  # the plan KL


def test_policy_gradient_does_not_reach_the_plan_encoder():
    agent = make_agent()
    _, logits, values, _ = _heads_on_a_fresh_rollout(agent)
    (logits.logsumexp(-1).sum() + values.sum()).backward()
    assert all(p.grad is None for p in agent.lpo.encoder.parameters())
    assert any(p.grad is not None for p in agent.lpo.policy.film.parameters())



def _store_made_up_episode(agent) -> dict:
    """Env 0's states of a fresh rollout, stored as one episode of action 2 that ends with reward 1."""
    obs = agent.collect().obs[:, 0].copy()
    agent.collector.stats.drain()  # that rollout's episodes are not training's
    rewards = np.zeros(len(obs), np.float32)
    rewards[-1] = 1.0
    term = np.zeros((len(obs), 1), bool)
    term[-1] = True
    sil = SelfImitationReplay(1, agent.obs_dim, agent.model.k, 100, 0.99, alpha=0.6, beta=0.4, priority_epsilon=1e-6,
                              seed=0)
    items = sil.collect(obs[:, None], np.full((len(obs), 1), 2), rewards[:, None], term, np.zeros_like(term))
    agent.sil.buffer.add(items, np.ones(len(obs)))
    return items


def test_self_imitation_raises_the_stored_actions_where_the_return_beats_the_value():
    agent = make_agent(**{"echo_config.self_imitation_updates": 1})
    items = _store_made_up_episode(agent)

    def logp_and_value():
        with torch.no_grad():
            logits, values = agent.model.window_heads(items["windows"], items["mask"])
        return torch.log_softmax(logits, -1)[:, 2].mean().item(), values.mean().item()

    before = logp_and_value()
    m = agent.learner.self_imitation_update()
    after = logp_and_value()
    assert m["self_imitation/positive_fraction"] == 1.0  # V starts near 0, every return is > 0.8
    assert after[0] > before[0] and after[1] > before[1]


def test_replay_too_big_for_checkpoints_warns_once_when_built(monkeypatch):
    """A replay over the checkpoint limit is said once, at construction; checkpoints then leave it out quietly."""
    import warnings

    from echo_rl.vector.echo import adder

    monkeypatch.setattr(adder, "REPLAY_CHECKPOINT_LIMIT", 1024)
    with pytest.warns(UserWarning, match="replay preallocates .*max_replay_age"):
        a = make_agent()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert a.rollout_state().replay_npz is None
        assert make_agent(**{"echo_config.replay_updates": 0}).replay is None  # no replay, nothing to say


def test_collector_carries_the_actors_fields_next_observations_and_context():
    """The shared collector's extras: per-step fields from the actor, the observation after each step
    (final_obs at episode ends, not the reset one), and the k states before each rollout."""
    agent = make_agent(env_kwargs={"max_steps": 6})
    first = agent.collect()
    obs1, ep1 = first.obs.copy(), first.ep.copy()
    done = first.terminated | first.truncated
    assert done[:-1].any()
    same = ~done[:-1]
    np.testing.assert_array_equal(first.wm_target[:-1][same], first.obs[1:][same])
    assert (first.wm_target[:-1][done[:-1]] != first.obs[1:][done[:-1]]).any(axis=-1).all()
    # episode ids count each env's episodes; the next rollout starts with the last k states as context
    np.testing.assert_array_equal(ep1[1:], ep1[:-1] + done[:-1])
    second = agent.collect()
    k = agent.model.k
    np.testing.assert_array_equal(second.ctx_obs, obs1[-k:])
    np.testing.assert_array_equal(second.ctx_ep, ep1[-k:])
    np.testing.assert_array_equal(second.ep[0], ep1[-1] + done[-1])
