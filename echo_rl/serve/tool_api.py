"""OpenAI tool calling in ``serve``: ``tools`` and ``tool_choice`` in, ``tool_calls`` out.

Two renderings, picked by the model's chat template:

- ``template``: the template renders a ``tools`` list (it has a tool format of
  its own, e.g. Qwen2.5's). Tools, assistant ``tool_calls`` (arguments as JSON
  objects) and ``tool`` messages go through the template as they are, and a
  reply's calls are read from the ``<tool_call>{"name": ..., "arguments":
  ...}</tool_call>`` blocks these templates teach (Hermes' format).
- ``text``: the template has no tool format (SmolLM2, ChatML). Everything is
  written in EchoRL's one text format (``echo_rl.environments.tool_calls``),
  the one terminal tasks and LM training use: the tools as
  :func:`format_instruction` system text, a call as ``<name>ARGUMENT</name>``
  (:func:`render_text`), a tool result as a ``tool`` turn where the template
  names that role and a ``user`` turn otherwise. A reply is read with
  :func:`parse_text` and ends at the closing tag, which is kept. That format
  carries one string argument per tool and one call per turn, so anything else
  is refused with a 400 rather than mangled.

``tool_choice``: ``auto`` (the default with tools); ``none`` (no tools offered,
a plain reply; earlier calls in the history are still rendered); a named
function (text: the prompt ends with the call's opening tag, so the model writes
that call's argument; template: offered as ``auto``, and a reply whose calls are
not all that function is returned as text with its own finish reason);
``required`` (text: allowed with one tool, as if named; template: as ``auto``,
with the same check as a named function).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from echo_rl.environments.tool_calls import Tool, ToolCall, ToolCallError, format_instruction, parse_text, \
    render_text
from echo_rl.models.backbone import check_messages
from echo_rl.models.chat_template import apply_chat_template, template_accepts_tools, template_has_tool_role

TEMPLATE_OPEN = "<tool_call>"
_TEMPLATE_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class ToolRequestError(ValueError):
    """A request's tools or tool turns this server cannot honour; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ToolPlan:
    """How one request's tools are offered, rendered and read back."""

    mode: str  # "none": no tools offered; "text" or "template" (see the module docstring)
    schemas: list[dict] = field(default_factory=list)  # the offered tools, OpenAI's shape (template mode)
    tools: tuple[Tool, ...] = ()  # the offered tools in the text format (text mode)
    forced: str | None = None  # the function tool_choice names (or required's only one)

    @property
    def prefill(self) -> str:
        """Text the prompt ends with: a forced call's opening tag (text mode)."""
        return f"<{self.forced}>" if self.mode == "text" and self.forced else ""

    @property
    def keep_stops(self) -> tuple[str, ...]:
        """Stop strings that end a reply and stay in it: the offered tools' closing tags (text mode)."""
        if self.mode != "text":
            return ()
        return tuple(t.close_tag for t in self.tools if self.forced in (None, t.name))

    @property
    def openings(self) -> tuple[str, ...]:
        if self.mode == "text":
            return tuple(f"<{t.name}>" for t in self.tools)
        return (TEMPLATE_OPEN,) if self.mode == "template" else ()

    def hold_from(self, text: str, start: int) -> int:
        """Where text to hold back begins: a call's opening tag, or a tail that may still become one."""
        if not self.openings:
            return len(text)
        found = [i for i in (text.find(o, start) for o in self.openings) if i >= 0]  # none starts before start
        if found:
            return min(found)
        for k in range(min(max(map(len, self.openings)) - 1, len(text) - start), 0, -1):
            if any(o.startswith(text[-k:]) for o in self.openings):
                return len(text) - k
        return len(text)

    def read(self, text: str) -> tuple[str | None, list[dict] | None]:
        """(content, tool_calls) of a reply; tool_calls None when it holds no call this request accepts."""
        if self.mode == "text":
            try:
                call = parse_text(text, self.tools)
            except ToolCallError:
                return text, None
            start = text.find(f"<{call.name}>")
            return (text[:start] if text[:start].strip() else None), [call.to_openai(_call_id())]
        if self.mode == "template":
            calls = []
            for block in _TEMPLATE_CALL.findall(text):
                try:
                    obj = json.loads(block)
                    name, args = obj["name"], obj.get("arguments", {})
                except (json.JSONDecodeError, TypeError, KeyError):
                    return text, None
                if not isinstance(args, dict) or name not in {s["function"]["name"] for s in self.schemas} \
                        or self.forced not in (None, name):
                    return text, None
                calls.append({"id": _call_id(), "type": "function",
                              "function": {"name": name, "arguments": json.dumps(args)}})
            if not calls:
                return text, None
            head = text[:text.find(TEMPLATE_OPEN)]
            return (head if head.strip() else None), calls
        return text, None


