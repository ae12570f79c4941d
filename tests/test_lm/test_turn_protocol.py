"""The LM path reads the task's turn protocol: ARC's multi-line replies reach the env and are trained whole."""

import asyncio
import json
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from echo_rl.environments.arc import ARCConfig, ARCEnvironment  # noqa: E402
from echo_rl.config import ConfigError, LMConfig  # noqa: E402
from echo_rl.environments.registry import task_format  # noqa: E402
from echo_rl.environments.reply_format import TaskFormat, tool_format  # noqa: E402
from echo_rl.environments.tool_calls import BASH, TERMINAL_TOOLS  # noqa: E402
from echo_rl.lm.chat_delta import ChatRenderer  # noqa: E402
from echo_rl.lm.rollout import LM_INTRO, LMRolloutWorker, stop_cut  # noqa: E402
from echo_rl.types import ACTION  # noqa: E402


class ScriptedEngine:
    """The engine's interface, "sampling" fixed replies (log-prob -0.5 each) and keeping every request."""

    policy_version, max_context, config = 0, 8192, None

    def __init__(self, replies):
        self.replies, self.requests = list(replies), []

    async def generate(self, prompt_ids, **kw):
        self.requests.append((list(prompt_ids), kw))
        ids = self.replies.pop(0)
        return SimpleNamespace(token_ids=ids, logprobs=[-0.5] * len(ids), policy_versions=[0] * len(ids),
                               prompt_length=len(prompt_ids), cached_length=0, finish_reason="stop")


def _arc_env(tmp_path):
    task = {"train": [{"input": [[1, 0], [0, 0]], "output": [[1, 1], [1, 1]]}],
            "test": [{"input": [[0, 2], [0, 0]], "output": [[2, 2], [2, 2]]}]}
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "fill.json").write_text(json.dumps(task))
    return ARCEnvironment(ARCConfig(data_dir=str(tmp_path), split="training"))


def test_arc_trains_on_the_whole_multiline_reply(tmp_path, chatml_tokenizer):
    renderer = ChatRenderer(chatml_tokenizer)
    end = renderer.turn_end([{"role": "user", "content": "x"}])[0]
    grid = "2 2\n2 2"
    engine = ScriptedEngine([renderer.encode(grid) + [end]])
    env = _arc_env(tmp_path)
    sent = []
    step = env.step
    env.step = lambda action: sent.append(action) or step(action)
    worker = LMRolloutWorker(engine, renderer, LMConfig(max_turns=2), task="arc")
    traj = asyncio.run(worker.episode(env, seed=0))
    assert sent == [grid] and traj.info["won"]  # every line reached the env, not the first
    (a, b), = traj.turn_spans()
    assert chatml_tokenizer.decode(traj.token_ids[a:b], skip_special_tokens=True) == grid
    assert sum(r == ACTION for r in traj.roles) == len(renderer.encode(grid)) + 1
    fmt = task_format("arc")
    assert engine.requests[0][1]["max_new_tokens"] == fmt.max_tokens == 640  # the task's budget, not 16
    system = chatml_tokenizer.decode(traj.token_ids[:traj.prompt_length])
    assert fmt.system_prompt(LM_INTRO) in system


def test_a_reply_is_cut_after_its_stop_string_and_the_rest_not_trained(chatml_tokenizer):
    renderer = ChatRenderer(chatml_tokenizer)
    decode = lambda ids: chatml_tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    ids = renderer.encode("take key 1\ngo to door 1")
    keep = stop_cut(ids, ("\n",), decode)
    assert decode(ids[:keep]).startswith("take key 1\n") and "\n" not in decode(ids[:keep - 1])
    assert stop_cut(ids, ("zzz",), decode) == len(ids) and stop_cut(ids, (), decode) == len(ids)
    engine = ScriptedEngine([ids] * 3)
    worker = LMRolloutWorker(engine, renderer, LMConfig(max_turns=1), task="minigrid")
    from echo_rl.environments.minigrid import MiniGridEnvironment

    traj = asyncio.run(worker.episode(MiniGridEnvironment(task_type="empty", max_steps=3), seed=0))
    (a, b), = traj.turn_spans()
    assert traj.token_ids[a:b] == ids[:keep] and traj.info["actions"] == ["take key 1\n"]


QWENISH = ("{% if tools %}{{ tools | tojson }}{% endif %}{% for message in messages %}"
           "{% if message.role == \"tool\" %}{{ '<|im_start|>user\\n<tool_response>' + message.content + "
           "'</tool_response><|im_end|>\\n' }}{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + "
           "'<|im_end|>\\n' }}{% endif %}{% endfor %}")


def test_template_tool_support_is_read_from_the_template(chatml_tokenizer):
    plain, qwen = ChatRenderer(chatml_tokenizer), ChatRenderer(chatml_tokenizer, chat_template=QWENISH)
    assert (plain.has_tool_role, plain.accepts_tools) == (False, False)
    assert (qwen.has_tool_role, qwen.accepts_tools) == (True, True)
    fmt = tool_format("Do it.", TERMINAL_TOOLS)
    assert fmt.chat_role(qwen.has_tool_role) == "tool" and fmt.chat_role(plain.has_tool_role) == "user"
    assert task_format("minigrid").chat_role(True) == "user"  # a plain-text task keeps the user role


@pytest.mark.parametrize("kw, words", [
    ({"tools": (BASH,), "multiline": True}, "multiline"),
    ({"tools": ("bash",)}, "tools"),
    ({"tools": (BASH, BASH)}, "repeat"),
    ({"observation_role": "system"}, "observation_role"),
])
def test_bad_turn_protocols_are_one_line_errors(kw, words):
    with pytest.raises(ConfigError, match=words) as info:
        TaskFormat(instruction="x", example="", answer="", **kw)
    assert "\n" not in str(info.value)


def test_one_parser_per_kind_of_task():
    assert task_format("minigrid").action("> move forward\nthen more") == "move forward"
    assert task_format("arc").action("1 2\n3 4\n") == "1 2\n3 4"
    tools = tool_format("Do it.", TERMINAL_TOOLS)
    assert tools.parser == "tool_call" and tools.action("ok <submit>7</submit> bye") == "<submit>7</submit>"
