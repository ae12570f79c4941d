"""A task's turn protocol: :class:`TaskFormat`, one field of the task's ``TaskSpec``, read by everything that
runs episodes.

A small instruct model given only the environment's text tends to chat, or to
copy the task back (CRUXEval's function, ARC's grids), instead of answering.
A task's format therefore holds the whole protocol of a turn: the answer
format written as one instruction (the task's part of the system prompt), a
worked one-shot example in the environment's own wording (an exchange of chat
turns, so the model sees a reply of exactly that shape; not taken from the
evaluation data), how a reply becomes an action (its first line, the whole
multi-line reply, or a tool call), the tools a tool-use task offers, the chat
role observations take, the stop strings that end a reply and a token budget.
ReAct, Act-only, ToT, LM training (rollouts and SFT, in process and on Ray)
all read it through ``registry.task_format`` and parse with :meth:`TaskFormat.action`,
so a reply means the same everywhere.

A task registers its format with its other metadata:
``register_text_env(name, factory, reply_format=TaskFormat(...))`` (a tool-use
task: ``reply_format=tool_format(...)``), or a function ``env -> TaskFormat``
where the format depends on the env's settings (CRUXEval's input vs output
prediction; called with ``None`` before an env exists). A task that registers
none gets :data:`GENERIC`. This module imports nothing heavy: every task module
imports it while the registry loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from echo_rl.config import ConfigError
from echo_rl.environments.tool_calls import Tool, ToolCallError, format_instruction, parse_text, render_text, \
    stop_strings

#: how a reply becomes an action (:attr:`TaskFormat.parser`)
PARSERS = ("first_line", "multiline", "tool_call")
#: the chat roles an observation may take; ``tool`` only where the chat template has that role
OBSERVATION_ROLES = ("user", "tool")


@dataclass(frozen=True)
class TaskFormat:
    instruction: str  # the answer format, one plain instruction (joins the system prompt)
    example: str  # a one-shot task in the environment's wording ("" when the task has its own few-shot)
    answer: str  # the reply the example wants
    thought: str = ""  # ReAct's example thought before the answer ("" : none)
    more: tuple[tuple[str, str], ...] = ()  # multi-step tasks: the example's later (observation, action) turns
    multiline: bool = False  # replies may span lines (ARC grids)
    stop: tuple[str, ...] = ("\n",)
    max_tokens: int = 48
    tools: tuple[Tool, ...] = ()  # a tool-use task's tools: replies are tool calls (see tool_calls.py)
    observation_role: str = "user"  # "tool": observations are tool results where the chat template has that role

    def __post_init__(self) -> None:
        for name in ("instruction", "example", "answer", "thought"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"TaskFormat.{name} is invalid: must be a string, got "
                                  f"{type(getattr(self, name)).__name__}")
        if not self.instruction.strip():
            raise ConfigError("TaskFormat.instruction is invalid: must say how to reply (a non-empty string)")
        if self.example and not self.answer:
            raise ConfigError("TaskFormat.answer is invalid: the one-shot example needs the reply it wants")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError(f"TaskFormat.stop={self.stop!r} is invalid: must be a sequence of non-empty strings")
        if not all(isinstance(t, (tuple, list)) and len(t) == 2 and all(isinstance(s, str) for s in t)
                   for t in self.more):
            raise ConfigError("TaskFormat.more is invalid: must be (observation, action) string pairs")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"TaskFormat.max_tokens={self.max_tokens!r} is invalid: must be an integer >= 1")
        if isinstance(self.tools, Tool) or not all(isinstance(t, Tool) for t in self.tools):
            raise ConfigError("TaskFormat.tools is invalid: must be a tuple of echo_rl.environments.tool_calls.Tool")
        if len({t.name for t in self.tools}) != len(self.tools):
            raise ConfigError(f"TaskFormat.tools is invalid: tool names repeat ({[t.name for t in self.tools]})")
        if self.tools and self.multiline:
            raise ConfigError("TaskFormat.multiline is invalid with tools: a tool call's body already spans lines")
        if self.observation_role not in OBSERVATION_ROLES:
            raise ConfigError(f"TaskFormat.observation_role={self.observation_role!r} is invalid: allowed: "
                              f"{', '.join(OBSERVATION_ROLES)}")
        object.__setattr__(self, "stop", tuple(self.stop))  # hashable and immutable, like the rest
        object.__setattr__(self, "more", tuple(tuple(t) for t in self.more))
        object.__setattr__(self, "tools", tuple(self.tools))

    @property
    def parser(self) -> str:
        """How a reply becomes an action: ``tool_call``, ``multiline`` (the whole reply) or ``first_line``."""
        return "tool_call" if self.tools else "multiline" if self.multiline else "first_line"

    def action(self, reply: str) -> str:
        """The action a reply hands the environment: the one reply parser of every harness.

        A tool call becomes its canonical text (``render_text``: thoughts and text
        after the call dropped). A reply with no valid call is handed over as it
        is: the env parses it with the same :func:`parse_text`, so it never runs as
        a command and the env answers with a ``warning`` carrying the
        :class:`ToolCallError` message (the text contract: a bad action is a
        warning, and counts towards ``max_steps``).
        """
        if self.tools:
            try:
                return render_text(parse_text(reply, self.tools), self.tools)
            except ToolCallError:
                return reply
        return extract_reply(reply, self.multiline)

    def system_prompt(self, intro: str = "", *, native_tools: bool = False) -> str:
        """``intro`` (the harness's own line) then the task's instruction, then the tool-call text format
        (left out where the tools travel in the model's own tool format: ``native_tools``)."""
        text = f"{intro} {self.instruction}".strip()
        if self.tools and not native_tools:
            text += "\n" + format_instruction(self.tools)
        return text

    def chat_role(self, template_has_tool_role: bool) -> str:
        """The role observations are sent as: ``tool`` where the task asks for it and the template has it."""
        return "tool" if self.observation_role == "tool" and template_has_tool_role else "user"

    def example_turns(self, mode: str) -> list[dict[str, str]]:
        """The one-shot example as chat turns; ReAct's has its thought (answered ``OK.``) before the answer."""
        if not self.example:
            return []
        turns = [{"role": "user", "content": self.example}]
        if mode == "react" and self.thought:
            turns += [{"role": "assistant", "content": f"think: {self.thought}"}, {"role": "user", "content": "OK."}]
        turns.append({"role": "assistant", "content": self.answer})
        for obs, action in self.more:
            turns += [{"role": "user", "content": obs}, {"role": "assistant", "content": action}]
        return turns

    def example_text(self) -> str:
        """The example as plain text, for prompts that are not a chat of turns (ToT's propose/value prompts)."""
        if not self.example:
            return ""
        steps = "".join(f"\n{obs}\n> {action}" for obs, action in self.more)
        return f"Example task:\n{self.example}\nExample answer:\n{self.answer}{steps}"


def tool_format(instruction: str, tools: tuple[Tool, ...], *, example: str = "", answer: str = "",
                thought: str = "", more: tuple[tuple[str, str], ...] = (), max_tokens: int = 256,
                observation_role: str = "tool") -> TaskFormat:
    """The format of a tool-use task: replies are tool calls and end at a call's closing tag."""
    return TaskFormat(instruction=instruction, example=example, answer=answer, thought=thought, more=more,
                      stop=stop_strings(tools), max_tokens=max_tokens, tools=tuple(tools),
                      observation_role=observation_role)


#: the format of a task that registers none: no example, the env's own wording decides
GENERIC = TaskFormat(instruction="Reply with the next action only, written exactly as the environment expects it.",
                     example="", answer="", max_tokens=96)

#: :data:`GENERIC` for a task whose answers span lines (``TaskSpec.multiline``): a reply ends at an empty line
GENERIC_MULTILINE = TaskFormat(instruction=GENERIC.instruction, example="", answer="", multiline=True,
                               stop=("\n\n",), max_tokens=GENERIC.max_tokens)


# -- the lenient extraction of a plain-text answer ----------------------------------------------------------

_TAGGED = re.compile(r"\[ANSWER\](.*?)(?:\[/ANSWER\]|$)", re.S)
_FENCE = re.compile(r"```[a-zA-Z]*[ \t]*\n?(.*?)(?:```|$)", re.S)
_PREFIX = re.compile(r"^\s*(?:>\s*|\d+[.)]\s+|[-*]\s+|(?:final\s+)?answer\s*:\s*|action\s*:\s*|output\s*:\s*)", re.I)
_THINK = re.compile(r"^\s*(?:think|thought)\s*:", re.I)


def is_thought(text: str) -> bool:
    """A ReAct thought: starts ``think:`` and carries no tagged answer."""
    return bool(_THINK.match(text)) and "[ANSWER]" not in text


def extract_reply(text: str, multiline: bool) -> str:
    """The answer (or action) a plain-text reply holds, its wrapping removed; the content itself is untouched.

    Lenient about *wrapping* (``[ANSWER]...[/ANSWER]``, a fenced code block, ``Answer:`` / ``Action:`` / ``>``
    prefixes, backticks around a one-line answer), never about content: what remains goes to the environment
    verbatim (CRUXEval still parses it with ``ast.literal_eval`` and never runs it).
    """
    text = text.strip()
    if is_thought(text):
        return text.splitlines()[0].strip() if not multiline else text
    tagged = _TAGGED.search(text)
    if tagged:
        text = tagged.group(1).strip()
    elif "```" in text:
        fence = _FENCE.search(text)
        if fence:
            text = fence.group(1).strip()
    if not multiline:
        text = next((ln for ln in (_PREFIX.sub("", ln).strip() for ln in text.splitlines()) if ln), "")
    else:
        text = _PREFIX.sub("", text, count=1).strip()
    if len(text) >= 2 and text[0] == text[-1] == "`" and "\n" not in text:
        text = text.strip("`").strip()
    return text
