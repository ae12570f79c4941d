"""ReAct and Act-only loops: prompting, parsing, thoughts, stop strings, accounting."""

import pytest

from echo_rl.prompting import ReActAgent, build_agent
from echo_rl.prompting.base import alfworld_kind, clean_alfworld, parse_action, parse_reply
from echo_rl.config import ConfigError
from echo_rl.models import ScriptedBackbone

from corridor_env import CorridorEnv


def expert_backbone(env, think_every=0):
    """Replies with the env's expert action; optionally a thought before each action."""
    state = {"n": 0}

    def respond(messages):
        state["n"] += 1
        if think_every and state["n"] % (think_every + 1) == 1:
            return "think: I should follow the plan.\nextra line that the stop string must cut"
        return "> " + env.expert_action()

    return ScriptedBackbone(respond, count_tokens=lambda s: len(s.split()))


@pytest.mark.parametrize("index", [0, 1, 2])
def test_react_with_expert_replies_wins(index):
    env = CorridorEnv()
    agent = ReActAgent(expert_backbone(env, think_every=1))
    res = agent.run_episode(env, seed=0, options={"task_index": index})
    assert res.success and res.reward == 1.0
    assert res.steps == len([t for t in res.trajectory if t["role"] == "agent" and not t["text"].startswith("think")])
    assert res.turns == 2 * res.steps  # one thought before every action
    assert res.usage.requests == res.turns and res.usage.prompt_tokens > 0
    # the thought was answered with OK. and never reached the env; the stop string cut the second line
    thoughts = [t for t in res.trajectory if t["text"].startswith("think")]
    assert thoughts and all("\n" not in t["text"] for t in thoughts)


def test_react_messages_grow_append_only():
    env = CorridorEnv()
    bb = expert_backbone(env)
    ReActAgent(bb).run_episode(env, seed=0, options={"task_index": 1})
    for prev, cur in zip(bb.calls, bb.calls[1:]):
        assert cur[: len(prev)] == prev  # every prompt extends the last one: prefix-cache friendly
    assert bb.calls[0][1]["content"].startswith("You are in room 0")


def test_wrong_actions_do_not_crash_and_fail_the_episode():
    env = CorridorEnv()
    res = ReActAgent(ScriptedBackbone(lambda m: "dance wildly")).run_episode(env, seed=0, max_steps=5)
    assert not res.success and res.steps == 5 and res.reward == 0.0
    assert "Nothing happens." in [t["text"] for t in res.trajectory if t["role"] == "env"]


def test_act_mode_sends_thoughts_to_the_env():
    env = CorridorEnv()
    agent = build_agent("act", ScriptedBackbone(lambda m: "think: hmm"))
    res = agent.run_episode(env, seed=0, max_steps=3)
    assert res.steps == 3 and agent.name == "act"


def test_parsing():
    assert parse_action("> go to room 2\nmore") == "go to room 2"
    assert parse_action("\n\n  1. take key") == "take key"
    assert parse_action("Action: open door") == "open door"
    assert parse_action("") == ""
    assert parse_reply("```\n1 2\n3 4\n```", True) == "1 2\n3 4"
    assert parse_reply("think: rows", True) == "think: rows"


def test_alfworld_helpers():
    assert clean_alfworld("You arrive at loc 12. On the desk 1, you see a pen 1.") == "On the desk 1, you see a pen 1."
    obs = "You are in the middle of a room.\nYour task is to: put a clean lettuce in diningtable."
    assert alfworld_kind({}, obs) == "clean"
    assert alfworld_kind({"task_id": "pick_two_obj_and_place-Pen-None-Desk-1/trial_1"}, obs) == "puttwo"
    assert alfworld_kind({}, "Your task is to: look at bowl under the desklamp.") == "examine"
    assert alfworld_kind({}, "Your task is to: heat some egg and put it in countertop.") == "heat"


def test_unknown_agent_and_bad_options():
    with pytest.raises(ConfigError, match="allowed: react, act, tot"):
        build_agent("reflexion", ScriptedBackbone(["x"]))
    with pytest.raises(ConfigError, match="mode"):
        ReActAgent(ScriptedBackbone(["x"]), mode="plan")
    with pytest.raises(ConfigError, match="bad option"):
        build_agent("react", ScriptedBackbone(["x"]), beam=3)
