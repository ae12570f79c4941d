"""evaluate_text_agent: scores, tokens, cost, cost/success, errors, output files."""

import json

import pytest

from echo_rl.prompting.runner import episode_plan, evaluate_text_agent, summarize, wilson_interval
from echo_rl.prompting.base import EpisodeResult
from echo_rl.config import ConfigError
from echo_rl.models import ScriptedBackbone, Usage


def test_expert_backbone_solves_minigrid_through_react(tmp_path):
    out = tmp_path / "res.json"
    r = evaluate_text_agent("minigrid", "react", "expert", episodes=3, seed=0, output=str(out))
    assert r["episodes"] == 3 and r["success_rate"] == 1.0 and r["errors"] == 0
    assert 0 < r["avg_reward"] <= 1.0  # MiniGrid's reward shrinks with steps taken
    assert json.loads(out.read_text())["successes"] == 3
    lines = (tmp_path / "res.trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["trajectory"][0]["role"] == "env"


def test_expert_backbone_solves_arc_through_tot(shared_data):
    r = evaluate_text_agent("arc", "tot", "expert", episodes=2, seed=3)
    assert r["success_rate"] == 1.0 and r["avg_steps"] >= 1


def test_wrong_answers_score_zero_on_arc(shared_data):
    r = evaluate_text_agent("arc", "react", ScriptedBackbone(lambda m: "1 2\n3 4"), episodes=2, seed=0, max_steps=3)
    assert r["success_rate"] == 0.0 and r["cost_per_success_usd"] is None


def test_cost_per_success_from_usage():
    res = [EpisodeResult("a", 0, True, 1.0, 3, 3, Usage(100, 10, 0.5, 3)),
           EpisodeResult("b", 1, False, 0.0, 5, 5, Usage(200, 20, 0.25, 5)),
           EpisodeResult("c", 2, True, 1.0, 2, 2, Usage(50, 5, 0.75, 2))]
    s = summarize(res, task="t", agent="react", backbone="b", seed=0, seconds=1.0)
    assert s["cost_usd"] == pytest.approx(1.5) and s["cost_per_success_usd"] == pytest.approx(0.75)
    assert s["total_tokens"] == 385 and s["success_rate"] == pytest.approx(2 / 3)
    unknown = [EpisodeResult("a", 0, True, 1.0, 1, 1, Usage(1, 1, None, 1))]
    assert summarize(unknown, task="t", agent="a", backbone="b", seed=0, seconds=0)["cost_usd"] is None


def test_episode_plan_and_wilson():
    assert episode_plan(5, 7, 0) == [0, 1, 2, 3, 4, 0, 1]
    sample = episode_plan(100, 5, 1)
    assert sample == sorted(set(sample)) and len(sample) == 5 and sample == episode_plan(100, 5, 1)
    assert episode_plan(100, 5, 2) != sample
    assert episode_plan(None, 2, 0) == [None, None]
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and 0.2 < hi < 0.35
    lo, hi = wilson_interval(5, 10)
    assert lo < 0.5 < hi


def test_bad_names_are_config_errors():
    with pytest.raises(ConfigError, match="unknown agent 'reflexion'; allowed: react, act, tot"):
        evaluate_text_agent("minigrid", "reflexion", "expert", episodes=1, seed=0)
    with pytest.raises(ConfigError, match="unknown backbone 'gpt-17'"):
        evaluate_text_agent("minigrid", "react", "gpt-17", episodes=1, seed=0)
    with pytest.raises(ConfigError, match="unknown task"):
        evaluate_text_agent("chess", "react", "expert", episodes=1, seed=0)
    with pytest.raises(ConfigError, match="episodes"):
        evaluate_text_agent("minigrid", "react", "expert", episodes=0, seed=0)


def test_missing_api_key_fails_before_any_request(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        evaluate_text_agent("minigrid", "react", "claude-3.5-sonnet", episodes=1, seed=0)


def test_eval_cli_one_line_error(monkeypatch, capsys):
    from echo_rl.cli import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code = main(["eval", "--task", "minigrid", "--agent", "react", "--backbone", "gpt-4o", "--episodes", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "OPENAI_API_KEY" in err and len(err.splitlines()) == 1


def test_cruxeval_answers_are_unwrapped_but_never_repaired(shared_data):
    """The expert's reference answer in a fenced block scores; the function copied back is refused, not run."""
    from echo_rl.environments.registry import make_env

    env = make_env("cruxeval", task="output")
    fenced = ScriptedBackbone(lambda m: f"Answer:\n```python\n{env.expert_action()}\n```")
    env.reset(seed=0, options={"task_index": 0})  # the scripted reply reads this env's current sample
    from echo_rl.prompting.react import ReActAgent

    for i in range(3):
        res = ReActAgent(fenced, task="cruxeval", mode="act").run_episode(env, seed=i, options={"task_index": i})
        assert res.success and res.steps == 1
    copier = ScriptedBackbone(lambda m: "def f(text):\n    return text")
    res = ReActAgent(copier, task="cruxeval", mode="act").run_episode(env, seed=0, max_steps=2)
    assert not res.success and res.reward == 0.0
    assert "not a Python expression" in res.trajectory[2]["text"]


def test_eval_cli_passes_env_options_and_concurrency(tmp_path, shared_data, capsys):
    from echo_rl.cli import main

    out = tmp_path / "r.json"
    assert main(["eval", "--task", "cruxeval", "--agent", "act", "--backbone", "expert", "--episodes", "3",
                 "--set", "task=input", "--concurrency", "2", "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["successes"] == 3 and r["concurrency"] == 2 and r["tokens_per_second"] is not None
    capsys.readouterr()
    assert main(["eval", "--task", "cruxeval", "--agent", "act", "--backbone", "expert", "--concurrency", "0"]) == 2
    assert "--concurrency=0 is invalid: must be >= 1" in capsys.readouterr().err
