"""The tool-call text format and OpenAI's shape: one parser for every caller."""

import json

import pytest

from echo_rl.environments.tool_calls import (BASH, SUBMIT, TERMINAL_TOOLS, ToolCall, ToolCallError,
                                             format_instruction, parse_text, render_text, stop_strings)


def test_round_trip_text_and_openai():
    call = ToolCall("bash", {"command": "grep -c 'a<b' f.txt | sort > out"})
    text = render_text(call)
    assert text == "<bash>grep -c 'a<b' f.txt | sort > out</bash>"
    assert parse_text(text) == call
    entry = call.to_openai("call_0")
    assert json.loads(entry["function"]["arguments"]) == {"command": call.arguments["command"]}
    assert ToolCall.from_openai(entry, TERMINAL_TOOLS) == call


def test_thought_before_and_text_after_are_ignored_and_multiline_bodies_kept():
    reply = "I should list files.\n<bash>\nfor f in *; do\n  echo $f\ndone\n</bash> trailing"
    assert parse_text(reply) == ToolCall("bash", {"command": "for f in *; do\n  echo $f\ndone"})
    assert parse_text("<submit>yes</submit><bash>rm -rf /</bash>") == ToolCall("submit", {"answer": "yes"})


@pytest.mark.parametrize("reply, words", [
    ("ls -la", "no tool call found"),
    ("<bash>rm -rf /tmp/x", "not closed"),
    ("<python>print(1)</python>", "no tool call found"),
])
def test_bad_replies_are_one_line_warnings(reply, words):
    with pytest.raises(ToolCallError, match=words) as info:
        parse_text(reply)
    assert "\n" not in str(info.value)


def test_openai_calls_are_checked_against_the_tools():
    bad = [{"function": {"name": "rm", "arguments": "{}"}},
           {"function": {"name": "bash", "arguments": "{not json"}},
           {"function": {"name": "bash", "arguments": json.dumps({"command": 1})}},
           {"function": {"name": "bash", "arguments": json.dumps({"command": "ls", "x": "y"})}},
           {"name": "bash"}]
    for entry in bad:
        with pytest.raises(ToolCallError):
            ToolCall.from_openai(entry, TERMINAL_TOOLS)


def test_schema_stop_strings_and_instruction():
    assert BASH.schema()["function"]["parameters"]["required"] == ["command"]
    assert stop_strings() == ("</bash>", "</submit>")
    text = format_instruction()
    assert "<bash>COMMAND</bash>" in text and "<submit>ANSWER</submit>" in text
    with pytest.raises(ToolCallError):
        render_text(ToolCall("submit", {"answer": "x</submit>"}))
    assert SUBMIT.argument == "answer"


def test_restore_stop_closes_only_a_call_left_open_by_a_stop():
    from echo_rl.environments.tool_calls import restore_stop

    assert restore_stop("think first\n<bash>ls -la") == "think first\n<bash>ls -la</bash>"
    assert restore_stop("<submit>42") == "<submit>42</submit>"
    assert restore_stop("<bash>ls</bash>") == "<bash>ls</bash>"  # already closed: unchanged
    assert restore_stop("no call at all") == "no call at all"
    assert parse_text(restore_stop("<bash>ls</bash> then <bash>rm")) == ToolCall("bash", {"command": "ls"})
