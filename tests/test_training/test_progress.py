"""Progress lines and the run summary count steps against the budget and wall time truthfully."""

import asyncio
import json

import pytest

from echo_rl.config import TrainingConfig
from echo_rl.training.progress import TrainingProgress, WallClock, format_duration, format_eval
from echo_rl.training.trainer import EchoRLTrainer


def test_line_shows_steps_against_the_budget_and_the_average_rate(capsys):
    p = TrainingProgress(total=64, enabled=True)
    p.live = False  # plain lines (pytest's stderr is no terminal anyway)
    with p:
        p.update(66, {"episode/return": 0.5, "episode/success_rate": 0.25}, sps=1.1234, elapsed=60.0)
    err = capsys.readouterr().err
    assert "[train] 66/64 steps" in err  # past the budget: shown as it is, never hidden
    assert "1.12 steps/s avg" in err and "1:00 elapsed" in err and "success 0.25" in err


def test_plain_lines_about_every_tenth_and_at_the_end(capsys):
    p = TrainingProgress(total=100, enabled=True)
    p.live = False
    for step in range(5, 101, 5):
        p.update(step, {}, sps=10.0, elapsed=step / 10)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[1] for line in lines] == [f"{s}/100" for s in (5, 15, 25, 35, 45, 55, 65, 75, 85, 95, 100)]


def test_disabled_progress_prints_nothing(capsys):
    p = TrainingProgress(total=10, enabled=False)
    p.update(10, {}, 1.0, 1.0)
    p.evaluation(10, {"success_rate": 1.0})
    assert capsys.readouterr().err == ""


def test_evaluation_line_names_success_and_held_out_ce():
    text = format_eval(64, {"success_rate": 0.375, "avg_reward": 0.3, "episodes": 8.0, "heldout_env_ce": 2.10449,
                            "valid_action_rate": 0.5, "failed": 1.0})
    assert text == ("[eval] step 64: success 0.38 (8 episodes) | return 0.300 | valid actions 50% | "
                    "held-out env CE 2.104 | 1 failed")
    assert format_eval(0, {"success_rate": 0.0}) == "[eval] step 0: success 0.00"


def test_wall_clock_summary_rates_over_total_and_over_iterations():
    clock = WallClock(setup=2.0, start=8.0, evaluation=30.0, iterations=20.0, total=60.0)
    s = clock.summary(steps=30)
    assert s["env_steps_per_s"] == 0.5 and s["iteration_env_steps_per_s"] == 1.5
    assert s["time_s"] == {"setup": 2.0, "start": 8.0, "evaluation": 30.0, "iterations": 20.0, "total": 60.0}
    assert WallClock().summary(0)["env_steps_per_s"] == 0.0
    assert format_duration(3725) == "1:02:05" and format_duration(59.6) == "1:00"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_vector_run_summary_counts_all_wall_time(tmp_path, capsys):
    cfg = TrainingConfig().with_overrides({"env_name": "minigrid", "num_actors": 2, "batch_size": 16,
                                           "total_timesteps": 40, "evaluation_episodes": 2,
                                           "evaluation_frequency": 32, "save_frequency": 0, "device": "cpu"})
    result = asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=True).train())
    assert result.total_timesteps == 48  # whole updates of batch_size: 3 x 16
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    t = summary["time_s"]
    assert summary["timestep_budget"] == 40 and summary["total_timesteps"] == 48
    assert t["total"] >= t["setup"] + t["start"] + t["evaluation"] + t["iterations"] - 1e-3
    assert summary["env_steps_per_s"] == pytest.approx(48 / t["total"], rel=1e-2)
    assert summary["iteration_env_steps_per_s"] >= summary["env_steps_per_s"]
    err = capsys.readouterr().err
    assert "[train] 48/40 steps" in err and "[eval] step 48: success" in err  # the final evaluation


def test_live_bar_prints_the_eval_line_literally(capsys):
    p = TrainingProgress(total=64, enabled=True)
    p.live = True  # the rich bar, as on a terminal
    with p:
        p.evaluation(32, {"success_rate": 0.5, "heldout_env_ce": 1.0})
        p.update(66, {}, sps=1.0, elapsed=1.0)
    assert "[eval] step 32: success 0.50 | held-out env CE 1.000" in capsys.readouterr().err  # not eaten as markup
    assert p._progress.tasks[0].completed == 66  # past the budget: shown as it is
