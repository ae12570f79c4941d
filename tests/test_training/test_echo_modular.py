"""agent.set(...) on the EchoRL agent: each part swaps (or is refused in one line), an injected encoder keeps its
weights, the intrinsic reward reaches the PPO pass and the replay but not self-imitation, and a swapped agent
trains, checkpoints and resumes exactly (in process and through the trainer)."""

import asyncio
import copy
import json

import numpy as np
import pytest
import torch
from test_modules import FakeNovelty, fake_intrinsic  # noqa: F401 - the stand-in intrinsic package fixture
from torch import nn

from echo_rl import EchoRLTrainer, TrainingConfig
from echo_rl.config import ConfigError
from echo_rl.models.encoders import MiniGridCNN, MiniGridEncoder
from echo_rl.models.policies import ActorCritic, EpsilonCategorical, TemperedCategorical
from echo_rl.replay.buffer import PrioritizedReplayBuffer
from echo_rl.replay.hot_cold import HotColdBuffer
from echo_rl.utils import state_codec
from echo_rl.training.agents import build_agent
from echo_rl.vector.rollout import RolloutBuffer

CPU = torch.device("cpu")
SMALL = dict(env_name="minigrid:MiniGrid-Empty-5x5-v0", agent="echo-rl", total_timesteps=256, num_actors=2,
             batch_size=32, evaluation_episodes=2, evaluation_frequency=0, save_frequency=0,
             env_config={"max_steps": 8}, loggers=[])
ECHO = {"echo_config.latent_plan": True, "planning_config.embedding_dim": 8, "planning_config.state_window_size": 3,
        "echo_config.sequence_length": 8, "echo_config.replay_batch_sequences": 4, "echo_config.hidden_dim": 32,
        "echo_config.self_imitation_capacity": 256, "replay_config.age_threshold": 16,
        "replay_config.max_replay_age": 64, "replay_config.min_experiences": 4, "ppo_config.batch_size": 16,
        "ppo_config.num_epochs": 1}


def config(**overrides) -> TrainingConfig:
    dotted = {k: v for k, v in overrides.items() if "." in k}
    plain = {k: v for k, v in overrides.items() if "." not in k}
    return TrainingConfig(**{**SMALL, **plain}).with_overrides({**ECHO, **dotted})


def agent_for(**overrides):
    return build_agent(config(**overrides), CPU)


def params(module):
    return [p.detach().clone() for p in module.parameters()]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# -- the network's parts --------------------------------------------------------------------------------------
def test_an_injected_encoder_keeps_its_weights_and_trains():
    agent = agent_for()
    try:
        agent.train_iteration()
        plan_encoder, network = params(agent.lpo.encoder), agent.network
        torch.manual_seed(123)
        encoder = MiniGridCNN()
        pretrained = params(encoder)
        assert agent.set(encoder=encoder) is agent
        agent.start()  # nothing re-initialises it at train start
        assert agent.lpo.policy.trunk is encoder and same(params(encoder), pretrained)
        assert same(params(agent.lpo.encoder), plan_encoder)  # the plan encoder keeps what it learned
        optimised = {id(p) for g in agent.lpo.optimizer.param_groups for p in g["params"]}
        assert {id(p) for p in encoder.parameters()} <= optimised  # the fresh optimiser holds it
        assert agent.network is network and network["policy"].trunk is encoder  # the actors act with it
        agent.train_iteration()
        assert not same(params(encoder), pretrained)  # ... and learns it
    finally:
        agent.close()


