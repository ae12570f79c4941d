"""examples/own_agent/agent.py, unchanged, trained through `echo-rl train --task external` with the tiny model."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("minigrid")

from echo_rl.cli import main  # noqa: E402

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
