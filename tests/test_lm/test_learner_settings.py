"""Every LM setting is reachable from ``--set lm_config.*``: the learner and the rollout workers read the run's
``LMConfig`` itself, with the choices the losses accept."""

import dataclasses

import pytest
import torch

from echo_rl.algorithms.echo_loss import NORMALIZATIONS, SCHEDULES
from echo_rl.algorithms.grpo import ADVANTAGE_SCALES
from echo_rl.algorithms.token_logprobs import CE_TARGETS
from echo_rl.config import BandwidthConfig, ConfigError, LMConfig, PlanningConfig, TrainingConfig
from echo_rl.lm.learner import LMLearner
from echo_rl.lm.plan import LMPlanner
from echo_rl.lm.trainer import LMTrainer
from echo_rl.training.bandwidth import BandwidthEfficiencyTracker

SETTINGS = {"lm_config.advantage_scale": "none", "lm_config.pg_reduction": "sequence_mean",
            "lm_config.ce_target": "warning_plus_env", "lm_config.ce_normalization": "token_mean",
            "lm_config.learner_chunk_tokens": 64}


def _trainer(overrides, planner=None):
    config = TrainingConfig(env_name="alfworld", backbone="tiny").with_overrides(
        {"lm_config.learning_rate": 1e-5, **overrides})  # LMAgent resolves the backbone's default first
    return config, LMTrainer(config, torch.nn.Linear(2, 2), planner, 0, 0.05,
                             BandwidthEfficiencyTracker(BandwidthConfig()))


def test_the_learner_reads_the_runs_lm_config_itself():
    """No copy to fall out of step: whatever ``--set lm_config.*`` gives is what the learner reads."""
    config, trainer = _trainer(SETTINGS)
    cfg = trainer.learner.config
    assert cfg is config.lm_config
    assert (cfg.advantage_scale, cfg.pg_reduction, cfg.ce_target, cfg.ce_normalization, cfg.learner_chunk_tokens) == (
        "none", "sequence_mean", "warning_plus_env", "token_mean", 64)
    assert trainer.learner.lam(0) == 0.05


def test_the_env_loss_schedule_reaches_the_learner():
    _, trainer = _trainer({"lm_config.env_loss_schedule": "linear_decay", "lm_config.env_loss_steps": 10,
                           "lm_config.env_loss_end": 0.01})
    assert [trainer.learner.lam(s) for s in (0, 5, 10, 20)] == pytest.approx([0.05, 0.03, 0.01, 0.01])
    grpo = LMTrainer(trainer.config, torch.nn.Linear(2, 2), None, 0, 0.0, BandwidthEfficiencyTracker(BandwidthConfig()))
    assert grpo.learner.lam(5) == 0.0  # no ECHO term: the schedule has nothing to scale


def test_plan_settings_are_the_planners_own():
    planner = LMPlanner(8, PlanningConfig(embedding_dim=4, learning_rate=7e-4, kl_weight=0.3), num_tokens=1,
                        encoder_hidden=8)
    _, trainer = _trainer({}, planner)
    assert trainer.learner.optimizer.param_groups[1]["lr"] == 7e-4


def test_a_learner_without_a_learning_rate_is_one_line():
    with pytest.raises(ConfigError, match="lm_config.learning_rate=None is invalid.*resolve_lm_defaults") as err:
        LMLearner(torch.nn.Linear(2, 2), 0, LMConfig())
    assert "\n" not in str(err.value)


def test_every_rollout_setting_is_an_lm_config_field(chatml_tokenizer):
    """The generator's workers read the run's lm_config (held-out ones at eval_temperature), nothing copied."""
    from echo_rl.config import ExecutionConfig
    from echo_rl.lm.chat_delta import ChatRenderer
    from echo_rl.lm.generator import LMGenerator

    lm = LMConfig(temperature=0.7, eval_temperature=0.2, max_turns=3, system_prompt="")
    gen = LMGenerator(ExecutionConfig(), ChatRenderer(chatml_tokenizer), lm, "minigrid", lambda held_out: None,
                      BandwidthEfficiencyTracker(BandwidthConfig()))
    assert gen.lm_config is lm and gen.eval_config.temperature == 0.2
    assert dataclasses.replace(gen.eval_config, temperature=0.7) == lm


def test_config_choices_are_what_the_losses_accept():
    fields = {f.name: f.metadata for f in dataclasses.fields(LMConfig)}
    assert fields["advantage_scale"]["choices"] == tuple(ADVANTAGE_SCALES)
    assert fields["ce_target"]["choices"] == tuple(CE_TARGETS)
    assert fields["ce_normalization"]["choices"] == tuple(NORMALIZATIONS)
    assert fields["pg_reduction"]["choices"] == ("token_mean", "sequence_mean")
    assert fields["env_loss_schedule"]["choices"] == SCHEDULES


def test_a_bad_value_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError, match="pg_reduction.*sequence_sum.*token_mean, sequence_mean") as err:
        TrainingConfig().with_overrides({"lm_config.pg_reduction": "sequence_sum"})
    assert "\n" not in str(err.value)
