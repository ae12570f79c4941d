"""ReAct and Act-only on the terminal family and InterCode-Bash, through the task's tool calls.

Three backbone paths: a local checkpoint behind the engine (the text format, as SmolLM2 runs it), a scripted
backbone speaking OpenAI's native ``tools=`` / ``tool_calls`` on a real sandboxed episode, and the harness's
``expert`` backbone (the oracle through the agent's prompt, parser and loop). Episodes need bubblewrap; they
skip where it does not run.
"""

import json

import pytest

from echo_rl.config import ConfigError
from echo_rl.environments.sandbox import SandboxUnavailable
from echo_rl.environments.terminal.env import TERMINAL_FORMAT, TerminalEnvironment
from echo_rl.environments.tool_calls import TERMINAL_TOOLS, ToolCall, parse_text
from echo_rl.prompting.runner import build_agent, evaluate_text_agent, expert_backbone
from echo_rl.models.backbone import Backbone, Completion, Usage, check_messages
from echo_rl.prompting.react import ReActAgent, native_example


def _terminal(**kw) -> TerminalEnvironment:
    env = TerminalEnvironment(split="test", instances_per_template=5, **kw)
    try:
        env.reset(options={"task_index": 0})
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    return env


class NativeOracle(Backbone):
    """An OpenAI-style tools backbone whose every reply is one ``tool_calls`` entry: the env's oracle."""

    supports_tools = True

    def __init__(self, env):
        super().__init__()
        self.env, self.requests = env, []

    def chat(self, messages, *, tools=None, **sampling):
        self.requests.append({"messages": check_messages(messages, tools=True), "tools": tools, **sampling})
        call = parse_text(self.env.expert_action(), TERMINAL_TOOLS)
        entry = call.to_openai(f"call_{len(self.requests)}")
        return Completion("", "tool_calls", Usage(0, 0, 0.0, 1), "oracle", tool_calls=[entry])


@pytest.mark.parametrize("mode", ["react", "act"])
def test_native_tool_calls_solve_a_terminal_task(mode):
    env = _terminal(level=2)
    try:
        backbone = NativeOracle(env)
        result = ReActAgent(backbone, task="terminal", mode=mode).run_episode(env, seed=0,
                                                                              options={"task_index": 0})
    finally:
        env.close()
    assert result.success and result.reward == 1.0 and result.steps == result.turns >= 3
    first, last = backbone.requests[0], backbone.requests[-1]
    assert [t["function"]["name"] for t in first["tools"]] == ["bash", "submit"] and first["stop"] == ()
    system = first["messages"][0]["content"]
    assert "<bash>COMMAND</bash>" not in system  # the tools travel as schemas, not as the text format
    # the one-shot example is in the same native shape: no tagged text anywhere in the request
    assert not any("<bash>" in m["content"] or "<submit>" in m["content"] for m in last["messages"])
    example = [m for m in first["messages"] if m.get("tool_calls")]
    assert [json.loads(m["tool_calls"][0]["function"]["arguments"]) for m in example] == [
        {"command": "echo hello > greeting.txt"}, {"answer": ""}]
    # every call is answered by a tool result with its id, the episode's own turns included
    msgs = last["messages"]
    for i, m in enumerate(msgs):
        if m.get("tool_calls"):
            assert msgs[i + 1]["role"] == "tool" and msgs[i + 1]["tool_call_id"] == m["tool_calls"][0]["id"]
    assert msgs[-1]["role"] == "tool" and msgs[-1]["tool_call_id"] == f"call_{len(backbone.requests) - 1}"


def test_native_example_keeps_thoughts_and_answers_every_call():
    turns = native_example(TERMINAL_FORMAT.example_turns("react"), TERMINAL_TOOLS)
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "tool", "assistant", "tool"]
    assert turns[1] == {"role": "assistant", "content": "think: One echo with a redirect writes the file."}
    assert turns[3]["tool_calls"][0] == ToolCall("bash", {"command": "echo hello > greeting.txt"}).to_openai(
        "call_example_3")
    assert turns[4] == {"role": "tool", "tool_call_id": "call_example_3", "content": "(no output)"}
    assert turns[6] == {"role": "tool", "tool_call_id": "call_example_5", "content": "OK."}
    check_messages(turns, tools=True)


@pytest.mark.parametrize("agent", ["react", "act"])
def test_the_oracle_through_the_agents_solves_every_level(agent, tmp_path):
    _terminal().close()  # skips without the sandbox
    for level in (1, 2, 3):
        out = evaluate_text_agent("terminal", agent, "expert", 3, seed=0, output=str(tmp_path / f"{level}.json"),
                                  env_config={"split": "test", "level": level, "instances_per_template": 5},
                                  concurrency=2)
        assert out["successes"] == 3 and out["errors"] == 0, out["per_episode"]


@pytest.mark.parametrize("agent", ["react", "act"])
def test_the_agents_run_intercode_bash(agent, shared_data, monkeypatch):
    from echo_rl.environments.terminal.intercode import InterCodeBashEnvironment

    monkeypatch.setenv("ECHO_RL_INTERCODE_BASH_DIR", str(shared_data / "intercode_bash"))
    try:
        env = InterCodeBashEnvironment()
        env.reset(options={"task_index": 0})
    except (FileNotFoundError, ConfigError, SandboxUnavailable) as exc:
        pytest.skip(str(exc))
    try:
        agent_ = build_agent(agent, expert_backbone(env), task="intercode_bash")
        # the first query of each file system (all reproducible here): the gold command through the agent's
        # prompt and parser scores upstream's reward 1; episodes have upstream's 10 turns
        for index in (0, 60, 113):
            result = agent_.run_episode(env, seed=index, options={"task_index": index})
            assert result.success and result.reward == 1.0 and result.turns == 2, result.trajectory
            assert env.max_steps == 10
    finally:
        env.close()


