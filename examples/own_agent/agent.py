"""An agent you could have written already: it plays MiniGrid-as-text through tool calls with the openai client.

Run it against any OpenAI-compatible endpoint (OPENAI_BASE_URL, OPENAI_API_KEY, ECHO_RL_MODEL), or train it
with ``echo-rl train --task external --command "python examples/own_agent/agent.py"``: the trainer sets those
variables per episode, records every turn and takes the reward from ``report``.
"""

import json
import os

from openai import OpenAI

from echo_rl.environments.registry import make_env
from echo_rl.external import report

TOOLS = [{"type": "function", "function": {
    "name": "act", "description": "Take one action in the grid world.",
    "parameters": {"type": "object", "required": ["action"], "properties": {
        "action": {"type": "string", "description": "one of the actions the observation lists"}}}}}]
SYSTEM = "You play a grid world. Each turn, call the act tool with exactly one of the listed actions."


def text(info: dict) -> str:
    return "".join(segment.text for segment in info["segments"])


def main() -> None:
    client = OpenAI(max_retries=0)
    model = os.environ.get("ECHO_RL_MODEL", "gpt-4o-mini")
    seed = int(os.environ.get("ECHO_RL_EPISODE", "0")) % int(os.environ.get("AGENT_TASKS", "4"))
    env = make_env("minigrid", env_id=os.environ.get("AGENT_ENV", "MiniGrid-Empty-5x5-v0"))
    _, info = env.reset(seed=seed)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text(info)}]
    total = 0.0
    for _ in range(int(os.environ.get("AGENT_MAX_TURNS", "8"))):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                               max_tokens=int(os.environ.get("AGENT_MAX_TOKENS", "24")))
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Call the act tool with one of the listed actions."})
            continue
        call = message.tool_calls[0]
        try:
            action = str(json.loads(call.function.arguments).get("action", ""))
        except (ValueError, AttributeError):
            action = ""
        _, reward, terminated, truncated, info = env.step(action)
        total += reward
        messages.append({"role": "tool", "tool_call_id": call.id, "content": text(info)})
        if terminated or truncated:
            break
    report(total, task=f"minigrid-{seed}")


if __name__ == "__main__":
    main()
