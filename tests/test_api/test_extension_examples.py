"""The worked examples of docs/architecture.md ("Extending EchoRL") are the files in examples/extending/,
and each works through its registry: a text task (eval and train accept it, its split is used), an A2C
agent (``--agent a2c`` trains) and a REINFORCE LM objective (one LM update on the tiny backbone)."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from echo_rl.cli import main
from echo_rl.config import ConfigError, TrainingConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "extending"
FILES = ("parity_task.py", "a2c_agent.py", "reinforce_objective.py")


@pytest.fixture(autouse=True, scope="module")
def _registries_restored():
    """The examples register a task, an agent, a benchmark method and an objective; other test modules see
    the registries as they were."""
    from echo_rl.environments import registry
    from echo_rl.evaluation import methods
    from echo_rl.training import agents
    from echo_rl.lm import objectives

    registry.text_task_names()  # the built-ins in first
    saved = [(d, dict(d)) for d in (registry._TASKS, agents.AGENTS, methods._METHODS, objectives._OBJECTIVES)]
    yield
    for registered, before in saved:
        registered.clear()
        registered.update(before)
    for name in ("parity_task", "a2c_agent", "reinforce_objective"):
        sys.modules.pop(name, None)


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # what PYTHONPATH=examples/extending does for the CLI


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_docs_show_the_example_files_verbatim():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## Extending EchoRL", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    sources = {name: (EXAMPLES / name).read_text() for name in FILES}
    shown = {name: 0 for name in FILES}
    for block in blocks:
        owners = [name for name, text in sources.items() if block in text]
        assert owners, f"docs block not in any examples/extending file:\n{block[:300]}"
        shown[owners[0]] += 1
    assert all(shown.values()), shown  # every example is shown


# -- (a) a text task --------------------------------------------------------------------------------------

def test_parity_task_follows_the_text_contract_and_its_split():
    import parity_task  # noqa: F401  (registers "parity")
    from echo_rl.environments.registry import make_env, split_configs, task_spec, text_task_names
    from echo_rl.lm.rollout import env_kwargs

    assert "parity" in text_task_names() and task_spec("parity").data == "none: generated"
    env = make_env("parity", split="test")
    obs, info = env.reset(seed=3)
    assert obs.startswith("Is 1") and info["admissible_actions"] == ["even", "odd"]
    wrong = "odd" if env.expert_action() == "even" else "even"
    obs, reward, terminated, _, info = env.step(wrong)
    assert (reward, terminated, info["won"]) == (0.0, False, False)
    obs, reward, terminated, _, info = env.step(env.expert_action())
    assert (reward, terminated, info["won"]) == (1.0, True, True)
    assert split_configs("parity") == ({"split": "train"}, {"split": "test"})
    cfg = TrainingConfig(env_name="parity", backbone="tiny", num_actors=4, batch_size=4)
    assert env_kwargs(cfg, held_out=False)["split"] == "train" and env_kwargs(cfg, held_out=True)["split"] == "test"


def test_parity_task_registers_its_reply_format_for_the_prompting_agents():
    import parity_task
    from echo_rl.prompting import build_agent
    from echo_rl.prompting.prompts import task_format
    from echo_rl.environments.registry import make_env
    from echo_rl.models import ScriptedBackbone

    assert task_format("parity") is parity_task.PARITY_REPLY
    env, backbone = make_env("parity", split="test"), ScriptedBackbone(lambda m: "odd")
    build_agent("act", backbone, task="parity").run_episode(env, seed=3, max_steps=1)
    system, example, answer, task = backbone.calls[0]
    assert system["content"].endswith(parity_task.PARITY_REPLY.instruction)
    first_obs = env.reset(seed=3)[0]
    assert (example["content"], answer["content"], task["content"]) == ("Is 7 even or odd?", "odd", first_obs)


def test_cli_eval_accepts_the_plugin_task(capsys):
    assert main(["--plugin", "parity_task", "eval", "--task", "parity", "--agent", "act", "--backbone", "expert",
                 "--episodes", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["success_rate"] == 1.0


# -- (b) a vector algorithm -------------------------------------------------------------------------------

def test_a2c_loss_is_the_policy_gradient():
    from a2c_agent import a2c_loss

    logits = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = a2c_loss(logits, torch.zeros(2), torch.tensor([0, 2]), torch.tensor([1.0, -1.0]),
                             torch.zeros(2), value_coef=0.5, entropy_coef=0.0)
    loss.backward()
    # d(-A log π(a))/d logit = -A (1[a] - π): the advantaged action is pushed up, the other down
    assert logits.grad[0, 0] < 0 and logits.grad[1, 2] > 0
    assert metrics["loss/policy"] == pytest.approx(0.0) and metrics["loss/entropy"] == pytest.approx(np.log(3))


def test_cli_trains_the_registered_a2c_agent(tmp_path):
    run = tmp_path / "a2c"
    assert main(["--plugin", "a2c_agent", "train", "--agent", "a2c", "--task", "CartPole-v1", "--timesteps", "256",
                 "--num-actors", "4", "--batch-size", "64", "--run-dir", str(run), "--no-progress",
                 "--set", "evaluation_episodes=2"]) == 0
    updates = [r for r in _rows(run) if "loss/policy" in r]
    assert len(updates) == 4 and all(r["loss/grad_norm"] > 0 for r in updates)
    assert not any("loss/clip_fraction" in r for r in updates)  # A2C's learn ran, not PPO's
    from echo_rl.evaluation.methods import get_method
    from echo_rl.evaluation.records import NO_BACKBONE

    assert get_method("a2c").skip_reason("minigrid", NO_BACKBONE) is None  # also a benchmark method


def test_unregistered_agents_and_objectives_say_how_to_register():
    with pytest.raises(ConfigError, match="unknown agent 'a3c'.*register_agent"):
        TrainingConfig(env_name="CartPole-v1", agent="a3c")
    with pytest.raises(ConfigError, match="objective='dpo' is invalid.*register_lm_objective"):
        TrainingConfig.from_dict({"env_name": "arc", "backbone": "tiny", "lm_config": {"objective": "dpo"}})


# -- (c) an LM objective ----------------------------------------------------------------------------------

def test_cli_trains_one_lm_update_with_the_registered_objective(tmp_path, tiny_path):
    run = tmp_path / "lm"
    assert main(["--plugin", "parity_task", "--plugin", "reinforce_objective", "train", "--task", "parity",
                 "--agent", "echo-rl", "--no-plan", "--backbone", "tiny", "--timesteps", "8", "--num-actors", "4",
                 "--batch-size", "4", "--run-dir", str(run), "--no-progress",
                 "--set", "lm_config.objective=reinforce", "--set", "lm_config.sft_episodes=0",
                 "--set", "lm_config.heldout_pool=0", "--set", "lm_config.max_updates=1",
                 "--set", "lm_config.max_turns=2", "--set", "lm_config.max_new_tokens=4",
                 "--set", "evaluation_episodes=2"]) == 0
    (update,) = [r for r in _rows(run) if "lm/loss" in r]
    assert update["lm/policy_version"] == 1.0 and update["lm/grad_norm"] > 0
    assert "lm/clip_fraction" not in update  # GRPO's loss did not run
    # the loss the learner stepped on is REINFORCE's: pg + λ·env CE
    assert update["lm/loss"] == pytest.approx(update["lm/pg_loss"] + update["lm/lambda"] * update["lm/env_ce"])
    assert update["lm/env_ce"] > 0