def test_a_local_model_runs_the_text_format_behind_the_engine(tiny):
    from echo_rl.prompting.engine_backbone import EngineBackbone

    env = _terminal(level=1)
    backbone = EngineBackbone(tiny)
    try:
        seen = []
        chat = backbone.achat

        async def spy(messages, **kw):
            reply = await chat(messages, **kw)
            seen.append((list(messages), kw, reply))  # the agent appends to its list afterwards
            return reply

        backbone.achat = spy
        result = ReActAgent(backbone, task="terminal", mode="act", max_tokens=24).run_episode(
            env, seed=0, max_steps=2, options={"task_index": 0})
    finally:
        backbone.host.close()
        env.close()
    assert result.error is None and result.turns == 2 and len(seen) == 2
    messages, kw, reply = seen[0]
    assert "<bash>COMMAND</bash>" in messages[0]["content"]  # no tool format in the template: the text format
    assert kw["stop"] == ("</bash>", "</submit>") and "tools" not in kw
    assert messages[-1] == {"role": "user", "content": env.tasks[0].instruction.rstrip("\n") + "\n"}
    # what reached the env is the canonical call or the reply as is (then answered with the parser's warning)
    agent_turns = [t["text"] for t in result.trajectory if t["role"] == "agent"]
    env_turns = [t["text"] for t in result.trajectory if t["role"] == "env"][1:]
    for text, answer in zip(agent_turns, env_turns):
        if not text:  # an empty reply is answered by the agent itself
            continue
        try:
            parse_text(text, TERMINAL_TOOLS)
        except ValueError as exc:
            assert answer.startswith(str(exc))


def test_eval_cli_names_missing_benchmark_data_in_one_line(tmp_path, monkeypatch, capsys):
    from echo_rl.cli import main

    monkeypatch.setenv("ECHO_RL_INTERCODE_BASH_DIR", str(tmp_path / "absent"))
    code = main(["eval", "--task", "intercode_bash", "--agent", "act", "--backbone", "expert", "--episodes", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "intercode_bash data not found at" in err and "ECHO_RL_INTERCODE_BASH_DIR" in err


def test_the_baseline_script_plans_eval_cells_and_tabulates_them(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "terminal_baselines.py"
    spec = importlib.util.spec_from_file_location("terminal_baselines", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--dry-run", "--output-dir", str(tmp_path), "--intercode-episodes", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8 and all(" eval --task " in ln and "--seed 0" in ln for ln in lines)
    assert "--task intercode_bash --agent act --episodes 5" in lines[-1]
    summary = {"agent": "act", "episodes": 4, "successes": 1, "avg_reward": 0.5, "errors": 0, "seconds": 3.0,
               "per_episode": [{"task_id": f"t{i}", "turns": 2} for i in range(4)]}
    (tmp_path / "intercode-act.json").write_text(json.dumps(summary))
    plan = bench.cells((1, 1, 1), 4)
    rows = [bench.row(n, label, bench.command(a, "m", tmp_path / f"{n}.json"), tmp_path / f"{n}.json")
            for n, label, a in plan]
    assert [r["status"] for r in rows].count("ok") == 1 and rows[-1]["ci95"][0] > 0.04
    text = bench.table(rows, "m")
    assert "| InterCode-Bash fs 1, 2, 4 | act | 1/4 = 25.0% | 4.6%-69.9% | 0.500 | 2.0 | 3 |" in text
    assert "97/200 = 48.5%" in text
    with pytest.raises(SystemExit):
        bench.main(["--episodes-per-level", "1,2"])


# ChatML whose template names the tool role (as Qwen2.5's does): tool results in <tool_response> user turns
TOOL_ROLE_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("template_has_tool_role", [True, False])
def test_text_calls_answer_in_the_tool_role_where_the_template_has_one(tiny_path, template_has_tool_role):
    """The task's observation role, as LM training sends it: ``tool`` where the local template names that role."""
    from echo_rl.environments import registry
    from echo_rl.models.local import LocalBackbone
    from tests.tool_env import SPEC, NotesEnv

    class Rendering(LocalBackbone):  # the real prompt rendering; the replies scripted
        def chat(self, messages, **sampling):
            self.prompts.append(self.render_chat(messages))
            return Completion(next(self.replies), "stop", Usage(0, 0, 0.0, 1), "tiny")

    registry.register_task(SPEC)
    try:
        backbone = Rendering(tiny_path, device="cpu", name="tiny")
        if template_has_tool_role:
            backbone.tokenizer.chat_template = TOOL_ROLE_TEMPLATE
        env = NotesEnv()
        env.reset(seed=3)
        backbone.prompts, backbone.replies = [], iter(
            ["think: look first", "<bash>ls", "cat it", f"<submit>{env.secret}</submit>"])
        result = ReActAgent(backbone, task=SPEC.name, few_shot=None).run_episode(env, seed=3)
    finally:
        registry._TASKS.pop(SPEC.name, None)
    assert result.success
    last = backbone.prompts[-1]
    listing = result.trajectory[4]["text"]  # the env's answer to <bash>ls</bash>
    warning = result.trajectory[6]["text"]  # and to a reply without a call
    assert "<|im_start|>user\nOK.<|im_end|>" in last  # the agent's own answer to a thought stays a user turn
    if template_has_tool_role:
        assert f"<tool_response>{listing}</tool_response>" in last and f"<tool_response>{warning}" in last
    else:
        assert f"<|im_start|>user\n{listing}<|im_end|>" in last and "<tool_response>" not in last
