"""Run directories hold no pickles, opening one never runs its code, and bad ones give one-line errors."""

import builtins
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from echo_rl import TrainingConfig
from echo_rl.environments.minigrid_vector import make_vector_env, restore_vector_env, snapshot_vector_env
from echo_rl.utils import state_codec
from echo_rl.training.run_dir import CheckpointError, RunDirectory
from tests.trained_run import trained_run_fixtures

TINY = dict(env_name="minigrid:MiniGrid-Empty-5x5-v0", total_timesteps=512, num_actors=4, batch_size=128,
            evaluation_frequency=512, evaluation_episodes=2, save_frequency=128)
STEPS = ["step_000000000256", "step_000000000384", "step_000000000512"]


@pytest.fixture(autouse=True)
def _run_key_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ECHO_RL_HOME", str(tmp_path / "home"))  # never the user's real run key


trained, run = trained_run_fixtures(TINY)


def _cli(*args, home=None):
    env = {**os.environ, "ECHO_RL_HOME": str(home or os.environ["ECHO_RL_HOME"])}
    return subprocess.run([sys.executable, "-m", "echo_rl.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def _one_line_error(r, needle):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr, r.stderr


class _Payload:
    """Unpickling this creates ``marker``: proof that a file's code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


def _malicious_pickle(marker) -> bytes:
    return pickle.dumps(_Payload(marker))


def _ckpts(run):
    return sorted((run / "checkpoints").glob("step_*"))


# -- the format --------------------------------------------------------------------------------------------------
def test_checkpoints_hold_no_pickles(trained):
    ckpts = _ckpts(trained)
    assert [c.name for c in ckpts] == STEPS
    for ckpt in ckpts:
        assert sorted(p.name for p in ckpt.iterdir()) == ["rollout.json", "rollout.npz", "state.pt"]
        torch.load(ckpt / "state.pt", weights_only=True)
        with np.load(ckpt / "rollout.npz", allow_pickle=False) as z:
            assert len(z.files) > 0
        assert '"$pickle"' not in (ckpt / "rollout.json").read_text()
        assert '"minigrid-json/1"' in (ckpt / "rollout.json").read_text()


@pytest.mark.parametrize("task", ["minigrid:MiniGrid-DoorKey-5x5-v0", "minigrid:MiniGrid-LavaGapS5-v0",
                                  "minigrid:MiniGrid-Dynamic-Obstacles-5x5-v0"])
def test_env_snapshot_through_the_codec_continues_exactly(task, tmp_path):
    envs = make_vector_env(task, 2)
    rng = np.random.default_rng(0)
    envs.reset(seed=[3, 4])
    for _ in range(23):
        envs.step(rng.integers(0, 7, 2))
    state_codec.write(tmp_path, snapshot_vector_env(envs))
    signed = (tmp_path / "rollout.sig").exists()
    assert signed == ("Dynamic-Obstacles" in task)  # its obstacle list is more than the JSON format holds
    other = restore_vector_env(state_codec.read(tmp_path))
    for _ in range(150):  # across episode ends: autoreset draws from the restored np_random
        a = rng.integers(0, 7, 2)
        for x, y in zip(envs.step(a)[:4], other.step(a)[:4]):
            np.testing.assert_array_equal(x, y)
    envs.close()
    other.close()


def test_opaque_parts_need_this_users_signature(tmp_path, monkeypatch):
    value = {"frac": Fraction(1, 3), "blob": b"\x00\x01", "arr": np.arange(3, dtype=np.int16), "t": (1, 2.5, "x")}
    state_codec.write(tmp_path, value)
    assert (tmp_path / "rollout.sig").exists() and oct(state_codec.key_path().stat().st_mode & 0o777) == "0o600"
    back = state_codec.read(tmp_path)
    assert back["frac"] == Fraction(1, 3) and back["blob"] == b"\x00\x01" and back["t"] == (1, 2.5, "x")
    assert back["arr"].dtype == np.int16 and back["arr"].tolist() == [0, 1, 2]
    monkeypatch.setenv("ECHO_RL_HOME", str(tmp_path / "elsewhere"))  # another machine: no key
    with pytest.raises(state_codec.UntrustedState, match="does not exist here"):
        state_codec.read(tmp_path)
    state_codec._key(create=True)  # another user's key
    with pytest.raises(state_codec.UntrustedState, match="not signed with this user's run key"):
        state_codec.read(tmp_path)


def test_crafted_rollout_json_with_a_pickle_is_refused_unsigned(tmp_path):
    marker = tmp_path / "pwned"
    _write_crafted(tmp_path, marker)
    with pytest.raises(state_codec.UntrustedState, match="no rollout.sig"):
        state_codec.read(tmp_path)
    (tmp_path / "rollout.sig").write_text("0" * 64 + "\n")  # forged
    state_codec._key(create=True)
    with pytest.raises(state_codec.UntrustedState):
        state_codec.read(tmp_path)
    assert not marker.exists()


def _write_crafted(ckpt: Path, marker) -> None:
    """A new-format rollout whose tree is a pickle that writes ``marker``."""
    for name in ("rollout.json", "rollout.npz", "rollout.sig", "rollout.pkl"):
        (ckpt / name).unlink(missing_ok=True)
    (ckpt / "rollout.json").write_text(json.dumps({"format": "echo-rl-rollout", "version": 1,
                                                   "tree": {"$pickle": "a0"}}))
    buf = io.BytesIO()
    np.savez(buf, a0=np.frombuffer(_malicious_pickle(marker), np.uint8))
    (ckpt / "rollout.npz").write_bytes(buf.getvalue())


# -- a malicious run directory ----------------------------------------------------------------------------------------
def test_old_format_malicious_rollout_pkl_never_runs(run, tmp_path):
    marker = tmp_path / "pwned"
    for ckpt in _ckpts(run):
        for name in ("rollout.json", "rollout.npz"):
            (ckpt / name).unlink()
        (ckpt / "rollout.pkl").write_bytes(_malicious_pickle(marker))
    r = _cli("train", "--resume", "--run-dir", run, "--no-progress")
    _one_line_error(r, "written by an older echo-rl: its rollout.pkl is a pickle, which is never loaded")
    assert not marker.exists()
    r = _cli("eval", "--run-dir", run, "--episodes", "1")  # weights only: works, never opens rollout files
    assert r.returncode == 0 and json.loads(r.stdout)["checkpoint"] == STEPS[-1], r.stderr
    assert not marker.exists()


def test_crafted_new_format_rollout_never_runs(run, tmp_path):
    marker = tmp_path / "pwned"
    for ckpt in _ckpts(run):
        _write_crafted(ckpt, marker)
    r = _cli("train", "--resume", "--run-dir", run, "--no-progress")
    _one_line_error(r, "rollout state refused: it holds pickled data but no rollout.sig")
    assert not marker.exists()


# -- one-line errors (item 5) -------------------------------------------------------------------------------------
def test_corrupt_state_pt_is_one_line(run):
    for ckpt in _ckpts(run):
        (ckpt / "state.pt").write_bytes(b"PK\x03\x04 not a checkpoint")
    _one_line_error(_cli("train", "--resume", "--run-dir", run, "--no-progress"), "state.pt is unreadable")
    _one_line_error(_cli("eval", "--run-dir", run, "--episodes", "1"), "state.pt is unreadable")


def test_truncated_rollout_is_one_line(run):
    for ckpt in _ckpts(run):
        data = (ckpt / "rollout.npz").read_bytes()
        (ckpt / "rollout.npz").write_bytes(data[: len(data) // 2])
    _one_line_error(_cli("train", "--resume", "--run-dir", run, "--no-progress"), "rollout state is unreadable")


@pytest.mark.parametrize("damage", ["truncated json", "json of another shape", "missing npz", "unknown class"])
def test_damaged_rollout_files_are_a_checkpoint_error(run, damage):
    ckpt = _ckpts(run)[-1]
    text = (ckpt / "rollout.json").read_text()
    if damage == "truncated json":
        (ckpt / "rollout.json").write_text(text[: len(text) // 2])
    elif damage == "json of another shape":
        (ckpt / "rollout.json").write_text(json.dumps({"format": "echo-rl-rollout", "version": 1, "tree": {"$x": 1}}))
    elif damage == "missing npz":
        (ckpt / "rollout.npz").unlink()
    else:
        (ckpt / "rollout.json").write_text(text.replace('"VectorRolloutCollector"', '"Popen"'))
    with pytest.raises(CheckpointError) as e:
        RunDirectory.load_checkpoint(ckpt)
    assert "\n" not in str(e.value) and "rollout state is unreadable" in str(e.value)


def test_run_dir_that_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    _one_line_error(_cli("train", "--resume", "--run-dir", f), "is a file, not a run directory")
    _one_line_error(_cli("train", "--task", TINY["env_name"], "--timesteps", "8", "--run-dir", f),
                    f"run directory {f} is a file")


def test_eval_of_a_missing_run_dir_names_run_dir(tmp_path):
    r = _cli("eval", "--run-dir", tmp_path / "nope")
    _one_line_error(r, "--run-dir")
    assert "--resume" not in r.stderr and "no such run directory" in r.stderr


def test_run_dir_under_proc():
    _one_line_error(_cli("train", "--task", TINY["env_name"], "--timesteps", "8", "--run-dir", "/proc/echo_rl_run"),
                    "cannot write the run directory /proc/echo_rl_run")


def test_read_only_run_dir(run, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        shutil.copytree(run, ro / "run")
        for p in sorted((ro / "run").rglob("*"), reverse=True) + [ro / "run", ro]:
            p.chmod(0o555 if p.is_dir() else 0o444)
    elif (subprocess.run(["mount", "--bind", str(run), str(ro)], capture_output=True).returncode != 0 or
          subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode != 0):
        subprocess.run(["umount", str(ro)], capture_output=True)
        pytest.skip("cannot make a read-only mount here")
    target = ro / "run" if os.geteuid() != 0 else ro
    try:
        _one_line_error(_cli("train", "--resume", "--run-dir", target, "--no-progress"),
                        "cannot write the run directory")
        r = _cli("eval", "--run-dir", target, "--episodes", "1")  # evaluation only reads
        assert r.returncode == 0, r.stderr
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=True)
        else:
            for p in [ro, *ro.rglob("*")]:
                p.chmod(0o755 if p.is_dir() else 0o644)


# -- fallback ------------------------------------------------------------------------------------------------------
def test_corrupt_latest_falls_back_to_an_older_checkpoint_and_resumes_exactly(run):
    metrics = (run / "metrics.jsonl").read_text()
    (run / "checkpoints" / STEPS[-1] / "state.pt").write_bytes(b"garbage")
    r = _cli("train", "--resume", "--run-dir", run, "--no-progress")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "skipped 1 newer checkpoint(s)" in lines[0] and f"loaded {STEPS[1]}" in lines[0], lines
    assert (run / "metrics.jsonl").read_text() == metrics  # 384 -> 512 again, through the JSON env snapshots


def test_eval_falls_back_too_and_missing_latest_pointer_is_fine(run):
    (run / "checkpoints" / "latest").unlink()
    (run / "checkpoints" / STEPS[-1] / "state.pt").write_bytes(b"")  # empty: a disk-full write
    r = _cli("eval", "--run-dir", run, "--episodes", "1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["checkpoint"] == STEPS[1]
    assert len(r.stderr.strip().splitlines()) == 1 and "skipped 1 newer" in r.stderr


def test_checkpoints_order_and_load_without_rollout(run):
    rd = RunDirectory(run, TrainingConfig(**TINY))
    assert [p.name for p in rd.checkpoints()] == STEPS[::-1]
    payload, rollout = rd.load_checkpoint(rd.checkpoints()[0], rollout=False)
    assert payload["step"] == 512 and rollout is None


def test_echo_agent_rollout_state_through_the_codec_is_exact(tmp_path):
    """The EchoRL agent's envs, windows, replay and self-imitation buffer survive rollout.json/.npz exactly."""
    from echo_rl.vector.echo import EchoAgent

    cfg = TrainingConfig(env_name="minigrid", agent="echo-rl", num_actors=2, batch_size=32, total_timesteps=1000)
    cfg = cfg.with_overrides({"planning_config.embedding_dim": 8, "planning_config.state_window_size": 3,
                              "echo_config.sequence_length": 8, "echo_config.replay_batch_sequences": 2,
                              "echo_config.hidden_dim": 16, "replay_config.min_experiences": 2,
                              "replay_config.age_threshold": 16, "replay_config.max_replay_age": 64,
                              "ppo_config.batch_size": 16, "ppo_config.num_epochs": 1})
    make = lambda: EchoAgent(cfg, make_vector_env(cfg.env_name, 2, max_steps=10), torch.device("cpu"))  # noqa: E731
    a = make()
    for _ in range(3):
        a.train_iteration()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    rollout = a.rollout_state()
    assert rollout.replay_npz is not None and rollout.sil is not None  # small enough to be carried
    state_codec.write(tmp_path, rollout)
    assert not (tmp_path / "rollout.sig").exists()  # plain data only: portable, nothing to sign
    b = make()
    b.load_state_dict(torch.load(buf, weights_only=True))
    b.load_rollout_state(state_codec.read(tmp_path))
    for _ in range(2):
        assert a.train_iteration() == b.train_iteration()
    a.close()
    b.close()


def test_resume_may_change_the_budget_only(tmp_path):
    """--timesteps and lm_config.max_updates extend a run, keep_checkpoints frees disk; any other change is one
    line naming it."""
    from echo_rl.cli import build_parser
    from echo_rl.commands.train import build_config
    from echo_rl.config import ConfigError

    run = tmp_path / "run"
    run.mkdir()
    TrainingConfig(env_name="minigrid", backbone="tiny", lm_config={"max_updates": 12}).save_yaml(run / "config.yaml")
    parse = build_parser().parse_args
    cfg = build_config(parse(["train", "--resume", "--run-dir", str(run), "--timesteps", "999",
                              "--set", "lm_config.max_updates=24", "--set", "keep_checkpoints=1"]))
    assert cfg.total_timesteps == 999 and cfg.lm_config.max_updates == 24 and cfg.backbone == "tiny"
    assert cfg.keep_checkpoints == 1
    for bad in (["--set", "lm_config.learning_rate=1"], ["--seed", "3"]):
        with pytest.raises(ConfigError, match="only the budget .* may change") as err:
            build_config(parse(["train", "--resume", "--run-dir", str(run), *bad]))
        assert "\n" not in str(err.value) and ("lm_config.learning_rate" in str(err.value) or "seed" in str(err.value))


def test_a_checkpoint_write_that_fails_midway_is_one_line_and_keeps_the_last_one(tmp_path, monkeypatch):
    """A full disk surfaces from torch.save as a RuntimeError of its zip writer, not an OSError: the same one line,
    no half-written directory, the previous checkpoint still the latest."""
    from echo_rl.config import ConfigError

    run = RunDirectory(tmp_path / "run", TrainingConfig(env_name="minigrid"))
    run.create()
    first = run.save_checkpoint(8, {"w": torch.zeros(2)}, None)

    def full_disk(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 403671104 vs 403671056")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(ConfigError, match=r"cannot write a checkpoint in .*: the write failed \(\[enforce fail") as err:
        run.save_checkpoint(16, {"w": torch.ones(2)}, None)
    assert "\n" not in str(err.value) and f"{first.name} is kept" in str(err.value) and "MiB free" in str(err.value)
    assert [p.name for p in run.checkpoint_dir.iterdir() if p.name.startswith(".tmp")] == []
    assert run.latest_checkpoint() == first


@pytest.mark.parametrize("keep", [1, 3])
def test_a_run_keeps_its_newest_keep_checkpoints(tmp_path, keep):
    run = RunDirectory(tmp_path / "run", TrainingConfig(env_name="minigrid", keep_checkpoints=keep))
    run.create()
    for step in range(8, 48, 8):
        run.save_checkpoint(step, {"w": torch.full((2,), float(step))}, None)
    assert [p.name for p in run.checkpoints()] == [f"step_{s:012d}" for s in (40, 32, 24)[:keep]]
    assert float(run.load_checkpoint(run.latest_checkpoint())[0]["state"]["w"][0]) == 40.0
