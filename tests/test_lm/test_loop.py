"""Text tasks through EchoRLTrainer (the LM agent): run directory, metrics, resume, arms, bad backbones."""

import asyncio
import copy
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from echo_rl.config import ConfigError, TrainingConfig  # noqa: E402
from echo_rl.lm.chat_delta import TemplatePrefixError  # noqa: E402
from echo_rl.lm.loop import HELD_OUT_SEED_BASE, LMAgent, load_policy  # noqa: E402
from echo_rl.lm.rollout import env_kwargs  # noqa: E402
from echo_rl.training.trainer import EchoRLTrainer  # noqa: E402


def save_checkpoint(path, tokenizer, template=None):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=4096, bos_token_id=None, pad_token_id=0,
                                   eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    if template is not None:
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def checkpoint(tmp_path, chatml_tokenizer):
    return save_checkpoint(tmp_path / "ckpt", chatml_tokenizer)


def _cfg(path, **over):
    base = {"env_name": "minigrid:MiniGrid-Empty-Random-5x5-v0", "env_config": {"max_steps": 2},
            "backbone": str(path), "agent": "echo-rl", "num_actors": 2, "batch_size": 2, "total_timesteps": 4,
            "evaluation_episodes": 1, "evaluation_frequency": 0, "save_frequency": 0,
            "lm_config.group_size": 2, "lm_config.max_new_tokens": 4, "lm_config.sft_episodes": 1,
            "lm_config.sft_steps": 1, "lm_config.heldout_pool": 1, "lm_config.eval_every_updates": 1,
            "echo_config.latent_plan": True, "planning_config.embedding_dim": 8, "planning_config.state_window_size": 2}
    return TrainingConfig().with_overrides({**base, **over})


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_trains_through_the_trainer_logs_and_resumes(checkpoint, tmp_path):
    run = tmp_path / "run"
    cfg = _cfg(checkpoint, total_timesteps=100, **{"lm_config.max_updates": 1})
    result = asyncio.run(EchoRLTrainer(cfg, run, show_progress=False).train())
    assert result.num_updates == 1 and result.total_timesteps == 4  # 2 episodes x 2 turns
    assert {"success_rate", "avg_reward", "heldout_env_ce"} <= set(result.evaluation_results)
    assert [h["step"] for h in result.history] == [0, 4]  # before the first update, and at the end
    rows = _rows(run)
    assert [r["train/updates"] for r in rows] == [0.0, 1.0, 1.0]
    train = rows[1]
    for key in ("episode/success_rate", "lm/pg_loss", "lm/env_ce", "lm/kl", "lm/plan_kl", "lm/lambda",
                "engine/kv_reuse_rate", "engine/eta_bw", "sft/sft_action_ce"):
        assert key in train, key
    assert train["lm/lambda"] == 0.05 and train["lm/plan"] == 1.0
    timings = [json.loads(x) for x in (run / "timings.jsonl").read_text().splitlines()]
    assert "time/etps" in timings[0] and "time/rollout_s" in timings[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["text_task"] and summary["num_updates"] == 1 and (run / "config.yaml").is_file()
    # resume: one more update, no second SFT, no second update-0 evaluation
    more = _cfg(checkpoint, total_timesteps=100, **{"lm_config.max_updates": 2})
    again = asyncio.run(EchoRLTrainer(more, run, resume=True, show_progress=False).train())
    assert again.num_updates == 2 and again.total_timesteps == 8
    rows = _rows(run)
    assert [r["train/updates"] for r in rows] == [0.0, 1.0, 1.0, 2.0, 2.0]
    assert "sft/sft_action_ce" not in rows[3] and rows[3]["lm/learner_step"] == train["lm/learner_step"] + 1


@pytest.mark.parametrize("agent, over, lam, plan", [
    ("ppo", {}, 0.0, 0.0),
    ("echo-rl", {"echo_config.latent_plan": False, "lm_config.env_loss_coef": 0.01}, 0.01, 0.0),
    ("echo-rl", {"echo_config.world_model_coef": 0.0}, 0.0, 1.0),
])
def test_arms_map_onto_the_loss(checkpoint, tmp_path, agent, over, lam, plan):
    cfg = _cfg(checkpoint, agent=agent, **{"lm_config.max_updates": 1, "lm_config.heldout_pool": 0,
                                           "lm_config.sft_episodes": 0, **over})
    asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=False).train())
    row = _rows(tmp_path / "run")[1]
    assert row["lm/lambda"] == lam and row["lm/plan"] == plan and ("lm/plan_kl" in row) == bool(plan)


