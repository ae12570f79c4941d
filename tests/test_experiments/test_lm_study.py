"""The study summary: means and t-based 95% intervals over seeds, per arm and update, paired to GRPO."""

import json
import math

import pytest

from echo_rl.experiments.lm_study import ARMS, EXTRA_ARMS, main, run_config, summarize, write_summary


def _write(root, arm, seed, rows):
    d = root / f"{arm}-seed{seed}"
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(succ, ce, train):
    return [{"step": 0, "train/updates": 0.0, "eval/success_rate": 0.0, "eval/heldout_env_ce": 7.0},
            {"step": 9, "train/updates": 1.0, "episode/success_rate": train[0]},
            {"step": 20, "train/updates": 2.0, "episode/success_rate": train[1], "eval/success_rate": succ,
             "eval/heldout_env_ce": ce}]


def test_summary_over_seeds(tmp_path):
    _write(tmp_path, "echo0.05", 0, _run(0.25, 4.0, [0.0, 0.5]))
    _write(tmp_path, "echo0.05", 1, _run(0.75, 6.0, [0.5, 0.5]))
    _write(tmp_path, "grpo", 0, _run(0.25, 7.0, [0.0, 0.0]))
    _write(tmp_path, "grpo", 1, _run(0.5, 8.0, [0.0, 0.0]))
    table = summarize(tmp_path, ["grpo", "echo0.05"], [0, 1])
    mean, half, n = table["echo0.05"][2]["success"]
    assert (mean, n) == (0.5, 2) and half == pytest.approx(12.7062 * 0.353553 / math.sqrt(2), rel=1e-4)
    # paired differences to GRPO: CE -3 and -2 -> mean -2.5; success 0 and +0.25
    d_mean, d_half, _ = table["echo0.05"][2]["d_heldout_env_ce"]
    assert d_mean == -2.5 and d_half == pytest.approx(12.7062 * 0.707107 / math.sqrt(2), rel=1e-4)
    assert table["echo0.05"][2]["d_success"][0] == 0.125 and "d_success" not in table["grpo"][2]
    # training success: mean over the updates since the previous evaluation (0.25 and 0.5 -> 0.375)
    assert table["echo0.05"][2]["train_success"][0] == 0.375 and "train_success" not in table["grpo"][0]
    write_summary(tmp_path, table, {"updates": 2})
    md = (tmp_path / "summary.md").read_text()
    assert "| echo0.05 | 2 | 0.500 ± " in md and "| -2.500 ± " in md
    assert "| grpo | 0 | 0.000 ± 0.000 |  | 7.000 ± 0.000 |" in md


def test_arms_are_real_training_configs(tmp_path):
    import argparse

    args = argparse.Namespace(task="minigrid:MiniGrid-Empty-Random-5x5-v0", max_steps=10, backbone="tiny",
                              group_size=4, groups=2, eval_episodes=16, lr=3e-4, temperature=0.7, sft_episodes=8,
                              eval_temperature=0.7, action_mode="choose",
                              sft_steps=30, heldout_pool=8, updates=60, eval_every=10)
    cfgs = {a: run_config(args, tmp_path, a, 1) for a in [*ARMS, *EXTRA_ARMS]}
    assert cfgs["grpo"].agent == "ppo" and cfgs["grpo"].text_task and cfgs["grpo"].seed == 1
    assert cfgs["echo0.01"].lm_config.env_loss_coef == 0.01 and not cfgs["echo0.01"].echo_config.latent_plan
    assert cfgs["echo0.05+plan"].echo_config.latent_plan and cfgs["echo0.05+plan"].agent == "echo-rl"
    assert {c.lm_config.max_updates for c in cfgs.values()} == {60} and cfgs["grpo"].num_actors == 8
    assert cfgs["grpo"].lm_config.eval_temperature == 0.7 and cfgs["grpo"].lm_config.action_mode == "choose"
    assert cfgs["grpo+replay"].lm_config.replay_updates == 2 and cfgs["grpo"].lm_config.replay_updates == 0
    assert cfgs["ppo-rlhf"].lm_config.objective == "ppo-rlhf" and cfgs["ppo-rlhf"].agent == "ppo"
    assert cfgs["gigpo"].lm_config.objective == "gigpo" and cfgs["gigpo"].agent == "ppo"
    both = cfgs["gigpo+echo"]
    assert both.lm_config.objective == "gigpo" and both.lm_config.env_loss_coef == 0.05 and both.agent == "echo-rl"
    args.set = ["lm_config.compute_dtype=bfloat16", "lm_config.sft_steps=4"]  # --set: every arm, typed from YAML
    cfg = run_config(args, tmp_path, "gigpo", 0)
    assert cfg.lm_config.compute_dtype == "bfloat16" and cfg.lm_config.sft_steps == 4


