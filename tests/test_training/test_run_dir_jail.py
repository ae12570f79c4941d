"""A run directory is a jail: paths stay inside it, symlinks are not followed, only regular files are read, each
within a size cap, npz members are checked before they inflate, and YAML aliases are bounded. Each refusal is one
line (CLI: exit 2) and nothing stored is lost."""

import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import yaml

from echo_rl import EchoRLTrainer, TrainingConfig
from echo_rl.config import ConfigError
from echo_rl.utils import state_codec
from echo_rl.training.run_dir import RunDirectory
from echo_rl.utils import jail as jail_mod
from echo_rl.utils.jail import Jail, JailError, check_npz
from echo_rl.utils.monitoring import JsonlLogger
from tests.trained_run import trained_run_fixtures

TINY = dict(env_name="minigrid:MiniGrid-Empty-5x5-v0", total_timesteps=256, num_actors=4, batch_size=128,
            evaluation_frequency=256, evaluation_episodes=2, save_frequency=128)
STEPS = ["step_000000000128", "step_000000000256"]
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))


@pytest.fixture(autouse=True)
def _run_key_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ECHO_RL_HOME", str(tmp_path / "home"))


trained, run = trained_run_fixtures(TINY, symlinks=True)


def _resume(run, *extra, timeout=240):
    r = subprocess.run([sys.executable, "-m", "echo_rl.cli", "train", "--resume", "--run-dir", str(run),
                        "--no-progress", *extra], capture_output=True, text=True, timeout=timeout, env=os.environ)
    return r


def _one_line(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    for needle in needles:
        assert needle in r.stderr, r.stderr


def _tree(path):
    return sorted((str(p.relative_to(path)), p.read_bytes() if p.is_file() else b"") for p in path.rglob("*"))


def _set_config(run, **changes):
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg.update(changes)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))


# -- writes stay inside --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["absolute", "dotdot", "symlink"])
def test_a_checkpoint_dir_outside_the_run_is_refused_and_deletes_nothing(run, tmp_path, where):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run / "checkpoints", elsewhere)  # another run's checkpoints: resumable, so the old code went on
    (elsewhere / "step_000000000001").mkdir()
    before = _tree(elsewhere)
    if where == "symlink":
        shutil.rmtree(run / "checkpoints")
        (run / "checkpoints").symlink_to(elsewhere)
        needle = "is a symlink"
    else:
        _set_config(run, checkpoint_dir=str(elsewhere) if where == "absolute" else "../elsewhere")
        needle = "TrainingConfig.checkpoint_dir"
    _set_config(run, keep_checkpoints=1, total_timesteps=384)
    _one_line(_resume(run), needle)
    assert _tree(elsewhere) == before


@pytest.mark.parametrize("name", ["metrics.jsonl", "timings.jsonl"])
def test_a_symlinked_log_is_neither_rewritten_nor_created_outside(run, tmp_path, name):
    outside, dangling = tmp_path / "outside.jsonl", tmp_path / "nowhere" / "made.jsonl"
    outside.write_text('{"step": 999, "x": 1}\n')
    (run / name).unlink()
    (run / name).symlink_to(outside)
    _one_line(_resume(run), name, "symlink")
    assert outside.read_text() == '{"step": 999, "x": 1}\n'
    (run / name).unlink()
    dangling.parent.mkdir()
    (run / name).symlink_to(dangling)
    _one_line(_resume(run), name, "symlink")
    assert not dangling.exists()


def test_a_resume_after_a_kill_past_the_final_checkpoint_adds_no_second_evaluation_row(run):
    """The run finished: final evaluation logged, final checkpoint written, then killed before summary.json."""
    (run / "summary.json").unlink()
    before = (run / "metrics.jsonl").read_text()
    result = asyncio.run(EchoRLTrainer(TrainingConfig(**TINY), run_dir=run, resume=True, show_progress=False).train())
    rows = JsonlLogger.read(run / "metrics.jsonl")
    final = [r for r in rows if r["step"] == 256 and any(k.startswith("eval/") for k in r)]
    assert len(final) == 1 and (run / "metrics.jsonl").read_text() == before
    assert result.evaluation_results["success_rate"] == final[0]["eval/success_rate"]
    assert json.loads((run / "summary.json").read_text())["evaluation_results"] == result.evaluation_results


# -- reads: regular files only, bounded ------------------------------------------------------------------------------
def test_a_fifo_rollout_json_never_hangs_resume(run):
    for step in STEPS:
        path = run / "checkpoints" / step / "rollout.json"
        path.unlink()
        os.mkfifo(path)
    _one_line(_resume(run, timeout=120), "rollout.json is a FIFO")


def test_rollout_json_and_latest_pointing_at_dev_zero_are_refused(run):
    for step in STEPS:
        path = run / "checkpoints" / step / "rollout.json"
        path.unlink()
        path.symlink_to("/dev/zero")
    _one_line(_resume(run, timeout=120), "rollout.json is a symlink")
    (run / "checkpoints" / "latest").unlink()
    (run / "checkpoints" / "latest").symlink_to("/dev/zero")
    _one_line(_resume(run, timeout=120), "latest is a symlink")
    r = subprocess.run([sys.executable, "-m", "echo_rl.cli", "eval", "--run-dir", str(run), "--episodes", "1"],
                       capture_output=True, text=True, timeout=120)
    _one_line(r, "latest is a symlink")


