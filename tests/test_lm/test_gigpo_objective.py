"""lm_config.objective=gigpo: GRPO's loss (+ the ECHO term) on GiGPO's per-step advantages, end to end."""

import asyncio
import copy

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from echo_rl.algorithms.echo_loss import echo_loss_from_logprobs  # noqa: E402
from echo_rl.algorithms.gigpo import gigpo_advantages, token_advantages  # noqa: E402
from echo_rl.algorithms.token_logprobs import sequence_logprobs  # noqa: E402
from echo_rl.config import ConfigError, LMConfig  # noqa: E402
from echo_rl.lm.batch import collate  # noqa: E402
from echo_rl.lm.chat_delta import ChatRenderer  # noqa: E402
from echo_rl.lm.learner import LMLearner  # noqa: E402
from echo_rl.training.trainer import EchoRLTrainer  # noqa: E402

from test_loop import _cfg, _rows, save_checkpoint  # noqa: E402
from test_lm_replay_loop import _tiny_model, _traj  # noqa: E402

STATES = [["start", "hall"], ["start", "hall"], ["start", "cellar"]]


@pytest.fixture
def checkpoint(tmp_path, chatml_tokenizer):
    return save_checkpoint(tmp_path / "ckpt", chatml_tokenizer)


def _trajs(r):
    return [_traj(r, k, 0, anchor_states=STATES[k]) for k in range(3)]


