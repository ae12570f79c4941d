"""Tree of Thoughts: propose/value prompts, lookahead through snapshots, beams, commit without lookahead."""

import pytest

from echo_rl.prompting import TreeOfThoughtsAgent
from echo_rl.prompting.tot import PROPOSE_MARK, VALUE_MARK
from echo_rl.config import ConfigError
from echo_rl.models import ScriptedBackbone

from corridor_env import CorridorEnv


def test_value_guided_search_finds_the_win_with_lookahead():
    """Proposals list every valid action; values come from the observation the lookahead produced."""
    env = CorridorEnv()

    def respond(messages):
        text = messages[-1]["content"]
        if PROPOSE_MARK in text:
            valid = text.split("Valid actions: ")[-1].split("; ")
            return "\n".join(valid)
        assert VALUE_MARK in text
        result = text.split("Resulting observation: ")[-1].split("\n")[0]
        if "take the key" in result:
            return "sure"
        return "likely" if ("see a key" in result or "room 3" in result) else "impossible"

    agent = TreeOfThoughtsAgent(ScriptedBackbone(respond), breadth=4, lookahead="snapshot")
    res = agent.run_episode(env, seed=0, options={"task_index": 2})
    assert res.success and res.reward == 1.0
    assert res.env_steps > res.steps  # lookahead tried actions that were not committed
    assert [t["text"] for t in res.trajectory if t["role"] == "agent"][-1] == "open door"


def test_expert_proposals_without_lookahead_commit_in_the_real_env():
    env = CorridorEnv()

    def respond(messages):
        return env.expert_action() if PROPOSE_MARK in messages[-1]["content"] else "likely"

    agent = TreeOfThoughtsAgent(ScriptedBackbone(respond), lookahead="none")
    res = agent.run_episode(env, seed=0, options={"task_index": 1})
    assert res.success and res.env_steps == res.steps == 4


def test_beam_keeps_several_states():
    env = CorridorEnv()
    seen_values = []

    def respond(messages):
        text = messages[-1]["content"]
        if PROPOSE_MARK in text:
            return "\n".join(text.split("Valid actions: ")[-1].split("; ")[:3])
        seen_values.append(text)
        return "likely"

    res = TreeOfThoughtsAgent(ScriptedBackbone(respond), breadth=3, beam=2, lookahead="snapshot").run_episode(
        env, seed=0, max_steps=6, options={"task_index": 0})
    assert res.steps <= 6 and len(seen_values) > 3


def test_unparseable_value_counts_zero_and_bad_config():
    with pytest.raises(ConfigError, match="beam"):
        TreeOfThoughtsAgent(ScriptedBackbone(["x"]), beam=2, lookahead="none").run_episode(CorridorEnv(), seed=0)
    with pytest.raises(ConfigError, match="lookahead"):
        TreeOfThoughtsAgent(ScriptedBackbone(["x"]), lookahead="mcts")
    with pytest.raises(ConfigError, match="breadth"):
        TreeOfThoughtsAgent(ScriptedBackbone(["x"]), breadth=0)
