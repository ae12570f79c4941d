"""The harness end to end on cheap real cells (random and expert on MiniGrid), resume, and bad input."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from echo_rl.config import ConfigError
from echo_rl.evaluation import BenchmarkConfig, EchoRLBenchmark
from echo_rl.evaluation import methods as M
from echo_rl.evaluation.records import CellOutcome, CellStore, EpisodeRecord

EMPTY = "minigrid:MiniGrid-Empty-5x5-v0"


def _run(cfg, messages=None):
    return asyncio.run(EchoRLBenchmark(cfg, progress=(messages.append if messages is not None else None))
                       .run_benchmark())


def _cfg(tmp_path, **kw):
    base = dict(tasks=[EMPTY], baselines=["random", "expert"], num_seeds=2, num_episodes=3,
                max_steps_per_episode=30, output_dir=str(tmp_path / "run"), bootstrap_reps=200,
                generate_plots=False)
    base.update(kw)
    return BenchmarkConfig(**base)


@pytest.mark.parametrize("field,value,match", [
    ("tasks", ["minigrid", "alfworld2"], r"unknown task 'alfworld2'; allowed: minigrid.*arc"),
    ("baselines", ["random", "reactt"], r"unknown baseline 'reactt'; allowed: .*react.*tot"),
    ("backbones", ["gpt-5o"], r"unknown backbone 'gpt-5o'; allowed: tiny.*gpt-4o"),
    ("echo_rl_configs", {"total_timestep": 10}, r"unknown field echo_rl_configs.total_timestep"),
    ("backbone_config", {"dtyp": "bfloat16"}, r"unknown field backbone_config.dtyp; allowed: .*dtype"),
    ("backbone_config", {"dtype": "int8"}, r"dtype='int8' is invalid"),
])
def test_bad_names_fail_before_any_work(tmp_path, field, value, match):
    kw = {"baselines": ["random", "ppo"], field: value}
    with pytest.raises(ConfigError, match=match) as err:
        _cfg(tmp_path, **kw)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


def test_small_benchmark_writes_results_and_report(tmp_path):
    cfg = _cfg(tmp_path, baselines=["random", "expert", "ppo-rlhf"], generate_plots=True)
    summary = _run(cfg)
    run = Path(summary["output_dir"])
    assert summary["cells"] == 6 and summary["ok"] == 4 and summary["skipped"] == 2
    recs = {(r["method"], r["seed"]): r for r in CellStore(run).records()}
    for seed in (0, 1):
        expert = recs[("expert", seed)]["metrics"]
        assert expert["success_at_1"] == 1.0  # the BFS expert solves Empty-5x5 every time
        assert expert["avg_episode_length"] < 30 and expert["num_episodes"] == 3
        assert expert["wall_time_s"] > 0 and expert["cost_per_success"] > 0
        assert len(recs[("expert", seed)]["episodes"]) == 3
        assert recs[("ppo-rlhf", seed)]["status"] == "skipped"
        assert "ppo-rlhf" in recs[("ppo-rlhf", seed)]["reason"]  # not registered yet, or no backbone given
    # the random policy ran real episodes: each capped at 30 steps, success only when the goal was reached
    for ep in recs[("random", 0)]["episodes"]:
        assert ep["length"] <= 30 and ep["success"] == (ep["reward"] > 0)
    md = (run / "report.md").read_text()
    assert "| Task | Method | Success@1 (95% CI) | ETPS | Cost/Success | Seeds |" in md
    assert f"| {EMPTY} | expert | 1.000 [1.000, 1.000] |" in md
    assert "ppo-rlhf | skipped" in md
    results = json.loads((run / "results.json").read_text())
    assert len(results["cells"]) == 6 and "expert" in results["summary"]["aggregates"]
    assert (run / "results.csv").read_text().count("\n") == 7
    for name in ("success_by_task", "aggregate", "performance_profile"):
        assert (run / "plots" / f"{name}.png").stat().st_size > 1000


def test_episode_seeds_make_cells_reproducible(tmp_path):
    a = _run(_cfg(tmp_path / "a", baselines=["random"], num_seeds=1))
    b = _run(_cfg(tmp_path / "b", baselines=["random"], num_seeds=1))
    ra, rb = (CellStore(x["output_dir"]).records()[0]["episodes"] for x in (a, b))
    assert [(e["reward"], e["length"]) for e in ra] == [(e["reward"], e["length"]) for e in rb]


@pytest.fixture
def counting_method():
    """A registered method whose runner logs each call; it can be told to die at a given seed."""
    calls, state = [], {"die_at": None}

    async def runner(ctx):
        if ctx.cell.seed == state["die_at"]:
            raise KeyboardInterrupt  # what Ctrl-C or a kill does half way
        calls.append(ctx.cell.seed)
        return CellOutcome(episodes=[EpisodeRecord(success=ctx.cell.seed % 2 == 0, reward=1.0, length=1,
                                                   wall_time_s=0.001)] * ctx.num_episodes)

    M.register_method(M.MethodSpec("counting", "reference", "test", runner, ("text", "vector")))
    yield calls, state
    M._METHODS.pop("counting")


def test_interrupted_benchmark_recomputes_only_unfinished_cells(tmp_path, counting_method):
    calls, state = counting_method
    cfg = _cfg(tmp_path, baselines=["counting"], num_seeds=5)
    state["die_at"] = 3
    with pytest.raises(KeyboardInterrupt):
        _run(cfg)
    assert calls == [0, 1, 2]
    state["die_at"] = None
    messages = []
    summary = _run(cfg, messages)
    assert calls == [0, 1, 2, 3, 4]  # only the unfinished cells ran again
    assert summary["reused"] == 3 and summary["ok"] == 2
    assert sum("done earlier, kept" in m for m in messages) == 3
    # a setting that shapes results (episodes per cell) invalidates the stored cells
    _run(_cfg(tmp_path, baselines=["counting"], num_seeds=5, num_episodes=4))
    assert calls == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]


def test_failing_method_is_recorded_and_the_rest_runs(tmp_path):
    async def broken(ctx):
        raise RuntimeError("boom")

    M.register_method(M.MethodSpec("broken", "reference", "test", broken, ("vector",)))
    try:
        summary = _run(_cfg(tmp_path, baselines=["broken", "expert"], num_seeds=1))
    finally:
        M._METHODS.pop("broken")
    assert summary["failed"] == 1 and summary["ok"] == 1
    rec = next(r for r in CellStore(summary["output_dir"]).records() if r["method"] == "broken")
    assert rec["status"] == "failed" and rec["reason"] == "RuntimeError: boom"
    md = (Path(summary["output_dir"]) / "report.md").read_text()
    assert "RuntimeError: boom" in md


@pytest.mark.parametrize("errors,limit,status", [(1, 0.25, "ok"), (2, 0.25, "failed"), (4, 1.0, "ok")])
def test_cell_with_too_many_errored_episodes_fails(tmp_path, errors, limit, status):
    """Errored episodes count as failures up to max_episode_error_fraction; past it the cell is failed (and rerun
    next time), with the episodes kept to say what broke — a broken method must not read as a weak one."""
    async def flaky(ctx):
        eps = [EpisodeRecord(success=i >= errors, reward=float(i >= errors), length=1, wall_time_s=0.0)
               for i in range(ctx.num_episodes)]
        notes = {"num_episode_errors": errors, "episode_errors": ["OSError: backbone went away"]}
        return CellOutcome(episodes=eps, notes=notes)

    M.register_method(M.MethodSpec("flaky", "reference", "test", flaky, ("vector",)))
    try:
        summary = _run(_cfg(tmp_path, baselines=["flaky"], num_seeds=1, num_episodes=4,
                            max_episode_error_fraction=limit))
    finally:
        M._METHODS.pop("flaky")
    rec = CellStore(summary["output_dir"]).records()[0]
    assert rec["status"] == status and summary[status] == 1
    if status == "failed":
        assert rec["reason"] == ("2 of 4 episodes errored, more than max_episode_error_fraction=0.25 "
                                 "(first: OSError: backbone went away)")
        assert len(rec["episodes"]) == 4 and "metrics" not in rec
    else:
        assert rec["metrics"]["success_at_1"] == (4 - errors) / 4


def test_random_reference_is_skipped_where_undefined(tmp_path, shared_data):
    # ARC answers are grids: there is no finite action set to draw uniformly from
    summary = _run(_cfg(tmp_path, tasks=["arc"], baselines=["random", "expert"], num_seeds=1, num_episodes=2))
    recs = {r["method"]: r for r in CellStore(summary["output_dir"]).records()}
    assert recs["random"]["status"] == "skipped" and "admissible" in recs["random"]["reason"]
    assert recs["expert"]["status"] == "ok" and recs["expert"]["metrics"]["success_at_1"] == 1.0


def test_react_cell_with_scripted_expert_backbone(tmp_path):
    summary = _run(_cfg(tmp_path, baselines=["react"], backbones=["expert"], num_seeds=1, num_episodes=2))
    rec = CellStore(summary["output_dir"]).records()[0]
    assert rec["label"] == "react (expert)" and rec["status"] == "ok", rec.get("reason")
    assert rec["metrics"]["success_at_1"] == 1.0
    assert rec["metrics"]["tokens_per_episode"] is not None  # the backbone's usage was read


def test_killed_benchmark_process_resumes(tmp_path):
    """SIGKILL a real `echo-rl benchmark` half way; the rerun keeps finished cells byte for byte."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "echo_rl.cli", "benchmark", "--tasks", "minigrid", "--baselines", "random",
           "--num-seeds", "8", "--num-episodes", "40", "--max-steps", "100", "--output-dir", str(out),
           "--reps", "200", "--no-plots", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    store = CellStore(out)
    deadline = time.monotonic() + 120
    while len(list(store.dir.glob("*.json"))) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no cell finished within 120 s"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {p.name: p.read_bytes() for p in store.dir.glob("*.json")}
    if len(before) == 8:
        pytest.skip("every cell finished before the kill landed; nothing to resume")
    cfg = BenchmarkConfig.load_yaml(out / "config.yaml")
    summary = _run(cfg)
    assert summary["reused"] == len(before) and summary["ok"] == 8 - len(before)
    after = {p.name: p.read_bytes() for p in store.dir.glob("*.json")}
    assert len(after) == 8 and all(after[name] == data for name, data in before.items())
    assert not list(store.dir.glob(".*.tmp"))  # no torn temp files left behind as cells


