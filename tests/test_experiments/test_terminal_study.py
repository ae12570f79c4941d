"""The terminal study: its arms and settings, and the summary (pooled Wilson per level, env CE, updates to
GRPO's peak) on hand-made metrics files."""

import json
import math

import pytest

from echo_rl.experiments.terminal_report import first_reaching, moving_average, report, summarize
from echo_rl.experiments.terminal_study import parser, run_config
from echo_rl.utils.statistics import wilson_interval


def _write(root, arm, seed, before, after, train, ce=(6.0, 4.0)):
    """before/after: {level: (wins, episodes)}; train: sampled success per update."""
    def ev(cells, ce_value):
        n = sum(e for _, e in cells.values())
        row = {"eval/success_rate": sum(w for w, _ in cells.values()) / n, "eval/episodes": float(n),
               "eval/heldout_env_ce": ce_value, "eval/intercode_bash/success_rate": 0.25,
               "eval/intercode_bash/episodes": 4.0}
        for lvl, (w, e) in cells.items():
            row |= {f"eval/success_rate/{lvl}": w / e, f"eval/episodes/{lvl}": float(e),
                    f"eval/heldout_env_ce/{lvl}": ce_value + 1}
        return row

    rows = [{"step": 0, "train/updates": 0.0, **ev(before, ce[0])}]
    rows += [{"step": i, "train/updates": float(i), "episode/success_rate": s} for i, s in enumerate(train, 1)]
    rows.append({"step": 99, "train/updates": float(len(train)), **ev(after, ce[1])})
    d = root / f"{arm}-seed{seed}"
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_pools_seeds_per_level_and_times_grpos_peak(tmp_path):
    _write(tmp_path, "grpo", 0, {"level1": (2, 4), "level2": (0, 4)}, {"level1": (3, 4), "level2": (1, 4)},
           [0.0, 0.25, 0.5, 0.5])
    _write(tmp_path, "grpo", 1, {"level1": (2, 4), "level2": (0, 4)}, {"level1": (4, 4), "level2": (0, 4)},
           [0.0, 0.25, 0.5, 0.75])
    _write(tmp_path, "grpo+echo", 0, {"level1": (2, 4), "level2": (0, 4)}, {"level1": (4, 4), "level2": (4, 4)},
           [0.5, 0.5, 1.0, 1.0], ce=(6.0, 3.0))
    _write(tmp_path, "grpo+echo", 1, {"level1": (1, 4), "level2": (0, 4)}, {"level1": (4, 4), "level2": (4, 4)},
           [0.25, 0.75, 1.0, 1.0], ce=(6.0, 5.0))
    t = summarize(tmp_path, ["grpo", "grpo+echo"], [0, 1], window=2)
    assert t["levels"] == ["level1", "level2"]
    g, e = t["arms"]["grpo"], t["arms"]["grpo+echo"]
    # pooled over the two seeds: 7/8 on level 1 after RL, with Wilson's interval of 7 of 8
    assert (g["after"]["level1"]["wins"], g["after"]["level1"]["n"]) == (7, 8)
    assert g["after"]["level1"]["ci"] == wilson_interval(7, 8)
    assert (e["before"]["all"]["wins"], e["before"]["all"]["n"]) == (3, 16)
    assert e["after"]["intercode_bash"]["wins"] == 2 and e["after"]["intercode_bash"]["n"] == 8
    # env CE: mean over seeds with a t interval (3 and 5 -> 4 ± 12.706)
    mean, half = e["after"]["all"]["ce"]
    assert mean == 4.0 and half == pytest.approx(12.7062, rel=1e-4)
    assert e["after"]["level2"]["ce"][0] == 5.0
    # GRPO's mean curve 0, .25, .5, .625 -> MA2 0, .125, .375, .5625: its peak .5625 at update 4;
    # grpo+echo's mean .375, .625, 1, 1 -> MA2 .375, .5, .8125, 1: reaches it at update 3 -> 4/3 sooner
    assert t["threshold"] == pytest.approx(0.5625)
    assert (g["to_threshold"], e["to_threshold"]) == (4, 3) and e["speedup"] == pytest.approx(4 / 3)
    md = report(tmp_path, ["grpo", "grpo+echo"], [0, 1], {"updates": 4}, window=2)
    assert "| grpo+echo | level2 | 0/8 = 0.00 [0.00, 0.32] | 8/8 = 1.00 [0.68, 1.00] | +1.00 (yes) |" in md
    assert "| grpo | level1 | 4/8 = 0.50" in md and "+0.38 (no)" in md
    assert "| grpo+echo | 1/8 = 0.12" not in md and "| grpo+echo | 2 | 2/8 = 0.25 [" in md and "| 3 | 1.33× |" in md
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "study.png").is_file()


