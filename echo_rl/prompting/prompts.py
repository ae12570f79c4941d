"""The prompting agents' reply handling: each task's reply format, read from its registry entry, and the
lenient extraction of the answer a reply holds.

:func:`task_format` is the :class:`~echo_rl.environments.reply_format.TaskFormat`
a task registered (``TaskSpec.reply_format``; the built-ins register theirs in
their own modules, as a user's task does), or the generic format for a task
that registered none. ReAct, Act-only and ToT all read it.

:func:`extract_reply` is lenient about *wrapping* — ``[ANSWER]...[/ANSWER]``,
a fenced code block, ``Answer:`` / ``Action:`` / ``>`` prefixes, backticks
around a one-line answer — and never about content: what remains is passed to
the environment verbatim (CRUXEval still parses it with ``ast.literal_eval``
and never runs it).
"""

from __future__ import annotations

import re
from typing import Any

from echo_rl.config import ConfigError
from echo_rl.environments.registry import find_task_spec
from echo_rl.environments.reply_format import GENERIC, GENERIC_MULTILINE, TaskFormat

__all__ = ["GENERIC", "TaskFormat", "extract_reply", "is_thought", "task_format"]


def task_format(task: str | None, env: Any = None) -> TaskFormat:
    """The reply format ``task`` registered (a format that depends on the env is computed from ``env``; ``None``
    before one exists), else the generic one; ``None`` and unregistered names get the generic format too."""
    spec = find_task_spec(task)
    if spec is None:
        return GENERIC
    fmt = spec.reply_format
    if fmt is None:
        return GENERIC_MULTILINE if spec.multiline else GENERIC
    if isinstance(fmt, TaskFormat):
        return fmt
    made = fmt(env)
    if not isinstance(made, TaskFormat):
        raise ConfigError(f"reply_format of task {spec.name!r} is invalid: it returned {type(made).__name__}, "
                          f"not a TaskFormat")
    if made.multiline != spec.multiline:
        raise ConfigError(f"reply_format of task {spec.name!r} is invalid: its multiline={made.multiline} "
                          f"contradicts the task's multiline={spec.multiline}")
    return made


_TAGGED = re.compile(r"\[ANSWER\](.*?)(?:\[/ANSWER\]|$)", re.S)
_FENCE = re.compile(r"```[a-zA-Z]*[ \t]*\n?(.*?)(?:```|$)", re.S)
_PREFIX = re.compile(r"^\s*(?:>\s*|\d+[.)]\s+|[-*]\s+|(?:final\s+)?answer\s*:\s*|action\s*:\s*|output\s*:\s*)", re.I)
_THINK = re.compile(r"^\s*(?:think|thought)\s*:", re.I)


def is_thought(text: str) -> bool:
    """A ReAct thought: starts ``think:`` and carries no tagged answer."""
    return bool(_THINK.match(text)) and "[ANSWER]" not in text


def extract_reply(text: str, multiline: bool) -> str:
    """The answer (or action) a reply holds, its wrapping removed; the content itself is untouched."""
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
