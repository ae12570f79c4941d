"""W&B and MLflow loggers: selected by config, offline, and logging exactly what metrics.jsonl holds."""

from __future__ import annotations

import asyncio
import json
import math
import struct
import sys
from pathlib import Path

import pytest

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.utils.monitoring import JsonlLogger
from echo_rl.utils.tracking import FanOutLogger, open_loggers

pytest.importorskip("wandb", reason="the tracking extra is not installed: pip install 'echo-rl[tracking]'")
pytest.importorskip("mlflow", reason="the tracking extra is not installed: pip install 'echo-rl[tracking]'")


def read_wandb_history(run_dir: Path) -> dict[int, dict[str, float]]:
    """Parse an offline run's ``run-*.wandb`` log (LevelDB-style 32 KiB blocks of protobuf Records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, buf, rows = 32768, 7, b"", {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk: a whole record
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            if record.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                rows.setdefault(int(items["_step"]), {}).update(items)
    return rows


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """One short MiniGrid run logging to TensorBoard, W&B (offline) and MLflow (file store) at once."""
    root = tmp_path_factory.mktemp("tracked")
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.delenv("WANDB_API_KEY", raising=False)
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    from echo_rl.training.trainer import EchoRLTrainer

    uri = (root / "mlruns").as_uri()
    cfg = TrainingConfig(env_name="minigrid:MiniGrid-Empty-5x5-v0", total_timesteps=192, num_actors=4, batch_size=64,
                         evaluation_frequency=128, evaluation_episodes=4, save_frequency=0,
                         loggers=["tensorboard", "wandb", "mlflow"],
                         tracking={"mlflow_tracking_uri": uri, "mlflow_experiment": "tests", "wandb_project": "t"})
    trainer = EchoRLTrainer(cfg, run_dir=root / "run", show_progress=False)
    asyncio.run(trainer.train())
    yield root / "run", uri
    mp.undo()


def _jsonl_points(run_dir: Path) -> dict[tuple[str, int], float]:
    rows = JsonlLogger.read(run_dir / "metrics.jsonl")
    assert len(rows) >= 3 and any(k.startswith("eval/") for r in rows for k in r)
    return {(k, r["step"]): v for r in rows for k, v in r.items() if k != "step" and v is not None}


def test_wandb_offline_run_logs_the_metrics_jsonl_rows(tracked_run):
    run_dir, _ = tracked_run
    history = read_wandb_history(run_dir)
    for (key, step), value in _jsonl_points(run_dir).items():
        assert key in history[step], f"W&B step {step} lacks {key}"
        assert history[step][key] == pytest.approx(value, rel=1e-12, abs=1e-12), (key, step)
    state = json.loads((run_dir / "tracking.json").read_text())
    assert state["wandb_run_id"] in next(run_dir.glob("wandb/offline-run-*")).name


def test_mlflow_file_store_logs_the_metrics_jsonl_rows_and_config(tracked_run):
    from mlflow.tracking import MlflowClient

    run_dir, uri = tracked_run
    state = json.loads((run_dir / "tracking.json").read_text())
    assert state["mlflow_tracking_uri"] == uri
    client = MlflowClient(uri)
    run = client.get_run(state["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["env_name"] == "minigrid:MiniGrid-Empty-5x5-v0"
    assert run.data.params["ppo_config.learning_rate"] == "0.0003"
    points = _jsonl_points(run_dir)
    names = {k for k, _ in points}
    assert names <= set(run.data.metrics), names - set(run.data.metrics)
    for name in names:
        logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}
        for (key, step), value in points.items():
            if key == name:
                assert logged[step] == value, (key, step)


def test_tensorboard_still_logs_beside_them(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = tracked_run
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    for (key, step), value in _jsonl_points(run_dir).items():
        by_step = {e.step: e.value for e in acc.Scalars(key)}
        assert math.isclose(by_step[step], value, rel_tol=1e-6, abs_tol=1e-6), (key, step)


def test_resume_continues_the_same_mlflow_run(tmp_path, monkeypatch):
    """A second open on one run directory (``--resume``) appends to the run recorded in tracking.json."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = TrainingConfig(loggers=["mlflow"])

    class Run:
        path = tmp_path / "runs" / "r1"

    first = open_loggers(cfg, Run)
    first.log({"train/x": 1.0, "eval/nan": float("nan")}, 10)
    first.close()
    again = open_loggers(cfg, Run)
    again.log({"train/x": 2.0}, 20)
    again.close()
    state = json.loads((Run.path / "tracking.json").read_text())
    assert state["mlflow_tracking_uri"] == (tmp_path / "runs" / "mlruns").as_uri()  # default: beside the run dir
    hist = MlflowClient(state["mlflow_tracking_uri"]).get_metric_history(state["mlflow_run_id"], "train/x")
    assert sorted((m.step, m.value) for m in hist) == [(10, 1.0), (20, 2.0)]
    assert "eval/nan" not in MlflowClient(state["mlflow_tracking_uri"]).get_run(state["mlflow_run_id"]).data.metrics


def test_bad_logger_names_and_options_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="allowed: tensorboard, wandb, mlflow"):
        TrainingConfig(loggers=["tensorboard", "neptune"])
    with pytest.raises(ConfigError, match="must not repeat"):
        TrainingConfig(loggers=["wandb", "wandb"])
    with pytest.raises(ConfigError, match=r"tracking\.wandb_projekt; allowed: .*wandb_project"):
        TrainingConfig(tracking={"wandb_projekt": "x"})
    with pytest.raises(ConfigError, match="wandb_tags='a' is invalid: expected a list of strings"):
        TrainingConfig(tracking={"wandb_tags": "a"})
    with pytest.raises(ConfigError, match="mlflow_experiment=3 is invalid: expected a string"):
        TrainingConfig(tracking={"mlflow_experiment": 3})
    with pytest.raises(ConfigError, match="wandb_mode='cloud' is invalid"):
        TrainingConfig(tracking={"wandb_mode": "cloud"})


def test_cli_rejects_an_unknown_logger_with_exit_2(tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "echo_rl.cli", "train", "--set", "loggers=[tensorboard,comet]",
                           "--run-dir", str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "echo-rl train: error: TrainingConfig.loggers has 'comet': allowed: tensorboard, wandb, mlflow"]


@pytest.mark.parametrize("module, package", [("wandb", "wandb"), ("mlflow", "mlflow-skinny")])
def test_missing_extra_names_the_pip_install(tmp_path, monkeypatch, module, package):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    cfg = TrainingConfig(loggers=[module])

    class Run:
        path = tmp_path / "r"
        tensorboard_dir = tmp_path / "r" / "tb"

    with pytest.raises(ImportError, match=rf"{package} is needed .*pip install 'echo-rl\[tracking\]'"):
        open_loggers(cfg, Run)


def test_fan_out_closes_every_logger_even_when_one_fails():
    closed = []

    class Bad:
        def close(self):
            raise RuntimeError("boom")

    class Good:
        def close(self):
            closed.append(True)

    with pytest.raises(RuntimeError, match="boom"):
        FanOutLogger([Bad(), Good()]).close()
    assert closed == [True]
