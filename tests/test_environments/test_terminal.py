"""Terminal tasks: the sandboxed shell, Harbor-layout tasks, the env contract, the generator's oracle."""

import json
import os
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env

from echo_rl.config import ConfigError
from echo_rl.environments.registry import make_env, task_spec
from echo_rl.environments.terminal.env import TERMINAL_FORMAT, TerminalEnvironment
from echo_rl.environments.terminal.generator import (HELD_OUT_TEMPLATES, TEMPLATES, build_task, split_of,
                                                      task_keys)
from echo_rl.environments.terminal.shell import Limits, ShellSession, episode_uid
from echo_rl.environments.terminal.task import TaskError, TerminalTask, load_task, split_commands
from echo_rl.environments.tool_calls import TERMINAL_TOOLS, stop_strings




@pytest.fixture
def shell(sandbox_ok, tmp_path):
    uid = episode_uid()
    work = tmp_path / "work"
    work.mkdir()
    if os.geteuid() == 0:
        os.chown(work, uid, uid)
    with ShellSession(work, limits=Limits(command_timeout=1.5, output_chars=200), uid=uid) as s:
        yield s


def run_oracle(env, index):
    env.reset(options={"task_index": index})
    for _ in range(env.max_steps):
        obs, reward, term, trunc, info = env.step(env.expert_action())
        if term or trunc:
            return reward, info
    raise AssertionError("the oracle did not end the episode")


def test_one_shell_keeps_cwd_variables_and_background_jobs(shell):
    assert shell.run("mkdir d && sleep 30 &").exit_code == 0  # the job starts in the background
    assert shell.run("while [ ! -d d ]; do sleep 0.01; done; cd d; Y=1").exit_code == 0
    out = shell.run("pwd; echo $((Y + 1)); jobs | wc -l")
    assert out.output == "/app/d\n2\n1\n" and out.exit_code == 0
    assert shell.run("false").exit_code == 1
    assert shell.run("cat").output == ""  # stdin is /dev/null: a command never reads the next one


def test_output_is_cut_with_a_marker_and_non_utf8_escaped(shell):
    out = shell.run(r"printf 'caf\xc3\xa9 \xff\xfe\n'")
    assert out.output == "café \\xff\\xfe\n"
    long = shell.run("seq 1 100000")
    assert long.output.startswith("1\n2\n") and "output cut" in long.output and len(long.output) < 400
    assert long.exit_code == 0


def test_timeout_and_exit_restart_the_shell_but_keep_files(shell):
    shell.run("echo kept > f; cd /tmp; Z=1")
    out = shell.run("sleep 20")
    assert out.timed_out and out.exit_code is None and "timed out after 1.5 s" in out.output
    after = shell.run("pwd; cat /app/f; echo ${Z:-unset}")
    assert after.output == "/app\nkept\nunset\n"
    assert "the shell exited" in shell.run("exit 7").output
    assert shell.run("echo back").output == "back\n"


def test_each_result_names_the_working_directory_on_one_line(shell):
    assert shell.run("true").cwd == "/app" and shell.run("mkdir -p d/e; cd d/e").cwd == "/app/d/e"
    odd = shell.run("cd /app; mkdir \"$(printf 'x\\ny')\"; cd x*")  # a newline in a name: quoted, one line
    assert odd.cwd == "$'/app/x\\ny'" and odd.exit_code == 0 and odd.output == ""
    assert shell.run("echo next").output == "next\n"  # the status line was read whole: nothing leaks
    assert shell.run("sleep 20").cwd == "/app" and shell.last_cwd == "/app"  # a restarted shell starts over


def test_generator_has_levels_splits_and_held_out_templates():
    assert len(TEMPLATES) >= 8 and {lvl for lvl, _ in TEMPLATES.values()} == {1, 2, 3}
    train, test = task_keys("train"), task_keys("test")
    assert len(train) >= 1000 and not set(train) & set(test)
    assert len(HELD_OUT_TEMPLATES) >= 2 and not {t for t, _ in train} & set(HELD_OUT_TEMPLATES)
    assert {t for t, _ in test} == set(TEMPLATES)  # held-out instances of every template, plus whole templates
    assert build_task("csv_totals", 7) == build_task("csv_totals", 7)  # the same task on every machine
    assert {split_of(t, i) for t, i in task_keys("all", level=1, per_template=50)} == {"train", "test"}