@pytest.mark.slow
def test_trained_cell_runs_the_trainer(tmp_path):
    cfg = _cfg(tmp_path, baselines=["ppo"], num_seeds=1, num_episodes=4,
               echo_rl_configs={"total_timesteps": 1024, "num_actors": 4, "batch_size": 256})
    summary = _run(cfg)
    rec = CellStore(summary["output_dir"]).records()[0]
    assert rec["status"] == "ok", rec.get("reason")
    m = rec["metrics"]
    assert m["env_steps_trained"] == 1024 and m["num_episodes"] == 4 and m["wall_time_s"] > 0
    assert [p["step"] for p in rec["learning_curve"]][-1] == 1024 and len(rec["learning_curve"]) >= 2
    assert (Path(summary["output_dir"]) / "plots" / "learning_curves.png").is_file() is False  # plots off
    # a rerun keeps the finished cell: the trainer does not run again
    again = _run(cfg)
    assert again["reused"] == 1 and again["ok"] == 0


def test_cell_past_its_timeout_is_recorded_as_timeout(tmp_path):
    summary = _run(_cfg(tmp_path, baselines=["random"], num_seeds=1, evaluation_timeout=1e-9))
    rec = CellStore(summary["output_dir"]).records()[0]
    assert summary["timeout"] == 1 and rec["status"] == "timeout" and "evaluation_timeout" in rec["reason"]
    assert "metrics" not in rec  # no partial numbers stand in for the cell
