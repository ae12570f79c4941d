"""Experiment tracking: TensorBoard, Weights & Biases and MLflow beside ``metrics.jsonl``.

The trainer writes every metric row to ``metrics.jsonl`` and hands the same
row (plus the wall-clock ``time/*`` figures of ``timings.jsonl``) to the
loggers selected by ``TrainingConfig.loggers``, e.g. ``[tensorboard, wandb,
mlflow]``, under the same names and steps, so a curve in the W&B or MLflow UI
is the curve in ``metrics.jsonl``. W&B and MLflow are optional (``pip install
'echo-rl[tracking]'``); options live in ``TrainingConfig.tracking``
(:data:`TRACKING_OPTIONS`), and each library's own environment variables
(``WANDB_MODE``, ``WANDB_API_KEY``, ``MLFLOW_TRACKING_URI``, ...) apply too.

A run's W&B/MLflow run ids are kept in ``<run dir>/tracking.json``, so
``echo-rl train --resume`` continues the same tracked run instead of starting
a new one.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping

from echo_rl.config import ConfigError, register_name_rule
from echo_rl.utils.jail import Jail
from echo_rl.utils.monitoring import TensorBoardLogger
from echo_rl.utils.optional import require

LOGGER_NAMES = ("tensorboard", "wandb", "mlflow")
TRACKING_OPTIONS = {
    "wandb_project": "W&B project (default: echo-rl, or $WANDB_PROJECT)",
    "wandb_entity": "W&B entity / team (default: the logged-in user, or $WANDB_ENTITY)",
    "wandb_mode": "online, offline or disabled (default: $WANDB_MODE, else online)",
    "wandb_tags": "list of W&B tags",
    "mlflow_tracking_uri": "MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else "
                           "file:<parent of the run dir>/mlruns)",
    "mlflow_experiment": "MLflow experiment name (default: echo-rl)",
}
TRACKING_STATE = "tracking.json"


def check_loggers(loggers: Any, tracking: Any) -> None:
    """Validate ``TrainingConfig.loggers`` / ``.tracking``; one-line :class:`ConfigError` naming what is allowed."""
    if not isinstance(loggers, (list, tuple)) or not all(isinstance(n, str) for n in loggers):
        raise ConfigError(f"TrainingConfig.loggers={loggers!r} is invalid: expected a list of names from "
                          f"{', '.join(LOGGER_NAMES)}")
    for name in loggers:
        if name not in LOGGER_NAMES:
            raise ConfigError(f"TrainingConfig.loggers has {name!r}: allowed: {', '.join(LOGGER_NAMES)}")
    if len(set(loggers)) != len(loggers):
        raise ConfigError(f"TrainingConfig.loggers={list(loggers)!r} is invalid: names must not repeat")
    unknown = sorted(set(tracking) - set(TRACKING_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown field TrainingConfig.tracking.{unknown[0]}; allowed: "
                          f"{', '.join(sorted(TRACKING_OPTIONS))}")
    tags = tracking.get("wandb_tags")
    if tags is not None and (not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags)):
        raise ConfigError(f"TrainingConfig.tracking.wandb_tags={tags!r} is invalid: expected a list of strings")
    for key in ("wandb_project", "wandb_entity", "mlflow_tracking_uri", "mlflow_experiment"):
        if tracking.get(key) is not None and not isinstance(tracking[key], str):
            raise ConfigError(f"TrainingConfig.tracking.{key}={tracking[key]!r} is invalid: expected a string")
    mode = tracking.get("wandb_mode")
    if mode is not None and mode not in ("online", "offline", "disabled"):
        raise ConfigError(f"TrainingConfig.tracking.wandb_mode={mode!r} is invalid: allowed: online, offline, disabled")


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Finite numbers only: what metrics.jsonl stores as a number (it writes NaN/inf as null)."""
    out = {}
    for key, value in metrics.items():
        value = value.item() if hasattr(value, "item") else value
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[str(key)] = float(value)
    return out


class WandbLogger:
    """One W&B run per EchoRL run; ``WANDB_MODE=offline`` writes it under ``<run dir>/wandb`` for ``wandb sync``."""

    def __init__(self, run_dir: str | os.PathLike, name: str, config: Mapping[str, Any] | None = None,
                 project: str | None = None, entity: str | None = None, mode: str | None = None,
                 tags: list[str] | None = None, run_id: str | None = None):
        wandb = require("wandb", "tracking")
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        try:
            self._run = wandb.init(project=project or os.environ.get("WANDB_PROJECT") or "echo-rl", entity=entity,
                                   name=name, dir=str(run_dir), config=dict(config or {}), mode=mode, tags=tags,
                                   id=run_id, resume="allow" if run_id else None, reinit="create_new")
        except Exception as exc:  # no API key, no network: say how to go on without them
            raise ConfigError(f"wandb.init failed ({type(exc).__name__}: {' '.join(str(exc).split())[:160]}); "
                              f"set WANDB_API_KEY or run `wandb login`, or log offline with WANDB_MODE=offline "
                              f"(or --set tracking.wandb_mode=offline)") from exc
        self.run_id = self._run.id

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        row = _scalars(metrics)
        if row:
            self._run.log(row, step=int(step))

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


