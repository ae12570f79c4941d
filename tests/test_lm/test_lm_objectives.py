"""PPO-RLHF and RLAIF as training arms: one update moves the weights and equals the pure loss functions."""

import asyncio
import copy

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from echo_rl.algorithms.echo_loss import env_ce_loss  # noqa: E402
from echo_rl.algorithms.ppo_rlhf import ppo_rlhf_loss, rewards_at_turn_ends, rlhf_advantages  # noqa: E402
from echo_rl.algorithms.rlaif import AIJudge, mix_rewards  # noqa: E402
from echo_rl.algorithms.token_logprobs import (action_mask, ce_mask, response_mask,  # noqa: E402
                                               sequence_logprobs)
from echo_rl.config import ConfigError, LMConfig  # noqa: E402
from echo_rl.models import ScriptedBackbone  # noqa: E402
from echo_rl.lm.batch import collate  # noqa: E402
from echo_rl.lm.chat_delta import ChatRenderer  # noqa: E402
from echo_rl.lm.learner import LMLearner  # noqa: E402
from echo_rl.training.trainer import EchoRLTrainer  # noqa: E402

from test_loop import _cfg, _rows, save_checkpoint  # noqa: E402
from test_lm_replay_loop import _tiny_model, _traj  # noqa: E402


@pytest.fixture
def checkpoint(tmp_path, chatml_tokenizer):
    return save_checkpoint(tmp_path / "ckpt", chatml_tokenizer)


