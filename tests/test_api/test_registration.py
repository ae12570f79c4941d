"""A task, a backbone and a baseline registered from user code work end to end: make_env,
TrainingConfig, BenchmarkConfig, and `echo-rl train/eval/benchmark` (through --plugin / ECHO_RL_PLUGINS).
Unregistered names fail with one line naming how to register them."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import echo_custom_plugin  # noqa: F401  (registers custom_task, custom_backbone, custom_baseline)
from echo_rl.cli import main
from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.environments.registry import make_env, register_text_env
from echo_rl.evaluation.benchmark import BenchmarkConfig, EchoRLBenchmark
from echo_rl.evaluation.methods import register_baseline
from echo_rl.models import load_backbone, register_backbone

HERE = Path(__file__).parent


def test_registered_names_are_valid_everywhere():
    env = make_env("custom_task", max_steps=2)
    obs, info = env.reset(seed=0)
    assert obs.startswith("Say the word: ") and info["admissible_actions"]
    assert load_backbone("custom_backbone").chat([{"role": "user", "content": obs}]).text == env.word
    cfg = TrainingConfig(env_name="custom_task", backbone="tiny", num_actors=4, batch_size=4)
    assert cfg.text_task
    # the product's custom benchmark config, as written
    bc = BenchmarkConfig(tasks=["custom_task"], backbones=["custom_backbone"], baselines=["custom_baseline"],
                         num_seeds=5, num_episodes=50, echo_rl_configs={"total_timesteps": 50000, "num_actors": 64})
    assert bc.echo_rl_configs["num_actors"] == 64


@pytest.mark.parametrize("kwargs, needle", [
    ({"tasks": ["custom_task2"]}, "unknown task 'custom_task2'.*register_text_env"),
    ({"backbones": ["custom_backbone2"]}, "unknown backbone 'custom_backbone2'.*register_backbone"),
    ({"baselines": ["custom_baseline2"]}, "unknown baseline 'custom_baseline2'.*register_baseline"),
])
def test_unregistered_names_say_how_to_register(kwargs, needle):
    base = {"tasks": ["custom_task"], "backbones": ["custom_backbone"], "baselines": ["custom_baseline"]}
    with pytest.raises(ConfigError, match=needle) as exc:
        BenchmarkConfig(**{**base, **kwargs})
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="register_text_env"):
        make_env("custom_task2")
    with pytest.raises(ConfigError, match="register_text_env"):
        TrainingConfig(env_name="custom_task2", backbone="tiny")


@pytest.mark.parametrize("call, needle", [
    (lambda: register_text_env("", lambda **kw: None), "task name '' is invalid"),
    (lambda: register_text_env("a:b", lambda **kw: None), "without ':'"),
    (lambda: register_text_env("MiniGrid-Custom-v0", lambda **kw: None), "MiniGrid's env ids"),
    (lambda: register_text_env("x", "not callable"), "must be callable"),
    (lambda: register_text_env("x", lambda **kw: None, anchor_state="text"),
     "anchor_state='text' of task 'x' is invalid: allowed: observation, state_key"),
    (lambda: register_backbone("x", None), "must be callable"),
    (lambda: register_baseline("x", None), "runner of baseline 'x' is invalid"),
    (lambda: register_baseline("x", lambda ctx: None, task_kinds=("image",)), "task_kinds"),
])
def test_bad_registrations_are_refused(call, needle):
    with pytest.raises(ConfigError, match=needle):
        call()


def test_registered_backbone_must_build_a_backbone():
    register_backbone("custom_broken", lambda config: "not a backbone")
    with pytest.raises(ConfigError, match="returned str, not an echo_rl.models.Backbone"):
        load_backbone("custom_broken")


def test_benchmark_runs_the_registered_baseline_and_react(tmp_path):
    cfg = BenchmarkConfig(tasks=["custom_task"], backbones=["custom_backbone"],
                          baselines=["custom_baseline", "react", "random"], num_seeds=1, num_episodes=4,
                          max_steps_per_episode=3, output_dir=str(tmp_path / "bench"), generate_plots=False,
                          generate_report=False)
    summary = asyncio.run(EchoRLBenchmark(cfg).run_benchmark())
    assert summary["ok"] == 3 and summary["failed"] == summary["skipped"] == 0
    files = (tmp_path / "bench").rglob("cells/**/*.json")
    records = {r["method"]: r for r in (json.loads(p.read_text()) for p in files)}
    assert records["custom_baseline"]["metrics"]["success_at_1"] == 1.0  # the backbone reads the word back
    assert records["react"]["metrics"]["success_at_1"] == 1.0
    assert records["random"]["metrics"]["num_episodes"] == 4  # uniform over the 4 words: a real floor


def test_cli_benchmark_and_eval_load_the_plugin(tmp_path, monkeypatch, capsys):
    out = tmp_path / "bench"
    assert main(["--plugin", "echo_custom_plugin", "benchmark", "--tasks", "custom_task", "--backbones",
                 "custom_backbone", "--baselines", "custom_baseline", "--num-seeds", "1", "--num-episodes", "2",
                 "--max-steps", "3", "--output-dir", str(out), "--no-plots", "--no-report", "--quiet"]) == 0
    assert list(out.rglob("cells/**/*.json"))
    monkeypatch.setenv("ECHO_RL_PLUGINS", "echo_custom_plugin")
    assert main(["eval", "--task", "custom_task", "--agent", "react", "--backbone", "custom_backbone",
                 "--episodes", "2", "--max-steps", "3"]) == 0
    assert '"success_rate": 1.0' in capsys.readouterr().out


def test_cli_missing_plugin_is_one_line(capsys):
    assert main(["--plugin", "no_such_plugin_module", "benchmark", "--list-methods"]) == 2
    err = capsys.readouterr().err.strip()
    assert "plugin module 'no_such_plugin_module' not found" in err and len(err.splitlines()) == 1


def test_cli_in_a_new_process_sees_the_plugin(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "ECHO_RL_PLUGINS": "echo_custom_plugin", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "echo_rl.cli", "eval", "--task", "custom_task", "--agent", "react",
                        "--backbone", "custom_backbone", "--episodes", "1", "--max-steps", "2"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["success_rate"] == 1.0
    bad = subprocess.run([sys.executable, "-m", "echo_rl.cli", "eval", "--task", "custom_task", "--agent", "react",
                          "--backbone", "custom_backbone"], capture_output=True, text=True, timeout=300,
                         env={**env, "ECHO_RL_PLUGINS": ""})
    assert bad.returncode == 2 and "register_text_env" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_cli_trains_on_the_registered_task(tmp_path, tiny_path):
    run = tmp_path / "run"
    assert main(["--plugin", "echo_custom_plugin", "train", "--task", "custom_task", "--backbone", "tiny",
                 "--timesteps", "8", "--num-actors", "4", "--batch-size", "4", "--run-dir", str(run),
                 "--no-progress", "--set", "lm_config.sft_episodes=0", "--set", "lm_config.heldout_pool=0",
                 "--set", "lm_config.max_updates=1", "--set", "lm_config.max_turns=3",
                 "--set", "lm_config.max_new_tokens=4", "--set", "evaluation_episodes=2",
                 "--set", "env_config={max_steps: 3}"]) == 0
    assert (run / "metrics.jsonl").is_file()


def test_benchmark_builds_every_backbone_with_backbone_config(tmp_path):
    """``backbone_config`` reaches the prompting and custom runners' load_backbone, and a cell run with other
    settings is not reused as if it were the same cell."""
    from echo_custom_plugin import ScriptedBackbone, _read_word

    seen = []
    register_backbone("custom_backbone_cfg",
                      lambda config: seen.append(config.dtype) or ScriptedBackbone(_read_word, name="cfg"))

    def bench(dtype):
        cfg = BenchmarkConfig(tasks=["custom_task"], backbones=["custom_backbone_cfg"],
                              baselines=["custom_baseline", "react"], num_seeds=1, num_episodes=2,
                              max_steps_per_episode=3, output_dir=str(tmp_path / "bench"), generate_plots=False,
                              generate_report=False, backbone_config={"dtype": dtype})
        return asyncio.run(EchoRLBenchmark(cfg).run_benchmark())

    assert bench("bfloat16")["ok"] == 2 and seen == ["bfloat16", "bfloat16"]
    assert bench("bfloat16")["reused"] == 2 and len(seen) == 2
    assert bench("float32")["ok"] == 2 and seen[2:] == ["float32", "float32"]