class MLflowLogger:
    """One MLflow run per EchoRL run, written through ``MlflowClient`` (no global active run to leak).

    ``mlflow-skinny`` has no database backend, so local runs use MLflow's file
    store (``file:...``); MLflow 3 refuses it unless ``MLFLOW_ALLOW_FILE_STORE``
    is set, which this logger sets for file URIs only. Point
    ``mlflow_tracking_uri`` at a server (``http://...``) to log remotely.
    """

    def __init__(self, tracking_uri: str, experiment: str, run_name: str,
                 params: Mapping[str, Any] | None = None, run_id: str | None = None):
        require("mlflow", "tracking", package="mlflow-skinny")
        if tracking_uri.startswith("file:") or "://" not in tracking_uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self._client = MlflowClient(tracking_uri)
        if run_id is None:
            exp = self._client.get_experiment_by_name(experiment)
            exp_id = exp.experiment_id if exp is not None else self._client.create_experiment(experiment)
            run_id = self._client.create_run(exp_id, run_name=run_name).info.run_id
            flat = [Param(k, str(v)[:6000]) for k, v in _flatten(params or {}).items()]
            for i in range(0, len(flat), 100):  # MLflow's log_batch takes at most 100 params
                self._client.log_batch(run_id, params=flat[i:i + 100])
        else:
            self._client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(k, v, stamp, int(step)) for k, v in _scalars(metrics).items()]
        for i in range(0, len(batch), 1000):  # log_batch limit
            self._client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def close(self) -> None:
        if self._client is not None:
            self._client.set_terminated(self.run_id)
            self._client = None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class FanOutLogger:
    """Sends each ``log(metrics, step)`` to every logger; closes them all even if one fails."""

    def __init__(self, loggers: list[Any]):
        self.loggers = list(loggers)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def close(self) -> None:
        error = None
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as exc:  # close the others first
                error = error or exc
        if error is not None:
            raise error


def open_loggers(config: Any, run: Any) -> FanOutLogger:
    """The loggers ``config.loggers`` selects for the run directory ``run`` (a ``RunDirectory``)."""
    names = list(getattr(config, "loggers", ["tensorboard"]))
    opts = dict(getattr(config, "tracking", {}) or {})
    check_loggers(names, opts)

    jail = getattr(run, "jail", None) or Jail(run.path)  # the run's own files: no symlinks, bounded reads
    try:
        state = json.loads(jail.read_text(TRACKING_STATE, "json"))
    except FileNotFoundError:
        state = {}
    except ValueError:
        state = None
    if type(state) is not dict:
        raise ConfigError(f"{Path(run.path) / TRACKING_STATE} is not a JSON object; fix or delete it (it holds the "
                          f"W&B / MLflow run ids a resume continues)")
    name = Path(run.path).name
    opened: list[Any] = []
    try:
        for logger_name in names:
            if logger_name == "tensorboard":
                opened.append(TensorBoardLogger(run.tensorboard_dir))
            elif logger_name == "wandb":
                opened.append(WandbLogger(run.path, name, config.to_dict(), project=opts.get("wandb_project"),
                                          entity=opts.get("wandb_entity"), mode=opts.get("wandb_mode"),
                                          tags=opts.get("wandb_tags"), run_id=state.get("wandb_run_id")))
                state["wandb_run_id"] = opened[-1].run_id
            else:
                uri = (opts.get("mlflow_tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
                       or (Path(run.path).resolve().parent / "mlruns").as_uri())
                opened.append(MLflowLogger(uri, opts.get("mlflow_experiment") or "echo-rl", name, config.to_dict(),
                                           run_id=state.get("mlflow_run_id") if state.get("mlflow_tracking_uri") == uri
                                           else None))
                state.update(mlflow_run_id=opened[-1].run_id, mlflow_tracking_uri=uri)
    except BaseException:
        FanOutLogger(opened).close()
        raise
    if state:
        jail.write_atomic(TRACKING_STATE, json.dumps(state, indent=2, sort_keys=True) + "\n")
    return FanOutLogger(opened)


register_name_rule("loggers", check_loggers)  # TrainingConfig(loggers=..., tracking=...) is checked here
