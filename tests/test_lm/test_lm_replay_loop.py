"""Trajectory replay inside the LM loop: round trip with plans, staleness bound, replay off = today's loss, resume."""

import asyncio
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from echo_rl.config import LMConfig, ReplayConfig  # noqa: E402
from echo_rl.lm.chat_delta import ChatRenderer  # noqa: E402
from echo_rl.lm.learner import LMLearner  # noqa: E402
from echo_rl.lm.replay import TrajectoryReplay  # noqa: E402
from echo_rl.lm.trajectory import TrajectoryBuilder  # noqa: E402
from echo_rl.training.trainer import EchoRLTrainer  # noqa: E402

from test_loop import _cfg, _rows, save_checkpoint  # noqa: E402


@pytest.fixture
def checkpoint(tmp_path, chatml_tokenizer):
    return save_checkpoint(tmp_path / "ckpt", chatml_tokenizer)


def _traj(r, k, version, **info):
    b = TrajectoryBuilder(r, [("env_output", "You see a key 1.")], group_id=1, episode_id=k, policy_version=version)
    for turn in range(2):
        ids = r.encode("take key 1")[: k + 1 + turn]
        b.add_action(ids, [-0.25 * (k + 1)] * len(ids))
        b.add_observation([("warning", "Nothing happens."), ("env_output", " You see a door 1.")], float(k == turn))
    return b.finish(**info)


def _replay(plan_dim=0):
    cfg = ReplayConfig(hot_buffer_size=8, cold_buffer_size=8, age_threshold=4, max_replay_age=8,
                       min_experiences=1, sampling_mode="proportional")
    return TrajectoryReplay(cfg, max_len=256, max_turns=4, seed=0, plan_dim=plan_dim)


def test_replayed_tokens_roles_logprobs_plans_round_trip(chatml_tokenizer):
    r = ChatRenderer(chatml_tokenizer)
    eps = [np.arange(6, dtype=np.float32).reshape(2, 3) * (k + 1) for k in range(3)]
    trajs = [_traj(r, k, 5, plan_eps=eps[k], truncated=bool(k % 2), won=False) for k in range(3)]
    rep = _replay(plan_dim=3)
    rep.add(trajs, [0.5, -1.0, 0.25])
    got, adv, w, idx = rep.sample(12, current_version=5, max_staleness=0)
    assert len(got) == 12
    for t, a in zip(got, adv):
        src = trajs[t.episode_id]
        assert t.token_ids == src.token_ids and t.roles == src.roles
        assert t.behavior_logprobs == pytest.approx(src.behavior_logprobs, abs=0)  # float32 values, stored as such
        assert t.rewards == src.rewards and t.prompt_length == src.prompt_length
        assert t.env_output_count == src.env_output_count and t.policy_version == 5
        np.testing.assert_array_equal(t.info["plan_eps"], eps[t.episode_id])
        assert t.info.get("truncated", False) == bool(t.episode_id % 2)
        assert a == [0.5, -1.0, 0.25][t.episode_id]
    with pytest.raises(ValueError, match="no info\\['plan_eps'\\]"):
        rep.add([_traj(r, 0, 5)], [0.0])


def _tiny_model(tokenizer, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=512, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg)


def test_unit_weights_and_group_advantages_give_the_on_policy_loss(chatml_tokenizer):
    """A replayed step with importance weight 1 and the stored group advantage is today's on-policy step."""
    from echo_rl.algorithms.grpo import group_advantages

    r = ChatRenderer(chatml_tokenizer)
    trajs = [_traj(r, k, 0) for k in range(3)]
    adv = group_advantages(torch.tensor([t.total_reward for t in trajs]), torch.tensor([1, 1, 1]))
    cfg = LMConfig(learning_rate=1e-5)
    a, b = LMLearner(_tiny_model(chatml_tokenizer), 0, cfg), LMLearner(_tiny_model(chatml_tokenizer), 0, cfg)
    ma = a.update(trajs)
    mb = b.update(trajs, advantages=adv.numpy(), weights=np.ones(3))
    assert ma["loss"] == mb["loss"] and ma["env_ce"] == mb["env_ce"]
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)


