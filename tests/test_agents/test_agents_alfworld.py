"""Acceptance on real ALFWorld games: expert-scripted ReAct and ToT win; ReAct drives the served tiny model over HTTP."""

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("textworld")

from echo_rl.prompting import ReActAgent, TreeOfThoughtsAgent  # noqa: E402
from echo_rl.prompting.runner import evaluate_text_agent, expert_backbone  # noqa: E402

pytestmark = [pytest.mark.needs_data, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(shared_data):
    from echo_rl.environments.registry import make_env

    e = make_env("alfworld", split="valid_unseen", expert=True, max_steps=50)
    yield e
    e.close()


@pytest.mark.parametrize("index", [0, 7])
def test_expert_scripted_react_wins_real_games(env, index):
    bb = expert_backbone(env)
    res = ReActAgent(bb, task="alfworld").run_episode(env, seed=index, options={"task_index": index})
    assert res.success and res.reward == 1.0, res.trajectory[-4:]
    first = bb.calls[0][1]["content"]  # the published few-shot prompt, then the task
    assert first.startswith("Interact with a household to solve a task. Here are two examples.")
    assert "\nHere is the task.\nYou are in the middle of a room." in first
    assert "You arrive at loc" not in "".join(t["text"] for t in res.trajectory)


def test_expert_scripted_tot_wins_a_real_game(env):
    res = TreeOfThoughtsAgent(expert_backbone(env), task="alfworld").run_episode(env, seed=1,
                                                                                options={"task_index": 3})
    assert res.success and res.steps == res.env_steps


def test_react_drives_the_served_tiny_model_over_http(shared_data, tiny):
    from echo_rl.serve import ModelServer, create_app

    with ModelServer(create_app(tiny, model_name="tiny")) as srv:
        r = evaluate_text_agent("alfworld", "react", f"{srv.url}#tiny", episodes=1, seed=0, max_steps=4,
                                agent_config={"max_tokens": 24, "temperature": 1.0})
    ep = r["per_episode"][0]
    assert r["episodes"] == 1 and ep["error"] is None
    assert ep["turns"] == 4 and ep["usage_requests"] == 4  # four chat requests went over HTTP
    assert r["prompt_tokens"] > 1000 and r["completion_tokens"] >= 4  # the few-shot prompt was served
    assert ep["steps"] >= 1  # sampled replies reached the game (an untrained model: "Nothing happens.")
    assert r["cost_usd"] == 0.0  # a local server is not metered