def test_files_over_their_cap_are_refused_before_they_are_read(tmp_path, monkeypatch):
    monkeypatch.setitem(jail_mod.CAPS, "json", 100)
    (tmp_path / "big.json").write_text("[" + "0," * 100 + "0]")
    with pytest.raises(JailError, match="over the 100 bytes cap for a json file"):
        Jail(tmp_path).read_bytes("big.json", "json")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(JailError, match="is a FIFO"):
        Jail(tmp_path).open_append("fifo")  # O_NONBLOCK: no reader, yet no hang
    with pytest.raises(JailError, match="is a FIFO"):
        Jail(tmp_path).read_bytes("fifo", "json")


def _npz_with_member(name: str, header_shape: tuple, data: bytes) -> bytes:
    """An npz whose member's npy header declares ``header_shape`` uint8 but holds ``data``."""
    npy = io.BytesIO()
    np.lib.format.write_array_header_1_0(npy, {"descr": "|u1", "fortran_order": False, "shape": header_shape})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(name + ".npy", npy.getvalue() + data)
    return buf.getvalue()


def test_an_npz_bomb_is_refused_before_it_inflates(tmp_path, monkeypatch):
    state_codec.write(tmp_path, {"x": np.zeros(4)})
    buf = io.BytesIO()
    np.savez_compressed(buf, a0=np.zeros(8 * 2**20, np.uint8))  # 8 MiB of zeros: about 8 KB compressed
    assert len(buf.getvalue()) < 2**16
    (tmp_path / "rollout.npz").write_bytes(buf.getvalue())
    monkeypatch.setitem(jail_mod.CAPS, "npz", 2**20)
    with pytest.raises(JailError, match=r"rollout.npz would inflate to 8.0 MiB, over the 1.0 MiB cap"):
        state_codec.read(tmp_path)
    monkeypatch.undo()
    # a header that claims more than its member holds (numpy would allocate the claimed shape first)
    (tmp_path / "rollout.npz").write_bytes(_npz_with_member("a0", (2**40,), b"\0" * 16))
    with pytest.raises(JailError, match="member a0.npy declares 1024.0 GiB of data in"):
        state_codec.read(tmp_path)
    check_npz(_npz_with_member("ok", (16,), b"\0" * 16))  # an honest one passes


def test_a_damaged_metrics_line_is_one_line_and_nothing_is_truncated(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 9}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl line 2 is not a JSON object"):
        JsonlLogger("metrics.jsonl", Jail(tmp_path)).open(truncate_after_step=1)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\nnot json\n{"step": 9}\n'


# -- the jail's own rules --------------------------------------------------------------------------------------------
def test_paths_that_leave_the_directory_are_refused(tmp_path):
    for bad in ("/etc/passwd", "../x", "a/../../x", "", "."):
        with pytest.raises(JailError, match="relative path inside the run directory"):
            Jail(tmp_path).read_bytes(bad, "json")


def test_writes_replace_a_symlink_never_its_target(tmp_path):
    (tmp_path / "target").write_text("keep")
    root = tmp_path / "root"
    root.mkdir()
    (root / "summary.json").symlink_to(tmp_path / "target")
    Jail(root).write_atomic("summary.json", "{}")
    assert (tmp_path / "target").read_text() == "keep" and not (root / "summary.json").is_symlink()
    (root / "sub").symlink_to(tmp_path)
    with pytest.raises(JailError, match="sub is a symlink"):
        Jail(root).write_atomic("sub/x", "no")
    assert not (tmp_path / "x").exists()


def test_old_checkpoints_are_pruned_without_following_symlinks(tmp_path):
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "state.pt").write_bytes(b"x")  # the old code listed (and loaded) it as a checkpoint
    run = RunDirectory(tmp_path / "run", TrainingConfig(env_name="minigrid", keep_checkpoints=1))
    run.create()
    (run.checkpoint_dir / "step_000000000000").symlink_to(outside)  # sorts first: the old code's rmtree target
    run.save_checkpoint(1, {"w": 1}, {"x": 1})
    run.save_checkpoint(2, {"w": 2}, {"x": 2})
    assert (outside / "keep").is_dir()
    assert [p.name for p in run.checkpoints()] == ["step_000000000002"]


def test_learning_curve_and_tracking_state_are_written_inside(tmp_path):
    run = RunDirectory(tmp_path / "run", TrainingConfig(env_name="minigrid"))
    run.create()
    (tmp_path / "target.png").write_bytes(b"keep")
    (run.path / "learning_curve.png").symlink_to(tmp_path / "target.png")
    run.plot_learning_curve([{"step": 1, "episode/return": 0.5}])
    assert (tmp_path / "target.png").read_bytes() == b"keep"
    assert (run.path / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"


# -- YAML ----------------------------------------------------------------------------------------------------------
def test_a_yaml_alias_bomb_is_one_line(tmp_path, run):
    assert len(BOMB) < 1024
    path = tmp_path / "bomb.yaml"
    path.write_text("env_name: minigrid\nenv_config:\n" + "".join("  " + ln + "\n" for ln in BOMB.splitlines()))
    with pytest.raises(ConfigError, match="aliases expand to more than 100,000 nodes"):
        TrainingConfig.load_yaml(path)
    with pytest.raises(ConfigError, match="refers to its own anchor"):
        TrainingConfig().with_overrides({"env_config": "&a {x: *a}"})
    text = (run / "config.yaml").read_text().replace("env_config: {}\n", "")
    (run / "config.yaml").write_text(text + "env_config:\n" + "".join("  " + ln + "\n" for ln in BOMB.splitlines()))
    _one_line(_resume(run, timeout=120), "config.yaml is not valid YAML", "aliases expand")
