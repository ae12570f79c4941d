"""Cell metrics, report statistics from stored cells, and the `echo-rl report` / `benchmark` commands."""

import numpy as np
import pytest

from echo_rl.cli import main
from echo_rl.utils import statistics as st
from echo_rl.evaluation.benchmark import BenchmarkConfig, EchoRLBenchmark, load_run
from echo_rl.evaluation.metrics import cell_metrics
from echo_rl.evaluation.records import CellOutcome, CellStore, EpisodeRecord
from echo_rl.evaluation.report import summarize, write_report


def test_cell_metrics_from_episodes():
    eps = [EpisodeRecord(True, 1.0, 4, 2.0, tokens=300, prompt_tokens=200, kv_reused_tokens=150, cost_usd=0.01),
           EpisodeRecord(False, 0.0, 10, 3.0, tokens=700, prompt_tokens=600, kv_reused_tokens=50, cost_usd=0.03)]
    m = cell_metrics(CellOutcome(episodes=eps), {"wall_time_s": 6.0, "cpu_time_s": 7200.0}, cpu_hour_usd=0.5,
                     gpu_hour_usd=9.0)
    assert m["success_at_1"] == 0.5 and m["avg_reward"] == 0.5 and m["avg_episode_length"] == 7
    assert m["tokens_per_episode"] == 500 and m["etps"] == pytest.approx(1000 / 5.0)
    assert m["kv_reuse"] == pytest.approx(200 / 800)
    assert m["api_cost_usd"] == pytest.approx(0.04) and m["compute_cost_usd"] == pytest.approx(1.0)
    assert m["cost_per_success"] == pytest.approx(1.04)
    assert m["env_steps_per_s"] == pytest.approx(14 / 5.0)


def test_unpriced_api_calls_make_cost_unknown_not_zero():
    eps = [EpisodeRecord(True, 1.0, 1, 1.0, tokens=10, cost_usd=None)]
    m = cell_metrics(CellOutcome(episodes=eps), {"wall_time_s": 1.0, "cpu_time_s": 1.0}, 0.05, 2.5)
    assert m["cost_usd"] is None and m["cost_per_success"] is None
    eps = [EpisodeRecord(False, 0.0, 5, 1.0)]
    m = cell_metrics(CellOutcome(episodes=eps), {"wall_time_s": 1.0, "cpu_time_s": 1.0}, 0.05, 2.5)
    assert m["tokens_per_episode"] is None and m["etps"] is None and m["cost_per_success"] is None


def test_aggregate_only_outcome_needs_episode_count():
    with pytest.raises(ValueError, match="num_episodes"):
        cell_metrics(CellOutcome(success_rate=0.5), {}, 0.05, 2.5)
    m = cell_metrics(CellOutcome(success_rate=0.25, num_episodes=8, mean_reward=0.2), {"cpu_time_s": 36.0}, 1.0, 0)
    assert m["successes"] == 2 and m["cost_per_success"] == pytest.approx(0.005)


def _record(bench, task, method, seed, success, status="ok"):
    fp = next(pc.fingerprint for pc in bench.plan() if (pc.cell.task, pc.cell.method, pc.cell.seed) ==
              (task, method, seed))
    rec = {"task": task, "method": method, "backbone": "-", "seed": seed, "label": method, "status": status,
           "fingerprint": fp}
    if status == "ok":
        rec["metrics"] = cell_metrics(CellOutcome(success_rate=success, num_episodes=10),
                                      {"wall_time_s": 1.0, "cpu_time_s": 1.0}, 0.05, 0.0)
    else:
        rec["reason"] = "RuntimeError: boom"
    return rec


@pytest.fixture
def run_dir(tmp_path):
    cfg = BenchmarkConfig(tasks=["minigrid", "arc"], baselines=["random", "expert"], num_seeds=3,
                          output_dir=str(tmp_path), bootstrap_reps=1000)
    cfg.save_yaml(tmp_path / "config.yaml")
    bench = EchoRLBenchmark(cfg)
    store = CellStore(tmp_path)
    a = {"minigrid": [0.1, 0.3, 0.2], "arc": [0.0, 0.1, 0.0]}
    b = {"minigrid": [0.9, 1.0, 0.8], "arc": [0.7, 0.6, 0.9]}
    for task in a:
        for seed in range(3):
            store.save(_record(bench, task, "random", seed, a[task][seed]))
            # expert's arc seed 2 failed: its aggregate may only cover minigrid
            store.save(_record(bench, task, "expert", seed, b[task][seed],
                               status="failed" if (task, seed) == ("arc", 2) else "ok"))
    return tmp_path, a, b