def tool_prompt(req: Any, backbone: Any) -> tuple[ToolPlan, list[dict], Callable[[list[dict]], list[int]]]:
    """A chat request's tool plan, its messages for the template, and the function rendering them to prompt
    ids (a request with no tools and no tool turns renders as plain chat)."""
    if not (req.tools or req.tool_choice or any(m.role == "tool" or m.tool_calls for m in req.messages)):
        return ToolPlan("none"), [{"role": m.role, "content": m.text()} for m in req.messages], \
            backbone.chat_prompt_ids
    template = getattr(backbone.tokenizer, "chat_template", None)
    if not template:
        raise ToolRequestError("tools cannot be used with this model: its tokenizer has no chat template", "tools")
    native = template_accepts_tools(template)
    tool_plan, text_tools = plan(req, native)
    messages = render_messages(req, tool_plan, text_tools, native, template_has_tool_role(template))

    def render(msgs: list[dict]) -> list[int]:
        text = apply_chat_template(backbone.tokenizer, check_messages(msgs, tools=True), add_generation_prompt=True,
                                   tools=tool_plan.schemas if tool_plan.mode == "template" else None)
        return backbone.encode(text + tool_plan.prefill)

    return tool_plan, messages, render


def tool_call_deltas(calls: list[dict]) -> list[dict]:
    """A reply's calls as streamed ``delta``s, OpenAI's shape: per call its index, id and name, then its
    arguments."""
    out = []
    for k, call in enumerate(calls):
        fn = call["function"]
        out.append({"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                    "function": {"name": fn["name"], "arguments": ""}}]})
        out.append({"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]})
    return out


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _text_tool(i: int, entry: Any) -> Tool:
    """An OpenAI function tool as the text format's :class:`Tool` (one string argument), or a 400."""
    fn = entry.function
    where = f"tools.{i}.function"
    why = "this model's chat template has no tool format, and the text format used instead carries one " \
          "string argument per tool"
    props = (fn.parameters or {}).get("properties") or {}
    if len(props) != 1:
        raise ToolRequestError(f"{where}.parameters: {why}; {fn.name!r} has {len(props)} arguments", where)
    arg, spec = next(iter(props.items()))
    if not isinstance(spec, dict) or spec.get("type") != "string":
        kind = spec.get("type") if isinstance(spec, dict) else type(spec).__name__
        raise ToolRequestError(f"{where}.parameters: {why}; {fn.name!r} argument {arg!r} is of type {kind!r}",
                               where)
    desc = spec.get("description", "")
    try:
        return Tool(fn.name, fn.description or "", arg, desc if isinstance(desc, str) else "")
    except ValueError as exc:
        raise ToolRequestError(f"{where}: the text tool-call format needs tool and argument names matching "
                               f"[a-z][a-z0-9_]{{0,31}} ({exc})", where) from None


def plan(req: Any, template_tools: bool) -> tuple[ToolPlan, tuple[Tool, ...]]:
    """The request's :class:`ToolPlan` and, in text mode, all its tools (history calls are rendered with them
    even under ``tool_choice: none``)."""
    schemas = [t.model_dump(exclude_none=True) for t in req.tools or []]
    choice = req.tool_choice
    if choice is not None and not schemas and choice != "none":
        raise ToolRequestError("tool_choice needs tools: pass the functions it may call in tools", "tool_choice")
    names = [s["function"]["name"] for s in schemas]
    if len(set(names)) != len(names):
        raise ToolRequestError(f"tools: function names repeat ({names})", "tools")
    forced = None
    if choice is not None and not isinstance(choice, str):
        forced = choice.function.name
        if forced not in names:
            raise ToolRequestError(f"tool_choice.function.name={forced!r} is not in tools (they are "
                                   f"{', '.join(names)})", "tool_choice")
    text_tools = () if template_tools else tuple(_text_tool(i, t) for i, t in enumerate(req.tools or []))
    if choice == "required" and not template_tools:
        if len(names) != 1:
            raise ToolRequestError("tool_choice='required' with several tools is not supported by the text "
                                   "tool-call format this model uses; name one function or use 'auto'", "tool_choice")
        forced = names[0]
    if not schemas or choice == "none":
        return ToolPlan("none"), text_tools
    if template_tools:
        return ToolPlan("template", schemas=schemas, forced=forced if choice != "required" else None), ()
    return ToolPlan("text", schemas=schemas, tools=text_tools, forced=forced), text_tools


def render_messages(req: Any, tool_plan: ToolPlan, text_tools: tuple[Tool, ...], template_tools: bool,
                    tool_role: bool) -> list[dict]:
    """The request's messages as the chat template is given them (see the module docstring)."""
    out: list[dict] = []
    for i, m in enumerate(req.messages):
        msg: dict = {"role": m.role, "content": m.text()}
        if m.role == "tool":
            if template_tools:
                msg["tool_call_id"] = m.tool_call_id
            else:
                msg["role"] = "tool" if tool_role else "user"
        elif m.role == "assistant" and m.tool_calls:
            if template_tools:
                msg["tool_calls"] = [_template_call(i, j, c) for j, c in enumerate(m.tool_calls)]
            else:
                if not text_tools:
                    raise ToolRequestError(f"messages.{i}.tool_calls: pass the tools it calls in tools (the text "
                                           f"tool-call format writes a call with its tool's argument name)",
                                           f"messages.{i}.tool_calls")
                if len(m.tool_calls) != 1:
                    raise ToolRequestError(f"messages.{i}.tool_calls: the text tool-call format this model uses "
                                           f"carries one call per assistant turn, got {len(m.tool_calls)}",
                                           f"messages.{i}.tool_calls")
                try:
                    call = ToolCall.from_openai(m.tool_calls[0].model_dump(), text_tools)
                    msg["content"] += render_text(call, text_tools)
                except ToolCallError as exc:
                    raise ToolRequestError(f"messages.{i}.tool_calls.0: {exc}", f"messages.{i}.tool_calls") \
                        from None
        out.append(msg)
    if tool_plan.mode == "text":
        instruction = format_instruction(tool_plan.tools)
        if out and out[0]["role"] in ("system", "developer"):
            out[0]["content"] = f"{out[0]['content']}\n{instruction}" if out[0]["content"] else instruction
        else:
            out.insert(0, {"role": "system", "content": instruction})
    return out


def _template_call(i: int, j: int, call: Any) -> dict:
    """A history call for a template: arguments as an object, which these templates print with ``tojson``."""
    try:
        args = json.loads(call.function.arguments)
    except json.JSONDecodeError as exc:
        raise ToolRequestError(f"messages.{i}.tool_calls.{j}.function.arguments is not JSON: {exc}",
                               f"messages.{i}.tool_calls.{j}.function.arguments") from None
    if not isinstance(args, dict):
        raise ToolRequestError(f"messages.{i}.tool_calls.{j}.function.arguments must be a JSON object",
                               f"messages.{i}.tool_calls.{j}.function.arguments")
    return {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": args}}


class ToolStream:
    """A streamed reply with tools: text before a call goes out as it comes; from a call's opening tag on,
    text is held, and at the end it becomes ``tool_calls`` (or, if it holds no valid call, content)."""

    def __init__(self, tool_plan: ToolPlan) -> None:
        self.plan = tool_plan
        self.text = tool_plan.prefill
        self.sent = 0

    def push(self, piece: str) -> str:
        self.text += piece
        upto = self.plan.hold_from(self.text, self.sent)
        out, self.sent = self.text[self.sent:upto], max(upto, self.sent)
        return out

    def finish(self) -> tuple[str, list[dict] | None]:
        """(content still to send, tool_calls or None)."""
        content, calls = self.plan.read(self.text)
        if calls is None:
            return self.text[self.sent:], None
        return (content or "")[self.sent:], calls