@pytest.mark.parametrize("plan", [False, True])
def test_kl_to_the_policy_rl_started_from(checkpoint, tmp_path, plan):
    cfg = _cfg(checkpoint, total_timesteps=100, **{"lm_config.max_updates": 3, "lm_config.kl_coef": 0.1,
                                                   "lm_config.learning_rate": 1e-2, "echo_config.latent_plan": plan,
                                                   "lm_config.eval_every_updates": 5, "lm_config.heldout_pool": 0})
    asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=False).train())
    kls = [r["lm/kl"] for r in _rows(tmp_path / "run") if "lm/kl" in r]
    # the reference is the post-SFT policy: KL 0 at the first update, then the policy moves away from it
    assert kls[0] == pytest.approx(0.0, abs=1e-6) and kls[-1] > 1e-6


def test_bad_backbones_are_one_clear_error(tmp_path, checkpoint, forgetful_template, chatml_tokenizer, monkeypatch):
    monkeypatch.setenv("ECHO_RL_MODEL_DIR", str(tmp_path / "models"))  # smollm2-135m absent: no default backbone
    with pytest.raises(ConfigError, match="an API model has no weights to train"):
        TrainingConfig(env_name="alfworld", backbone="gpt-4o")
    with pytest.raises(ConfigError, match="API models cannot be trained"):
        load_policy("claude-3.5-sonnet", 0)
    with pytest.raises(ConfigError, match="needs a language-model backbone"):
        TrainingConfig(env_name="alfworld")
    with pytest.raises(ConfigError, match="not a tiny preset"):
        load_policy(str(tmp_path / "nowhere"), 0)
    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    (no_tok / "config.json").write_text((checkpoint / "config.json").read_text())
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match="has no tokenizer"):
        asyncio.run(EchoRLTrainer(_cfg(no_tok), run, show_progress=False).train())
    assert not run.exists()  # refused before anything was written
    forgetful = save_checkpoint(tmp_path / "forgetful", chatml_tokenizer, forgetful_template)
    with pytest.raises(TemplatePrefixError, match="does not keep earlier turns as a prefix"):
        asyncio.run(EchoRLTrainer(_cfg(forgetful), run, show_progress=False).train())
    assert not run.exists()
    with pytest.raises(ConfigError, match="num_actors=3 is invalid"):
        _cfg(checkpoint, num_actors=3, batch_size=3)


def test_sft_cache_is_shared_by_runs_that_differ_after_sft(checkpoint, tmp_path):
    over = {"lm_config.max_updates": 1, "lm_config.sft_cache_dir": str(tmp_path / "sft"),
            "echo_config.latent_plan": False}
    asyncio.run(EchoRLTrainer(_cfg(checkpoint, **over), tmp_path / "a", show_progress=False).train())
    asyncio.run(EchoRLTrainer(_cfg(checkpoint, agent="ppo", **over), tmp_path / "b", show_progress=False).train())
    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    assert a[1]["sft/cached"] == 0.0 and b[1]["sft/cached"] == 1.0
    assert a[1]["sft/sft_action_ce"] == b[1]["sft/sft_action_ce"]
    assert a[0]["eval/heldout_env_ce"] == b[0]["eval/heldout_env_ce"]  # same weights after SFT


def test_a_failing_rollout_does_not_abort_the_update(checkpoint, tmp_path, monkeypatch):
    made = {"n": 0}
    original = LMAgent.env

    def flaky(self, held_out):
        env = original(self, held_out)
        made["n"] += 1
        if not held_out and made["n"] % 2 == 0:
            def broken_reset(*, seed=None, options=None):
                raise RuntimeError("simulated env crash")
            env.reset = broken_reset
        return env

    monkeypatch.setattr(LMAgent, "env", flaky)
    cfg = _cfg(checkpoint, num_actors=4, batch_size=4, **{"lm_config.max_updates": 1, "lm_config.sft_episodes": 0,
                                                          "lm_config.heldout_pool": 0})
    asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=False).train())
    row = _rows(tmp_path / "run")[1]
    assert row["episode/failed"] >= 1 and row["episode/count"] >= 1 and row["lm/policy_version"] == 1.0


