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


def test_a_count_says_k_of_n_at_the_start_about_every_tenth_and_the_end_with_time_left():
    lines = []
    c = TrainingProgress(total=0, enabled=False)
    c.note = lines.append
    count = c.count("[sft]", 20, "steps", "warm start on 8 expert episodes")
    for i in range(20):
        count.advance(loss=2.0 - i / 10)
    assert lines[0] == "[sft] 0/20 steps (warm start on 8 expert episodes)"
    assert [line.split()[1] for line in lines[1:]] == [f"{k}/20" for k in (1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 20)]
    assert lines[1].startswith("[sft] 1/20 steps | loss 2.000 | 0:00 elapsed | ~")
    assert lines[-1].startswith("[sft] 20/20 steps | loss 0.100 |") and "left" not in lines[-1]


def test_the_log_gets_plain_lines_while_a_terminal_shows_the_bar(tmp_path, capsys):
    p = TrainingProgress(total=100, enabled=True)
    p.live = True
    p.open_log(tmp_path / "progress.log")
    p.note("[setup] ready")
    with p:
        for step in range(10, 101, 10):
            p.update(step, {"episode/return": 1.0}, sps=5.0, elapsed=step)
        p.evaluation(100, {"success_rate": 1.0})
    p.close_log()
    logged = [line[20:] for line in (tmp_path / "progress.log").read_text().splitlines()]
    assert logged[0] == "[setup] ready"
    assert [line.split()[1] for line in logged[1:-1]] == [f"{s}/100" for s in range(10, 101, 10)]
    assert logged[-1] == "[eval] step 100: success 1.00"
    assert "[train] 10/100 steps" not in capsys.readouterr().err  # the terminal has the bar, not the lines


def test_slow_iterations_get_a_line_each_with_updates_loss_and_time_left(capsys):
    p = TrainingProgress(total=100_000, enabled=True, line_per_iteration=True, iteration_budget=3)
    p.live = False
    for u in (1, 2, 3):
        p.update(8 * u, {"train/updates": float(u), "lm/loss": 0.5 / u}, sps=1.0, elapsed=10.0 * u)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["[train] update 1/3", "[train] update 2/3",
                                                        "[train] update 3/3"]
    assert "| 16/100,000 steps |" in lines[1] and "| loss 0.250 | ~" in lines[1] and lines[1].endswith(" left")
    assert "left" not in lines[0] and "left" not in lines[2]  # no rate yet / nothing left


def test_a_symlinked_progress_log_is_refused_and_its_target_untouched(tmp_path):
    from echo_rl.config import ConfigError

    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "progress.log").symlink_to(outside)
    cfg = TrainingConfig().with_overrides({"env_name": "minigrid", "num_actors": 2, "batch_size": 16,
                                           "total_timesteps": 16, "evaluation_episodes": 1, "save_frequency": 0,
                                           "device": "cpu"})
    with pytest.raises(ConfigError, match=r"cannot write .*progress.log: .* is a symbolic link"):
        asyncio.run(EchoRLTrainer(cfg, run, show_progress=False).train())
    assert outside.read_text() == "keep\n"


def test_the_silent_reporter_says_nothing(capsys):
    from echo_rl.training.progress import SILENT

    count = SILENT.count("[eval] step 0:", 2, "episodes")
    count.advance()
    count.advance()
    SILENT.note("[setup] x")
    assert capsys.readouterr().err == ""


def test_setup_shows_a_transient_spinner_on_a_terminal_and_nothing_elsewhere():
    import io

    from rich.console import Console

    from echo_rl.training.progress import working

    tty = io.StringIO()
    with working("[setup] loading the model", console=Console(file=tty, force_terminal=True)):
        pass
    assert "[setup] loading the model" in tty.getvalue()
    piped = io.StringIO()
    with working("[setup] loading the model", console=Console(file=piped, force_terminal=False)):
        pass
    with working("[setup] loading the model", enabled=False, console=Console(file=tty, force_terminal=True)):
        pass
    assert piped.getvalue() == ""
