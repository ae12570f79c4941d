import pytest

from echo_rl import ConfigError, PPOConfig, TrainingConfig
from echo_rl.config import parse_override


def test_defaults_match_documented_values():
    ppo = PPOConfig()
    assert (ppo.learning_rate, ppo.clip_epsilon, ppo.value_loss_coef, ppo.entropy_coef, ppo.kl_coef) == \
        (3e-4, 0.2, 0.5, 0.01, 0.1)
    assert (ppo.gae_lambda, ppo.gamma) == (0.95, 0.99)
    assert TrainingConfig().device == "cpu"


def test_yaml_round_trip(tmp_path):
    cfg = TrainingConfig(env_name="minigrid:MiniGrid-Empty-5x5-v0", total_timesteps=1234, num_actors=4,
                         batch_size=64, env_config={"max_steps": 50}, ppo_config=PPOConfig(target_kl=0.02))
    cfg.save_yaml(tmp_path / "c.yaml")
    assert TrainingConfig.load_yaml(tmp_path / "c.yaml") == cfg


@pytest.mark.parametrize("kwargs, needle", [
    ({"total_timesteps": -5}, "TrainingConfig.total_timesteps=-5 is invalid: must be >= 1"),
    ({"env_name": "nethack"}, "unknown task 'nethack'"),
    ({"agent": "sac"}, "unknown agent 'sac'; allowed: "),
    ({"batch_size": 100, "num_actors": 8}, "must be a multiple of num_actors=8"),
    ({"device": "tpu"}, "TrainingConfig.device='tpu' is invalid"),
    ({"num_actors": "eight"}, "expected int"),
])
def test_invalid_values_give_one_line_errors(kwargs, needle):
    with pytest.raises(ConfigError) as exc:
        TrainingConfig(**kwargs)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_nested_validation_names_the_path():
    with pytest.raises(ConfigError, match=r"PPOConfig.gae_lambda=1.5 is invalid: must be <= 1"):
        TrainingConfig.from_dict({"ppo_config": {"gae_lambda": 1.5}})


def test_unknown_field_lists_allowed_names():
    with pytest.raises(ConfigError, match=r"unknown field TrainingConfig.ppo_config.lr; allowed: .*learning_rate"):
        TrainingConfig.from_dict({"ppo_config": {"lr": 1}})


def test_malformed_and_missing_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("env_name: [minigrid\n")
    with pytest.raises(ConfigError, match=r"is not valid YAML at line \d+"):
        TrainingConfig.load_yaml(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        TrainingConfig.load_yaml(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        TrainingConfig.load_yaml(tmp_path / "list.yaml")


def test_overrides_parse_yaml_scalars_and_reject_unknown_paths():
    cfg = TrainingConfig().with_overrides(dict(parse_override(s) for s in
                                               ["ppo_config.learning_rate=1e-3", "seed=7", "ppo_config.target_kl=null"]))
    assert cfg.ppo_config.learning_rate == 1e-3 and cfg.seed == 7 and cfg.ppo_config.target_kl is None
    with pytest.raises(ConfigError, match="unknown field TrainingConfig.replay_config.nope"):
        TrainingConfig().with_overrides({"replay_config.nope": "1"})
    with pytest.raises(ConfigError, match="must look like field.path=value"):
        parse_override("seed")


@pytest.mark.parametrize("override", ["echo_config.self_imitation_updates=0", "echo_config.world_model_coef=0.2",
                                      "echo_config.replay_updates=4"])
def test_vector_only_knobs_are_refused_on_text_tasks(override):
    """``--no-self-imitation`` and friends do nothing for the LM agent: one line saying so, not a silent no-op."""
    key, value = override.split("=")
    section, field = key.split(".")
    config = TrainingConfig(env_name="minigrid", backbone="tiny", agent="echo-rl")
    setattr(getattr(config, section), field, type(getattr(getattr(config, section), field))(value))
    with pytest.raises(ConfigError, match=field):
        config.validate()


def test_world_model_off_is_allowed_on_text_tasks():
    config = TrainingConfig(env_name="minigrid", backbone="tiny", agent="echo-rl")
    config.echo_config.world_model_coef = 0.0
    config.validate()
