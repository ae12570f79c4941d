"""One registry per extension point: the task metadata every reader takes from ``TaskSpec``, the one backbone
resolver behind prompting, training and the benchmark, and the agent / objective registries' one-line errors."""

import pytest

from echo_rl.config import ConfigError
from echo_rl.environments import registry
from echo_rl.environments.registry import TaskSpec, register_task, register_text_env, split_configs, task_spec
from echo_rl.evaluation import methods
from echo_rl.models import resolve
from echo_rl.models.resolve import resolve_backbone
from echo_rl.training import agents
from echo_rl.lm import objectives


@pytest.fixture(autouse=True)
def _registries_restored():
    registry.text_task_names()
    saved = [(d, dict(d)) for d in (registry._TASKS, agents.AGENTS, methods._METHODS, objectives._OBJECTIVES,
                                    resolve._REGISTERED)]
    yield
    for registered, before in saved:
        registered.clear()
        registered.update(before)


def _factory(**kw):
    raise AssertionError("not built in these tests")


def test_built_in_tasks_carry_their_metadata_from_their_own_modules():
    assert registry.text_task_names()[:5] == ["alfworld", "webshop", "cruxeval", "arc", "minigrid"]
    assert split_configs("alfworld") == ({"split": "valid_train"}, {"split": "valid_unseen"})
    assert split_configs("cruxeval") == ({"split": "train"}, {"split": "test"})
    assert split_configs("arc") == ({"split": "training"}, {"split": "evaluation"})
    assert split_configs("webshop") == split_configs("minigrid:MiniGrid-Empty-5x5-v0") == ({}, {})
    assert task_spec("BabyAI-GoToRedBall-v0").name == "minigrid"  # every MiniGrid id is MiniGrid's text task
    assert [t for t in registry.text_task_names() if task_spec(t).multiline] == ["arc"]
    assert all(task_spec(t).prompting and task_spec(t).data for t in ("alfworld", "webshop", "cruxeval", "arc"))
    assert task_spec("alfworld").factory.__module__ == "echo_rl.environments.alfworld"
    with pytest.raises(ConfigError, match="vector task"):
        task_spec("CartPole-v1")


def test_prompting_and_multiline_readers_follow_the_registry():
    from echo_rl.prompting.base import is_multiline_task
    from echo_rl.evaluation.runners import agent_task

    assert agent_task("minigrid:MiniGrid-Empty-5x5-v0") == "minigrid" and agent_task("arc") == "arc"
    register_text_env("grids", _factory, multiline=True)
    assert agent_task("grids") is None and is_multiline_task("grids") and not is_multiline_task("webshop")
    register_text_env("arc", _factory)  # a user entry replaces the built-in one, metadata included
    assert split_configs("arc") == ({}, {}) and not is_multiline_task("arc")


def test_bad_task_entries_are_one_line_errors():
    with pytest.raises(ConfigError, match="unknown TaskSpec field.*multi_line.*allowed: "):
        register_text_env("t", _factory, multi_line=True)
    with pytest.raises(ConfigError, match="TaskSpec.eval_config of task 't' is invalid: must be a mapping"):
        register_task(TaskSpec("t", _factory, eval_config="test"))
    with pytest.raises(ConfigError, match="register_task needs a TaskSpec"):
        register_task({"name": "t"})
    spec = register_text_env("t", _factory, train_config={"split": "a"})
    with pytest.raises(TypeError):
        spec.train_config["split"] = "b"  # shared by every reader: read-only


def test_one_resolver_names_every_backbone(tmp_path):
    from echo_rl.models import ScriptedBackbone, register_backbone

    tiny = resolve_backbone("tiny:tiny-llama")
    assert (tiny.kind, tiny.preset, tiny.has_weights) == ("tiny", "tiny-llama", True)
    assert resolve_backbone("small").preset == "small"
    api = resolve_backbone("gpt-4o")
    assert api.kind == "api" and api.provider and not api.has_weights
    url = resolve_backbone("http://127.0.0.1:8000/v1#my-model")
    assert (url.kind, url.url, url.model) == ("url", "http://127.0.0.1:8000/v1", "my-model")
    ckpt = resolve_backbone(str(tmp_path))
    assert ckpt.kind == "checkpoint" and ckpt.checkpoint() == tmp_path
    register_backbone("mine", lambda config: ScriptedBackbone(lambda messages: "ok", name="mine"))
    assert resolve_backbone("mine").kind == "registered" and not resolve_backbone("mine").has_weights
    assert resolve_backbone("nowhere-model", strict=False) is None
    with pytest.raises(ConfigError, match="unknown backbone 'nowhere-model'; allowed: tiny.*register_backbone"):
        resolve_backbone("nowhere-model")
    with pytest.raises(ConfigError, match="unknown tiny preset 'huge'"):
        resolve_backbone("tiny:huge")


def test_training_and_the_benchmark_read_the_same_resolver():
    pytest.importorskip("transformers")
    from echo_rl.evaluation.methods import get_method
    from echo_rl.models import ScriptedBackbone, register_backbone
    from echo_rl.lm.policy import load_policy

    register_backbone("mine", lambda config: ScriptedBackbone(lambda messages: "ok", name="mine"))
    with pytest.raises(ConfigError, match="a registered backbone is built by its factory and has no checkpoint"):
        load_policy("mine", 0)
    with pytest.raises(ConfigError, match="API models cannot be trained"):
        load_policy("http://127.0.0.1:8000/v1", 0)
    reason = get_method("ppo-rlhf").skip_reason("arc", "mine")
    assert "registered backbone 'mine' has none" in reason
    assert get_method("react").skip_reason("arc", "mine") is None  # prompting builds it through its factory


