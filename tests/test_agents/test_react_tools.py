"""ReAct and Act-only on a tool-use task: the task's spec gives the tools, one parser, text or OpenAI tool calls."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from echo_rl.prompting.react import ReActAgent
from echo_rl.environments import registry
from echo_rl.models.scripted import ScriptedBackbone
from tests.tool_env import SPEC, NotesEnv


@pytest.fixture
def notes_task():
    registry.register_task(SPEC)
    yield SPEC.name
    registry._TASKS.pop(SPEC.name, None)


class Logged(NotesEnv):
    def __init__(self):
        super().__init__()
        self.actions = []

    def step(self, action):
        self.actions.append(action)
        return super().step(action)


def test_react_text_tool_calls_with_the_stop_tag_restored(notes_task):
    env = Logged()
    env.reset(seed=4)
    secret_file, secret = env.secret_file, env.secret
    replies = iter(["think: list the files first.", "Let me look.\n<bash>ls</bash> done", "cat it",
                    f"<bash>cat {secret_file}", f"<submit>{secret}</submit>"])
    stops = []

    def respond(messages):
        return next(replies)

    backbone = ScriptedBackbone(respond)
    original = backbone.chat
    backbone.chat = lambda messages, **kw: stops.append(kw["stop"]) or original(messages, **kw)
    result = ReActAgent(backbone, task=notes_task, few_shot=None).run_episode(env, seed=4)
    assert result.success and result.reward == 1.0
    # the env saw canonical calls only; "cat it" reached it as is and came back as a warning
    assert env.actions == ["<bash>ls</bash>", "cat it", f"<bash>cat {secret_file}</bash>",
                           f"<submit>{secret}</submit>"]
    assert set(stops) == {("</bash>", "</submit>")}
    system, *rest = backbone.calls[0]
    assert "<bash>COMMAND</bash>" in system["content"] and system["content"].startswith("You are an agent")
    last = backbone.calls[-1]
    assert last[2] == {"role": "assistant", "content": "think: list the files first."}
    assert "no tool call found" in last[7]["content"]  # the warning carries the ToolCallError message


class _ToolServer(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint that answers with ``tool_calls`` from a script."""

    script: list = []
    seen: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        name, args = type(self).script.pop(0)
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{len(self.seen)}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}]}
        out = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                          "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                          "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_act_only_with_openai_tool_calls(notes_task):
    pytest.importorskip("openai")
    from echo_rl.models.api import APIBackbone

    env = Logged()
    env.reset(seed=7)
    _ToolServer.seen = []
    _ToolServer.script = [("bash", {"command": "ls"}), ("bash", {"command": "cat"}), ("rm", {"path": "/"}),
                          ("bash", {"command": f"cat {env.secret_file}"}), ("submit", {"answer": env.secret})]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ToolServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backbone = APIBackbone("m", provider="openai-compatible", base_url=f"http://127.0.0.1:{server.server_port}/v1",
                               max_retries=0)
        result = ReActAgent(backbone, task=notes_task, mode="act", few_shot=None).run_episode(env, seed=7)
    finally:
        server.shutdown()
    assert result.success
    assert env.actions[:2] == ["<bash>ls</bash>", "<bash>cat</bash>"]
    assert env.actions[-1] == f"<submit>{env.secret}</submit>"
    assert env.actions[2] == "(an invalid tool call)"  # an unknown tool never runs: the env warns
    first = _ToolServer.seen[0]
    assert [t["function"]["name"] for t in first["tools"]] == ["bash", "submit"] and "stop" not in first
    assert "<bash>COMMAND</bash>" not in first["messages"][0]["content"]  # the tools travel as schemas
    second = _ToolServer.seen[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "bash"
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "call_1" and "txt" in second[-1]["content"]