def _replay_cfg(path, **over):
    return _cfg(path, total_timesteps=1000, **{"lm_config.max_updates": 2, "lm_config.sft_episodes": 0,
                                                "lm_config.heldout_pool": 0, "lm_config.eval_every_updates": 5,
                                                "echo_config.latent_plan": False, "lm_config.replay_updates": 3,
                                                "lm_config.replay_batch": 2, **over})


def test_stale_samples_are_never_trained_on(checkpoint, tmp_path, monkeypatch):
    seen = []
    original = LMLearner.update

    def spy(self, trajectories, **kw):
        seen.append((self.version, [t.policy_version for t in trajectories], "weights" in kw))
        return original(self, trajectories, **kw)

    monkeypatch.setattr(LMLearner, "update", spy)
    cfg = _replay_cfg(checkpoint, **{"lm_config.max_staleness": 1})
    asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=False).train())
    replayed = [(v, pvs) for v, pvs, is_replay in seen if is_replay]
    assert replayed and all(v - pv <= 1 for v, pvs in replayed for pv in pvs)
    rows = [r for r in _rows(tmp_path / "run") if "replay/steps" in r]
    assert len(rows) == 2 and all(r["replay/steps"] >= 1 for r in rows)
    assert sum(r["replay/expired"] for r in rows) > 0  # the version moved on: old samples were expired
    # every learner step (on-policy and replayed) is a policy version, and the engine serves the last one
    assert rows[-1]["engine/policy_version"] == sum(1 + r["replay/steps"] for r in rows)


def test_replay_off_is_todays_loop(checkpoint, tmp_path):
    """replay_updates=0 (the default) and --no-replay both leave the loop as it was: no replay keys, same losses."""
    runs = {"default": {"lm_config.replay_updates": 0},
            "no_replay_flag": {"echo_config.replay_updates": 0},
            "on": {}}
    rows = {}
    for name, over in runs.items():
        asyncio.run(EchoRLTrainer(_replay_cfg(checkpoint, **over), tmp_path / name, show_progress=False).train())
        rows[name] = [r for r in _rows(tmp_path / name) if "lm/loss" in r]
    for name in ("default", "no_replay_flag"):
        assert not any(k.startswith("replay/") for r in rows[name] for k in r)
        assert [r["engine/policy_version"] for r in rows[name]] == [1.0, 2.0]
    # the first on-policy step comes before any replayed one: its loss is today's
    assert rows["on"][0]["lm/loss"] == pytest.approx(rows["default"][0]["lm/loss"], rel=1e-5)
    assert rows["no_replay_flag"][0]["lm/loss"] == pytest.approx(rows["default"][0]["lm/loss"], rel=1e-5)


def test_checkpoint_carries_the_replay_exactly(checkpoint, tmp_path):
    """A resumed run's replay holds the same trajectories, priorities and sampling RNG as the one that saved it."""
    run = tmp_path / "run"
    cfg = _replay_cfg(checkpoint, **{"lm_config.max_updates": 1})
    first = EchoRLTrainer(cfg, run, show_progress=False)
    asyncio.run(first.train())  # checkpoints at the end
    resumed = EchoRLTrainer(cfg, run, resume=True, show_progress=False)
    resumed._setup(torch.device("cpu"))
    a, b = first.agent.replay, resumed.agent.replay
    assert len(a) == len(b) > 0 and (a.dropped_stale, a.expired, a._live) == (b.dropped_stale, b.expired, b._live)
    for _ in range(2):
        ta, _, wa, ia = a.sample(4, current_version=1, max_staleness=5)
        tb, _, wb, ib = b.sample(4, current_version=1, max_staleness=5)
        assert (ia == ib).all() and (wa == wb).all() and ta == tb


def test_replay_with_latent_plans_trains_with_the_actors_plan_noise(checkpoint, tmp_path):
    cfg = _replay_cfg(checkpoint, **{"echo_config.latent_plan": True, "lm_config.max_updates": 1,
                                     "planning_config.embedding_dim": 8, "planning_config.state_window_size": 2})
    asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=False).train())
    row = [r for r in _rows(tmp_path / "run") if "replay/steps" in r][0]
    assert row["replay/steps"] >= 1 and row["replay/trained"] >= 2 and "lm/plan_kl" in row
