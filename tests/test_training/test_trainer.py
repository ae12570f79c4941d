import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from echo_rl import EchoRLTrainer, TrainingConfig
from echo_rl.training.run_dir import RunDirectory

SMALL = dict(env_name="minigrid:MiniGrid-Empty-5x5-v0", total_timesteps=2048, num_actors=4, batch_size=256,
             evaluation_frequency=1024, evaluation_episodes=4, save_frequency=512)


def _train(run_dir, **overrides):
    cfg = TrainingConfig(**{**SMALL, **overrides})
    return asyncio.run(EchoRLTrainer(cfg, run_dir=run_dir, show_progress=False).train())


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "echo_rl.cli", *args], capture_output=True, text=True, **kw)


def test_run_directory_contents(tmp_path):
    m = _train(tmp_path / "run")
    run = tmp_path / "run"
    for name in ["config.yaml", "metrics.jsonl", "timings.jsonl", "summary.json", "learning_curve.png"]:
        assert (run / name).is_file(), name
    assert TrainingConfig.load_yaml(run / "config.yaml") == TrainingConfig(**SMALL)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["total_timesteps"] == m.total_timesteps == 2048 and summary["num_updates"] == 8
    assert set(m.evaluation_results) >= {"success_rate", "avg_reward"}
    ckpt = RunDirectory(run, TrainingConfig(**SMALL)).latest_checkpoint()
    payload = torch.load(ckpt / "state.pt", weights_only=True)  # loadable without pickle code execution
    assert payload["step"] == 2048 and payload["config"]["env_name"] == SMALL["env_name"]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/success_rate" in r] == [1024, 2048]


def test_same_seed_same_metrics_and_different_seed_differs(tmp_path):
    _train(tmp_path / "a")
    _train(tmp_path / "b")
    _train(tmp_path / "c", seed=1)
    a, b, c = ((tmp_path / x / "metrics.jsonl").read_text() for x in "abc")
    assert a == b
    assert a != c


def test_existing_run_is_not_overwritten(tmp_path):
    _train(tmp_path / "run")
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(Exception, match="already holds a run; pass --resume"):
        _train(tmp_path / "run")
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


def _wait_for_checkpoint(run_dir: Path, proc, min_step: int, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        ptr = run_dir / "checkpoints" / "latest"
        if ptr.exists() and int(ptr.read_text().strip().split("_")[1]) >= min_step:
            return
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    raise TimeoutError("no checkpoint appeared")


def _cli_args(run_dir, total):
    return ["train", "--task", SMALL["env_name"], "--timesteps", str(total), "--num-actors", "4", "--batch-size", "256",
            "--set", "evaluation_frequency=1024", "--set", "evaluation_episodes=4", "--set", "save_frequency=512",
            "--run-dir", str(run_dir), "--no-progress"]


@pytest.mark.parametrize("how", ["kill", "ctrl-c"])
def test_killed_or_interrupted_run_resumes_to_the_same_result(tmp_path, how):
    total = 4096
    ref = tmp_path / "ref"
    assert _cli(*_cli_args(ref, total)).returncode == 0
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "echo_rl.cli", *_cli_args(run, total)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_checkpoint(run, proc, 1024)
    if how == "kill":
        proc.kill()
    else:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if how == "ctrl-c":
        assert proc.returncode == 130 and "Resume with: echo-rl train --resume" in err, err
        assert "Traceback" not in err
    summary_before = run / "summary.json"
    resumed = _cli("train", "--resume", "--run-dir", str(run), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    ref_summary = json.loads((ref / "summary.json").read_text())
    run_summary = json.loads(summary_before.read_text())
    assert run_summary["total_timesteps"] == ref_summary["total_timesteps"] == total
    assert run_summary["num_updates"] == ref_summary["num_updates"]
    assert (run / "metrics.jsonl").read_text() == (ref / "metrics.jsonl").read_text()


@pytest.mark.parametrize("args, needle", [
    (["train", "--task", "nethack"], "unknown task 'nethack'"),
    (["train", "--timesteps", "-10"], "TrainingConfig.total_timesteps=-10 is invalid: must be >= 1"),
    (["train", "--set", "ppo_config.lr=0.1"], "unknown field TrainingConfig.ppo_config.lr; allowed:"),
    (["train", "--agent", "sac"], "unknown agent 'sac'; allowed:"),
    (["train", "--resume"], "--resume needs --run-dir"),
    (["eval"], "give --run-dir"),
])
def test_cli_bad_input_is_one_line_exit_2(args, needle):
    r = _cli(*args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_config_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("env_name: minigrid\nppo_config: {learning_rate: 0.1\n")
    r = _cli("train", "--config", str(bad))
    assert r.returncode == 2 and "is not valid YAML at line" in r.stderr and "Traceback" not in r.stderr
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("env_name: minigrid\nlearning_rat: 0.1\n")
    r = _cli("train", "--config", str(unknown))
    assert r.returncode == 2 and "unknown field TrainingConfig.learning_rat; allowed:" in r.stderr


def test_cli_eval_of_a_trained_run(tmp_path):
    _train(tmp_path / "run")
    r = _cli("eval", "--run-dir", str(tmp_path / "run"), "--episodes", "3")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["episodes"] == 3 and 0.0 <= out["success_rate"] <= 1.0
    greedy = [_cli("eval", "--run-dir", str(tmp_path / "run"), "--episodes", "3", "--deterministic", "--seed", s)
              for s in ("0", "0")]
    assert all(g.returncode == 0 for g in greedy), greedy[0].stderr
    assert json.loads(greedy[0].stdout) == json.loads(greedy[1].stdout)
    r = _cli("eval", "--task", "minigrid", "--agent", "react", "--backbone", "expert", "--deterministic")
    assert r.returncode == 2 and "--deterministic is for trained runs" in r.stderr


def test_help_documents_every_flag():
    out = _cli("train", "--help").stdout
    for flag in ["--task", "--backbone", "--timesteps", "--num-actors", "--batch-size", "--seed", "--device",
                 "--config", "--run-dir", "--resume", "--agent", "--set"]:
        assert flag in out


def test_ray_rollout_state_on_local_backend_is_a_one_line_error():
    """A Ray checkpoint's envs cannot be resumed in-process; the error says which backend wrote them."""
    from echo_rl.config import ConfigError
    from echo_rl.environments.minigrid_vector import make_vector_env
    from echo_rl.training.agents import agent_class

    cfg = TrainingConfig(**{k: v for k, v in SMALL.items() if k != "total_timesteps"})
    agent = agent_class("ppo")(cfg, make_vector_env(cfg.env_name, cfg.num_actors), torch.device("cpu"))
    try:
        with pytest.raises(ConfigError, match="written by backend=ray; resume it with the backend that wrote it"):
            agent.load_rollout_state({"backend": "ray", "slices": [(0, 4)], "workers": [], "tokens": []})
        agent.train_iteration()  # the agent's own envs were not closed by the refused load
    finally:
        agent.close()
