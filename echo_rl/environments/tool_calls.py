"""Tool calls: OpenAI's function-calling shape, and the one text format EchoRL uses where a template has none.

An action of a tool-use task is a :class:`ToolCall` (a function name and its
JSON arguments, as OpenAI's ``tool_calls`` carry them). A model whose chat
template has no tool format writes the call as text, in the XML-style tags ECHO
uses (easier for a small model than JSON, whose quoting a shell command breaks)::

    <bash>ls -la /work</bash>
    <submit>42</submit>

One tag per call: the tag is the tool's name, the body its single string
argument, verbatim (no escaping; a body cannot contain its own closing tag).
Text before the tag (a thought) is allowed and ignored; text after the closing
tag is ignored too, which is why the closing tags are the reply's stop strings.
Prompting agents, LM training and ``serve`` all parse with :func:`parse_text`,
so a reply means the same everywhere. This module imports nothing heavy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping


class ToolCallError(ValueError):
    """A reply that is not a valid tool call; its message is the harness's warning to the model."""


@dataclass(frozen=True)
class Tool:
    """A tool with one string argument (all a terminal agent needs)."""

    name: str
    description: str
    argument: str
    argument_description: str

    def __post_init__(self) -> None:
        for attr in ("name", "argument"):
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", getattr(self, attr)):
                raise ValueError(f"Tool.{attr}={getattr(self, attr)!r} is invalid: must match [a-z][a-z0-9_]{{0,31}}")

    def schema(self) -> dict[str, Any]:
        """The tool as OpenAI's ``tools=[...]`` entry."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "required": [self.argument], "additionalProperties": False,
                           "properties": {self.argument: {"type": "string",
                                                          "description": self.argument_description}}}}}

    @property
    def close_tag(self) -> str:
        return f"</{self.name}>"


BASH = Tool("bash", "Run one shell command in the task's terminal and see its output.",
            "command", "The command line, run by bash in the current working directory.")
SUBMIT = Tool("submit", "End the episode with your final answer (an empty answer when the task is file work).",
              "answer", "The final answer.")
TERMINAL_TOOLS: tuple[Tool, ...] = (BASH, SUBMIT)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, str] = field(default_factory=dict)

    def to_openai(self, call_id: str) -> dict[str, Any]:
        """The call as one entry of an assistant message's ``tool_calls``."""
        return {"id": call_id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(dict(self.arguments))}}

    @classmethod
    def from_openai(cls, entry: Mapping[str, Any], tools: Iterable[Tool]) -> "ToolCall":
        """A ``tool_calls`` entry, checked against the tools offered."""
        try:
            fn = entry["function"]
            name, raw = fn["name"], fn.get("arguments", "{}")
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ToolCallError(f"malformed tool call ({type(exc).__name__}): needs function.name and JSON "
                                f"function.arguments") from None
        tool = _find(name, tools)
        if not isinstance(arguments, dict) or set(arguments) != {tool.argument} \
                or not isinstance(arguments[tool.argument], str):
            raise ToolCallError(f"tool {tool.name!r} takes exactly one string argument {tool.argument!r}")
        return cls(tool.name, {tool.argument: arguments[tool.argument]})


def _find(name: Any, tools: Iterable[Tool]) -> Tool:
    tools = tuple(tools)
    for tool in tools:
        if tool.name == name:
            return tool
    raise ToolCallError(f"unknown tool {name!r}: the tools are {', '.join(t.name for t in tools)}")


def render_text(call: ToolCall, tools: Iterable[Tool] = TERMINAL_TOOLS) -> str:
    """``call`` in the text format; :func:`parse_text` of the result gives ``call`` back."""
    tool = _find(call.name, tools)
    body = call.arguments[tool.argument]
    if tool.close_tag in body:
        raise ToolCallError(f"a {tool.name} argument cannot contain {tool.close_tag!r}")
    return f"<{tool.name}>{body}{tool.close_tag}"


def parse_text(reply: str, tools: Iterable[Tool] = TERMINAL_TOOLS) -> ToolCall:
    """The first tool call written in ``reply``; :class:`ToolCallError` (the warning text) when there is none.

    A call cut off by the token budget (no closing tag) is an error, never a
    partial command: running half a command line is how a file gets deleted.
    """
    tools = tuple(tools)
    names = "|".join(re.escape(t.name) for t in tools)
    match = re.search(rf"<({names})>", reply)
    if match is None:
        usage = " or ".join(f"<{t.name}>{t.argument.upper()}{t.close_tag}" for t in tools)
        raise ToolCallError(f"no tool call found: reply with {usage}")
    tool = _find(match.group(1), tools)
    end = reply.find(tool.close_tag, match.end())
    if end < 0:
        raise ToolCallError(f"the {tool.name} call is not closed: end it with {tool.close_tag}")
    return ToolCall(tool.name, {tool.argument: reply[match.end():end].strip("\n")})


def restore_stop(reply: str, tools: Iterable[Tool] = TERMINAL_TOOLS) -> str:
    """``reply`` with the closing tag put back where a backbone stopped on it (APIs and local backbones drop
    the stop string from the text): only when the reply ends inside an open call. Call it for replies that
    ended on a stop, never for ones cut by the token budget (that would run half a command)."""
    tools = tuple(tools)
    names = "|".join(re.escape(t.name) for t in tools)
    opened = list(re.finditer(rf"<({names})>", reply))
    if opened:
        tool = _find(opened[-1].group(1), tools)
        if reply.find(tool.close_tag, opened[-1].end()) < 0:
            return reply + tool.close_tag
    return reply


def stop_strings(tools: Iterable[Tool] = TERMINAL_TOOLS) -> tuple[str, ...]:
    """Where a reply in the text format ends (the stop string itself is kept in the reply)."""
    return tuple(t.close_tag for t in tools)


def format_instruction(tools: Iterable[Tool] = TERMINAL_TOOLS) -> str:
    """The text format, as one system-prompt paragraph."""
    lines = [f"- <{t.name}>{t.argument.upper()}{t.close_tag}: {t.description}" for t in tools]
    return ("Reply with exactly one tool call, written as a tag whose body is the argument:\n"
            + "\n".join(lines))