@pytest.mark.parametrize("lam", [0.0, 0.05])
def test_gigpo_step_equals_the_pure_functions_and_moves_weights(chatml_tokenizer, lam):
    r = ChatRenderer(chatml_tokenizer)
    trajs = _trajs(r)
    cfg = LMConfig(objective="gigpo", learning_rate=1e-2, gigpo_gamma=0.9, gigpo_omega=0.7)
    learner = LMLearner(_tiny_model(chatml_tokenizer), 0, cfg, lam=lam)
    model0 = copy.deepcopy(learner.model)

    batch = collate(trajs, 0)
    adv = gigpo_advantages([t.rewards for t in trajs], [t.group_id for t in trajs], STATES, gamma=0.9, omega=0.7)
    tokens = token_advantages(adv.steps, [t.turn_spans() for t in trajs], tuple(batch.input_ids.shape))
    assert tokens.abs().sum() > 0 and not torch.allclose(tokens[0][tokens[0] != 0], tokens[0][tokens[0] != 0][0])
    lp = sequence_logprobs(model0(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
                           batch.input_ids)
    expected = echo_loss_from_logprobs(lp, lp, batch.roles, batch.prompt_length, batch.behavior_logprobs, tokens,
                                       batch.env_output_count, lam=lam, attention_mask=batch.attention_mask)

    m = learner.update(trajs)
    assert m["loss"] == pytest.approx(float(expected.loss.detach()), rel=1e-5, abs=1e-6)
    assert m["env_ce_scaled"] == pytest.approx(lam * float(expected.env_ce.detach()), rel=1e-5, abs=1e-7)
    assert m["gigpo_anchored_share"] == pytest.approx(5 / 6)  # "cellar" is the one state seen once
    assert learner.last_rows["advantage"].shape == (3,)
    assert all(not torch.equal(a, b) for a, b in zip(model0.parameters(), learner.model.parameters()))


def test_omega_zero_is_grpo(chatml_tokenizer):
    r = ChatRenderer(chatml_tokenizer)
    losses = {}
    for name, extra in (("grpo", {}), ("gigpo", {"gigpo_omega": 0.0})):
        learner = LMLearner(_tiny_model(chatml_tokenizer), 0, LMConfig(objective=name, learning_rate=1e-5, **extra))
        losses[name] = learner.update(_trajs(r))["loss"]
    assert losses["gigpo"] == pytest.approx(losses["grpo"], rel=1e-6, abs=1e-8)


def test_trajectories_without_anchor_states_are_one_clear_error(chatml_tokenizer):
    r = ChatRenderer(chatml_tokenizer)
    learner = LMLearner(_tiny_model(chatml_tokenizer), 0, LMConfig(objective="gigpo", learning_rate=1e-5))
    with pytest.raises(ValueError, match=r"objective='gigpo' needs info\['anchor_states'\] on trajectory 0: one "
                                         r"string per action turn \(2\); got NoneType"):
        learner.update([_traj(r, k, 0) for k in range(2)])
    with pytest.raises(ValueError, match="got 1 entries"):
        learner.update([_traj(r, k, 0, anchor_states=["a"]) for k in range(2)])


def test_gigpo_and_echo_through_the_cli_on_minigrid(checkpoint, tmp_path):
    """--set lm_config.objective=gigpo: MiniGrid's state keys reach the learner and two updates run."""
    from echo_rl.cli import main

    run = tmp_path / "run"
    assert main(["train", "--task", "minigrid:MiniGrid-Empty-Random-5x5-v0", "--agent", "echo-rl", "--no-plan",
                 "--backbone", str(checkpoint), "--timesteps", "100", "--num-actors", "2", "--batch-size", "2",
                 "--run-dir", str(run), "--no-progress", "--set", "lm_config.objective=gigpo",
                 "--set", "lm_config.gigpo_norm=none", "--set", "lm_config.group_size=2",
                 "--set", "lm_config.sft_episodes=0", "--set", "lm_config.heldout_pool=0",
                 "--set", "lm_config.max_updates=2", "--set", "lm_config.max_turns=3",
                 "--set", "lm_config.max_new_tokens=4", "--set", "evaluation_episodes=1"]) == 0
    rows = [r for r in _rows(run) if "lm/loss" in r]
    assert len(rows) == 2
    for row in rows:  # echo-rl: GiGPO + ECHO is one setting, λ·CE applies
        assert row["lm/lambda"] == 0.05 and np.isfinite(row["lm/loss"]) and "lm/env_ce_scaled" in row
        assert 0.0 <= row["lm/gigpo_anchored_share"] <= 1.0 and row["lm/gigpo_anchor_groups"] >= 1
    # both episodes of a group start from the same MiniGrid state: at least those first steps are anchored
    assert rows[0]["lm/gigpo_anchored_share"] > 0


def test_bad_gigpo_settings_are_one_clear_error(checkpoint, tmp_path):
    with pytest.raises(ConfigError, match="LMConfig.gigpo_norm='mad' is invalid: allowed: std, none"):
        _cfg(checkpoint, **{"lm_config.gigpo_norm": "mad"})
    with pytest.raises(ConfigError, match="LMConfig.gigpo_gamma=1.5 is invalid: must be <= 1"):
        _cfg(checkpoint, **{"lm_config.gigpo_gamma": 1.5})
    with pytest.raises(ConfigError, match="LMConfig.gigpo_similarity=0.0 is invalid: must be > 0"):
        _cfg(checkpoint, **{"lm_config.gigpo_similarity": 0.0})
    cfg = _cfg(checkpoint, **{"lm_config.objective": "gigpo", "lm_config.replay_updates": 1,
                              "echo_config.latent_plan": False})
    with pytest.raises(ConfigError, match="objective='gigpo' is invalid with replay"):
        asyncio.run(EchoRLTrainer(cfg, tmp_path / "a", show_progress=False).train())
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("anchor", ["observation", "state_key"])
def test_the_rollout_records_each_turns_anchor_state(chatml_tokenizer, anchor):
    from echo_rl.config import ExecutionConfig
    from echo_rl.engine.engine import AsyncExecutionEngine
    from echo_rl.environments.base import TextEnvironment
    from echo_rl.environments.minigrid import MiniGridEnvironment
    from echo_rl.lm.rollout import CandidateScorer, LMRolloutWorker
    from echo_rl.lm.trajectory import observation_text

    renderer, model = ChatRenderer(chatml_tokenizer), _tiny_model(chatml_tokenizer).eval()
    cfg = LMConfig(action_mode="choose", max_turns=3, temperature=0.0)
    task = "minigrid" if anchor == "state_key" else None  # the registered task names its anchor state

    def env():
        return MiniGridEnvironment(task_type="empty", max_steps=3)

    async def run(e):
        async with AsyncExecutionEngine(ExecutionConfig(), model) as engine:
            worker = LMRolloutWorker(engine, renderer, cfg, task=task, scorer=CandidateScorer(model))
            return await worker.episode(e, seed=4)

    traj = asyncio.run(run(env()))
    replay = env()
    _, info = replay.reset(seed=4)
    expected = []
    for action in traj.info["actions"]:  # the state each turn started from
        expected.append(info["state_key"] if anchor == "state_key" else observation_text(info["segments"]))
        info = replay.step(action)[4]
    assert traj.info["anchor_states"] == expected and len(expected) == traj.num_turns >= 2
    if anchor == "state_key":  # a task that names state_key must provide it
        bare = env()
        bare._state_key = TextEnvironment._state_key.__get__(bare)
        with pytest.raises(ValueError, match=r"anchor state is info\['state_key'\].*its info has NoneType"):
            asyncio.run(run(bare))