def test_a_named_encoder_a_config_encoder_and_wrong_ones():
    agent = agent_for()
    try:
        agent.set(encoder="minigrid_cnn")
        assert isinstance(agent.lpo.policy.trunk, MiniGridCNN)
        assert np.isfinite(agent.train_iteration()["loss/world_model"])  # a new trunk width: a fresh world model
        with pytest.raises(ConfigError, match=r"encoder nature_cnn does not fit the echo-rl agent's observations "
                                              r"of shape \(194,\): a pixel encoder needs image observations"):
            agent.set(encoder="nature_cnn")

        class Narrow(nn.Module):
            out_dim = 9  # but it returns 4 features

            def forward(self, obs):
                return obs[:, :4].float()

        with pytest.raises(ConfigError, match=r"its encoder features have shape \(1, 4\), expected \(1, 9\)"):
            agent.set(encoder=Narrow())
        with pytest.raises(ValueError, match="unknown agent part 'critic'; allowed: encoder, policy"):
            agent.set(critic=nn.Linear(1, 1))
    finally:
        agent.close()
    named = agent_for(encoder="minigrid_cnn")
    try:
        assert isinstance(named.lpo.policy.trunk, MiniGridCNN)
    finally:
        named.close()
    with pytest.raises(ConfigError, match="TrainingConfig.encoder='impala_cnn' does not fit the echo-rl agent"):
        agent_for(encoder="impala_cnn")


def test_a_policy_swap_puts_its_encoder_and_heads_under_the_plan_layer():
    agent = agent_for()
    try:
        policy = ActorCritic(agent.model.num_actions, MiniGridEncoder(hidden=16), hidden=(8,))
        before = params(policy)
        agent.set(policy=policy)
        pol = agent.lpo.policy
        assert (pol.trunk, pol.policy_head, pol.value_head) == (policy.encoder, policy.actor, policy.critic)
        assert torch.count_nonzero(pol.film.weight) == 0  # a fresh, inert FiLM layer
        metrics = agent.train_iteration()
        assert not same(params(policy), before) and np.isfinite(metrics["loss/policy"])
        with pytest.raises(ValueError, match="policy must be an actor-critic nn.Module with encoder"):
            agent.set(policy=nn.Linear(3, 3))
    finally:
        agent.close()


def test_a_distribution_changes_acting_and_every_learner():
    agent = agent_for()
    try:
        m = agent.model
        obs = torch.as_tensor(agent.collector.next_obs)
        raw, _, _ = m.heads(obs, None, None)
        agent.set(distribution=EpsilonCategorical(0.6))
        logp, _, _ = m.heads(obs, None, None)
        n = m.num_actions
        # (1 - eps) softmax + eps / n, hand-computed
        assert torch.allclose(logp.exp(), 0.4 * torch.softmax(raw, -1) + 0.6 / n, atol=1e-6)
        agent.set(encoder="minigrid_cnn")  # the distribution stays with the new heads
        assert isinstance(agent.lpo.policy.distribution, EpsilonCategorical)
        agent.set(distribution=TemperedCategorical(2.0))
        metrics = agent.train_iteration()
        # the learner's entropy is the distribution's: near-uniform policies at temperature 2
        assert metrics["loss/entropy"] > 0.99 * np.log(n)
        with pytest.raises(ValueError, match="distribution must be an nn.Module"):
            agent.set(distribution=torch.log_softmax)
    finally:
        agent.close()


# -- storage: the sequence replay ------------------------------------------------------------------------------
def test_the_replay_storage_swaps_for_another_prioritized_buffer():
    agent = agent_for()
    try:
        assert isinstance(agent.replay, HotColdBuffer)
        agent.set(storage=PrioritizedReplayBuffer.from_config)  # one ring, no hot/cold split
        assert type(agent.replay) is PrioritizedReplayBuffer
        for _ in range(2):
            metrics = agent.train_iteration()
        assert metrics["replay/size"] == len(agent.replay) > 0 and np.isfinite(metrics["replay/value_loss"])

        class NoSave:
            surprise = None

            def __init__(self, *a, **kw):
                pass

        with pytest.raises(ValueError, match="storage NoSave lacks add, sample, update_priorities"):
            agent.set(storage=NoSave)
        with pytest.raises(ValueError, match="RolloutBuffer is a rollout buffer, and echo-rl's rollout buffer"):
            agent.set(storage=RolloutBuffer)
    finally:
        agent.close()
    no_replay = agent_for(**{"echo_config.replay_updates": 0})
    try:
        with pytest.raises(ConfigError, match="which echo_config.replay_updates=0 switches off"):
            no_replay.set(storage=PrioritizedReplayBuffer.from_config)
    finally:
        no_replay.close()