def test_agent_and_objective_registration_errors():
    import torch

    from echo_rl.config import LMConfig
    from echo_rl.lm.learner import LMLearner

    def learner(objective):
        return LMLearner(torch.nn.Linear(2, 2), 0, LMConfig(objective=objective, learning_rate=1e-5))

    with pytest.raises(ConfigError, match="agent 'x' is invalid: must be a class or 'module:Class'"):
        agents.register_agent("x", object())
    with pytest.raises(ConfigError, match="name the class as 'module:Class'"):
        agents.register_agent("x", "no_colon")
    agents.register_agent("lazy", "echo_rl.vector.ppo_agent:PPOAgent")
    assert agents.agent_class("lazy").__name__ == "PPOAgent"
    with pytest.raises(ConfigError, match="loss of objective 'x' is invalid: must be callable"):
        objectives.register_lm_objective("x", 3)
    assert objectives.get_objective("ppo-rlhf").value_head and not objectives.get_objective("grpo").value_head
    with pytest.raises(ConfigError, match="advantages of objective 'x' is invalid: must be callable"):
        objectives.register_lm_objective("x", lambda x: None, advantages=3)
    with pytest.raises(ConfigError, match="advantages of objective 'x' is invalid: a value-head objective's"):
        objectives.register_lm_objective("x", lambda x: None, value_head=True, advantages=lambda *a: None)
    assert objectives.get_objective("gigpo").advantages_fn() is not None
    with pytest.raises(ConfigError, match="objective='sac' is invalid: allowed: grpo, ppo-rlhf.*register_lm_objective"):
        learner("sac")
    objectives.register_lm_objective("sac", lambda x: None)
    assert learner("sac").objective.name == "sac"


def test_a_multiline_user_task_gets_whole_answers_in_eval_and_the_benchmark(tmp_path):
    """``TaskSpec.multiline`` reaches the prompting agents of ``echo-rl eval`` and of benchmark cells: a two-line
    answer is passed whole (cut at its first line, it would never win)."""
    import asyncio
    from dataclasses import dataclass

    from echo_rl.prompting.runner import evaluate_text_agent
    from echo_rl.config import ConfigBase, spec
    from echo_rl.environments.base import StepOutcome, TextEnvironment, env_output
    from echo_rl.evaluation.benchmark import BenchmarkConfig, EchoRLBenchmark
    from echo_rl.models import ScriptedBackbone, register_backbone

    @dataclass
    class GridConfig(ConfigBase):
        max_steps: int = spec(2, help="answers per episode", min=1)

    class Grid(TextEnvironment):
        def _num_tasks(self):
            return 1

        def _reset_task(self, index, options):
            return env_output("Write the 2x2 grid of 1 2 / 3 4.")

        def _step(self, action):
            won = action.strip() == "1 2\n3 4"
            return StepOutcome(env_output("Right." if won else "Wrong."), reward=float(won), terminated=won, won=won)

    register_text_env("grid2", lambda **kw: Grid(GridConfig(**kw)), multiline=True)
    register_backbone("grid-writer", lambda config: ScriptedBackbone(lambda messages: "1 2\n3 4", name="grid-writer"))
    summary = evaluate_text_agent("grid2", "act", "grid-writer", episodes=1, seed=0)
    assert summary["success_rate"] == 1.0
    cfg = BenchmarkConfig(tasks=["grid2"], backbones=["grid-writer"], baselines=["act"], num_seeds=1, num_episodes=1,
                          max_steps_per_episode=2, output_dir=str(tmp_path / "bench"), generate_plots=False,
                          generate_report=False)
    assert asyncio.run(EchoRLBenchmark(cfg).run_benchmark())["ok"] == 1
    import json

    (cell,) = [json.loads(p.read_text()) for p in (tmp_path / "bench").rglob("cells/**/*.json")]
    assert cell["metrics"]["success_at_1"] == 1.0


def test_built_in_order_does_not_depend_on_which_module_was_imported_first():
    import subprocess
    import sys

    code = ("import echo_rl.environments.arc\n"
            "from echo_rl.environments import registry\n"
            "print(registry.text_task_names()[:5])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['alfworld', 'webshop', 'cruxeval', 'arc', 'minigrid']"


def test_registration_names_are_importable_from_the_package():
    """README and docs name ``echo_rl.environments`` as where a user registers a task."""
    import echo_rl.environments as envs
    from echo_rl.environments import registry

    for name in envs.__all__:
        assert getattr(envs, name) is getattr(registry, name)


def test_one_module_attr_loader_for_agents_and_objectives(monkeypatch):
    """The agent and LM-objective registries name built-ins as "module:attr" and load them one way."""
    from echo_rl.utils import optional

    calls = []
    real = optional.load_attr
    monkeypatch.setattr(optional, "load_attr", lambda target: calls.append(target) or real(target))
    monkeypatch.setattr(agents, "load_attr", optional.load_attr)
    monkeypatch.setattr(objectives, "load_attr", optional.load_attr)
    assert agents.agent_class("ppo").__name__ == "PPOAgent"
    assert callable(objectives.LMObjective("mine", "echo_rl.algorithms.lm_objectives:grpo_echo_loss").loss_fn())
    assert calls == ["echo_rl.vector.ppo_agent:PPOAgent", "echo_rl.algorithms.lm_objectives:grpo_echo_loss"]
    with pytest.raises(ValueError, match="'echo_rl.vector.ppo_agent' is not 'module:attr'"):
        real("echo_rl.vector.ppo_agent")
