"""Task reply formats: lenient about wrapping, never about content; the same example for every method."""

import pytest

from echo_rl.prompting.prompts import extract_reply, is_thought, task_format
from echo_rl.environments.cruxeval import parse_literal


@pytest.mark.parametrize("reply, expected", [
    ("[ANSWER][1, 'a'][/ANSWER]", "[1, 'a']"),
    ("[ANSWER]f('hi')", "f('hi')"),  # the stop string cut the closing tag
    ("```python\n{'a': 2}\n```", "{'a': 2}"),
    ("```\n[3]", "[3]"),  # an unterminated fence
    ("Answer: 'abc'", "'abc'"),
    ("`True`", "True"),
    ("> go to cabinet 1\nmore text", "go to cabinet 1"),
    ("  2. take key", "take key"),
    ("Action: click[Buy Now]", "click[Buy Now]"),
    ("", ""),
])
def test_wrapping_is_removed(reply, expected):
    assert extract_reply(reply, multiline=False) == expected


def test_content_is_never_repaired():
    # a function copied back stays a function: the env refuses it, the agent does not "fix" it
    assert extract_reply("def f(x):\n    return x", multiline=False) == "def f(x):"
    with pytest.raises(ValueError, match="not a Python expression"):
        parse_literal(extract_reply("def f(x):\n    return x", multiline=False))
    assert extract_reply("[ANSWER]__import__('os').system('x')[/ANSWER]", False) == "__import__('os').system('x')"
    with pytest.raises(ValueError, match="not a literal"):
        parse_literal("__import__('os').system('x')")


def test_multiline_grids_and_thoughts():
    assert extract_reply("```\n1 2\n3 4\n```", multiline=True) == "1 2\n3 4"
    assert extract_reply("Answer:\n5 5\n5 5", multiline=True) == "5 5\n5 5"
    assert extract_reply("think: rows repeat\nmore", multiline=False) == "think: rows repeat"
    assert is_thought("think: x") and not is_thought("think: so [ANSWER]1[/ANSWER]")
    assert extract_reply("think: it doubles\n[ANSWER][2][/ANSWER]", multiline=False) == "[2]"


class _Crux:
    def __init__(self, task):
        self.config = type("C", (), {"task": task})()


def test_formats_per_task_and_mode():
    o, i = task_format("cruxeval", _Crux("output")), task_format("cruxeval", _Crux("input"))
    assert "returns" in o.instruction and "call of f" in i.instruction
    assert parse_literal(extract_reply(o.answer, False)) == [4, 6]  # the example's own answer is admissible
    assert extract_reply(i.answer, False).startswith("f(")
    react, act = o.example_turns("react"), o.example_turns("act")
    assert [t["role"] for t in act] == ["user", "assistant"]
    assert [t["role"] for t in react] == ["user", "assistant", "user", "assistant"]
    assert react[1]["content"].startswith("think:") and react[-1] == act[-1]
    shop = task_format("webshop").example_turns("act")
    assert [t["content"] for t in shop if t["role"] == "assistant"][-1] == "click[Buy Now]"
    assert task_format("minigrid").max_tokens < task_format("arc").max_tokens and task_format("arc").multiline
    assert task_format("alfworld").example_turns("react") == []  # the paper's two games are its examples
    assert task_format("my-own-task").instruction


# -- a task's reply format is a field of its registry entry ---------------------------------------------------

@pytest.fixture
def _registry_restored():
    from echo_rl.environments import registry

    registry.text_task_names()  # the built-ins in first
    saved = dict(registry._TASKS)
    yield registry
    registry._TASKS.clear()
    registry._TASKS.update(saved)


def test_a_user_task_registers_its_own_reply_format(_registry_restored):
    from corridor_env import CorridorEnv

    from echo_rl.prompting import build_agent
    from echo_rl.environments.reply_format import TaskFormat
    from echo_rl.models import ScriptedBackbone

    fmt = TaskFormat(instruction="Reply as 'go to room N'.", example="You are in room 0.", answer="go to room 1",
                     thought="the key is ahead", stop=("\n", "."), max_tokens=7)
    _registry_restored.register_text_env("corridor", CorridorEnv, reply_format=fmt)
    assert task_format("corridor") is fmt and _registry_restored.task_spec("corridor").prompting
    sent = []

    class Recorder(ScriptedBackbone):
        def chat(self, messages, **sampling):
            sent.append((messages, sampling))
            return super().chat(messages, **sampling)

    build_agent("react", Recorder(lambda m: "go to room 1"), task="corridor").run_episode(CorridorEnv(), seed=0,
                                                                                         max_steps=1)
    (messages, sampling), = sent
    assert messages[0]["content"].endswith("Reply as 'go to room N'.")
    assert [m["content"] for m in messages[1:4]] == ["You are in room 0.", "think: the key is ahead", "OK."]
    assert sampling["stop"] == ("\n", ".") and sampling["max_tokens"] == 7
    sent.clear()
    build_agent("tot", Recorder(lambda m: "likely" if "Evaluate" in m[-1]["content"] else "go to room 1"),
                task="corridor").run_episode(CorridorEnv(), seed=0, max_steps=1)
    assert sent[0][0][1]["content"].startswith("Reply as 'go to room N'.\nExample task:\nYou are in room 0.")


def test_reply_formats_from_the_env_and_the_default(_registry_restored):
    from echo_rl.environments.reply_format import GENERIC, TaskFormat

    short, long_ = (TaskFormat(instruction=f"Reply {w}.", example="", answer="") for w in ("briefly", "at length"))
    _registry_restored.register_text_env("moody", dict, reply_format=lambda env: long_ if env else short)
    assert task_format("moody") is short and task_format("moody", env=object()) is long_
    _registry_restored.register_text_env("plain", dict)
    _registry_restored.register_text_env("grids", dict, multiline=True)
    assert task_format("plain") is GENERIC and not _registry_restored.task_spec("plain").prompting
    grid = task_format("grids")  # no format of its own: the generic one, ended by a blank line
    assert grid.multiline and grid.stop == ("\n\n",) and grid.instruction == GENERIC.instruction


def test_bad_reply_formats_are_refused_in_one_line(_registry_restored):
    from echo_rl.config import ConfigError
    from echo_rl.environments.reply_format import TaskFormat

    one_line = TaskFormat(instruction="Reply.", example="", answer="")
    with pytest.raises(ConfigError, match="reply_format of task 'x' is invalid: must be .*TaskFormat"):
        _registry_restored.register_text_env("x", dict, reply_format="Reply with one word")
    with pytest.raises(ConfigError, match="multiline=False contradicts the task's multiline=True"):
        _registry_restored.register_text_env("x", dict, multiline=True, reply_format=one_line)
    _registry_restored.register_text_env("x", dict, reply_format=lambda env: "Reply.")
    with pytest.raises(ConfigError, match="it returned str, not a TaskFormat"):
        task_format("x")
    with pytest.raises(ConfigError, match="TaskFormat.stop='\\\\n' is invalid"):
        TaskFormat(instruction="Reply.", example="", answer="", stop="\n")
    with pytest.raises(ConfigError, match="needs the reply it wants"):
        TaskFormat(instruction="Reply.", example="Is 2 even?", answer="")
    with pytest.raises(ConfigError, match="unknown TaskSpec field.*prompting"):
        _registry_restored.register_text_env("x", dict, prompting=True)