def test_missing_runs_and_an_unreached_threshold(tmp_path):
    _write(tmp_path, "grpo", 0, {"level1": (1, 2)}, {"level1": (2, 2)}, [0.5, 1.0])
    _write(tmp_path, "echo-nosft", 0, {"level1": (0, 2)}, {"level1": (0, 2)}, [0.0, 0.0])
    t = summarize(tmp_path, ["grpo", "echo-nosft", "grpo+echo"], [0], window=1)
    assert t["arms"]["echo-nosft"]["to_threshold"] is None and t["arms"]["echo-nosft"]["speedup"] is None
    assert t["arms"]["grpo+echo"]["seeds"] == 0 and t["arms"]["grpo+echo"]["curve"] == []
    assert "not reached" in report(tmp_path, ["grpo", "echo-nosft", "grpo+echo"], [0], {}, window=1)


def test_no_threshold_while_grpo_never_succeeds(tmp_path):
    _write(tmp_path, "grpo", 0, {"level1": (0, 2)}, {"level1": (0, 2)}, [0.0, 0.0])
    _write(tmp_path, "grpo+echo", 0, {"level1": (0, 2)}, {"level1": (1, 2)}, [0.0, 0.5])
    t = summarize(tmp_path, ["grpo", "grpo+echo"], [0], window=1)
    assert math.isnan(t["threshold"]) and t["arms"]["grpo+echo"]["to_threshold"] is None
    assert "undefined: GRPO's curve stays at 0" in report(tmp_path, ["grpo", "grpo+echo"], [0], {}, window=1)


def test_moving_average_and_first_reaching():
    assert moving_average([0.0, 1.0, 1.0, 0.0], 2) == [0.0, 0.5, 1.0, 0.5]
    assert first_reaching([0.1, 0.3, 0.3], 0.3) == 2 and first_reaching([0.1], 0.5) is None


def test_arms_share_settings_and_differ_as_named(tmp_path):
    args = parser().parse_args(["--out", str(tmp_path)])
    cfgs = {a: run_config(args, tmp_path, a, 1) for a in ("grpo", "grpo+echo", "echo-nosft")}
    assert cfgs["grpo"].agent == "ppo" and cfgs["grpo+echo"].agent == "echo-rl"
    e = cfgs["grpo+echo"].lm_config
    assert e.env_loss_coef == 0.05 and e.ce_normalization == "sequence" and not cfgs["grpo+echo"].echo_config.latent_plan
    assert e.sft_env_config == {"level": 1} and cfgs["grpo+echo"].env_config["level"] == 0
    assert cfgs["echo-nosft"].lm_config.sft_episodes == 0 and e.sft_episodes == args.sft_episodes
    assert e.extra_eval_env == "intercode_bash" and e.eval_every_updates == e.max_updates == args.updates
    assert {c.seed for c in cfgs.values()} == {1}


def test_a_run_still_going_is_left_out_until_it_finishes(tmp_path):
    _write(tmp_path, "grpo", 0, {"level1": (1, 4)}, {"level1": (3, 4)}, [0.5])
    d = tmp_path / "grpo-seed1"
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps({"train/updates": 0.0, "eval/success_rate": 0.0,
                                                 "eval/episodes": 4.0, "eval/success_rate/level1": 0.0,
                                                 "eval/episodes/level1": 4.0}) + "\n")
    row = summarize(tmp_path, ["grpo"], [0, 1])["arms"]["grpo"]
    assert (row["seeds"], row["finished"]) == (1, 1) and row["before"]["level1"]["n"] == 4
    only_before = summarize(tmp_path, ["grpo"], [1])["arms"]["grpo"]
    assert only_before["before"]["level1"]["n"] == 4 and only_before["finished"] == 0