def test_oracle_scores_one_on_every_template(sandbox_ok):
    tasks = [build_task(t, 3 + k) for k, t in enumerate(TEMPLATES)]  # the full check: benchmarks/terminal_bench.py
    env = TerminalEnvironment(tasks=tasks)
    try:
        for k, task in enumerate(tasks):
            reward, info = run_oracle(env, k)
            assert reward == 1.0 and info["won"], (task.name, info["verifier"])
    finally:
        env.close()


def test_episode_contract_warning_output_submit_and_verifier(sandbox_ok):
    env = TerminalEnvironment(tasks=[build_task("write_line", 0)])
    obs, info = env.reset(seed=0)
    assert obs == env.tasks[0].instruction and [s.role for s in info["segments"]] == ["env_output"]
    obs, reward, term, trunc, info = env.step("just talking")
    assert [s.role for s in info["segments"]] == ["warning"] and "no tool call found" in obs and not term
    obs, reward, term, trunc, info = env.step("Let me look.\n<bash>ls; false</bash>")
    assert [s.role for s in info["segments"]] == ["env_output"] and obs == "[exit code 1]\n"
    assert info["exit_code"] == 1 and reward == 0.0
    obs, reward, term, trunc, info = env.step("<submit></submit>")
    assert term and reward == 0.0 and not info["won"] and info["verifier"]["detail"] == "test.sh exited 1"
    assert env.step("<bash>ls</bash>")[2]  # over: a warning, nothing runs
    assert env._episode_dir is None  # the episode's directory is gone
    env.close()


def test_the_anchor_state_is_the_working_directory_and_the_last_output(sandbox_ok):
    assert task_spec("terminal").anchor_state == "state_key" == task_spec("intercode_bash").anchor_state
    env = TerminalEnvironment(tasks=[build_task("write_line", 0)])
    _, info = env.reset(seed=0)
    start = info["state_key"]
    assert start == "cwd=/app\n"
    keys = [env.step(a)[4]["state_key"] for a in ("<bash>mkdir -p a b</bash>", "<bash>cd a</bash>", "oops",
                                                  "<bash>cd ../b</bash>", "<bash>cd ..</bash>")]
    assert keys[0] == start  # no output, same directory: the same state, though the text says nothing new
    assert keys[1] == keys[2] == "cwd=/app/a\n"  # a bad tool call changes no state
    assert keys[3] == "cwd=/app/b\n" != keys[1] and keys[4] == start
    assert env.step("<bash>echo hi</bash>")[4]["state_key"] == "cwd=/app\nhi\n"
    assert isinstance(env.step("<submit></submit>")[4]["state_key"], str)  # the last step has one too
    env.close()


def test_max_turns_end_the_episode_and_the_verifier_still_scores(sandbox_ok):
    env = TerminalEnvironment(tasks=[build_task("make_dir", 1)], max_steps=2)
    env.reset(seed=0)
    assert env.step("hello")[3] is False  # a warning turn counts towards max_steps
    obs, reward, term, trunc, info = env.step(env.expert_action())
    assert trunc and not term and reward == 1.0 and info["won"]  # the work was done: verified without submit
    env.close()


def test_registered_task_spec_and_contract(sandbox_ok):
    spec = task_spec("terminal")
    assert spec.reply_format is TERMINAL_FORMAT and TERMINAL_FORMAT.stop == stop_strings()
    assert TERMINAL_FORMAT.parser == "tool_call" and TERMINAL_FORMAT.tools == TERMINAL_TOOLS
    assert "<bash>COMMAND</bash>" in TERMINAL_FORMAT.system_prompt() and spec.eval_config == {"split": "test"}
    env = make_env("terminal", split="test", level=2, instances_per_template=5)
    assert {t.metadata["level"] for t in env.tasks} == {2}
    check_env(env, skip_render_check=True)
    assert env.system_prompt().startswith(env._task.instruction.strip())
    assert [t.schema()["function"]["name"] for t in env.tools] == ["bash", "submit"]
    env.close()
    with pytest.raises(ConfigError, match="no such task directory"):
        make_env("terminal", task_dir="/nonexistent/tasks")


