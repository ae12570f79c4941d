"""An API backbone in OpenAI's tool-call format, end to end against EchoRL's own server, on a terminal episode.

The test starts ``echo-rl serve``'s app on loopback with the tiny model, points an ``APIBackbone``
(``openai-compatible``) and ReAct / Act-only at it, and runs a sandboxed terminal episode with native ``tools=``
and ``tool_calls``. The engine's sampler is replaced by a script that writes the task's oracle call in the
template's text format (the tiny model's ChatML has no tool format); everything between (the SDK, HTTP, the
server's tool rendering and parsing, the agent's tool turns, the sandbox and the verifier) is real. The server
is stopped at the end.
"""

import json

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

from echo_rl.environments.sandbox import SandboxUnavailable  # noqa: E402
from echo_rl.environments.terminal.env import TerminalEnvironment  # noqa: E402
from echo_rl.environments.tool_calls import TERMINAL_TOOLS, format_instruction  # noqa: E402
from echo_rl.models.api import APIBackbone  # noqa: E402
from echo_rl.prompting.react import ReActAgent  # noqa: E402
from echo_rl.serve import ModelServer, create_app  # noqa: E402
from echo_rl.serve.engine_host import Generated  # noqa: E402


class OracleSampler:
    """Stands in for the engine's sampler: the tokens of the env's next oracle call, then EOS; keeps each prompt."""

    def __init__(self, backbone, host, env):
        self.backbone, self.eos, self.env, self.prompts = backbone, host.stop_ids[0], env, []

    async def stream(self, prompt_ids, *, max_tokens, temperature, top_p, seed):
        self.prompts.append(self.backbone.tokenizer.decode(prompt_ids))
        ids = self.backbone.encode(self.env.expert_action())[:max_tokens]
        for t in ids:
            yield t
        yield self.eos
        yield Generated(ids + [self.eos], "stop")


@pytest.fixture
def terminal_env():
    env = TerminalEnvironment(split="test", level=2, instances_per_template=5)
    try:
        env.reset(options={"task_index": 0})
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    yield env
    env.close()


@pytest.mark.parametrize("mode", ["react", "act"])
def test_react_through_echo_rl_serve_with_native_tool_calls(tiny, terminal_env, mode):
    server = ModelServer(create_app(tiny, model_name="tiny")).start()
    try:
        sampler = OracleSampler(tiny, server.app.state.engine_host, terminal_env)
        server.app.state.engine_host.stream = sampler.stream
        backbone = APIBackbone("tiny", provider="openai-compatible", base_url=server.url, max_retries=0)
        replies = []
        chat = backbone.chat
        backbone.chat = lambda messages, **kw: replies.append(chat(messages, **kw)) or replies[-1]
        result = ReActAgent(backbone, task="terminal", mode=mode).run_episode(terminal_env, seed=0,
                                                                              options={"task_index": 0})
        backbone.close()
    finally:
        server.stop()
    assert result.success and result.reward == 1.0 and result.error is None
    # every reply came back as OpenAI tool_calls (not text), the last one the submit
    assert all(r.finish_reason == "tool_calls" and len(r.tool_calls) == 1 and not r.text for r in replies)
    assert [r.tool_calls[0]["function"]["name"] for r in replies][-1] == "submit"
    commands = [json.loads(r.tool_calls[0]["function"]["arguments"]) for r in replies[:-1]]
    assert [c["command"] for c in commands] == [t["text"][6:-7] for t in result.trajectory[1:-2:2]]
    # the server rendered the schemas in EchoRL's text format and each tool result as a user turn (ChatML has
    # no tool role); the example's call and the episode's calls went back in as text-format tags
    last = sampler.prompts[-1]
    assert format_instruction(TERMINAL_TOOLS) in last
    assert "<|im_start|>assistant\n<bash>echo hello > greeting.txt</bash><|im_end|>" in last
    first_output = result.trajectory[2]["text"]
    assert f"<|im_start|>user\n{first_output}" in last
    assert result.usage.requests == len(replies) and result.usage.prompt_tokens > 0
