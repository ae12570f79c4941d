"""echo_rl.hub.scores holds what docs/results.md reports: every per-seed cell, and the aggregates follow."""

import re
from pathlib import Path

import numpy as np
import pytest

from echo_rl.config import ConfigError
from echo_rl.utils.statistics import aggregate_iqm, stratified_bootstrap_ci
from echo_rl.hub import scores

DOC = (Path(__file__).resolve().parents[2] / "docs" / "results.md").read_text().splitlines()
SHORT = {"DoorKey-8x8": "MiniGrid-DoorKey-8x8-v0", "KeyCorridorS3R1": "MiniGrid-KeyCorridorS3R1-v0",
         "MultiRoom-N2-S4": "MiniGrid-MultiRoom-N2-S4-v0"}


def _table_after(header_start: str, nth: int = 0) -> list[list[str]]:
    """Rows (cells stripped) of the nth markdown table whose header line starts with ``header_start``."""
    starts = [i for i, line in enumerate(DOC) if line.startswith(header_start)]
    rows, i = [], starts[nth] + 2
    while i < len(DOC) and DOC[i].startswith("|"):
        rows.append([c.strip() for c in DOC[i].strip().strip("|").split("|")])
        i += 1
    return rows


def test_every_study_of_the_document_is_in_the_hub():
    studies = [line[3:] for line in DOC if line.startswith("## ")]
    assert len(studies) == 7
    sources = " ".join(scores.load(n).data["source"] for n in scores.names())
    for anchor in ("#the-ppo-demo-recipe-across-seeds", "#measured", "#held-out-seeds", "#longer-runs",
                   "#intrinsic-rewards-on-hard-exploration", "#prompting-baselines-with-smollm2",
                   "#ppo-on-continuous-control-pendulum-and-deepmind-control",
                   "#pixel-observations-and-pre-training", "#the-real-model-trained"):
        assert anchor in sources
    for n in scores.names():
        s = scores.load(n)
        assert s.command and s.tasks and s.methods
        assert all(m.get("code_commit") or s.data.get("doc_commit") for m in s.data["methods"].values())


def test_ppo_recipe_per_seed_returns():
    study = scores.load("ppo-doorkey5x5-recipe")
    for row in _table_after("| lr (constant) |"):
        method = "ppo/lr1e-3" if row[0].startswith("1e-3") else "ppo/lr5e-4"
        doc = {int(s): float(v) for s, v in re.findall(r"(\d+): \**([0-9.]+)\**", row[2])}
        got = dict(zip(study.seeds(method), study.scores(method)[:, 0]))
        assert got == doc
        reached = sum(v >= 0.9 for v in got.values())
        assert row[1].startswith(f"{reached} of {len(got)}")


def test_ppo_continuous_control_per_seed_returns():
    study = scores.load("ppo-continuous-control")
    final, start = study.scores("ppo"), study.scores("ppo", "start_return")
    evals = study.method("ppo")["evaluations"]
    for row in _table_after("| task | seed | return at start (first 2,048 steps)"):
        i = int(row[1])
        assert row[0] == "`Pendulum-v1`" and float(row[2]) == round(start[i, 0], 1)
        assert [float(v) for v in row[3].split(" / ")] == [round(v, 1) for v in evals["Pendulum-v1"]["values"][i]]
        assert round(final[i, 0], 1) == float(row[3].split(" / ")[-1])
    [row] = _table_after("| task | seed | return at start | evaluation at 100k")
    assert row[0].startswith("`dmc:cartpole-swingup`") and float(row[2]) == round(start[0, 1], 1)
    assert [float(v) for v in row[3].split(" / ")] == [round(v, 1) for v in evals["dmc:cartpole-swingup"]["values"][0]]
    assert np.isnan(final[1:, 1]).all()  # one seed on DMC


def _cell(study, method, env_short, seed_index):
    task = SHORT[env_short]
    col = study.tasks.index(task)
    steps = study.scores(method, "steps_to_0.9")[seed_index, col]
    if steps < study.data["budgets"][task]:
        return f"{int(steps) // 1000}k"
    return f"{study.scores(method, 'success_at_last_eval')[seed_index, col]:.2f}"


