"""agent.set(...): each part swaps on PPO and IMPALA, a swapped agent trains, checkpoints and resumes exactly,
an injected encoder keeps its weights, intrinsic rewards reach the learner only, pre-training and init_from."""

import asyncio
import copy
import json
import sys
import types

import numpy as np
import pytest
import torch
from torch import nn

from echo_rl import EchoRLTrainer, TrainingConfig
from echo_rl.config import ConfigError
from echo_rl.models.encoders import MiniGridCNN
from echo_rl.models.policies import ActorCritic, EpsilonCategorical, TemperedCategorical
from echo_rl.utils import state_codec
from echo_rl.training.agents import build_agent
from echo_rl.vector.rollout import RolloutBuffer

SMALL = dict(env_name="minigrid:MiniGrid-Empty-5x5-v0", total_timesteps=256, num_actors=2, batch_size=32,
             evaluation_episodes=2, evaluation_frequency=0, save_frequency=0, env_config={"max_steps": 16},
             loggers=[])
PIXELS = dict(SMALL, env_name="minigrid-pixels:MiniGrid-Empty-5x5-v0")
CPU = torch.device("cpu")
AGENTS = ["ppo", "impala"]


# -- a stand-in intrinsic reward package (the echo_rl.intrinsic interface) ------------------------------------
class FakeNovelty:
    """Prediction error of a trained linear model against a fixed random projection (RND's shape, tiny)."""

    def __init__(self, observation_space, device, lr=0.01):
        dim = int(np.prod(observation_space.shape))
        g = torch.Generator().manual_seed(7)
        self.target = torch.randn(dim, 4, generator=g)
        self.predictor = nn.Linear(dim, 4)
        self.optimizer = torch.optim.SGD(self.predictor.parameters(), lr=lr)
        self.updates = 0

    def _error(self, obs):
        x = obs.reshape(*obs.shape[:2], -1).float() / 255.0
        return (self.predictor(x) - x @ self.target).pow(2).mean(-1)

    def compute(self, obs, actions, next_obs, dones):
        with torch.no_grad():
            return self._error(next_obs)

    def update(self, obs, actions, next_obs, dones):
        loss = self._error(next_obs).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.updates += 1
        return {"loss": loss.item()}

    def state_dict(self):
        return {"predictor": self.predictor.state_dict(), "optimizer": self.optimizer.state_dict(),
                "updates": self.updates}

    def load_state_dict(self, state):
        self.predictor.load_state_dict(state["predictor"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state["updates"]


class FakeMixer:
    def __init__(self, module, beta, kappa, normalize):
        self.module, self.beta, self.kappa, self.normalize = module, beta, kappa, normalize

    def mix(self, extrinsic, intrinsic, global_step):
        return extrinsic + self.beta * (1 - self.kappa) ** global_step * intrinsic.cpu().numpy()


@pytest.fixture
def fake_intrinsic(monkeypatch):
    package, mixing = types.ModuleType("echo_rl.intrinsic"), types.ModuleType("echo_rl.intrinsic.mixing")
    made = []

    def make_intrinsic_reward(name, observation_space, action_space, device, **kw):
        if name != "fake":
            raise ConfigError(f"unknown intrinsic reward {name!r}; allowed: fake")
        made.append(FakeNovelty(observation_space, device, **kw))
        return made[-1]

    package.make_intrinsic_reward, mixing.IntrinsicMixer = make_intrinsic_reward, FakeMixer
    monkeypatch.setitem(sys.modules, "echo_rl.intrinsic", package)
    monkeypatch.setitem(sys.modules, "echo_rl.intrinsic.mixing", mixing)
    return made


def agent_for(name, **overrides):
    return build_agent(TrainingConfig(**{**SMALL, **overrides}, agent=name), CPU)


def params(module):
    return [p.detach().clone() for p in module.parameters()]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# -- each part ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", AGENTS)
def test_an_injected_encoder_keeps_its_weights_and_trains(name):
    agent = agent_for(name)
    try:
        torch.manual_seed(123)
        encoder = MiniGridCNN()
        pretrained = params(encoder)
        assert agent.set(encoder=encoder) is agent
        agent.start()  # nothing re-initialises it at train start
        assert agent.network.encoder is encoder and same(params(encoder), pretrained)
        optimised = {id(p) for g in agent.optimizer.param_groups for p in g["params"]}
        assert {id(p) for p in encoder.parameters()} <= optimised  # the fresh optimiser holds it
        agent.train_iteration()
        assert not same(params(encoder), pretrained)  # ... and learns it
    finally:
        agent.close()


@pytest.mark.parametrize("name", AGENTS)
def test_a_named_encoder_and_a_wrong_one(name):
    agent = agent_for(name)
    try:
        agent.set(encoder="minigrid_cnn")
        assert isinstance(agent.network.encoder, MiniGridCNN)
        with pytest.raises(ConfigError, match="nature_cnn does not fit observations of shape"):
            agent.set(encoder="nature_cnn")
        with pytest.raises(ValueError, match="unknown agent part 'critic'; allowed: encoder, policy"):
            agent.set(critic=nn.Linear(1, 1))
    finally:
        agent.close()


class TinyPolicy(nn.Module):
    """A whole policy: no shared encoder, logits and values from one linear layer each."""

    def __init__(self, obs_dim, num_actions):
        super().__init__()
        self.pi, self.v = nn.Linear(obs_dim, num_actions), nn.Linear(obs_dim, 1)

    def forward(self, obs):
        x = obs.float() / 10
        return self.pi(x), self.v(x).squeeze(-1)

    def value(self, obs):
        return self.forward(obs)[1]


@pytest.mark.parametrize("name", AGENTS)
def test_a_policy_swap_trains_the_new_network(name):
    agent = agent_for(name)
    try:
        policy = TinyPolicy(agent.obs_shape[0], agent.num_actions)
        before = params(policy)
        agent.set(policy=policy)
        metrics = agent.train_iteration()
        assert agent.network is policy and not same(params(policy), before) and np.isfinite(metrics["loss/policy"])
        with pytest.raises(ValueError, match="policy must be an nn.Module"):
            agent.set(policy=nn.Linear(3, 3))
    finally:
        agent.close()


@pytest.mark.parametrize("name", AGENTS)
def test_a_distribution_changes_acting_and_learning(name):
    agent = agent_for(name)
    try:
        obs = torch.as_tensor(agent.collector.next_obs)
        raw, _ = agent.network(obs)
        agent.set(distribution=EpsilonCategorical(0.6))
        logp, _ = agent.network(obs)
        n = agent.num_actions
        # (1 - eps) softmax + eps / n, hand-computed
        assert torch.allclose(logp.exp(), 0.4 * torch.softmax(raw, -1) + 0.6 / n, atol=1e-6)
        assert torch.allclose(logp.exp().sum(-1), torch.ones(len(obs)))
        agent.set(encoder="minigrid_cnn")  # the distribution stays with the new heads
        assert isinstance(agent.network.distribution, EpsilonCategorical)
        agent.set(distribution=TemperedCategorical(2.0))
        metrics = agent.train_iteration()
        # the learner's entropy is the distribution's: near-uniform policies at temperature 2
        assert metrics["loss/entropy"] > 0.99 * np.log(n)
    finally:
        agent.close()


class CountingBuffer(RolloutBuffer):
    """A storage that counts its fills (a RolloutBuffer subclass: the collector writes its arrays)."""

    fills = 0

    def __init__(self, *args):
        super().__init__(*args)
        CountingBuffer.fills += 1


@pytest.mark.parametrize("name", AGENTS)
def test_a_storage_swap_is_where_the_collector_writes(name):
    agent = agent_for(name)
    try:
        agent.set(storage=CountingBuffer)
        assert isinstance(agent.collector.buffer, CountingBuffer)
        agent.train_iteration()
        assert agent.collector.buffer.rewards.shape == (agent.num_steps, agent.num_envs)
        with pytest.raises(ValueError, match="lacks the arrays"):
            agent.set(storage=lambda *a: object())
    finally:
        agent.close()


@pytest.mark.parametrize("name", AGENTS)
def test_augmentation_reaches_the_learner_only(name, monkeypatch):
    agent = build_agent(TrainingConfig(**PIXELS, agent=name, encoder="nature_cnn"), CPU)
    try:
        seen = {}
        learn = agent.learn
        monkeypatch.setattr(agent, "learn", lambda buf: seen.setdefault("obs", buf.obs.copy()) is None or learn(buf))
        agent.set(augmentation="random_shift")
        agent.train_iteration()
        collected = agent.collector.buffer.obs
        assert seen["obs"].shape == collected.shape and seen["obs"].dtype == np.uint8
        assert not np.array_equal(seen["obs"], collected)  # the learner saw shifted images, the buffer is clean
        with pytest.raises(ConfigError, match="acts on pixel observations"):
            agent_for(name).set(augmentation="random_shift")
    finally:
        agent.close()


# -- intrinsic reward, pre-training --------------------------------------------------------------------------
@pytest.mark.parametrize("name", AGENTS)
@pytest.mark.parametrize("pretraining", [False, True])
def test_intrinsic_reward_is_mixed_in_after_collection(name, pretraining, fake_intrinsic, monkeypatch):
    agent = agent_for(name, intrinsic_reward="fake", intrinsic_beta=0.5,
                      pretraining=pretraining, env_config={"max_steps": 4})
    try:
        module = fake_intrinsic[0]
        assert agent.reward is module
        seen = {}
        learn = agent.learn

        def spy(buf):
            seen["rewards"] = buf.rewards.copy()
            return learn(buf)

        monkeypatch.setattr(agent, "learn", spy)
        predictor = copy.deepcopy(module.predictor)
        metrics = agent.train_iteration()
        buf = agent.collector.buffer
        # the state each step reached: at an episode's end its terminal observation, not the next episode's first
        next_obs = torch.as_tensor(buf.next_observations)
        done = buf.terminated | buf.truncated
        assert done.any() and not np.array_equal(buf.next_observations[:-1][done[:-1]], buf.obs[1:][done[:-1]])
        np.testing.assert_array_equal(buf.next_observations[:-1][~done[:-1]], buf.obs[1:][~done[:-1]])
        with torch.no_grad():  # computed before the module's update, with the predictor as it was
            x = next_obs.reshape(*next_obs.shape[:2], -1).float() / 255.0
            intrinsic = (predictor(x) - x @ module.target).pow(2).mean(-1).numpy()
        extrinsic = np.zeros_like(buf.rewards) if pretraining else buf.rewards
        np.testing.assert_allclose(seen["rewards"], extrinsic + 0.5 * intrinsic, rtol=1e-5)
        assert module.updates == 1 and "intrinsic/loss" in metrics and "intrinsic/reward_mean" in metrics
        # the collector's buffer (and so the episode statistics) keeps the task's rewards
        assert metrics["episode/count"] > 0 and not np.allclose(seen["rewards"], buf.rewards)
    finally:
        agent.close()


def test_intrinsic_config_errors(fake_intrinsic):
    with pytest.raises(ConfigError, match="set intrinsic_reward"):
        TrainingConfig(**SMALL, pretraining=True)
    with pytest.raises(ConfigError, match="unknown intrinsic reward 'nope'; allowed: fake"):
        agent_for("ppo", intrinsic_reward="nope")


def test_a_missing_intrinsic_package_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "echo_rl.intrinsic", None)
    with pytest.raises(ConfigError, match="needs the echo_rl.intrinsic package"):
        agent_for("ppo", intrinsic_reward="rnd")


# -- checkpoints with swapped parts ---------------------------------------------------------------------------
def swapped(name, **overrides):
    agent = agent_for(name, intrinsic_reward="fake", env_config={"max_steps": 4}, **overrides)
    torch.manual_seed(5)
    return agent.set(encoder=MiniGridCNN(), distribution=EpsilonCategorical(0.1), storage=CountingBuffer)


@pytest.mark.parametrize("name", AGENTS)
def test_a_swapped_agent_resumes_exactly(name, fake_intrinsic, tmp_path):
    a = swapped(name)
    try:
        for _ in range(2):
            a.train_iteration()
        state = a.state_dict()
        torch.save(state, tmp_path / "state.pt")
        state_codec.write(tmp_path, a.rollout_state())
        b = swapped(name)
        try:
            b.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
            b.load_rollout_state(state_codec.read(tmp_path))
            rows_a = [a.train_iteration() for _ in range(2)]
            rows_b = [b.train_iteration() for _ in range(2)]
            assert rows_a == rows_b
            assert same(params(a.network), params(b.network))
            assert same(params(a.reward.predictor), params(b.reward.predictor))
        finally:
            b.close()
        plain = agent_for(name)
        try:
            with pytest.raises(ConfigError, match="this checkpoint has an intrinsic reward module"):
                plain.load_state_dict(state)
        finally:
            plain.close()
    finally:
        a.close()


def train(cfg, run_dir, resume=False):
    return asyncio.run(EchoRLTrainer(cfg, run_dir=run_dir, resume=resume, show_progress=False).train())


def test_named_parts_resume_through_the_trainer(tmp_path):
    """--set encoder=... augmentation=...: a run cut at its checkpoint and resumed logs what the uncut run logs."""
    cfg = TrainingConfig(**{**PIXELS, "total_timesteps": 64}, encoder="nature_cnn", augmentation="color_jitter")
    train(cfg, tmp_path / "full")
    train(cfg.replace(total_timesteps=32), tmp_path / "cut")
    train(cfg, tmp_path / "cut", resume=True)
    rows = lambda run: [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    cut_end = lambda r: r["step"] == 32 and any(k.startswith("eval/") for k in r)  # noqa: E731
    full = rows("full")
    assert len(full) >= 2 and full == [r for r in rows("cut") if not cut_end(r)]


# -- pre-training, then fine-tuning from its checkpoint -------------------------------------------------------
def test_pretraining_then_init_from(fake_intrinsic, tmp_path):
    pre = TrainingConfig(**{**SMALL, "total_timesteps": 64}, intrinsic_reward="fake", pretraining=True,
                         encoder="minigrid_cnn")
    train(pre, tmp_path / "pre")
    saved = torch.load(sorted((tmp_path / "pre" / "checkpoints").iterdir())[-1] / "state.pt",
                       weights_only=True)["state"]["network"]
    fine = agent_for("ppo", encoder="minigrid_cnn", init_from=str(tmp_path / "pre"))
    try:
        fine.start()
        assert all(torch.equal(v, saved[k]) for k, v in fine.network.state_dict().items())
        assert fine.env_steps == 0 and fine.reward is None  # the task's reward, fresh counters
    finally:
        fine.close()
    wrong = agent_for("ppo", init_from=str(tmp_path / "pre"))  # the default encoder: another network
    try:
        with pytest.raises(ConfigError, match="does not fit this agent's encoder"):
            wrong.start()
    finally:
        wrong.close()
    missing = agent_for("ppo", init_from=str(tmp_path / "nowhere"))
    try:
        with pytest.raises(ConfigError, match="init_from .*no such run directory"):
            missing.start()
    finally:
        missing.close()


def test_encoder_names_from_the_cli_set():
    from echo_rl.commands.train import add_arguments, build_config
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = build_config(p.parse_args(["--task", "minigrid-pixels:MiniGrid-Empty-5x5-v0", "--set", "encoder=impala_cnn",
                                     "--set", "augmentation=random_crop", "--set", "intrinsic_reward=rnd"]))
    assert (cfg.encoder, cfg.augmentation, cfg.intrinsic_reward) == ("impala_cnn", "random_crop", "rnd")
    with pytest.raises(ConfigError, match="TrainingConfig.encoder='resnet' is invalid: allowed: None, mlp"):
        build_config(p.parse_args(["--set", "encoder=resnet"]))
    agent = build_agent(TrainingConfig(**SMALL, encoder="impala_cnn").replace(env_name=cfg.env_name), CPU)
    agent.close()
    with pytest.raises(ConfigError, match="encoder='nature_cnn' does not fit task"):
        build_agent(TrainingConfig(**SMALL, encoder="nature_cnn"), CPU)


@pytest.mark.parametrize("module", ["rnd"])
def test_a_real_intrinsic_module_trains_and_resumes_through_the_trainer(module, tmp_path):
    pytest.importorskip("echo_rl.intrinsic")
    cfg = TrainingConfig(**{**SMALL, "total_timesteps": 64}, intrinsic_reward=module)
    train(cfg, tmp_path / "full")
    train(cfg.replace(total_timesteps=32), tmp_path / "cut")
    train(cfg, tmp_path / "cut", resume=True)  # the mixer's numpy statistics pass torch.load(weights_only=True)
    rows = lambda run: [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    full = rows("full")
    assert any("intrinsic/reward_mean" in r for r in full)
    assert full == [r for r in rows("cut") if not (r["step"] == 32 and any(k.startswith("eval/") for k in r))]
    with pytest.raises(ConfigError, match="intrinsic_reward='nope' is invalid: unknown intrinsic reward 'nope'"):
        agent_for("ppo", intrinsic_reward="nope")


def test_the_guide_example_runs(capsys):
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "modules.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/modules.md", "exec"), {})
    assert "entropy" in capsys.readouterr().out


def test_parts_the_echo_rl_agent_and_text_tasks_do_not_take_are_refused():
    # the echo-rl agent takes the other parts (tests/test_training/test_echo_modular.py)
    with pytest.raises(ConfigError, match="augmentation='random_shift' is invalid: acts on pixel observations; the "
                                          "echo-rl agent reads MiniGrid's symbolic observation"):
        TrainingConfig(**SMALL, agent="echo-rl", augmentation="random_shift")
    with pytest.raises(ConfigError, match="augmentation='random_shift' is invalid: acts on vector tasks only"):
        TrainingConfig(env_name="cruxeval", backbone="tiny", augmentation="random_shift")


def test_pixel_observations_reach_an_intrinsic_module_channels_first(fake_intrinsic, monkeypatch):
    seen = []
    monkeypatch.setattr(FakeNovelty, "compute", lambda self, obs, a, nxt, d: seen.append(obs.shape) or
                        torch.zeros(obs.shape[:2]))
    agent = build_agent(TrainingConfig(**PIXELS, intrinsic_reward="fake"), CPU)
    try:
        agent.train_iteration()
        assert seen == [(agent.num_steps, agent.num_envs, 3, 56, 56)]
    finally:
        agent.close()
    pytest.importorskip("echo_rl.intrinsic")
    monkeypatch.undo()
    real = build_agent(TrainingConfig(**PIXELS, intrinsic_reward="rnd"), CPU)
    try:
        assert "intrinsic/reward_mean" in real.train_iteration()
    finally:
        real.close()
