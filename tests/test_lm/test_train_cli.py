"""`echo-rl train` on text tasks through the CLI: ALFWorld end to end with resume (slow); bad input."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")


def _cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "echo_rl.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, **kw)


def _one_line_error(r, needle):
    assert r.returncode == 2, r.stderr[-2000:]
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--task", "alfworld", "--backbone", "gpt-4o"], "backbone='gpt-4o' is invalid: an API model has no weights"),
    (["--task", "webshop", "--backbone", "anthropic/claude-3-5-haiku-20241022"], "an API model has no weights"),
    (["--task", "alfworld"], "text task 'alfworld' needs a language-model backbone"),
    (["--task", "minigrid", "--backbone", "tiny", "--agent", "impala"], "text tasks train with ppo (GRPO) or echo-rl"),
])
def test_bad_text_training_input_is_one_line(args, needle, tmp_path):
    # an empty model directory: with smollm2-135m fetched, a text task given no backbone would use it
    r = _cli("train", *args, "--run-dir", str(tmp_path / "run"), env={"ECHO_RL_MODEL_DIR": str(tmp_path / "models")})
    _one_line_error(r, needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_bad_checkpoints_are_one_line(tmp_path, chatml_tokenizer, forgetful_template):
    from test_loop import save_checkpoint

    unknown = _cli("train", "--task", "minigrid", "--backbone", str(tmp_path / "no-such-model"),
                   "--run-dir", str(tmp_path / "r0"))
    _one_line_error(unknown, "is invalid: not a tiny preset")
    no_tok = tmp_path / "no_tok"
    save_checkpoint(tmp_path / "full", chatml_tokenizer)
    no_tok.mkdir()
    (no_tok / "config.json").write_text((tmp_path / "full" / "config.json").read_text())
    r = _cli("train", "--task", "minigrid", "--backbone", str(no_tok), "--run-dir", str(tmp_path / "r1"))
    _one_line_error(r, "the checkpoint directory has no tokenizer")
    forgetful = save_checkpoint(tmp_path / "forgetful", chatml_tokenizer, forgetful_template)
    r = _cli("train", "--task", "minigrid", "--backbone", str(forgetful), "--run-dir", str(tmp_path / "r2"))
    _one_line_error(r, "chat template does not keep earlier turns as a prefix")
    assert not any((tmp_path / f"r{i}").exists() for i in range(3))


@pytest.mark.slow
def test_alfworld_tiny_end_to_end_and_resume(shared_data, tmp_path):
    pytest.importorskip("textworld", reason="ALFWorld needs pip install 'echo-rl[alfworld]'")
    pytest.importorskip("alfworld", reason="ALFWorld needs pip install 'echo-rl[alfworld]'")
    run = tmp_path / "run"
    env = {"ECHO_RL_CACHE_DIR": str(tmp_path / "cache")}
    common = ["--run-dir", str(run), "--no-progress"]
    r = _cli("train", "--task", "alfworld", "--backbone", "tiny", "--agent", "echo-rl", "--plan", "--timesteps", "4",
             "--num-actors", "2", "--batch-size", "2", *common,
             "--set", "env_config={max_steps: 2, task_type: pick_and_place}",
             "--set", "evaluation_episodes=1", "--set", "evaluation_frequency=0", "--set", "lm_config.group_size=2",
             "--set", "lm_config.sft_episodes=1", "--set", "lm_config.sft_steps=1", "--set", "lm_config.heldout_pool=1",
             "--set", "lm_config.max_new_tokens=6", "--set", "planning_config.embedding_dim=16", env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "done: 4 env steps, 1 updates" in r.stdout and "held-out env CE" in r.stdout
    assert "[train] 4/4 steps" not in r.stderr  # --no-progress
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and "eval/heldout_env_ce" in rows[0]
    assert rows[1]["episode/count"] == 2 and rows[1]["lm/plan"] == 1.0
    cfg = (run / "config.yaml").read_text()
    assert "env_name: alfworld" in cfg and (run / "checkpoints" / "latest").is_file()
    r2 = _cli("train", "--resume", "--timesteps", "8", *common, env=env, timeout=300)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "done: 8 env steps, 2 updates" in r2.stdout
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/updates"] for r in rows] == [0.0, 1.0, 1.0, 2.0, 2.0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_updates"] == 2 and summary["evaluation_results"]["episodes"] == 1.0
