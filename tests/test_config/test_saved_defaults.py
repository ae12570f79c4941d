"""A config saved under one default keeps that value when the default changes (``components.SAVED_DEFAULTS``),
and every shipped echo-rl config names the latent plan, so flipping ``LATENT_PLAN_DEFAULT`` changes none of them."""

from pathlib import Path

import pytest
import yaml

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.config import components
from echo_rl.training.run_dir import RunDirectory

ROOT = Path(__file__).resolve().parents[2]


def _run_dir(tmp_path, data: dict) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    return run


def test_a_saved_config_lacking_a_changed_field_gets_the_value_it_was_saved_under(tmp_path, monkeypatch):
    # the shape of a flip: the default is now one value, the configs saved so far were written under another
    monkeypatch.setitem(components.SAVED_DEFAULTS, "echo_config.latent_plan", not components.LATENT_PLAN_DEFAULT)
    monkeypatch.setitem(components.SAVED_DEFAULTS, "echo_config.replay_updates", 7)
    saved = RunDirectory.config_of(_run_dir(tmp_path, {"agent": "echo-rl"}))
    assert saved.echo_config.latent_plan is (not components.LATENT_PLAN_DEFAULT)
    assert saved.echo_config.replay_updates == 7
    # a fresh config, and a saved one that names the field, are not touched
    assert TrainingConfig().echo_config.latent_plan is components.LATENT_PLAN_DEFAULT
    named = TrainingConfig.from_saved({"echo_config": {"latent_plan": components.LATENT_PLAN_DEFAULT,
                                                       "replay_updates": 2}})
    assert named.echo_config.latent_plan is components.LATENT_PLAN_DEFAULT and named.echo_config.replay_updates == 2


def test_a_run_saved_now_names_the_plan_so_it_resumes_as_it_was(tmp_path):
    cfg = TrainingConfig(agent="echo-rl", env_name="minigrid:MiniGrid-Empty-5x5-v0")
    run = tmp_path / "saved"
    cfg.save_yaml(run / "config.yaml")
    text = (run / "config.yaml").read_text()
    assert f"latent_plan: {str(components.LATENT_PLAN_DEFAULT).lower()}" in text
    assert RunDirectory.config_of(run) == cfg


def test_malformed_saved_configs_are_still_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"echo_config=\[1, 2\] is invalid") as err:
        RunDirectory.config_of(_run_dir(tmp_path, {"echo_config": [1, 2]}))
    assert "\n" not in str(err.value)
    assert components.with_saved_defaults(["not", "a", "mapping"]) == ["not", "a", "mapping"]


def test_every_shipped_echo_rl_config_names_the_latent_plan():
    shipped = [*ROOT.glob("configs/*.yaml"), *ROOT.glob("echo_rl/hub/data/recipes/*.yaml")]
    echo = [p for p in shipped if (yaml.safe_load(p.read_text()) or {}).get("agent") == "echo-rl"]
    assert echo, "no shipped echo-rl config found"
    for path in echo:
        data = yaml.safe_load(path.read_text())
        assert "latent_plan" in (data.get("echo_config") or {}), f"{path.name} leaves echo_config.latent_plan " \
            "to the default: name it, so a change of the default does not change what the config trains"
