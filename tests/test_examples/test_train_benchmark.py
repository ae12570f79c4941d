"""examples/train_echo_rl.py and examples/benchmark_echo_rl.py: thin wrappers that run the library end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(script: str, *args: str, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg", **(env or {})}
    env.pop("OPENAI_API_KEY", None)  # an API backbone must be refused with its reason, never called
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=EXAMPLES.parent)


def test_train_example_runs_a_minigrid_agent_and_leaves_a_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    proc = run("train_echo_rl.py", "--task", "minigrid:MiniGrid-Empty-5x5-v0", "--timesteps", "256", "--num-actors",
               "4", "--batch-size", "64", "--set", "evaluation_episodes=4", "--run-dir", str(run_dir), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"done: 256 env steps, 4 updates, .* eval success [\d.]+, avg reward [\d.]+", proc.stdout)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 256 and "eval/success_rate" in rows[-1]
    assert (run_dir / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_train_example_text_task_with_the_tiny_backbone(tmp_path, shared_data):
    """The issue's form: --task alfworld --backbone tiny --timesteps N --num-actors N --batch-size N."""
    pytest.importorskip("alfworld", reason="pip install 'echo-rl[alfworld]'")
    run_dir = tmp_path / "alf"
    proc = run("train_echo_rl.py", "--task", "alfworld", "--backbone", "tiny", "--timesteps", "4", "--num-actors", "4",
               "--batch-size", "4", "--set", "evaluation_episodes=1", "--set", "lm_config.sft_episodes=0",
               "--set", "lm_config.heldout_pool=1", "--set", "lm_config.max_turns=2",
               "--set", "lm_config.max_new_tokens=4", "--run-dir", str(run_dir), "--no-progress",
               env={"ECHO_RL_DATA_DIR": str(shared_data)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"done: \d+ env steps, 1 updates, .* eval success [\d.]+, .*held-out env CE [\d.]+", proc.stdout)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["backbone"] == "tiny" and summary["text_task"] is True


def test_train_example_refuses_bad_input_with_exit_2(tmp_path):
    proc = run("train_echo_rl.py", "--task", "alfworld", "--backbone", "gpt-4o", "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert "an API model has no weights to train" in proc.stderr
    proc = run("benchmark_echo_rl.py", "--baselines", "react", "dqn", "--output-dir", str(tmp_path / "b"))
    assert proc.returncode == 2 and "dqn" in proc.stderr and "react" in proc.stderr


def test_benchmark_example_lists_every_reproduction_baseline():
    proc = run("benchmark_echo_rl.py", "--list-methods", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("react", "tot", "ppo-rlhf", "rlaif", "impala"):
        assert re.search(rf"^{re.escape(name)}\s+\w+\s.*-> available$", proc.stdout, re.M), (name, proc.stdout)


REPRO_BASELINES = ("react", "tot", "ppo-rlhf", "rlaif", "impala")


@pytest.mark.slow
def test_benchmark_example_reproduction_command_every_baseline_runs_or_is_refused(tmp_path, shared_data):
    """The reproduction command's baselines on a tiny budget: each runs on the tiny backbone, the API
    backbone without its key is refused per cell with the reason, and the report table is printed."""
    out = tmp_path / "bench"
    proc = run("benchmark_echo_rl.py", "--tasks", "cruxeval", "minigrid", "--baselines", *REPRO_BASELINES,
               "--backbones", "tiny", "gpt-4o", "--num-seeds", "1", "--num-episodes", "1", "--max-steps", "2",
               "--train-timesteps", "4", "--reps", "200", "--output-dir", str(out),
               "--set", "echo_rl_configs.lm_config.sft_episodes=0", "--set", "echo_rl_configs.lm_config.heldout_pool=1",
               "--set", "echo_rl_configs.lm_config.max_turns=2", "--set", "echo_rl_configs.lm_config.max_new_tokens=4",
               "--set", "echo_rl_configs.evaluation_episodes=1", "--set", "echo_rl_configs.num_actors=4",
               "--set", "echo_rl_configs.batch_size=4", "--set", "echo_rl_configs.impala.batch_size=64",
               "--set", "echo_rl_configs.impala.total_timesteps=128",
               env={"ECHO_RL_DATA_DIR": str(shared_data)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    log = proc.stderr
    for method in ("react", "tot", "ppo-rlhf", "rlaif"):
        assert re.search(rf"cruxeval \| {method} \(tiny\) \| seed 0: Success@1 [\d.]+", log), (method, log[-3000:])
        reason = "OPENAI_API_KEY" if method in ("react", "tot") else "API model 'gpt-4o' has none"
        assert re.search(rf"cruxeval \| {method} \(gpt-4o\) \| seed 0: SKIPPED: .*{reason}", log), method
    assert re.search(r"minigrid \| impala \| seed 0: Success@1 [\d.]+", log), log[-3000:]
    assert "## Results" in proc.stdout and "full report:" in proc.stdout
    assert re.search(r"\d+ cells: \d+ run, 0 kept from before, \d+ skipped, 0 failed, 0 timed out", proc.stdout)
