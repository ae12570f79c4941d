"""benchmarks/sample_efficiency.py: the study runner's bookkeeping (budgets, provenance, aggregation, one real cell)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sample_efficiency.py"


@pytest.fixture(scope="module")
def se():
    spec = importlib.util.spec_from_file_location("sample_efficiency_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cell(method, env, seed, successes, budget=100_000, sha="a" * 64, commit="c0", every=25_000, stopped=False):
    curve = [{"step": every * (i + 1), "success_rate": s, "avg_reward": s, "wall_s": 1.0}
             for i, s in enumerate(successes)]
    return {"method": method, "env": env, "seed": seed, "total_steps": budget, "curve": curve, "wall_s": 60.0,
            "stopped_early": stopped, "agent_file": "echo_rl/vector/ppo_agent.py", "agent_file_sha256": sha,
            "git_commit": commit}


def test_steps_to_threshold_is_the_first_evaluation_at_or_above_it(se):
    curve = _cell("ppo", "E", 0, [0.1, 0.95, 0.5, 1.0])["curve"]
    assert se.steps_to_threshold(curve, 0.9, 100_000) == (50_000.0, True)
    assert se.steps_to_threshold(curve, 0.96, 100_000) == (100_000.0, True)
    assert se.steps_to_threshold(curve[:1], 0.9, 123) == (123.0, False)  # never reached: the budget, flagged


def test_budgets_parse_and_bad_items_are_one_line_errors(se):
    envs = ["MiniGrid-DoorKey-8x8-v0", "MiniGrid-MultiRoom-N2-S4-v0"]
    got = se.parse_budgets(["MiniGrid-DoorKey-8x8-v0=1000", "MiniGrid-KeyCorridorS3R1-v0=7"], envs, 50)
    assert got == {"MiniGrid-DoorKey-8x8-v0": 1000, "MiniGrid-MultiRoom-N2-S4-v0": 50}
    for bad in ("MiniGrid-DoorKey-8x8-v0", "Nope-v0=5", "MiniGrid-DoorKey-8x8-v0=0", "MiniGrid-DoorKey-8x8-v0=1e6"):
        with pytest.raises(ValueError, match="expected ENV=STEPS") as err:
            se.parse_budgets([bad], envs, 50)
        assert "\n" not in str(err.value)


def test_provenance_refuses_mixed_versions_and_unrecorded_cells(se):
    a = _cell("ppo", "E", 0, [1.0], sha="a" * 64, commit="c1")
    b = _cell("ppo", "E", 1, [1.0], sha="b" * 64, commit="c2")
    with pytest.raises(se.MixedCellsError, match="2 different versions"):
        se.check_provenance([a, b])
    assert se.check_provenance([a, b], allow_mixed=True)["ppo"]["commits"] == {"c1", "c2"}
    old = {k: v for k, v in a.items() if k != "agent_file_sha256"}
    with pytest.raises(se.MixedCellsError, match="no recorded agent source"):
        se.check_provenance([old], allow_mixed=True)


def test_summary_counts_and_iqm_match_a_hand_computed_grid(se):
    # 4 seeds on one env: steps to 0.9 = 25k, 50k, budget(100k, never), 75k; last success 1, 0.9, 0.2, 0.95
    cells = [_cell("ppo", "E", 0, [0.95, 1.0], stopped=True), _cell("ppo", "E", 1, [0.1, 0.9]),
             _cell("ppo", "E", 2, [0.1, 0.2, 0.2, 0.2]), _cell("ppo", "E", 3, [0.0, 0.5, 0.95])]
    (row,) = se.summarize(cells, reps=200)
    assert (row["seeds"], row["reached"], row["cells"], row["stopped_early"]) == (4, 3, 4, 1)
    # IQM of 4 values = mean of the middle two
    assert row["steps_to_threshold"][0] == pytest.approx((50_000 + 75_000) / 2)
    assert row["final_success"][0] == pytest.approx((0.9 + 0.95) / 2)
    lo, hi = row["final_success"][1:]
    assert lo <= row["final_success"][0] <= hi


def test_report_lists_unfinished_cells_apart_from_the_aggregates(se, tmp_path):
    for c in (_cell("ppo", "E", 0, [1.0]), _cell("ppo", "E", 1, [0.5, 1.0])):
        se._write(tmp_path / "cells" / f"{se.cell_name(c['method'], c['env'], c['seed'])}.json", c)
    se._write(tmp_path / "partial" / "echo-rl__E__0.json", _cell("echo-rl", "E", 0, [0.3]))
    table = se.report(tmp_path, None, reps=100, plot_path=tmp_path / "p.png")
    assert "| ppo | E (100k) | 2 | 2/2 |" in table
    assert "| E | `ppo` | 25k | 50k |" in table  # the per-seed table
    assert "Unfinished cells" in table and "| echo-rl | E | 0 | 25,000 / 100,000 | 0.300 | not yet |" in table
    assert (tmp_path / "p.png").stat().st_size > 0
    assert json.loads((tmp_path / "summary.json").read_text())[0]["method"] == "ppo"


def test_per_seed_table_gives_steps_where_reached_else_last_success(se):
    cells = [_cell("ppo", "E", 0, [0.1, 0.95]), _cell("ppo", "E", 2, [0.1, 0.22]),
             _cell("echo-rl", "E", 2, [0.91]), _cell("echo-rl/no-kl", "E", 0, [0.0, 0.5, 0.9])]
    header, rule, *rows = se.per_seed_table(cells)
    assert header == "| env | method | seed 0 | seed 2 |" and rule == "|---|---|---|---|"
    assert rows == ["| E | `echo-rl` | – | 25k |",  # METHODS order, then seeds that did not run as "–"
                    "| E | `ppo` | 50k | 0.22 |",
                    "| E | `echo-rl/no-kl` | 75k | – |"]


def test_a_real_cell_records_its_curve_provenance_and_stops_early(se, tmp_path):
    res = se.run_cell("ppo", "MiniGrid-Empty-5x5-v0", 0, total_steps=3 * 2048, eval_every=2048, eval_episodes=4,
                      out=str(tmp_path), early_stop=2, threshold=0.0)
    assert res["stopped_early"] and [p["step"] for p in res["curve"]] == [2048, 4096]
    saved = json.loads((tmp_path / "cells" / "ppo__MiniGrid-Empty-5x5-v0__0.json").read_text())
    assert saved["agent_file"] == "echo_rl/vector/ppo_agent.py" and len(saved["agent_file_sha256"]) == 64
    assert not (tmp_path / "partial").exists() or not any((tmp_path / "partial").iterdir())
    assert np.isfinite([p["success_rate"] for p in saved["curve"]]).all()
    # time to solve reads training seconds (evaluations excluded) and the machine
    train = [p["train_s"] for p in saved["curve"]]
    assert 0 < train[0] < train[1] <= saved["train_s"] < saved["wall_s"] + 0.1
    assert saved["cpu"] and saved["torch_threads"] == 1


def test_intrinsic_methods_are_ppo_with_the_module_and_record_its_source(se, tmp_path):
    assert all("+" not in m for m in se.DEFAULT_METHODS)  # the default study is unchanged
    cfg = se.build_config("ppo+pseudo_counts", "MiniGrid-Empty-5x5-v0", 0, 4096)
    assert (cfg.agent, cfg.intrinsic_reward) == ("ppo", "pseudo_counts")
    assert se.build_config("ppo", "MiniGrid-Empty-5x5-v0", 0, 4096).intrinsic_reward is None
    res = se.run_cell("ppo+rnd", "MiniGrid-Empty-5x5-v0", 0, total_steps=2048, eval_every=2048, eval_episodes=2,
                      out=str(tmp_path))
    assert res["intrinsic_file"] == "echo_rl/intrinsic/rnd.py" and len(res["intrinsic_file_sha256"]) == 64
    assert (tmp_path / "cells" / "ppo+rnd__MiniGrid-Empty-5x5-v0__0.json").exists()


def test_pretrained_cells_pretrain_on_the_bonus_alone_then_start_from_those_weights(se, tmp_path, monkeypatch):
    import torch

    assert not any(m in se.DEFAULT_METHODS for m in se.PRETRAINED)
    fine = se.build_config("ppo/pretrained+re3", "MiniGrid-Empty-5x5-v0", 0, 4096)
    assert (fine.agent, fine.intrinsic_reward, fine.pretraining) == ("ppo", None, False)  # fine-tuning: task reward
    fresh = se._agent("ppo", "MiniGrid-Empty-5x5-v0", 0).network.state_dict()
    weights, meta = se.pretrain("re3", "MiniGrid-Empty-5x5-v0", 0, 2048)
    assert meta["pretrain_steps"] == 2048 and meta["intrinsic_file"] == "echo_rl/intrinsic/re3.py"
    assert any(not torch.equal(weights[k], fresh[k]) for k in fresh)  # pre-training moved them
    pretrained, loaded = [], []
    real_pretrain, real_load = se.pretrain, torch.nn.Module.load_state_dict
    monkeypatch.setattr(se, "pretrain", lambda *a: pretrained.append(real_pretrain(*a)) or pretrained[-1])
    monkeypatch.setattr(torch.nn.Module, "load_state_dict",
                        lambda self, sd, *a, **k: loaded.append(sd) or real_load(self, sd, *a, **k))
    res = se.run_cell("ppo/pretrained+re3", "MiniGrid-Empty-5x5-v0", 0, total_steps=2048, eval_every=2048,
                      eval_episodes=2, out=str(tmp_path), pretrain_steps=2048)
    assert loaded[0] is pretrained[0][0]  # the fine-tuning network started from the pre-trained weights
    assert (res["pretrain_reward"], res["pretrain_steps"], res["total_steps"]) == ("re3", 2048, 2048)
    assert (tmp_path / "cells" / "ppo+pretrained+re3__MiniGrid-Empty-5x5-v0__0.json").exists()


def test_speed_times_every_method_and_names_parts_still_idle(se, capsys):
    rates = se.speed(["ppo", "echo-rl"], "MiniGrid-Empty-5x5-v0", 0, iterations=1, max_warmup=1)
    assert set(rates) == {"ppo", "echo-rl"} and all(r > 0 for r in rates.values())
    out = capsys.readouterr().out
    assert "echo-rl:" in out and "x ppo" in out
    assert "idle during timing: replay" in out  # one warm-up iteration cannot fill the replay (256 sequences)


def test_digest_is_a_function_of_the_code_and_the_seed(se):
    a = se.digest("ppo", "MiniGrid-Empty-5x5-v0", 0, iterations=1)
    assert a == se.digest("ppo", "MiniGrid-Empty-5x5-v0", 0, iterations=1) and len(a) == 64
    assert a != se.digest("ppo", "MiniGrid-Empty-5x5-v0", 1, iterations=1)


def test_shipped_echo_rl_config_is_the_studys(se):
    """configs/minigrid_doorkey8x8_echo_rl.yaml trains what the study's echo-rl DoorKey-8x8 cells trained."""
    from echo_rl.config import TrainingConfig

    shipped = TrainingConfig.load_yaml(SCRIPT.parents[1] / "configs" / "minigrid_doorkey8x8_echo_rl.yaml")
    study = se.build_config("echo-rl", "MiniGrid-DoorKey-8x8-v0", shipped.seed, shipped.total_timesteps)
    run_only = ("evaluation_frequency", "evaluation_episodes", "save_frequency")  # the study evaluates on its own
    assert shipped.replace(**{f: getattr(study, f) for f in run_only}).to_dict() == study.to_dict()
