"""Every learner setting is reachable from ``--set lm_config.*``, with the choices the losses accept."""

import dataclasses

import pytest
import torch

from echo_rl.algorithms.echo_loss import NORMALIZATIONS
from echo_rl.algorithms.grpo import ADVANTAGE_SCALES
from echo_rl.algorithms.token_logprobs import CE_TARGETS
from echo_rl.config import BandwidthConfig, ConfigError, LMConfig, TrainingConfig
from echo_rl.lm.learner import LMLearnerConfig
from echo_rl.lm.trainer import LMTrainer
from echo_rl.training.bandwidth import BandwidthEfficiencyTracker

SETTINGS = {"lm_config.advantage_scale": "none", "lm_config.pg_reduction": "sequence_mean",
            "lm_config.ce_target": "warning_plus_env", "lm_config.ce_normalization": "token_mean",
            "lm_config.learner_chunk_tokens": 64}


def _learner_config(overrides):
    config = TrainingConfig(env_name="alfworld", backbone="tiny").with_overrides(
        {"lm_config.learning_rate": 1e-5, **overrides})  # LMAgent resolves the backbone's default first
    trainer = LMTrainer(config, torch.nn.Linear(2, 2), None, 0, 0.05,
                        BandwidthEfficiencyTracker(BandwidthConfig()))
    return trainer.learner.config


def test_the_five_learner_settings_reach_the_learner():
    cfg = _learner_config(SETTINGS)
    assert (cfg.advantage_scale, cfg.pg_reduction, cfg.ce_target, cfg.ce_normalization, cfg.chunk_tokens) == (
        "none", "sequence_mean", "warning_plus_env", "token_mean", 64)


def test_defaults_are_the_learners_own():
    cfg, default = _learner_config({}), LMLearnerConfig()
    for name in ("advantage_scale", "pg_reduction", "ce_target", "ce_normalization", "chunk_tokens"):
        assert getattr(cfg, name) == getattr(default, name), name


def test_config_choices_are_what_the_losses_accept():
    fields = {f.name: f.metadata for f in dataclasses.fields(LMConfig)}
    assert fields["advantage_scale"]["choices"] == tuple(ADVANTAGE_SCALES)
    assert fields["ce_target"]["choices"] == tuple(CE_TARGETS)
    assert fields["ce_normalization"]["choices"] == tuple(NORMALIZATIONS)
    assert fields["pg_reduction"]["choices"] == ("token_mean", "sequence_mean")


def test_a_bad_value_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError, match="pg_reduction.*sequence_sum.*token_mean, sequence_mean") as err:
        TrainingConfig().with_overrides({"lm_config.pg_reduction": "sequence_sum"})
    assert "\n" not in str(err.value)
