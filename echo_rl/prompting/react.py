"""ReAct (Yao et al., ICLR 2023): interleaved thoughts and actions, over any backbone and text env.

Each turn the backbone writes one line: a thought (``think: ...``, answered
with ``OK.`` and not sent to the environment) or an action (sent as is). On
ALFWorld the prompt is the paper's: the two published few-shot examples of the
game's task family, ``Here is the task.``, observations without the
``You arrive at loc N.`` prefix, and at most ``max_steps`` backbone turns
(thoughts count, as in the upstream notebook). The paper completes raw text;
here the episode is a chat (examples and the task in the first user message,
each reply an assistant message, each observation a user message), which every
chat API accepts and which keeps the prompt an append-only prefix for KV reuse.
``mode="act"`` is the paper's Act-only ablation.

The turn protocol is the task's ``TaskFormat`` (``task_format``), the one LM
training reads: its instruction joins the system prompt, its stop strings and
budget bound a reply, and its parser turns the reply into the action. On a
tool-use task the reply is a tool call: in the text format
(``<bash>...</bash>``), or, where the backbone speaks OpenAI's tool calls
(``supports_tools``: API backbones), as ``tools=[...]`` in the request and
``tool_calls`` in the reply, with the observation sent back as a ``tool``
message. Either way the env gets the call's canonical text; a reply without a
valid call reaches the env as is and is answered with a warning. In the text
format the env's answers take the task's observation role, as LM training
sends them: ``tool`` where a local model's chat template names that role,
``user`` otherwise (and for the agent's own ``OK.`` after a thought).
"""

from __future__ import annotations

import time
from typing import Any

from echo_rl.prompting.base import (EpisodeResult, TextAgent, achat, alfworld_examples, alfworld_kind, clean_alfworld,
                                 is_thought, match_admissible)
from echo_rl.prompting.prompts import TaskFormat, extract_reply, task_format
from echo_rl.config import ConfigError
from echo_rl.environments.tool_calls import ToolCall, ToolCallError, parse_text, render_text, restore_stop
from echo_rl.models.backbone import Backbone, Usage
from echo_rl.models.chat_template import template_has_tool_role

SYSTEM = {
    "react": ("You are an agent solving a task in a text environment. Each reply is either a thought that starts "
              "with 'think:' (it does not change the environment; you will see 'OK.' after it) or your next "
              "action."),
    "act": "You are an agent solving a task in a text environment. Each reply is your next action.",
}
ALFWORLD_INTRO = "Interact with a household to solve a task. Here are two examples.\n"


