"""Task reply formats: lenient about wrapping, never about content; the same example for every method."""

import pytest

from echo_rl.agents.prompts import extract_reply, is_thought, task_format
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
