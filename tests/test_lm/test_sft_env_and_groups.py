"""lm_config.sft_env_config (expert demonstrations on other tasks than RL's), held-out success and env CE per
task group (the terminal tasks' levels), and the extra held-out task (lm_config.extra_eval_env)."""

import asyncio

import pytest
import torch

pytest.importorskip("transformers")

from echo_rl.config import ConfigError  # noqa: E402
from echo_rl.lm import loop  # noqa: E402
from echo_rl.lm.loop import LMAgent, by_group  # noqa: E402
from tests.test_lm.test_loop import _cfg, checkpoint  # noqa: E402,F401  (fixture)




def _terminal(path, **over):
    return _cfg(path, env_name="terminal", env_config={"level": 0, "max_steps": 1, "instances_per_template": 10},
                **{"lm_config.max_turns": 1, "lm_config.heldout_pool": 0, **over})


def test_sft_demonstrates_on_sft_env_config_tasks_and_rl_keeps_all(checkpoint, sandbox_ok, monkeypatch):  # noqa: F811
    agent = LMAgent(_terminal(checkpoint, **{"lm_config.sft_env_config": {"level": 1},
                                             "lm_config.sft_episodes": 3}), torch.device("cpu"))
    seen, real = [], loop.expert_trajectory

    def spy(env, *args, **kwargs):
        traj = real(env, *args, **kwargs)
        seen.append((env.config.level, traj.info["task_group"]))
        return traj

    monkeypatch.setattr(loop, "expert_trajectory", spy)
    agent._sft()
    assert seen == [(1, "level1")] * 3
    assert agent.env(held_out=False).config.level == 0  # RL's tasks: every level


def test_bad_sft_env_config_fails_at_construction(checkpoint):  # noqa: F811
    with pytest.raises(ConfigError, match="levle"):
        LMAgent(_terminal(checkpoint, **{"lm_config.sft_env_config": {"levle": 1}}), torch.device("cpu"))
    with pytest.raises(ConfigError, match="extra_eval_episodes"):
        _terminal(checkpoint, **{"lm_config.extra_eval_env": "terminal"})


def test_evaluation_per_level_and_on_the_extra_task(checkpoint, sandbox_ok):  # noqa: F811
    cfg = _terminal(checkpoint, evaluation_episodes=6, **{
        "lm_config.heldout_pool": 4, "lm_config.sft_episodes": 0,
        "lm_config.extra_eval_env": "terminal", "lm_config.extra_eval_episodes": 3,
        "lm_config.extra_eval_env_config": {"split": "test", "level": 2, "instances_per_template": 10}})
    agent = LMAgent(cfg, torch.device("cpu"))
    out = asyncio.run(agent.evaluate(6))
    groups = {k.split("/", 1)[1] for k in out if k.startswith("episodes/")}
    assert groups and groups <= {"level1", "level2", "level3"}
    assert sum(out[f"episodes/{g}"] for g in groups) == out["episodes"] == 6
    assert all(0.0 <= out[f"success_rate/{g}"] <= 1.0 for g in groups)
    pool = by_group(agent.heldout_pool())
    assert sum(map(len, pool.values())) == 4
    assert {f"heldout_env_ce/{g}" for g in pool} <= set(out) and all(out[f"heldout_env_ce/{g}"] > 0 for g in pool)
    # the extra task: its own env, 3 episodes on tasks spread over its list, without per-group keys
    assert out["terminal/episodes"] == 3 and "terminal/success_rate" in out
    assert not any(k.startswith("terminal/") and k.count("/") > 1 for k in out)


def test_by_group_leaves_ungrouped_out():
    class T:
        def __init__(self, group):
            self.info = {} if group is None else {"task_group": group}

    a, b, c = T("level2"), T(None), T("level1")
    assert by_group([a, b, c]) == {"level1": [c], "level2": [a]}


def test_a_run_waits_for_a_sibling_computing_the_same_sft(checkpoint, tmp_path):  # noqa: F811
    import fcntl
    import threading

    over = {"lm_config.sft_cache_dir": str(tmp_path / "sft"), "echo_config.latent_plan": False}
    first = LMAgent(_cfg(checkpoint, **over), torch.device("cpu"))
    assert first._sft()["cached"] == 0.0
    (cache,) = (tmp_path / "sft").glob("*.pt")
    saved = cache.read_bytes()
    cache.unlink()
    second = LMAgent(_cfg(checkpoint, agent="ppo", **over), torch.device("cpu"))
    result = {}
    with open(cache.with_suffix(".lock"), "a") as lock:  # a sibling run is computing this SFT
        fcntl.flock(lock, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: result.update(second._sft()))
        waiter.start()
        waiter.join(timeout=2.0)
        assert waiter.is_alive() and not result  # waits instead of computing it again
        cache.write_bytes(saved)
    waiter.join(timeout=60)
    assert result["cached"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(first.model.state_dict().values(),
                                                 second.model.state_dict().values()))


def test_the_evaluation_before_rl_is_shared_with_the_sft(checkpoint, tmp_path):  # noqa: F811
    import json

    from echo_rl.training.trainer import EchoRLTrainer

    over = {"lm_config.max_updates": 1, "lm_config.sft_cache_dir": str(tmp_path / "sft"),
            "echo_config.latent_plan": False}

    def first_eval(run, **more):
        asyncio.run(EchoRLTrainer(_cfg(checkpoint, **over, **more), tmp_path / run, show_progress=False).train())
        row = json.loads((tmp_path / run / "metrics.jsonl").read_text().splitlines()[0])
        return {k: v for k, v in row.items() if k.startswith("eval/")}, (tmp_path / run / "progress.log").read_text()

    a, _ = first_eval("a")
    b, log_b = first_eval("b", agent="ppo")  # differs only after SFT: the same evaluation, loaded
    assert a == b and "the same weights' evaluation loaded" in log_b
    assert len(list((tmp_path / "sft").glob("*.eval-*.json"))) == 1
    _, log_c = first_eval("c", agent="ppo", evaluation_episodes=2)  # another evaluation: its own
    assert "evaluation loaded" not in log_c and len(list((tmp_path / "sft").glob("*.eval-*.json"))) == 2