@pytest.mark.parametrize("name, header_nth, seeds", [("sample-efficiency-minigrid", 0, range(0, 5)),
                                                     ("sample-efficiency-doorkey8x8-heldout", 1, range(5, 15))])
def test_sample_efficiency_per_cell_tables(name, header_nth, seeds):
    study = scores.load(name)
    rows = _table_after("| env | method | seed", header_nth)
    assert len(rows) == sum(len(study.tasks) for _ in study.methods)
    for env, method, *cells in rows:
        method = method.strip("`")
        run = study.seeds(method)
        assert [s for s, c in zip(seeds, cells) if c != "–"] == run
        assert [c for c in cells if c != "–"] == [_cell(study, method, env, i) for i in range(len(run))]
        steps = study.scores(method, "steps_to_0.9")[:, study.tasks.index(SHORT[env])]
        # exact values: the evaluation steps of the study's grid (first rollout boundary past k * 25k)
        reached = steps[steps < study.data["budgets"][SHORT[env]]]
        assert all(s % 2048 == 0 and (s - 2048) < 25_000 * np.ceil(s / 25_000) for s in reached)


@pytest.mark.parametrize("name, header_nth", [("sample-efficiency-minigrid", 0),
                                              ("sample-efficiency-doorkey8x8-heldout", 1)])
def test_sample_efficiency_aggregates_follow_from_the_cells(name, header_nth):
    """The document's IQM of steps to 0.9 (and its CI, pooled and held-out rows) from the hub's cells, with
    echo_rl.utils.statistics as the study's report computed it (50,000 resamples, seed 0)."""
    study = scores.load(name)
    rows = _table_after("| method | scope (budget) |", header_nth)
    for method, scope, seeds, reached, *_, steps_iqm, _time in rows:
        mat = study.scores(method, "steps_to_0.9")
        if "pooled" not in scope:
            env = scope.split(" (")[0]
            mat = mat[:, [study.tasks.index(SHORT[env])]]
        budgets = np.array([study.data["budgets"][t] for t in study.tasks])
        cells_reached = int((mat < (budgets if mat.shape[1] > 1 else budgets[study.tasks.index(SHORT[env])])).sum())
        assert reached == f"{cells_reached}/{mat.size}" and int(seeds) == mat.shape[0]
        point, rest = steps_iqm.split(" [")
        assert f"{aggregate_iqm(mat):,.0f}" == point
        if "pooled" in scope or header_nth == 1:
            _, ci = stratified_bootstrap_ci(mat, aggregate_iqm, reps=50_000, seed=0)
            assert f"{ci[0]:,.0f}, {ci[1]:,.0f}]" == rest


def test_lm_per_seed_curves_and_arm_means():
    study = scores.load("lm-grpo-vs-echo-400")
    rows = _table_after("| arm | seed | success 0 |")
    for arm, seed, s0, s160, s400, *_, ce0, ce400 in rows:
        steps, success = study.curves(arm, "heldout_success")
        i = study.seeds(arm).index(int(seed))
        assert list(steps) == [0, 160, 400]
        assert [f"{v:.3f}" for v in success[i]] == [s0, s160, s400]
        assert [f"{v:.2f}" for v in study.curves(arm, "heldout_env_ce")[1][i]] == [ce0, ce400]
        assert study.scores(arm, "heldout_success")[i, 0] == success[i, -1]
    # the arm table's held-out success means at updates 0, 160 and 400 are the seeds' means
    for arm, update, mean_ci, *_ in _table_after("| arm | update | held-out success |", 2):
        if arm in study.methods and int(update) in (0, 160, 400):
            steps, success = study.curves(arm, "heldout_success")
            assert f"{success[:, list(steps).index(int(update))].mean():.3f}" == mean_ci.split(" ±")[0]


def test_scores_are_arrays_for_the_statistics_module():
    study = scores.load("sample-efficiency-minigrid")
    mat = study.scores("echo-rl")
    assert mat.shape == (5, 3) and np.isfinite(mat).all()
    assert set(study.score_dict()) == set(study.methods)
    assert not np.isfinite(study.scores("echo-rl", "success_at_last_eval")).all()  # reached cells: not listed
    assert study.score_dict("success_at_last_eval").keys() == {"impala"}  # the one method that never got there
    assert scores.resolve("hub:ppo-doorkey5x5-recipe/ppo/lr5e-4")[1] == "ppo/lr5e-4"
    with pytest.raises(ConfigError, match="unknown hub study"):
        scores.load("no-such-study")
    with pytest.raises(ConfigError, match="several methods"):
        scores.resolve("hub:sample-efficiency-minigrid")
    with pytest.raises(ConfigError, match="has no method"):
        scores.resolve("hub:sample-efficiency-minigrid/dqn")
    with pytest.raises(ConfigError, match="no 'steps_to_0.9' learning curve"):
        study.curves("ppo")