class ReActAgent(TextAgent):
    """ReAct; ``show_admissible`` lists valid actions after each observation (not in the paper).

    ``max_tokens``, ``multiline`` and the stop strings default to the task's
    :class:`~echo_rl.prompting.prompts.TaskFormat`; ``few_shot="auto"`` uses its
    one-shot example (ALFWorld: the paper's two games), ``None`` none, a string that text.
    """

    name = "react"

    def __init__(self, backbone: Backbone, *, task: str | None = None, mode: str = "react",
                 few_shot: str | None = "auto", max_tokens: int | None = None, temperature: float = 0.0,
                 show_admissible: bool = False, snap_to_admissible: bool = False,
                 multiline: bool | None = None) -> None:
        super().__init__(backbone, task=task)
        if mode not in SYSTEM:
            raise ConfigError(f"mode={mode!r} is invalid: allowed: {', '.join(SYSTEM)}")
        self.format = task_format(task)
        # one-line replies (stop at newline) unless the task's actions span lines (ARC grids)
        self.multiline = self.format.multiline if multiline is None else bool(multiline)
        self.mode, self.few_shot = mode, few_shot
        self.max_tokens, self.temperature = max_tokens or self.format.max_tokens, temperature
        self.show_admissible, self.snap_to_admissible = show_admissible, snap_to_admissible
        if mode == "act":
            self.name = "act"

    # -- prompt ------------------------------------------------------------------
    def _messages(self, obs: str, info: dict, fmt: TaskFormat, native: bool = False) -> list[dict]:
        system = fmt.system_prompt(SYSTEM[self.mode], native_tools=native)
        first = obs
        turns: list[dict] = []
        if self.task == "alfworld" and self.few_shot == "auto":
            first = ALFWORLD_INTRO + alfworld_examples(alfworld_kind(info, obs), self.mode) + \
                "\nHere is the task.\n" + obs
        elif self.few_shot == "auto":
            turns = fmt.example_turns(self.mode)
            if native:
                turns = native_example(turns, fmt.tools)
        elif self.few_shot not in (None, "none"):
            first = f"Here are examples.\n{self.few_shot}\nHere is the task.\n{obs}"
        return [{"role": "system", "content": system}, *turns, {"role": "user", "content": first}]

    def _stop(self, fmt: TaskFormat, native: bool = False) -> tuple[str, ...]:
        if native:
            return ()  # calls come back as tool_calls, not as tagged text
        if self.multiline == fmt.multiline:
            return fmt.stop
        return ("\n\n",) if self.multiline else ("\n",)

    def _show(self, obs: str, info: dict) -> str:
        if self.task == "alfworld":
            obs = clean_alfworld(obs)
        if self.show_admissible and info.get("admissible_actions"):
            obs += "\nValid actions: " + "; ".join(info["admissible_actions"])
        return obs

    # -- episode -------------------------------------------------------------------
    async def arun_episode(self, env: Any, *, seed: int, max_steps: int | None = None,
                           options: dict | None = None) -> EpisodeResult:
        start = time.perf_counter()
        fmt = task_format(self.task, env)
        native = bool(fmt.tools) and getattr(self.backbone, "supports_tools", False)
        # text calls: the env's replies take the task's observation role where the model's template has a tool
        # role (as LM training sends them); native calls: each answers its call as a tool message
        obs_role = "user" if native else fmt.chat_role(template_has_tool_role(chat_template_of(self.backbone)))
        stop = self._stop(fmt, native)
        tools = {"tools": [t.schema() for t in fmt.tools]} if native else {}
        obs, info = env.reset(seed=seed, options=options)
        max_turns = max_steps or getattr(env, "max_steps", None) or 50
        obs = self._show(obs, info)
        messages = self._messages(obs, info, fmt, native)
        traj = [{"role": "env", "text": obs}]
        self.episode_usage = Usage()
        reward, steps, turns, won = 0.0, 0, 0, bool(info.get("won"))
        for turns in range(1, max_turns + 1):
            reply = await achat(self.backbone, messages, max_tokens=self.max_tokens, temperature=self.temperature,
                                stop=stop, seed=turn_seed(seed, turns), **tools)
            self.episode_usage = self.episode_usage + reply.usage
            line, call_id = self._parse(reply, fmt, native)
            messages.append({"role": "assistant", "content": line} if call_id is None else
                            {"role": "assistant", "content": "", "tool_calls": [
                                ToolCall.from_openai(reply.tool_calls[0], fmt.tools).to_openai(call_id)]})
            traj.append({"role": "agent", "text": line})
            if self.mode == "react" and is_thought(line):
                feedback, from_env = "OK.", False
            elif not line:
                feedback, from_env = "Your reply was empty. Reply with one action" + \
                    (" or a thought starting with 'think:'." if self.mode == "react" else "."), False
            else:
                from_env = True
                action = line
                if self.snap_to_admissible:
                    action = match_admissible(line, info.get("admissible_actions")) or line
                obs, r, terminated, truncated, info = env.step(action)
                steps += 1
                reward += float(r)
                won = bool(info.get("won"))
                feedback = self._show(obs, info)
                if terminated or truncated:
                    traj.append({"role": "env", "text": feedback})
                    break
            if call_id is None and obs_role == "tool" and from_env:
                call_id = f"call_{turns}"  # the template reads the role; the id only satisfies the message check
            messages.append({"role": "user", "content": feedback} if call_id is None else
                            {"role": "tool", "tool_call_id": call_id, "content": feedback})
            traj.append({"role": "env", "text": feedback})
        return EpisodeResult(str(info.get("task_id", "")), seed, won, reward, steps, turns, self.episode_usage, traj,
                             env_steps=steps, seconds=time.perf_counter() - start)


    def _parse(self, reply: Any, fmt: TaskFormat, native: bool) -> tuple[str, str | None]:
        """(the action or thought a reply holds, the id of the native tool call it answers or None).

        The task's parser (``TaskFormat.action``) for tagged text, with the closing tag a stop string took off
        put back; a native ``tool_calls`` entry becomes the same canonical text.
        """
        if native and getattr(reply, "tool_calls", None):
            try:
                call = ToolCall.from_openai(reply.tool_calls[0], fmt.tools)
                return render_text(call, fmt.tools), str(reply.tool_calls[0].get("id") or "call_0")
            except ToolCallError:
                return reply.text.strip() or "(an invalid tool call)", None
        text = reply.text
        if fmt.tools:
            if reply.finish_reason == "stop":
                text = restore_stop(text, fmt.tools)
            line = fmt.action(text)
            return (line.strip() if line == text else line), None
        if self.multiline == fmt.multiline:
            return fmt.action(text), None
        return extract_reply(text, self.multiline), None


def chat_template_of(backbone: Backbone) -> str | None:
    """A local checkpoint's chat template (through the engine or not); None for APIs and scripted backbones."""
    tokenizer = getattr(getattr(backbone, "local", backbone), "tokenizer", None)
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else None


def native_example(turns: list[dict], tools: tuple) -> list[dict]:
    """The one-shot example in OpenAI's tool-call shape, as the episode itself will run: each tagged answer an
    assistant ``tool_calls`` turn, the observation after it that call's ``tool`` result (an example must not
    teach a tools-API model to write tags as text). A call the example does not answer (its last ``submit``)
    gets the result ``OK.``, since the API requires one for every call."""
    out: list[dict] = []
    pending: str | None = None
    for i, turn in enumerate(turns):
        if turn["role"] == "assistant":
            try:
                call = parse_text(turn["content"], tools)
            except ToolCallError:  # a thought: plain assistant text
                out.append(turn)
                continue
            pending = f"call_example_{i}"
            thought = turn["content"][:turn["content"].find(f"<{call.name}>")].strip()
            out.append({"role": "assistant", "content": thought, "tool_calls": [call.to_openai(pending)]})
        elif turn["role"] == "user" and pending is not None:
            out.append({"role": "tool", "tool_call_id": pending, "content": turn["content"]})
            pending = None
        else:
            out.append(turn)
    if pending is not None:
        out.append({"role": "tool", "tool_call_id": pending, "content": "OK."})
    return out


def turn_seed(episode_seed: int, turn: int) -> int:
    """Sampling seed of one backbone call: episodes are a function of their seed (where the API honours seeds)."""
    return (int(episode_seed) * 1_000_003 + int(turn)) % (2**31 - 1)


def _delta(after: Usage, before: Usage) -> Usage:
    cost = None if after.cost is None or before.cost is None else after.cost - before.cost
    return Usage(after.prompt_tokens - before.prompt_tokens, after.completion_tokens - before.completion_tokens,
                 cost, after.requests - before.requests)