def test_alfworld_trains_on_valid_train_and_evaluates_on_valid_unseen():
    cfg = TrainingConfig(env_name="alfworld", backbone="tiny")
    assert env_kwargs(cfg, held_out=False)["split"] == "valid_train"
    assert env_kwargs(cfg, held_out=True)["split"] == "valid_unseen"
    own = TrainingConfig(env_name="alfworld", backbone="tiny", env_config={"split": "valid_seen"},
                         lm_config={"eval_env_config": {"split": "valid_seen"}})
    assert env_kwargs(own, held_out=True)["split"] == "valid_seen"
    assert HELD_OUT_SEED_BASE == 1_000_000


def test_eval_command_on_a_text_run(checkpoint, tmp_path):
    """`echo-rl eval --run-dir` on a text run: a short-lived engine on the checkpoint's weights, held-out games."""
    import argparse

    from echo_rl.commands.eval import _eval_run

    cfg = _cfg(checkpoint, total_timesteps=100, **{"lm_config.max_updates": 1, "lm_config.sft_episodes": 0})
    run = tmp_path / "run"
    trained = asyncio.run(EchoRLTrainer(cfg, run, show_progress=False).train())
    out = _eval_run(argparse.Namespace(run_dir=str(run), seed=None, episodes=1, deterministic=False))
    assert out["episodes"] == 1.0 and out["checkpoint"].startswith("step_")
    assert out["heldout_env_ce"] == pytest.approx(trained.evaluation_results["heldout_env_ce"], abs=1e-6)


def test_stops_at_the_step_budget_even_below_one_batch(checkpoint, tmp_path):
    """A budget under batch_size: one update capped at its share of the steps left, then stop (the trainer's
    round-up to whole batches of the vector agents would otherwise run more updates past the budget)."""
    cfg = _cfg(checkpoint, total_timesteps=3, batch_size=8, **{"lm_config.sft_episodes": 0,
                                                               "lm_config.heldout_pool": 0})
    result = asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=False).train())
    assert result.num_updates == 1 and 3 <= result.total_timesteps <= 3 + cfg.num_actors - 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["timestep_budget"] == 3 and summary["time_s"]["start"] > 0  # engine start counted


def test_valid_action_rate_counts_turns_without_a_warning():
    from echo_rl.lm.loop import valid_action_rate
    from echo_rl.types import TokenTrajectory

    # prompt [0 0] | act 1 | env 2 2 | act 1 1 | warning 3 env 2 | act 1 | template 0 (episode ended)
    roles = [0, 0, 1, 2, 2, 1, 1, 3, 2, 1, 0]
    t = TokenTrajectory(token_ids=list(range(11)), roles=roles, behavior_logprobs=[-0.5 if r == 1 else 0.0
                                                                                  for r in roles],
                        rewards=[0.0, 0.0, 1.0], prompt_length=2, env_output_count=4)
    assert valid_action_rate([t]) == pytest.approx(2 / 3)
    assert valid_action_rate([]) == 0.0


def test_defaults_follow_the_backbone_and_explicit_values_win():
    from echo_rl.lm.loop import resolve_lm_defaults

    cfg = TrainingConfig(env_name="minigrid", backbone="tiny")
    tiny, real = resolve_lm_defaults(cfg, tiny=True).lm_config, resolve_lm_defaults(cfg, tiny=False).lm_config
    assert (tiny.learning_rate, tiny.sft_learning_rate, tiny.sft_episodes, tiny.sft_steps) == (1e-4, 3e-3, 16, 20)
    assert (real.learning_rate, real.sft_learning_rate, real.sft_episodes, real.sft_steps) == (1e-5, 5e-5, 48, 18)
    assert (tiny.sft_batch_episodes, real.sft_batch_episodes) == (0, 8)
    own = TrainingConfig(env_name="minigrid", backbone="tiny", lm_config={"sft_learning_rate": 1e-4})
    assert resolve_lm_defaults(own, tiny=False).lm_config.sft_learning_rate == 1e-4