@pytest.mark.parametrize("level, lam, truncated", [("turn", 0.0, False), ("token", 0.05, True)])
def test_ppo_rlhf_step_equals_the_pure_functions_and_moves_weights(chatml_tokenizer, level, lam, truncated):
    r = ChatRenderer(chatml_tokenizer)
    trajs = [_traj(r, k, 0, truncated=truncated) for k in range(3)]
    cfg = LMConfig(objective="ppo-rlhf", gae_level=level, gamma=0.9, gae_lambda=0.8, learning_rate=1e-2,
                   temperature=0.7, vf_coef=0.5, value_clip=0.2)
    learner = LMLearner(_tiny_model(chatml_tokenizer), 0, cfg, lam=lam)
    torch.nn.init.normal_(learner.value_head.proj.weight, std=0.5)  # a non-trivial critic
    model0, head0 = copy.deepcopy(learner.model), copy.deepcopy(learner.value_head)

    # by hand, from the pure functions, on the weights before the step
    batch = collate(trajs, 0)
    out = model0(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
    hidden = out.hidden_states[-1]
    values = head0(hidden)
    lp = sequence_logprobs(out.logits, batch.input_ids, 0.7)
    resp = response_mask(batch.prompt_length, batch.input_ids.shape[1], batch.attention_mask)
    acts = action_mask(batch.roles, resp)
    last = batch.attention_mask.sum(1) - 1
    boot = head0.proj(hidden[torch.arange(3), last]).squeeze(-1) * float(truncated)
    adv, ret, vmask = rlhf_advantages(rewards_at_turn_ends(acts, [t.rewards for t in trajs]), values.detach(), acts,
                                      gamma=0.9, lam=0.8, level=level, last_values=boot.detach())
    terms = ppo_rlhf_loss(lp, batch.behavior_logprobs, values, values.detach(), adv, ret, acts, vmask, clip=0.2,
                          value_clip=0.2, vf_coef=0.5)
    ce = env_ce_loss(sequence_logprobs(out.logits, batch.input_ids), ce_mask(batch.roles, resp),
                     batch.env_output_count)
    expected = terms.loss + lam * ce

    m = learner.update(trajs)
    assert m["loss"] == pytest.approx(float(expected.detach()), rel=1e-5, abs=1e-6)
    assert m["value_loss"] == pytest.approx(float(terms.value_loss.detach()), rel=1e-5, abs=1e-7)
    assert m["value_loss"] > 0 and m["policy_version"] == 1.0
    moved = [not torch.equal(a, b) for a, b in zip(model0.parameters(), learner.model.parameters())]
    assert all(moved)
    assert not torch.equal(head0.proj.weight, learner.value_head.proj.weight)


def test_truncation_bootstraps_and_termination_does_not(chatml_tokenizer):
    r = ChatRenderer(chatml_tokenizer)
    cfg = LMConfig(objective="ppo-rlhf", gae_level="turn", gamma=1.0, gae_lambda=1.0, learning_rate=1e-5)
    losses = {}
    for truncated in (False, True):
        learner = LMLearner(_tiny_model(chatml_tokenizer), 0, cfg)
        torch.nn.init.constant_(learner.value_head.proj.bias, 3.0)  # V = 3 everywhere
        learner.update([_traj(r, k, 0, truncated=truncated) for k in range(2)])
        losses[truncated] = learner.last_rows["advantage"]
    # with gamma = lambda = 1 the advantage of turn k is (sum of rewards after it + bootstrap) - V: bootstrap 3 or 0
    np.testing.assert_allclose(losses[True] - losses[False], 3.0, rtol=1e-5)


def test_ppo_rlhf_arm_through_the_trainer(checkpoint, tmp_path):
    cfg = _cfg(checkpoint, total_timesteps=100, **{"lm_config.max_updates": 2, "lm_config.objective": "ppo-rlhf",
                                                   "echo_config.latent_plan": False, "lm_config.sft_episodes": 0,
                                                   "lm_config.heldout_pool": 0, "lm_config.eval_every_updates": 1,
                                                   "lm_config.replay_updates": 1, "lm_config.replay_batch": 2})
    run = tmp_path / "run"
    first = EchoRLTrainer(cfg, run, show_progress=False)
    asyncio.run(first.train())
    rows = [r for r in _rows(run) if "lm/loss" in r]
    assert len(rows) == 2 and all("lm/value_loss" in r and r["lm/lambda"] == 0.05 for r in rows)
    assert rows[0]["replay/steps"] == 1.0
    # resume restores the value head and its optimiser state
    resumed = EchoRLTrainer(cfg, run, resume=True, show_progress=False)
    resumed._setup(torch.device("cpu"))
    a, b = first.agent.learner, resumed.agent.learner
    for k, v in a.value_head.state_dict().items():
        assert torch.equal(v, b.value_head.state_dict()[k])
    assert len(b.optimizer.param_groups) == 2 and b.optimizer.state_dict()["state"].keys() == \
        a.optimizer.state_dict()["state"].keys()


def test_bad_objective_combinations_are_one_clear_error(checkpoint, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="objective='ppo-rlhf' is invalid with the latent plan"):
        asyncio.run(EchoRLTrainer(_cfg(checkpoint, **{"lm_config.objective": "ppo-rlhf"}), tmp_path / "a",
                                  show_progress=False).train())
    assert not (tmp_path / "a").exists()
    with pytest.raises(ConfigError, match="objective=.sac. is invalid: allowed: grpo, ppo-rlhf"):
        _cfg(checkpoint, **{"lm_config.objective": "sac"})
    with pytest.raises(ConfigError, match="judge_backbone=None is invalid: reward='mix' needs a judge"):
        _cfg(checkpoint, **{"lm_config.reward": "mix"})
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    api = _cfg(checkpoint, **{"lm_config.reward": "rlaif", "lm_config.judge_backbone": "gpt-4o",
                              "echo_config.latent_plan": False})
    with pytest.raises(ConfigError, match="needs an API key"):  # an API judge without its key: before any run dir
        asyncio.run(EchoRLTrainer(api, tmp_path / "b", show_progress=False).train())
    assert not (tmp_path / "b").exists()
    with pytest.raises(ConfigError, match="judge_weight=1.5 is invalid"):
        _cfg(checkpoint, **{"lm_config.reward": "mix", "lm_config.judge_backbone": "tiny",
                            "lm_config.judge_weight": 1.5})


@pytest.mark.parametrize("reward, weight", [("rlaif", 1.0), ("mix", 0.25)])
def test_rlaif_rewards_come_from_the_judge(checkpoint, tmp_path, monkeypatch, reward, weight):
    """The judge's score (scripted here) becomes the reward the learner normalises; the env return is kept apart."""
    from echo_rl.lm.loop import LMAgent

    seen = {}
    original = LMLearner.update

    def spy(self, trajectories, **kw):
        seen["returns"] = [t.total_reward for t in trajectories]
        seen["env"] = [t.info["env_return"] for t in trajectories]
        seen["before"] = [p.detach().clone() for p in self.model.parameters()]
        return original(self, trajectories, **kw)

    def scripted(self):
        return AIJudge(ScriptedBackbone(["Fine. Score: 7/10", "Poor. Score: 2/10"] * 8), "Reach the goal.")

    monkeypatch.setattr(LMLearner, "update", spy)
    monkeypatch.setattr(LMAgent, "_make_judge", scripted)
    cfg = _cfg(checkpoint, **{"lm_config.max_updates": 1, "echo_config.latent_plan": False,
                              "lm_config.sft_episodes": 0, "lm_config.heldout_pool": 0, "lm_config.reward": reward,
                              "lm_config.judge_backbone": str(checkpoint), "lm_config.judge_weight": weight})
    trainer = EchoRLTrainer(cfg, tmp_path / "run", show_progress=False)
    asyncio.run(trainer.train())
    want = [mix_rewards(env, score, weight) for env, score in zip(seen["env"], [0.7, 0.2])]
    assert seen["returns"] == pytest.approx(want)
    row = [r for r in _rows(tmp_path / "run") if "lm/loss" in r][0]
    assert row["rlaif/judge_score"] == pytest.approx(0.45) and row["lm/return_mean"] == pytest.approx(np.mean(want))
    assert row["lm/advantage_abs_mean"] > 0  # the judge separated the group: a real policy gradient
    assert any(not torch.equal(a, b) for a, b in zip(seen["before"], trainer.agent.model.parameters()))


def test_a_local_judge_scores_by_likelihood(checkpoint, tmp_path):
    """No scripting: the judge is a local checkpoint scoring 'Score: k/10' by likelihood (no network)."""
    cfg = _cfg(checkpoint, **{"lm_config.max_updates": 1, "echo_config.latent_plan": False,
                              "lm_config.sft_episodes": 0, "lm_config.heldout_pool": 0, "lm_config.reward": "rlaif",
                              "lm_config.judge_backbone": str(checkpoint)})
    asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=False).train())
    row = [r for r in _rows(tmp_path / "run") if "lm/loss" in r][0]
    assert 0.0 < row["rlaif/judge_score"] < 1.0 and row["rlaif/unparsed"] == 0.0
    assert row["lm/return_mean"] == pytest.approx(row["rlaif/return"])