def test_summary_statistics_from_cells(run_dir):
    path, a, b = run_dir
    config, records = load_run(path)
    s = summarize(config, records, seed=0)
    row = next(r for r in s["rows"] if r["task"] == "minigrid" and r["label"] == "random")
    point, ci = st.stratified_bootstrap_ci(np.array([[v] for v in a["minigrid"]]), st.aggregate_mean, 1000, 0.95, 0)
    assert row["success_at_1"] == {"point": pytest.approx(point), "low": ci[0], "high": ci[1]}
    agg = s["aggregates"]
    assert agg["random"]["tasks"] == ["minigrid", "arc"]
    m = np.array([a["minigrid"], a["arc"]]).T
    assert agg["random"]["iqm"]["point"] == pytest.approx(st.aggregate_iqm(m))
    assert agg["expert"]["tasks"] == ["minigrid"]  # arc is incomplete for expert
    poi = s["probability_of_improvement"][0]
    assert (poi["x"], poi["y"], poi["tasks"]) == ("random", "expert", ["minigrid"]) and poi["point"] == 0.0
    partial = next(r for r in s["rows"] if r["task"] == "arc" and r["label"] == "expert")
    assert partial["status"] == "partial" and partial["seeds_ok"] == 2


def test_report_command_regenerates(run_dir, capsys):
    path, _, _ = run_dir
    assert main(["report", str(path), "--reps", "500"]) == 0
    md = (path / "report.md").read_text()
    assert "| arc | expert | 0.650 [" in md and "| 2/3 |" in md
    assert "RuntimeError: boom" in md
    for name in ("success_by_task", "aggregate", "performance_profile"):
        assert (path / "plots" / f"{name}.png").is_file()
    assert not (path / "plots" / "learning_curves.png").exists()  # no trained method: nothing to draw
    before = (path / "results.csv").read_text()
    write_report(path, *load_run(path), plots=False)
    assert (path / "results.csv").read_text() == before
    # a cell left by a run with other settings (another fingerprint) stays out of the tables
    stale = CellStore(path).records()[0]
    stale.update(seed=7, fingerprint="other-settings")
    CellStore(path).save(stale)
    write_report(path, *load_run(path), plots=False)
    assert (path / "results.csv").read_text() == before


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    assert main(["benchmark", "--tasks", "minigrid", "webshopp", "--output-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown task 'webshopp'" in err and "webshop" in err
    assert not (tmp_path / "r").exists()
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert main(["benchmark", "--set", "num_seeds=0"]) == 2
    assert "num_seeds=0" in capsys.readouterr().err


def test_cli_set_reaches_nested_method_overrides(capsys):
    from echo_rl.cli import build_parser
    from echo_rl.commands.benchmark import build_config

    args = build_parser().parse_args(["benchmark", "--tasks", "minigrid", "--baselines", "ppo", "random",
                                      "--train-timesteps", "4096", "--set", "echo_rl_configs.ppo.num_actors=4",
                                      "--set", "echo_rl_configs.ppo.batch_size=256", "--set", "num_seeds=2"])
    cfg = build_config(args)
    assert cfg.num_seeds == 2 and cfg.baselines == ["ppo", "random"]
    assert cfg.training_overrides("ppo") == {"total_timesteps": 4096, "num_actors": 4, "batch_size": 256}
    # values are checked as the trainer would check them, before any cell runs
    assert main(["benchmark", "--tasks", "minigrid", "--baselines", "ppo",
                 "--set", "echo_rl_configs.ppo.num_actors=3"]) == 2
    assert "multiple of num_actors=3" in capsys.readouterr().err


def test_cli_dtype_and_backbone_config_reach_the_config(capsys):
    from echo_rl.cli import build_parser
    from echo_rl.commands.benchmark import build_config

    parse = build_parser().parse_args
    assert build_config(parse(["benchmark", "--dtype", "bfloat16"])).backbone_config == {"dtype": "bfloat16"}
    cfg = build_config(parse(["benchmark", "--set", "backbone_config.max_context=512", "--dtype", "float32"]))
    assert cfg.backbone_config == {"dtype": "float32", "max_context": 512}
    assert main(["benchmark", "--set", "backbone_config.dtyp=bfloat16"]) == 2
    assert "unknown field backbone_config.dtyp" in capsys.readouterr().err
    assert main(["eval", "--run-dir", "runs/x", "--dtype", "bfloat16"]) == 2
    assert "--dtype are for text-task prompting agents" in capsys.readouterr().err


def test_episodes_the_harness_could_not_run_are_named_in_the_report(run_dir):
    """An errored episode (env start, backbone) counts as a failure in Success@1; the report says how many."""
    path, _, _ = run_dir
    store = CellStore(path)
    rec = next(r for r in store.records() if (r["task"], r["method"], r["seed"]) == ("minigrid", "random", 1))
    rec["notes"] = {"num_episode_errors": 3, "episode_errors": ["OSError: [Errno 28] No space left on device"]}
    store.save(rec)
    write_report(path, *load_run(path), plots=False)
    md = (path / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| minigrid | random |"))
    assert "(3 episodes errored)" in row
    assert "minigrid, random: 3 episodes errored" in md and "No space left on device" in md
    other = next(line for line in md.splitlines() if line.startswith("| minigrid | expert |"))
    assert "errored" not in other
    assert EchoRLBenchmark._describe(rec).endswith("(3 episodes errored, counted as failures)")
