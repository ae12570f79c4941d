"""The prompting agents' reply handling, re-exported from the task's turn protocol.

A task's :class:`~echo_rl.environments.reply_format.TaskFormat` (its
``TaskSpec.reply_format``) says how a reply becomes an action; ReAct, Act-only,
ToT and LM training read it through the one lookup :func:`task_format` and
parse with the one parser (``TaskFormat.action``: :func:`extract_reply` for
plain-text tasks, a tool call for tool-use tasks). They live in
``echo_rl.environments.reply_format`` so that tasks and trainers need no agent.
"""

from __future__ import annotations

from echo_rl.environments.registry import task_format
from echo_rl.environments.reply_format import GENERIC, TaskFormat, extract_reply, is_thought

__all__ = ["GENERIC", "TaskFormat", "extract_reply", "is_thought", "task_format"]
