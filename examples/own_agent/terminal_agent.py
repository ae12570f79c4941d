"""A shell agent of the usual kind: it solves a terminal task through bash/submit tool calls with the openai client.

Each episode is one generated terminal task in its own bubblewrap sandbox, scored by the task's verifier. Run it
against any OpenAI-compatible endpoint, or train it with ``echo-rl train --task external --command "python
examples/own_agent/terminal_agent.py"``. Each ``AGENT_GROUP`` consecutive episodes share a task, so the trainer
compares ``AGENT_GROUP`` attempts at each (one group for GRPO / GiGPO / ECHO).
"""

import json
import os

from openai import OpenAI

from echo_rl.environments.registry import make_env
from echo_rl.environments.tool_calls import TERMINAL_TOOLS, ToolCall, render_text
from echo_rl.external import report

# the in-process trainer's system prompt for this task; the server appends the tool-call format to it
SYSTEM = ("You are an agent in a text environment. You work in a Linux terminal to complete the task. You see each "
          "command's output. When the task is done, submit (an empty answer for file work).")


def text(info: dict) -> str:
    return "".join(segment.text for segment in info["segments"])


def main() -> None:
    client = OpenAI(max_retries=0)
    episode, group = int(os.environ.get("ECHO_RL_EPISODE", "0")), int(os.environ.get("AGENT_GROUP", "4"))
    task_seed = (int(os.environ.get("AGENT_SEED", "0")) * 100_003 + episode // group) % 1_000_000
    env = make_env("terminal", level=int(os.environ.get("AGENT_LEVEL", "1")), max_steps=3)
    _, info = env.reset(seed=task_seed)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text(info)}]
    reward, done = 0.0, False
    while not done:
        reply = client.chat.completions.create(
            model=os.environ.get("ECHO_RL_MODEL", "gpt-4o-mini"), messages=messages, temperature=1.0,
            tools=[tool.schema() for tool in TERMINAL_TOOLS], max_tokens=int(os.environ.get("AGENT_MAX_TOKENS", "256")))
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        call = message.tool_calls[0] if message.tool_calls else None
        try:  # the environment reads the call in its text form; anything else it answers with a warning
            action = render_text(ToolCall(call.function.name, json.loads(call.function.arguments))) if call else \
                message.content or ""
        except (ValueError, TypeError):
            action = call.function.arguments
        _, r, terminated, truncated, info = env.step(action)
        reward, done = reward + r, terminated or truncated
        result = {"role": "tool", "tool_call_id": call.id} if call else {"role": "user", "echo_rl_role": "warning"}
        messages.append({**result, "content": text(info)})
    env.close()
    report(reward, task=f"terminal-{task_seed}")


if __name__ == "__main__":
    main()