# -- refusals -------------------------------------------------------------------------------------------------
def test_augmentation_and_non_symbolic_tasks_are_refused_in_one_line():
    agent = agent_for()
    try:
        with pytest.raises(ConfigError, match="augmentation acts on pixel observations; the echo-rl agent reads "
                                              "MiniGrid's symbolic observation"):
            agent.set(augmentation="random_shift")
    finally:
        agent.close()
    with pytest.raises(ConfigError, match="augmentation='random_crop' is invalid: acts on pixel observations"):
        config(augmentation="random_crop")
    with pytest.raises(ConfigError, match=r"task 'CartPole-v1' has float32 observations of shape \(4,\); the "
                                          r"echo-rl agent reads MiniGrid's symbolic observation"):
        agent_for(env_name="CartPole-v1", env_config={})


# -- the intrinsic reward ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("pretraining", [False, True])
def test_intrinsic_reward_reaches_ppo_and_replay_not_self_imitation(pretraining, fake_intrinsic, monkeypatch):
    extra = {"echo_config.self_imitation_updates": 0} if pretraining else {}
    agent = agent_for(intrinsic_reward="fake", intrinsic_beta=0.5, pretraining=pretraining,
                      env_config={"max_steps": 4}, **extra)
    try:
        module = fake_intrinsic[0]
        assert agent.reward is module
        seen = {}

        def spy(key, f):  # records the rewards of the first rollout it is given, then passes it on
            return lambda roll, *a: seen.setdefault(key, roll.rewards.copy()) is None or f(roll, *a)

        monkeypatch.setattr(agent.learner, "ppo_update", spy("ppo", agent.learner.ppo_update))
        monkeypatch.setattr(agent.adder, "add", spy("replay", agent.adder.add))
        if agent.sil_adder is not None:
            monkeypatch.setattr(agent.sil_adder, "add", spy("sil", agent.sil_adder.add))
        predictor = copy.deepcopy(module.predictor)
        metrics = agent.train_iteration()
        buf = agent.collector.buffer
        with torch.no_grad():  # computed before the module's update, on the states each step reached
            x = torch.as_tensor(buf.next_observations).float() / 255.0
            intrinsic = (predictor(x) - x @ module.target).pow(2).mean(-1).numpy()
        extrinsic = np.zeros_like(buf.rewards) if pretraining else buf.rewards
        np.testing.assert_allclose(seen["ppo"], extrinsic + 0.5 * intrinsic, rtol=1e-5)
        np.testing.assert_array_equal(seen["replay"], seen["ppo"])  # one critic, one return
        if not pretraining:
            np.testing.assert_array_equal(seen["sil"], buf.rewards)  # self-imitation imitates by task return
            assert not np.allclose(seen["sil"], seen["ppo"])
        assert module.updates == 1 and "intrinsic/loss" in metrics and "intrinsic/reward_mean" in metrics
    finally:
        agent.close()
    with pytest.raises(ConfigError, match="pretraining=True is invalid for echo-rl with echo_config."
                                          "self_imitation_updates=16: self-imitation learns from episodes' task"):
        agent_for(intrinsic_reward="fake", pretraining=True, **{"echo_config.self_imitation_updates": 16})


# -- checkpoints with swapped parts -----------------------------------------------------------------------------
def swapped(**overrides):
    agent = agent_for(intrinsic_reward="fake", env_config={"max_steps": 6}, **overrides)
    torch.manual_seed(5)
    return agent.set(encoder=MiniGridCNN(), distribution=EpsilonCategorical(0.1),
                     storage=PrioritizedReplayBuffer.from_config)


