"""The trainer drives agents through ``echo_rl.training.protocol.Agent`` and nothing else."""

import ast
import asyncio
import inspect
import json
import sys

import pytest
import torch

from echo_rl import EchoRLTrainer, TrainingConfig
from echo_rl.training import agents as agents_module, trainer as trainer_module
from echo_rl.training.agents import build_agent
from echo_rl.vector.echo import EchoAgent
from echo_rl.vector.impala_agent import IMPALAAgent
from echo_rl.lm.loop import LMAgent
from echo_rl.vector.ppo_agent import PPOAgent
from echo_rl.training.protocol import AGENT_MEMBERS, Agent, AgentBase, missing_members

SMALL = dict(env_name="minigrid:MiniGrid-Empty-5x5-v0", total_timesteps=512, num_actors=2, batch_size=64,
             evaluation_episodes=2, evaluation_frequency=0, save_frequency=0, env_config={"max_steps": 16})


@pytest.mark.parametrize("cls", [PPOAgent, IMPALAAgent, EchoAgent, LMAgent])
def test_every_agent_class_implements_the_protocol(cls):
    assert issubclass(cls, AgentBase)
    instance_counters = {"env_steps", "updates"}  # set in __init__
    lacking = [m for m in AGENT_MEMBERS if m not in instance_counters and not hasattr(cls, m)]
    assert not lacking, f"{cls.__name__} lacks {lacking}"


@pytest.mark.parametrize("agent", ["ppo", "impala", "echo-rl"])
def test_built_vector_agents_are_protocol_agents_with_the_default_hooks(agent):
    small_replay = {"replay_config.age_threshold": 16, "replay_config.max_replay_age": 64}  # echo-rl's
    a = build_agent(TrainingConfig(**SMALL, agent=agent).with_overrides(small_replay), torch.device("cpu"))
    try:
        assert isinstance(a, Agent) and missing_members(a) == []
        assert (a.evaluate_at_start, a.finished, a.due(), dict(a.timings), a.summary_fields(), a.start()) == \
            (False, False, None, {}, {}, None)
        result = a.run_evaluation(2)  # the trainer's evaluation: seeded, off the training envs
        assert set(result) >= {"success_rate", "avg_reward"}
        assert a.run_evaluation(2) == result
    finally:
        a.close()


def test_the_lm_agent_overrides_the_hooks_it_owns():
    own = {name for name, _ in inspect.getmembers(LMAgent) if name in LMAgent.__dict__}
    assert {"evaluate_at_start", "finished", "due", "start", "run_evaluation", "summary_fields"} <= own
    assert LMAgent.evaluate_at_start is True
    assert inspect.iscoroutinefunction(LMAgent.evaluate)


def test_the_trainer_neither_probes_agents_nor_branches_on_text_tasks():
    tree = ast.parse(inspect.getsource(trainer_module))
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert "getattr" not in calls and "hasattr" not in calls
    attrs = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
    assert "text_task" not in attrs


class ScriptedAgent(AgentBase):
    """Counts steps, stops on its own after 3 updates, evaluates on its own cadence; coroutine methods."""

    evaluate_at_start = True

    def __init__(self, config, envs, device):
        self.config, self.envs = config, envs
        self.env_steps = self.updates = 0
        self.timings = {}
        self.started = self.closed = False
        self.evaluations = []
        BUILT.append(self)

    @property
    def finished(self):
        return self.updates >= 3

    async def start(self):
        self.started = True

    def due(self):
        return self.updates % 2 == 0  # every 2nd update, whatever the env-step schedule says

    async def train_iteration(self):
        await asyncio.sleep(0)
        self.env_steps += self.config.batch_size
        self.updates += 1
        self.timings = {"time/learn_s": 0.25}
        return {"train/loss": float(self.updates)}

    async def run_evaluation(self, episodes):
        self.evaluations.append((self.env_steps, episodes))
        return {"success_rate": self.updates / 10, "avg_reward": 0.0}

    def summary_fields(self):
        return {"scripted": True}

    def state_dict(self):
        return {"env_steps": self.env_steps, "updates": self.updates}

    def load_state_dict(self, state):
        self.env_steps, self.updates = state["env_steps"], state["updates"]

    def rollout_state(self):
        return None

    def load_rollout_state(self, state):
        pass

    def close(self):
        self.closed = True
        self.envs.close()


class Incomplete:
    """An agent that forgot most of the protocol."""

    def __init__(self, config, envs, device):
        self.envs, self.env_steps, self.updates, self.closed = envs, 0, 0, False
        BUILT.append(self)

    def train_iteration(self):
        return {}

    def close(self):
        self.closed = True
        self.envs.close()


BUILT: list = []  # every scripted/incomplete agent the tests built, newest last


@pytest.fixture
def registered(monkeypatch):
    BUILT.clear()
    monkeypatch.setitem(agents_module.AGENTS, "scripted", f"{__name__}:ScriptedAgent")
    monkeypatch.setitem(agents_module.AGENTS, "incomplete", f"{__name__}:Incomplete")
    return BUILT


def test_the_trainer_calls_every_hook(tmp_path, registered):
    cfg = TrainingConfig(**{**SMALL, "total_timesteps": 64 * 10}, agent="scripted")
    result = asyncio.run(EchoRLTrainer(cfg, run_dir=tmp_path / "run", show_progress=False).train())
    agent = registered[-1]
    assert agent.started and agent.closed
    assert (result.num_updates, result.total_timesteps) == (3, 192)  # finished: 3 updates, not 10
    # at start (evaluate_at_start), after update 2 (due), at the end
    assert agent.evaluations == [(0, 2), (128, 2), (192, 2)]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("eval/success_rate")) for r in rows] == \
        [(0, 0.0), (64, None), (128, 0.2), (192, None), (192, 0.3)]
    timings = [json.loads(line) for line in (tmp_path / "run" / "timings.jsonl").read_text().splitlines()]
    assert [t["time/learn_s"] for t in timings] == [0.25] * 3
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["scripted"] is True


def test_an_agent_missing_protocol_members_is_refused_when_built(registered):
    with pytest.raises(TypeError, match="agent Incomplete does not implement the trainer's Agent protocol: "
                                        "missing evaluate_at_start, finished, timings, start, due, run_evaluation"):
        build_agent(TrainingConfig(**SMALL, agent="incomplete"), torch.device("cpu"))
    assert registered[-1].closed  # its envs are released
