"""Every built-in task's ReAct, Act-only and ToT prompts, rendered byte for byte: the reply formats live on the
tasks' registry entries, and moving them there (or anywhere) must not change one byte a backbone is sent.

Each case runs a short episode over the corridor env with a scripted backbone and hashes everything the agent
sent: the messages and the sampling arguments (stop strings, token budget) of every call.
"""

import hashlib
import json
from dataclasses import dataclass

import pytest

from echo_rl.prompting import build_agent
from echo_rl.config import spec
from echo_rl.models import ScriptedBackbone

from corridor_env import CorridorConfig, CorridorEnv

#: sha256 of the rendered calls, recorded from the formats as they were first written in echo_rl/prompting/prompts.py
EXPECTED = {
    "react/alfworld/output": "9dabf92a1f9fbe2a2dea0d9585be4ff3463dc70ed9231494631f8df085000e87",
    "act/alfworld/output": "c34186c5889b2dca2547fc7afeed2f9d7df3c991b5aac4214487d457afae225c",
    "tot/alfworld/output": "45d551480b69b5a652779ed11043b96d70c344a0c94f146a50b1a6aafbd5bd49",
    "react/webshop/output": "bbb856483b0dcb0e38e2db1bd09470e9e2a2e2c667739f963a50e2242c0abd71",
    "act/webshop/output": "b81966fe7cb050408e0fa6c264e5010de561f09b921085aecfa0dbff6c555734",
    "tot/webshop/output": "b50503a0413674c286d225ba75c9181d62641876c1327802bc786f02903949cb",
    "react/cruxeval/output": "c35ada1db1476fd17c063f94096a405c8b656a33f27b3e79046d42c8217e0f7a",
    "act/cruxeval/output": "0d1b747ab2f4609f79ac146c53f2fc9d3719ab653603fbfc61cd5af99f48972d",
    "tot/cruxeval/output": "66a173370b7db8bf850c9fe612f200d9d40d67aff61d257818d03d2de182f4ff",
    "react/cruxeval/input": "5104e54d6d83036219a8ec1d2e649963249563e5bbede3f84f2be88355757904",
    "act/cruxeval/input": "78064b384683a97d88a9dfbde9e1c3c684df5bedf7dde52f4f46975393ac5e48",
    "tot/cruxeval/input": "ccb8a46a956459cb8b326bd75fcde17f79dcd2cafdb6bf29074983604e8979ee",
    "react/arc/output": "6a11a6925f70394e7c696f39934dea0ff87a17506610e5047b6af101a0b8a31a",
    "act/arc/output": "e3d9bb24ca725e10ee442c17bfc865ff976b0ab501d882be95fa3082f3d097b5",
    "tot/arc/output": "cd45ad35ebaab87f7022cd25f930fad8ec892593aacd45678f6b564a9422ed54",
    "react/minigrid/output": "f0ca6ab1d4edb100ed7999f27046e50e4fa4632c8c19b06260c6dbd6390c907a",
    "act/minigrid/output": "d4920a9781fec06d4fa904fe2e278eea5e46f7125cb11a286fb68dce17164ff6",
    "tot/minigrid/output": "5bc14ac9283278282420d0828488d042357e08628a24c2f377639c784e869b6b",
    "react/minigrid:BabyAI-GoToObj-v0/output": "f0ca6ab1d4edb100ed7999f27046e50e4fa4632c8c19b06260c6dbd6390c907a",
    "act/minigrid:BabyAI-GoToObj-v0/output": "d4920a9781fec06d4fa904fe2e278eea5e46f7125cb11a286fb68dce17164ff6",
    "tot/minigrid:BabyAI-GoToObj-v0/output": "5bc14ac9283278282420d0828488d042357e08628a24c2f377639c784e869b6b",
    "react/None/output": "ea530e7bc58e608b56874ca53e43ac1f8a17edf5f6e626fa4cbf5e507e55e224",
    "act/None/output": "a675a998e63ede30ff0a37448cc4514eeb957945a0329a7b7d2bb3225dd8a8dc",
    "tot/None/output": "5f02d164325cee49014703f8822946be3c204d8608825e66564b1248ae71ad47",
    "react/not-registered/output": "ea530e7bc58e608b56874ca53e43ac1f8a17edf5f6e626fa4cbf5e507e55e224",
    "act/not-registered/output": "a675a998e63ede30ff0a37448cc4514eeb957945a0329a7b7d2bb3225dd8a8dc",
    "tot/not-registered/output": "5f02d164325cee49014703f8822946be3c204d8608825e66564b1248ae71ad47",
}


@dataclass
class _VariantConfig(CorridorConfig):
    task: str = spec("output", help="CRUXEval's variant, read by its reply format")


class _Recorder(ScriptedBackbone):
    """A scripted backbone that also keeps each call's sampling arguments."""

    def __init__(self, responder):
        super().__init__(responder)
        self.sent: list[dict] = []

    def chat(self, messages, **sampling):
        self.sent.append({"messages": [dict(m) for m in messages], "stop": list(sampling.get("stop") or ()),
                          "max_tokens": sampling.get("max_tokens")})
        return super().chat(messages, **sampling)


def _reply(messages) -> str:
    ask = messages[-1]["content"]
    if "Propose the next actions." in ask:
        return "go to room 1\ngo to room 2"
    if "Evaluate the candidate action." in ask:
        return "likely"
    return "think: the key may be near\nmore" if len(messages) <= 4 else "go to room 1"


CASES = [(task, variant) for task in ("alfworld", "webshop", "cruxeval", "arc", "minigrid", "minigrid:BabyAI-GoToObj-v0",
                                      None, "not-registered")
         for variant in (("output", "input") if task == "cruxeval" else ("output",))]


def render(agent: str, task: str | None, variant: str) -> str:
    env = CorridorEnv(_VariantConfig(task=variant))
    backbone = _Recorder(_reply)
    build_agent(agent, backbone, task=task).run_episode(env, seed=0, max_steps=2, options={"task_index": 1})
    return json.dumps(backbone.sent, sort_keys=True)


@pytest.mark.parametrize("agent", ["react", "act", "tot"])
@pytest.mark.parametrize("task, variant", CASES)
def test_builtin_prompts_are_unchanged(agent, task, variant, request):
    if task == "alfworld":  # ReAct's ALFWorld prompts are benchmark data (../shared/data)
        request.getfixturevalue("shared_data")
    digest = hashlib.sha256(render(agent, task, variant).encode()).hexdigest()
    assert digest == EXPECTED[f"{agent}/{task}/{variant}"]
