"""`echo-rl report RUN_DIR... --against hub:STUDY/METHOD`: the statistics of the runs against the published seeds."""

import json

import numpy as np
import pytest

from echo_rl.cli import main
from echo_rl.config import TrainingConfig
from echo_rl.utils.statistics import aggregate_iqm, probability_of_improvement
from echo_rl.hub import scores


def _run(tmp_path, name, env, evals):
    """A training run directory with the given evaluations [(step, success, avg_reward)]."""
    run = tmp_path / name
    run.mkdir()
    TrainingConfig(env_name=env).save_yaml(run / "config.yaml")
    rows = [{"step": s, "eval/success_rate": sr, "eval/avg_reward": r} for s, sr, r in evals]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    return str(run)


def test_final_return_against_the_ppo_recipe(tmp_path, capsys):
    runs = [_run(tmp_path, f"s{i}", "minigrid:MiniGrid-DoorKey-5x5-v0", [(30000, 0.2, 0.1), (149504, 1.0, r)])
            for i, r in enumerate([0.97, 0.965, 0.99])]
    out = tmp_path / "cmp.json"
    assert main(["report", *runs, "--against", "hub:ppo-doorkey5x5-recipe/ppo/lr5e-4", "--reps", "2000",
                 "--output", str(out)]) == 0
    text = capsys.readouterr().out
    r = json.loads(out.read_text())
    published = scores.load("ppo-doorkey5x5-recipe").scores("ppo/lr5e-4")
    assert r["runs"]["scores"] == [0.97, 0.965, 0.99]
    assert r["published"]["iqm"] == pytest.approx(float(aggregate_iqm(published)))
    poi = float(probability_of_improvement(np.array([[0.97], [0.965], [0.99]]), published))
    assert r["probability_of_improvement"]["point"] == pytest.approx(poi) and poi == 1.0
    assert "P(a run beats a published one) = 1.000" in text


def test_steps_to_threshold_is_lower_better_and_uses_the_budget(tmp_path):
    env = "minigrid:MiniGrid-MultiRoom-N2-S4-v0"
    fast = _run(tmp_path, "fast", env, [(26624, 0.95, 0.8)])
    never = _run(tmp_path, "never", env, [(250000, 0.4, 0.3)])
    out = tmp_path / "cmp.json"
    assert main(["report", fast, never, "--against", "hub:sample-efficiency-minigrid/ppo", "--reps", "500",
                 "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["metric"] == "steps_to_0.9" and r["higher_is_better"] is False
    assert r["runs"]["scores"] == [26624.0, 250000.0]  # never reached: the study's budget for this env
    published = scores.load("sample-efficiency-minigrid").scores("ppo")[:, 2]
    poi = float(probability_of_improvement(-np.array([[26624.0], [250000.0]]), -published[:, None]))
    assert r["probability_of_improvement"]["point"] == pytest.approx(poi)


@pytest.mark.parametrize("against, needle", [
    ("hub:nope", "unknown hub study"),
    ("ppo-doorkey5x5-recipe", "give hub:STUDY[/METHOD]"),
    ("hub:sample-efficiency-minigrid/ppo", "has no task 'MiniGrid-DoorKey-5x5-v0'"),
])
def test_bad_comparisons_are_one_line(tmp_path, capsys, against, needle):
    run = _run(tmp_path, "r", "minigrid:MiniGrid-DoorKey-5x5-v0", [(1000, 1.0, 0.9)])
    assert main(["report", run, "--against", against]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_a_run_without_evaluations_is_one_line(tmp_path, capsys):
    run = _run(tmp_path, "r", "minigrid:MiniGrid-DoorKey-5x5-v0", [])
    assert main(["report", run, "--against", "hub:ppo-doorkey5x5-recipe/ppo/lr5e-4"]) == 2
    assert "has no evaluation yet" in capsys.readouterr().err