def test_a_bad_set_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--set", "lm_config.no_such_field=1", "--summarize-only"]) == 2
    assert main(["--out", str(tmp_path), "--set", "lm_config.sft_steps", "--summarize-only"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no_such_field" in err[0] and "field.path=value" in err[1]


def test_pooled_wilson_threshold_anchor_share_and_time(tmp_path):
    from echo_rl.experiments.lm_study import pooled

    for seed, (first, last) in enumerate([(0.25, 0.75), (0.5, 0.5)]):
        _write(tmp_path, "gigpo", seed, [
            {"train/updates": 0.0, "eval/success_rate": first, "eval/episodes": 8.0},
            {"train/updates": 1.0, "episode/success_rate": 0.5, "lm/gigpo_anchored_share": 0.2 + 0.4 * seed},
            {"train/updates": 2.0, "eval/success_rate": last, "eval/episodes": 8.0}])
        (tmp_path / f"gigpo-seed{seed}" / "timings.jsonl").write_text(
            json.dumps({"step": 4, "time/update_s": 2.0 + seed, "time/rollout_s": 1.0}) + "\n")
    _write(tmp_path, "grpo", 0, [{"train/updates": 0.0, "eval/success_rate": 0.25, "eval/episodes": 8.0}])
    pool = pooled(tmp_path, ["gigpo", "grpo"], [0, 1], threshold=0.6)
    g = pool["gigpo"]
    assert g["success"][0][:2] == (6, 16) and g["success"][2][:2] == (10, 16)
    assert g["success"][2][2:] == pytest.approx((0.3864, 0.8152), abs=1e-3)  # Wilson, 10/16: 0.601 ± 0.214
    assert g["updates_to_threshold"] == {0: 2, 1: None}  # seed 1 never reaches 0.6
    assert g["anchored_share"] == pytest.approx(0.4) and (g["update_s"], g["step_s"]) == (2.5, 3.5)
    assert pool["grpo"]["anchored_share"] is None and pool["grpo"]["updates_to_threshold"] == {0: None}
    write_summary(tmp_path, summarize(tmp_path, ["gigpo"], [0, 1]), {}, pool)
    md = (tmp_path / "summary.md").read_text()
    assert "| gigpo | 2 | 10/16 | 0.62 [0.39, 0.82] | 2, — (≥ 0.6) | 0.40 | 2.5 | 3.5 |" in md


def test_summarize_only_cli(tmp_path, capsys):
    _write(tmp_path, "grpo", 0, [{"step": 3, "train/updates": 3.0, "eval/success_rate": 1.0,
                                  "eval/heldout_env_ce": 2.0}])
    assert main(["--out", str(tmp_path), "--seeds", "0", "--arms", "grpo", "--summarize-only"]) == 0
    out = capsys.readouterr().out
    assert "| grpo | 3 | 1.000 |" in out and (tmp_path / "study.png").is_file()
    # the runs' own settings are named, not the study's defaults (they may have been launched by hand)
    assert '"summarized": ["grpo-seed0"]' in out and "minigrid" not in out.split("\n")[0]


def test_extend_copies_a_finished_run_and_raises_its_updates(tmp_path):
    from echo_rl.config import TrainingConfig
    from echo_rl.experiments.lm_study import extend

    old = tmp_path / "old" / "grpo-seed0"
    (old / "checkpoints").mkdir(parents=True)
    (old / "checkpoints" / "latest").write_text("step_1")
    (old / "summary.json").write_text("{}")
    (old / "metrics.jsonl").write_text('{"train/updates": 60.0}\n')
    TrainingConfig(env_name="alfworld", backbone="tiny", lm_config={"max_updates": 60}).save_yaml(old / "config.yaml")
    new = tmp_path / "new" / "grpo-seed0"
    new.parent.mkdir()
    assert extend(tmp_path / "old", new, 160)
    assert TrainingConfig.load_yaml(new / "config.yaml").lm_config.max_updates == 160
    assert not (new / "summary.json").exists() and (new / "metrics.jsonl").read_text() == '{"train/updates": 60.0}\n'
    assert not extend(tmp_path / "old", new, 160)  # already there: left alone (a later invocation resumes it)
    (tmp_path / "third").mkdir()
    with pytest.raises(SystemExit, match="already have 60 updates"):
        extend(tmp_path / "old", tmp_path / "third" / "grpo-seed0", 60)