def test_split_commands_keeps_multi_line_constructs_whole():
    script = ("#!/bin/bash\nset -euo pipefail\n# make files\nmkdir -p out\nfor f in a b; do\n  touch out/$f\ndone\n"
              "cat > out/c <<'EOF'\nline\nEOF\necho a \\\n  b\n")
    assert split_commands(script) == ["mkdir -p out", "for f in a b; do\n  touch out/$f\ndone",
                                      "cat > out/c <<'EOF'\nline\nEOF", "echo a \\\n  b"]


def write_harbor_task(root: Path, reward_style: str) -> Path:
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "solution").mkdir()
    (root / "instruction.md").write_text("Append the line 'done' to /app/data.txt.\n")
    (root / "task.toml").write_text('version = "1.0"\n[metadata]\ndifficulty = "easy"\n[verifier]\ntimeout_sec = 30.0\n'
                                    '[agent]\ntimeout_sec = 120.0\n[environment]\nmemory = "512M"\ncpus = 1\n'
                                    '[echo_rl]\nmax_turns = 5\ncommand_timeout_sec = 4\n')
    (root / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /app\nCOPY data.txt /app/data.txt\nENV GREETING=hello\n"
        "RUN echo \"$GREETING\" >> data.txt && \\\n    chmod 644 data.txt\n")
    (root / "environment" / "data.txt").write_text("start\n")
    check = "[ \"$(cat /app/data.txt)\" = \"$(printf 'start\\nhello\\ndone')\" ]"
    if reward_style == "reward.txt":
        test = f"if {check}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    else:
        test = f"{check} || exit 1\n"
    (root / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    (root / "solution" / "solve.sh").write_text("#!/bin/bash\necho done >> /app/data.txt\n")
    return root


@pytest.mark.parametrize("reward_style", ["reward.txt", "exit code"])
def test_harbor_task_directory_runs_unchanged(sandbox_ok, tmp_path, reward_style):
    root = write_harbor_task(tmp_path / "append-done", reward_style)
    task = load_task(root)
    assert (task.workdir, task.max_turns, task.limits.command_timeout, task.limits.memory_mb) == ("/app", 5, 4, 512)
    assert task.env == {"GREETING": "hello"} and task.verifier_timeout == 30.0
    env = TerminalEnvironment(task_dir=str(root))
    assert run_oracle(env, 0)[0] == 1.0
    env.reset(options={"task_index": 0})
    assert env.step("<bash>cat data.txt; echo $GREETING</bash>")[0] == "start\nhello\nhello\n"
    assert env.step("<submit>x</submit>")[1] == 0.0
    env.close()
    written = build_task("find_key", 2).write(tmp_path / "gen")
    assert load_task(written).solution == build_task("find_key", 2).solution


@pytest.mark.parametrize("toml, words", [
    ('[environment]\ndocker_image = "ubuntu:24.04"\n', "cannot run here"),
    ("[echo_rl]\nmax_turns = 0\n", "max_turns=0 is invalid"),
    ("[echo_rl]\nturns = 3\n", "unknown \\[echo_rl\\] key"),
    ('[environment]\nmemory = "lots"\n', "memory='lots' is invalid"),
    ("[echo_rl\n", "not valid TOML"),
])
def test_bad_task_toml_is_one_clear_error(tmp_path, toml, words):
    root = write_harbor_task(tmp_path / "t", "exit code")
    (root / "task.toml").write_text(toml)
    with pytest.raises(TaskError, match=words):
        load_task(root)


def test_unsupported_dockerfile_and_bad_workdir_are_refused(tmp_path):
    root = write_harbor_task(tmp_path / "t", "exit code")
    (root / "environment" / "Dockerfile").write_text("FROM x\nHEALTHCHECK NONE\nCOPY https://example.com/f /app/\n")
    with pytest.raises(TaskError, match="only COPY/ADD of files"):
        load_task(root)
    with pytest.raises(TaskError, match="workdir/cwd '/usr/x' is invalid"):
        TerminalTask("t", "i", "", {}, "", workdir="/usr/x")


def test_reward_file_forms(tmp_path):
    from echo_rl.environments.terminal.verify import read_reward

    assert read_reward(tmp_path, 0) == 1.0 and read_reward(tmp_path, 1) == 0.0
    (tmp_path / "reward.json").write_text(json.dumps({"reward": 0.25}))
    assert read_reward(tmp_path, 1) == 0.25
    (tmp_path / "reward.txt").write_text("nan\n")
    assert read_reward(tmp_path, 0) == 0.0


def test_verifier_copy_keeps_times_skips_fifos_and_drops_escaping_links(tmp_path):
    from echo_rl.environments.terminal.verify import copy_workdir

    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "old.txt").write_text("x")
    os.utime(src / "d" / "old.txt", (1_600_000_000, 1_600_000_000))
    os.mkfifo(src / "pipe")  # reading it would block the host forever
    os.symlink("d/old.txt", src / "inside")
    os.symlink("/usr/bin/env", src / "tool")
    os.symlink("/tests/expected", src / "out")
    os.symlink("/etc/shadow", src / "host")
    dropped = copy_workdir(src, tmp_path / "copy", "/app", None)
    copy = tmp_path / "copy"
    assert sorted(dropped) == ["host", "out"] and sorted(os.listdir(copy)) == ["d", "inside", "tool"]
    assert (copy / "d" / "old.txt").stat().st_mtime == 1_600_000_000 and (copy / "inside").read_text() == "x"


