"""benchmarks/time_to_solve.py: seconds to the first evaluation >= 0.9, its aggregates and the interleaved order."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_solve.py"


@pytest.fixture(scope="module")
def tts():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("time_to_solve_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cell(method, env, seed, points, train_s, budget=100_000, every=25_000):
    """``points``: (success, training seconds so far) per evaluation."""
    curve = [{"step": every * (i + 1), "success_rate": s, "avg_reward": s, "wall_s": t + 5.0, "train_s": t}
             for i, (s, t) in enumerate(points)]
    return {"method": method, "env": env, "seed": seed, "total_steps": budget, "curve": curve, "wall_s": 99.0,
            "train_s": train_s, "agent_file": "x.py", "agent_file_sha256": "a" * 64, "git_commit": "c0",
            "cpu": "Test CPU (2 CPUs)", "torch_threads": 1}


def test_time_is_the_training_seconds_at_the_first_solving_evaluation_else_the_budgets_flagged(tts):
    solved = _cell("ppo", "E", 0, [(0.1, 10.0), (0.92, 21.5), (0.5, 30.0), (1.0, 40.0)], train_s=40.0)
    assert tts.time_to_threshold(solved, 0.9) == (21.5, True)  # training seconds, not wall_s (evaluations)
    never = _cell("ppo", "E", 1, [(0.1, 10.0), (0.8, 20.0)], train_s=20.7)
    assert tts.time_to_threshold(never, 0.9) == (20.7, False)  # the whole budget's time, flagged
    old = {k: v for k, v in solved.items() if k != "train_s"}
    with pytest.raises(ValueError, match="no training time"):
        tts.time_to_threshold(old, 0.9)


def test_steps_per_second_reads_the_last_evaluation_and_the_training_time(tts):
    cell = _cell("ppo", "E", 0, [(0.1, 10.0), (0.5, 20.0)], train_s=25.0)
    assert tts.steps_per_second(cell) == pytest.approx(50_000 / 25.0)


def test_pooled_and_per_env_iqm_solved_counts_and_ratio_to_ppo(tts):
    # PPO: env A 4 seeds at 100, 200, 300, never (400 s); env B seeds at 50, 60, 70, 80 s.
    cells = [_cell("ppo", "A", s, [(1.0, t)] if ok else [(0.0, t)], train_s=t)
             for s, (t, ok) in enumerate([(100.0, True), (200.0, True), (300.0, True), (400.0, False)])]
    cells += [_cell("ppo", "B", s, [(1.0, t)], train_s=t + 1) for s, t in enumerate([50.0, 60.0, 70.0, 80.0])]
    cells += [_cell("echo-rl", e, s, [(0.95, 0.5 * t)], train_s=t) for e in "AB" for s, t in
              enumerate([100.0, 200.0, 300.0, 400.0])]
    rows = {(r["method"], r["scope"]): r for r in tts.summarize_times(cells, reps=200)}
    pooled = rows[("ppo", "all")]
    assert (pooled["solved"], pooled["cells"], pooled["seeds"]) == (7, 8, [0, 1, 2, 3])
    # IQM of the 8 pooled times: drop the two lowest (50, 60) and two highest (300, 400) -> mean of 70, 80, 100, 200
    assert pooled["time_to_threshold_s"][0] == pytest.approx(np.mean([70, 80, 100, 200]))
    lo, hi = pooled["time_to_threshold_s"][1:]
    assert lo <= pooled["time_to_threshold_s"][0] <= hi
    assert rows[("ppo", "A")]["time_to_threshold_s"][0] == pytest.approx(250.0)  # IQM of 100..400: mean of 200, 300
    echo = rows[("echo-rl", "all")]
    assert echo["solved"] == 8 and echo["time_to_threshold_s"][0] == pytest.approx(125.0)
    ratio, lo, hi = echo["ratio_to_ppo"]
    assert ratio == pytest.approx(125.0 / 112.5) and lo <= ratio <= hi and lo < hi
    assert rows[("ppo", "all")]["ratio_to_ppo"][0] == pytest.approx(1.0)
    assert rows[("echo-rl", "B")]["ratio_to_ppo"][0] == pytest.approx(125.0 / 65.0)  # per env: B's IQMs
    assert echo["cpus"] == ["Test CPU (2 CPUs)"] and echo["threads"] == [1]


def test_pooled_rows_use_only_the_seeds_every_env_has(tts):
    cells = [_cell("ppo", "A", s, [(1.0, 10.0 * (s + 1))], train_s=99.0) for s in range(3)]
    cells += [_cell("ppo", "B", 1, [(1.0, 5.0)], train_s=99.0)]
    cells += [_cell("echo-rl", "A", s, [(1.0, 5.0)], train_s=99.0) for s in range(2)]  # seeds 0, 1 only
    rows = {(r["method"], r["scope"]): r for r in tts.summarize_times(cells, reps=100)}
    assert rows["ppo", "all"]["seeds"] == [1] and rows["ppo", "all"]["cells"] == 2
    assert rows["ppo", "A"]["seeds"] == [0, 1, 2]
    assert rows["echo-rl", "all"]["envs"] == ["A"]  # its one env: PPO's row for A has seeds 0-2, so no ratio
    assert rows["echo-rl", "all"]["ratio_to_ppo"] is None


def test_tables_flag_unsolved_cells_and_name_the_cpu(tts, tmp_path):
    import json

    cells = [_cell("ppo", "MiniGrid-DoorKey-8x8-v0", 0, [(0.2, 30.0)], train_s=31.0),
             _cell("echo-rl", "MiniGrid-DoorKey-8x8-v0", 0, [(0.95, 12.0)], train_s=12.0)]
    (tmp_path / "cells").mkdir()
    for c in cells:
        (tmp_path / "cells" / f"{c['method']}__{c['env']}__0.json").write_text(json.dumps(c))
    text = tts.report(tmp_path, reps=100)
    assert "CPU: Test CPU (2 CPUs); torch threads per process: 1" in text
    assert "| DoorKey-8x8 | `ppo` | 31 s (not solved) |" in text
    assert "| DoorKey-8x8 | `echo-rl` | 12 s |" in text
    assert "| `echo-rl` | DoorKey-8x8 (0) | 1/1 | 12 s [12, 12] | 0.39x [0.39, 0.39] |" in text
    assert (tmp_path / "time_to_solve.json").exists()


def test_interleaved_order_alternates_methods_and_reverses_them_every_other_seed(tts):
    order = tts.interleaved(["ppo", "echo-rl"], ["A", "B"], [0, 1])
    assert order == [("ppo", "A", 0), ("echo-rl", "A", 0), ("ppo", "B", 0), ("echo-rl", "B", 0),
                     ("echo-rl", "A", 1), ("ppo", "A", 1), ("echo-rl", "B", 1), ("ppo", "B", 1)]


def test_cli_refuses_bad_input_with_one_line_and_exit_code_2(tts, tmp_path, capsys):
    assert tts.main(["run", "--out", str(tmp_path), "--envs", "MiniGrid-Nope-v0"]) == 2
    assert tts.main(["run", "--out", str(tmp_path), "--early-stop", "0"]) == 2
    assert tts.main(["report", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("time_to_solve: error: ") for line in err)
    assert "--early-stop=0 is invalid" in err[1] and "no finished cells" in err[2]