def test_a_swapped_agent_resumes_exactly(fake_intrinsic, tmp_path):
    a = swapped()
    try:
        for _ in range(2):
            a.train_iteration()
        assert len(a.replay) > 0
        state = a.state_dict()
        torch.save(state, tmp_path / "state.pt")
        state_codec.write(tmp_path, a.rollout_state())
        b = swapped()
        try:
            b.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
            b.load_rollout_state(state_codec.read(tmp_path))
            assert len(b.replay) == len(a.replay)
            rows_a = [a.train_iteration() for _ in range(2)]
            rows_b = [b.train_iteration() for _ in range(2)]
            assert rows_a == rows_b and "replay/value_loss" in rows_a[-1] and "intrinsic/loss" in rows_a[-1]
            assert same(params(a.lpo.modules()), params(b.lpo.modules()))
            assert same(params(a.reward.predictor), params(b.reward.predictor))
        finally:
            b.close()
        plain = agent_for()
        try:
            with pytest.raises(ConfigError, match="this checkpoint has an intrinsic reward module"):
                plain.load_state_dict(state)
        finally:
            plain.close()
        hot_cold = agent_for(intrinsic_reward="fake")
        try:
            with pytest.raises(ConfigError, match="replay storage is PrioritizedReplayBuffer and this agent's is "
                                                  "the hot/cold buffer"):
                hot_cold.load_state_dict(state)
            hot_cold.set(storage=PrioritizedReplayBuffer.from_config)
            with pytest.raises(ConfigError, match="this checkpoint's model does not fit this agent's parts"):
                hot_cold.load_state_dict(state)  # its trunk is the default, the run's was a MiniGridCNN
        finally:
            hot_cold.close()
    finally:
        a.close()


def train(cfg, run_dir, resume=False):
    return asyncio.run(EchoRLTrainer(cfg, run_dir=run_dir, resume=resume, show_progress=False).train())


def rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_named_parts_resume_through_the_trainer_and_init_from(tmp_path):
    """--set encoder=minigrid_cnn intrinsic_reward=rnd: a run cut at its checkpoint and resumed logs what the uncut
    run logs; then pre-training and fine-tuning from it (init_from)."""
    pytest.importorskip("echo_rl.intrinsic")
    cfg = config(total_timesteps=96, encoder="minigrid_cnn", intrinsic_reward="rnd")
    train(cfg, tmp_path / "full")
    train(cfg.replace(total_timesteps=32), tmp_path / "cut")  # its learning rate anneals over 32 steps: cut at 32
    train(cfg, tmp_path / "cut", resume=True)
    full = rows(tmp_path / "full")
    cut_end = lambda r: r["step"] == 32 and any(k.startswith("eval/") for k in r)  # noqa: E731
    assert len(full) == 4 and all("intrinsic/reward_mean" in r and "replay/size" in r for r in full[:3])
    assert "replay/value_loss" in full[1]  # the resumed run learns from the replay its checkpoint carried
    assert full == [r for r in rows(tmp_path / "cut") if not cut_end(r)]

    pre = cfg.replace(total_timesteps=32, pretraining=True).with_overrides({"echo_config.self_imitation_updates": 0})
    train(pre, tmp_path / "pre")
    saved = torch.load(sorted((tmp_path / "pre" / "checkpoints").iterdir())[-1] / "state.pt",
                       weights_only=True)["state"]["lpo"]["modules"]
    fine = agent_for(encoder="minigrid_cnn", init_from=str(tmp_path / "pre"))
    try:
        fine.start()
        assert all(torch.equal(v, saved[k]) for k, v in fine.lpo.modules().state_dict().items())
        assert fine.env_steps == 0 and fine.reward is None  # the task's reward, fresh counters
    finally:
        fine.close()
    wrong = agent_for(init_from=str(tmp_path / "pre"))  # the default trunk: another network
    try:
        with pytest.raises(ConfigError, match="its model does not fit this agent's parts"):
            wrong.start()
    finally:
        wrong.close()


def test_the_guide_example_runs(capsys):
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "modules.md").read_text()
    section = text.split("## The EchoRL agent", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/modules.md", "exec"), {})
    assert float(capsys.readouterr().out) > 0  # the world model's loss after one iteration