def test_plain_layout_setup_sh_and_solution_sh(sandbox_ok, tmp_path):
    root = tmp_path / "sum"
    (root / "tests").mkdir(parents=True)
    (root / "instruction.md").write_text("Write the sum of the numbers in nums.txt to sum.txt.\n")
    (root / "setup.sh").write_text("printf '3\\n4\\n5\\n' > nums.txt\n")
    (root / "tests" / "test.sh").write_text('[ "$(cat /app/sum.txt)" = 12 ] && echo 1 > /logs/verifier/reward.txt\n')
    (root / "solution.sh").write_text("#!/bin/bash\nset -e\ncat nums.txt\npaste -sd+ nums.txt | bc > sum.txt\n")
    env = TerminalEnvironment(task_dir=str(root))
    assert env.tasks[0].workdir == "/app" and env.tasks[0].max_turns == 16
    assert run_oracle(env, 0)[0] == 1.0
    env.close()


def test_terminal_quick_start_config_trains_end_to_end(sandbox_ok, tmp_path, capsys):
    """configs/lm_smollm2_terminal.yaml, shrunk to the tiny model: warm start on oracle episodes, one GRPO + ECHO
    update on tool-call replies, held-out evaluation; the run directory records it."""
    from echo_rl.cli import main

    config = Path(__file__).parents[2] / "configs" / "lm_smollm2_terminal.yaml"
    small = ["backbone=tiny", "evaluation_episodes=2", "lm_config.sft_episodes=4", "lm_config.sft_steps=2",
             "lm_config.sft_batch_episodes=2", "lm_config.max_updates=1", "lm_config.group_size=2", "num_actors=2",
             "batch_size=2", "lm_config.heldout_pool=2"]
    args = ["train", "--config", str(config), "--run-dir", str(tmp_path / "run")]
    for item in small:
        args += ["--set", item]
    assert main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    update = next(r for r in rows if r.get("train/updates") == 1.0 and "lm/loss" in r)
    assert update["lm/tokens_action"] > 0 and "sft/loss" in update and update["lm/lambda"] == 0.05
    assert "eval/heldout_env_ce" in rows[0] and "eval/success_rate" in rows[-1]
    assert "[sft]" in capsys.readouterr().err
