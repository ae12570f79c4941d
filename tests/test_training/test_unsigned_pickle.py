"""Pickled bytes are unpickled only when Signed: an env snapshot or Ray worker state spelled as plain data in
``rollout.json`` (a uint8 array, a numpy bytes scalar) is refused with one line, never run, and nothing stored
is lost."""

import asyncio
import builtins
import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from echo_rl import EchoRLTrainer, TrainingConfig
from echo_rl.environments.minigrid_vector import make_vector_env, restore_env, restore_vector_env, snapshot_vector_env
from echo_rl.utils import state_codec

TINY = dict(env_name="minigrid:MiniGrid-Empty-5x5-v0", total_timesteps=256, num_actors=2, batch_size=64,
            evaluation_frequency=256, evaluation_episodes=1, save_frequency=128)


@pytest.fixture(autouse=True)
def _run_key_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ECHO_RL_HOME", str(tmp_path / "home"))  # never the user's real run key


class _Payload:
    """Unpickling this creates ``marker``: proof that the bytes ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


def _blob_node(kind: str, payload: bytes, arrays: dict) -> dict:
    key = f"x{len(arrays)}"
    arrays[key] = np.frombuffer(payload, np.uint8) if kind == "$array" else np.asarray(np.bytes_(payload))
    return {kind: key}


def _write(directory: Path, tree, arrays: dict) -> None:
    (directory / "rollout.json").write_text(json.dumps({"format": "echo-rl-rollout", "version": 1, "tree": tree}))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    (directory / "rollout.npz").write_bytes(buf.getvalue())


@pytest.mark.parametrize("kind", ["$array", "$scalar"])
def test_an_unsigned_pickle_env_snapshot_is_refused(tmp_path, kind):
    marker, arrays = tmp_path / "pwned", {}
    snap = {"$dict": [["format", "pickle"], ["blob", _blob_node(kind, pickle.dumps(_Payload(marker)), arrays)]]}
    _write(tmp_path, snap, arrays)
    value = state_codec.read(tmp_path)  # plain data: read without a signature
    assert value["format"] == "pickle" and type(value["blob"]) is not state_codec.Signed
    with pytest.raises(state_codec.UntrustedState, match="an env snapshot's blob is pickled data that is not signed"):
        restore_env(value)
    with pytest.raises(state_codec.UntrustedState):
        restore_vector_env({"asynchronous": False, "envs": [value]})
    assert not marker.exists()


def test_loads_takes_signed_bytes_only(tmp_path):
    marker = tmp_path / "pwned"
    raw = pickle.dumps(_Payload(marker))
    for blob in (raw, bytearray(raw), np.frombuffer(raw, np.uint8), np.bytes_(raw), memoryview(raw)):
        with pytest.raises(state_codec.UntrustedState, match="never unpickled"):
            state_codec.loads(blob, "x")
    assert not marker.exists()
    assert state_codec.loads(state_codec.dumps({"a": (1, 2)}), "x") == {"a": (1, 2)}


@pytest.mark.parametrize("asynchronous", [False, True])
def test_own_pickled_snapshots_still_restore(tmp_path, asynchronous):
    """Dynamic-Obstacles has no plain-data form: its snapshot is pickled by this process (Signed, across the
    async workers' pipes too), stored signed, and read back Signed."""
    envs = make_vector_env("minigrid:MiniGrid-Dynamic-Obstacles-5x5-v0", 2, asynchronous=asynchronous)
    envs.reset(seed=[1, 2])
    snap = snapshot_vector_env(envs)
    assert all(type(s["blob"]) is state_codec.Signed for s in snap["envs"])
    restore_vector_env(snap).close()
    state_codec.write(tmp_path, snap)
    assert (tmp_path / "rollout.sig").exists()
    back = state_codec.read(tmp_path)
    assert all(type(s["blob"]) is state_codec.Signed for s in back["envs"])
    restore_vector_env(back).close()
    envs.close()


def test_ray_worker_blobs_must_be_signed(tmp_path):
    from echo_rl.vector.ray_backend import Slice, check_ray_rollout_state

    marker = tmp_path / "pwned"
    slices = [Slice(0, 2)]
    state = {"backend": "ray", "slices": [(0, 2)], "workers": [np.frombuffer(pickle.dumps(_Payload(marker)), np.uint8)],
             "tokens": [0]}
    with pytest.raises(state_codec.UntrustedState, match="a Ray worker's state in this checkpoint"):
        check_ray_rollout_state(state, slices)
    check_ray_rollout_state({**state, "workers": [state_codec.dumps({})]}, slices)
    assert not marker.exists()


def _digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_resume_refuses_an_unsigned_pickle_env_with_one_line_and_loses_nothing(tmp_path):
    """The audit's case: a collector whose env snapshot is ``{"format": "pickle", "blob": <uint8 array>}``."""
    run, marker = tmp_path / "run", tmp_path / "pwned"
    asyncio.run(EchoRLTrainer(TrainingConfig(**TINY), run_dir=run, show_progress=False).train())
    ckpts = sorted((run / "checkpoints").glob("step_*"))
    assert len(ckpts) == 2
    newest = ckpts[-1]
    header = json.loads((newest / "rollout.json").read_text())
    with np.load(newest / "rollout.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    text = json.dumps(header["tree"])
    assert '"minigrid-json/1"' in text
    snaps = []

    def swap(node):  # every env snapshot -> a pickle blob as a plain uint8 array
        if type(node) is dict and node.get("$dict") and ["format", "minigrid-json/1"] in node["$dict"]:
            snaps.append(node)
            return {"$dict": [["format", "pickle"],
                              ["blob", _blob_node("$array", pickle.dumps(_Payload(marker)), arrays)]]}
        if type(node) is dict:
            return {k: swap(v) for k, v in node.items()}
        if type(node) is list:
            return [swap(v) for v in node]
        return node

    tree = swap(header["tree"])
    assert snaps, "no env snapshot found in the rollout tree"
    _write(newest, tree, arrays)
    before = _digest(run)
    r = subprocess.run([sys.executable, "-m", "echo_rl.cli", "train", "--resume", "--run-dir", str(run),
                        "--no-progress"], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{newest.name}: rollout state refused" in r.stderr and "not signed" in r.stderr, r.stderr
    assert not marker.exists()
    assert _digest(run) == before  # refused, not skipped: the older checkpoint was not resumed over it
    shutil.rmtree(run)