def test_studies_feed_the_plots(tmp_path):
    from echo_rl.evaluation.plots import write_plots

    lm = scores.load("lm-grpo-vs-echo-400").plot_summary("heldout_success", reps=200)
    curve = lm["learning_curves"]["MiniGrid-Empty-Random-5x5-v0 (text)"]["echo0.05"]
    assert [p["step"] for p in curve[0]] == [0, 160, 400] and len(curve) == 3
    assert lm["aggregates"]["echo0.05"]["iqm"]["point"] == pytest.approx(
        float(aggregate_iqm(scores.load("lm-grpo-vs-echo-400").scores("echo0.05", "heldout_success"))))
    written = write_plots(tmp_path, lm)
    assert sorted(Path(p).name for p in written) == ["aggregate.png", "learning_curves.png"]
    se = scores.load("sample-efficiency-minigrid").plot_summary("success_at_last_eval", reps=200)
    assert set(se["aggregates"]) == {"impala"} and not se["learning_curves"]  # the only complete method


@pytest.mark.parametrize("name, nth", [("intrinsic-multiroom-n2-s4", 0), ("intrinsic-multiroom-n4-s5", 1)])
def test_intrinsic_study_per_cell_table_and_aggregates(name, nth):
    """The intrinsic-reward studies: the per-cell tables and the IQM of steps to 0.9 follow from the hub's cells."""
    study = scores.load(name)
    rows = _table_after("| method | seed 0 |", nth)
    assert [r[0] for r in rows] == study.methods
    for method, *cells in rows:
        steps = study.scores(method, "steps_to_0.9")[:, 0]
        succ = study.scores(method, "success_at_last_eval")[:, 0]
        assert cells == [f"{int(s) // 1000}k" if np.isnan(f) else f"{f:.2f}" for s, f in zip(steps, succ)]
    aggregates = _table_after("| method | seeds | reached 0.9 |", nth)
    assert [r[0] for r in aggregates] == study.methods
    for method, seeds, reached, _succ, steps_iqm, _time in aggregates:
        mat = study.scores(method, "steps_to_0.9")
        assert int(seeds) == mat.shape[0] and reached == f"{int(np.isnan(study.scores(method, 'success_at_last_eval')).sum())}/5"
        assert f"{aggregate_iqm(mat):,.0f}" == steps_iqm.split(" [")[0]
        steps, values = study.curves(method, "success_rate")
        assert values.shape == (mat.shape[0], len(steps)) and values.max() <= 1.0


def test_prompting_baselines_table_is_the_hubs_episodes():
    """Every cell of the baselines table: k/n from the hub's per-episode outcomes; unmeasured cells are null."""
    study = scores.load("prompting-baselines-smollm2")
    rows = _table_after("| Task | Method | Success@1")
    assert len(rows) == len(study.tasks) * len(study.methods)
    for task, method, cell, *_ in rows:
        rate = study.scores(method, "success_at_1")[0, study.tasks.index(task)]
        if "/" not in cell:  # not run, or timed out
            assert np.isnan(rate) and task not in study.method(method)["episodes"]
            continue
        outcomes = study.method(method)["episodes"][task]
        assert cell.startswith(f"{sum(outcomes)}/{len(outcomes)} = {rate:.2f}")


