"""examples/own_agent/agent.py, unchanged, trained through `echo-rl train --task external` with the tiny model."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("minigrid")

from echo_rl.cli import main  # noqa: E402
from tests.script_loader import load_script  # noqa: E402

AGENT = Path(__file__).resolve().parents[2] / "examples" / "own_agent" / "agent.py"


def test_the_example_trains_for_an_update(tiny_path, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_MAX_TURNS", "2")
    monkeypatch.setenv("AGENT_MAX_TOKENS", "6")
    code = main(["train", "--task", "external", "--backbone", "tiny", "--command", f"{sys.executable} {AGENT}",
                 "--episodes", "2", "--concurrency", "2", "--updates", "1", "--run-dir", str(tmp_path / "run"),
                 "--no-progress", "--set", "lm_config.objective=gigpo"])  # GiGPO: the turns' anchors are recorded
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    assert rows[0]["external/episodes"] == 2 and rows[0]["external/crashed"] == 0, rows[0]
    assert rows[0]["external/turns"] == 4  # 2 episodes x 2 turns, every one recorded
    assert any(k.startswith("lm/") for k in rows[0])  # the learner updated on them
    # the trained weights end as a transformers directory that differs from the start and loads as a backbone
    from safetensors.torch import load_file

    from echo_rl.external.train import _checkpoint
    from echo_rl.lm.policy import load_policy

    export = tmp_path / "run" / "export" / "transformers"
    start, end = load_file(_checkpoint("tiny", 0) / "model.safetensors"), load_file(export / "model.safetensors")
    assert start.keys() == end.keys() and any(not start[k].equal(end[k]) for k in start)
    info = json.loads((export / "echo_rl_export.json").read_text())
    assert info["task"] == "external" and info["updates"] == 1 and info["policy_version"] == 1
    model, _ = load_policy(str(export), 0)
    assert all(p.equal(end[k]) for k, p in model.state_dict().items() if k in end)


def test_the_terminal_example_trains_for_an_update(tiny_path, tmp_path, monkeypatch):
    """Two attempts at one sandboxed terminal task (AGENT_GROUP=2), each verified and reported, one update."""
    monkeypatch.setenv("AGENT_GROUP", "2")
    monkeypatch.setenv("AGENT_MAX_TOKENS", "8")
    code = main(["train", "--task", "external", "--backbone", "tiny", "--command",
                 f"{sys.executable} {AGENT.with_name('terminal_agent.py')}", "--episodes", "2", "--concurrency", "2",
                 "--updates", "1", "--run-dir", str(tmp_path / "run"), "--no-progress"])
    assert code == 0
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert row["external/episodes"] == 2 and row["external/crashed"] == 0 and row["external/no_reward"] == 0, row
    assert 2 <= row["external/turns"] <= 6  # at most the task's 3 turns each
    assert "lm/loss" in row


def test_the_terminal_example_asks_what_the_in_process_trainer_asks(tiny):
    """Its first request renders, through the server's tool path, to the in-process episode's first prompt."""
    from echo_rl.environments.registry import make_env, task_format
    from echo_rl.environments.tool_calls import TERMINAL_TOOLS
    from echo_rl.lm.chat_delta import ChatRenderer
    from echo_rl.lm.rollout import lm_turn_setup
    from echo_rl.lm.trajectory import TrajectoryBuilder
    from echo_rl.serve.schemas import ChatCompletionRequest
    from echo_rl.serve.tool_api import tool_prompt

    agent = load_script("examples/own_agent/terminal_agent.py", "terminal_agent")
    env = make_env("terminal", level=1, max_steps=3)
    try:
        _, info = env.reset(seed=5)
        renderer = ChatRenderer(tiny.tokenizer)
        system, role = lm_turn_setup(task_format("terminal", env), renderer, None)
        in_process = TrajectoryBuilder(renderer, info["segments"], system=system, observation_role=role).token_ids
        request = ChatCompletionRequest(model="policy", tools=[t.schema() for t in TERMINAL_TOOLS], messages=[
            {"role": "system", "content": agent.SYSTEM}, {"role": "user", "content": agent.text(info)}])
        _, messages, render = tool_prompt(request, tiny)
        assert render(messages) == list(in_process)
    finally:
        env.close()
