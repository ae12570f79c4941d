import argparse

import pytest

from echo_rl.commands import train
from echo_rl.config import LATENT_PLAN_DEFAULT, ConfigError


def parse(*argv):
    p = argparse.ArgumentParser()
    train.add_arguments(p)
    return train.build_config(p.parse_args(list(argv)))


def test_ablation_flags_switch_off_each_part():
    cfg = parse("--agent", "echo-rl", "--no-plan", "--no-replay")
    assert cfg.echo_config.latent_plan is False and cfg.echo_config.replay_updates == 0
    assert cfg.echo_config.world_model_coef > 0 and cfg.planning_config.kl_weight > 0
    cfg = parse("--agent", "echo-rl", "--no-kl", "--no-world-model")
    assert cfg.planning_config.kl_weight == 0 and cfg.echo_config.world_model_coef == 0
    assert cfg.echo_config.latent_plan is LATENT_PLAN_DEFAULT and cfg.echo_config.self_imitation_updates > 0
    assert parse("--agent", "echo-rl", "--no-self-imitation").echo_config.self_imitation_updates == 0


def test_ablation_flags_need_the_echo_agent():
    with pytest.raises(ConfigError, match="--no-plan.*--agent echo-rl"):
        parse("--agent", "ppo", "--no-plan")


def test_plan_flag_switches_the_plan_on_over_a_config_that_has_it_off(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("agent: echo-rl\necho_config:\n  latent_plan: false\n")
    assert parse("--config", str(config)).echo_config.latent_plan is False
    assert parse("--config", str(config), "--plan").echo_config.latent_plan is True
    with pytest.raises(ConfigError, match="--plan and --no-plan contradict") as err:
        parse("--agent", "echo-rl", "--plan", "--no-plan")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="--plan.*--agent echo-rl"):
        parse("--agent", "ppo", "--plan")