def test_pixels_and_pretraining_tables():
    """The pixel table and the pre-training table: every cell from the hub's per-seed evaluations."""
    study = scores.load("pixels-and-pretraining")
    pixel_rows = _table_after("| task | method | seed | untrained policy")
    assert len(pixel_rows) == 5
    for task, method, seed, start, final, *_ in pixel_rows:
        col, i = study.tasks.index(task.strip("`")), study.seeds(method.strip("`")).index(int(seed))
        cells = {m: study.scores(method.strip("`"), m)[i, col] for m in study.metrics}
        assert start == f"{cells['start_eval_return']:.3f} / {cells['start_eval_success']:.2f}"
        assert final == f"{cells['final_eval_return']:.3f} / {cells['final_eval_success']:.2f}"
    rows = _table_after("| arm | seed | start policy")
    assert len(rows) == sum(len(study.seeds(m)) for m in ("ppo/scratch", "ppo/rnd-pretrained"))
    for arm, seed, start, curve, final in rows:
        method = arm.strip("`")
        i = study.seeds(method).index(int(seed))
        assert start == f"{study.scores(method, 'start_eval_success')[i, 2]:.2f}"
        steps, values = study.curves(method, "success_rate")
        assert list(steps) == [10240, 20480, 30720, 40960, 51200, 61440]
        assert curve == " / ".join(f"{v:.2f}" for v in values[i])
        assert final == f"{study.scores(method)[i, 2]:.3f}" and values[i, -1] == study.scores(method, "final_eval_success")[i, 2]


def test_dmc_pixels_per_seed_returns():
    """The DMC-from-pixels table: each seed's start return and evaluations from the hub, and the states anchor."""
    study = scores.load("ppo-dmc-pixels")
    for method, header in (("ppo/nature_cnn", "| seed | return at start (first 1,024 steps), pixels"),
                           ("ppo/states", "| seed | return at start (first 1,024 steps), states")):
        rows = _table_after(header)
        evals = study.method(method)["evaluations"]["cartpole-balance"]
        start, final = study.scores(method, "start_return")[:, 0], study.scores(method)[:, 0]
        mean_action = study.scores(method, "mean_action_return")[:, 0]
        assert [int(r[0]) for r in rows] == study.seeds(method)
        for i, (_seed, start_cell, curve, mean_action_cell, _wall) in enumerate(rows):
            assert float(start_cell) == round(start[i], 1) and float(mean_action_cell) == round(mean_action[i], 1)
            assert [float(v) for v in curve.split(" / ")] == [round(v, 1) for v in evals["values"][i]]
            assert round(final[i], 1) == float(curve.split(" / ")[-1])


def test_real_model_study_per_seed_tables():
    """Both tables of "The real model trained" (MiniGrid-as-text, CRUXEval-I): every row is a hub cell, exactly
    (successes as k/64), and every hub cell is a row."""
    study = scores.load("lm-smollm2-study")
    label = {"GRPO (`--agent ppo`)": "GRPO", "GRPO + ECHO λ 0.05": "GRPO + ECHO",
             "ECHO + latent plan": "ECHO + latent plan", "PPO-RLHF (value head, GAE)": "PPO-RLHF",
             "RLAIF (SmolLM2 judge), GRPO + ECHO": "RLAIF", "LoRA r16, GRPO + ECHO": "LoRA r16, GRPO + ECHO"}
    header = "| arm | seed | after SFT: success | valid | env CE | after RL: success"
    seen = 0
    for task in range(2):
        for arm, seed, sft, sft_valid, sft_ce, rl, valid, ce, _wall, rss in _table_after(header, task):
            method = label[arm]
            i = study.seeds(method).index(int(seed))

            def cell(metric):
                return study.scores(method, metric)[i, task]

            assert sft == f"{round(cell('sft_success') * 64)}/64"
            assert rl.startswith(f"**{round(cell('heldout_success') * 64)}/64**")
            assert (sft_valid, valid) == (f"{cell('sft_valid_action_rate'):.2f}", f"{cell('valid_action_rate'):.2f}")
            assert (sft_ce, ce) == (f"{cell('sft_heldout_env_ce'):.3f}", f"{cell('heldout_env_ce'):.3f}")
            assert rss == f"{cell('peak_rss_gb'):.2f}"
            seen += 1
    arms = [m for m in study.methods if not m.startswith("ReAct")]
    assert seen == sum(np.isfinite(study.scores(m)).sum() for m in arms)
    # the anchor: ReAct with the same model on the same held-out episode seeds, one line per task
    react = study.scores("ReAct (same model, same held-out episodes)")[0]
    lines = [line for line in DOC if line.startswith("ReAct with the same model on the same 64 held-out")]
    assert [f"**{round(v * 64)}/64" in line for v, line in zip(react, lines)] == [True, True]
