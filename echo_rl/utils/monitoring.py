"""Metric loggers the trainer and the benchmark write through, and resource monitoring.

Metrics are flat ``dict[str, float]`` (ARCHITECTURE §3). The same names go to
JSON lines and to TensorBoard (when the ``eval`` extra is installed);
:class:`LineLogger` keeps a run's progress lines as text.
:class:`PerformanceMonitor` samples this process's CPU, memory and GPU use in
a background thread; :class:`MetricsCollector` gathers metric rows and
summarises them.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping

from echo_rl.config.base import ConfigError
from echo_rl.utils.optional import require


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _rows(text: str, where: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines text; a line that is not one is a ConfigError naming it."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if type(row) is not dict:
            raise ConfigError(f"{where} line {n} is not a JSON object; fix or remove that line")
        rows.append(row)
    return rows


class JsonlLogger:
    """Appends one JSON object per call; flushed each line so a killed run keeps its history. With ``jail`` (a
    run directory's :class:`~echo_rl.utils.jail.Jail`) ``path`` is relative to it and no symlink is followed."""

    def __init__(self, path: str | os.PathLike, jail: Any = None):
        self.jail, self._rel = jail, path
        self.path = Path(path) if jail is None else jail.root / path
        self._fh = None

    def open(self, truncate_after_step: int | None = None) -> "JsonlLogger":
        """Open for appending; on resume, drop lines logged after the checkpoint's step (the file is replaced
        atomically, so a refusal or a crash loses nothing)."""
        if self.jail is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after_step is not None:
            try:
                text = self._read(self.path, self.jail, self._rel)
            except FileNotFoundError:
                text = None
            if text is not None:
                kept = [r for r in _rows(text, self.path) if r.get("step", 0) <= truncate_after_step]
                out = "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept)
                if self.jail is None:
                    self.path.write_text(out)
                else:
                    self.jail.write_atomic(self._rel, out)
        self._fh = open(self.path, "a", encoding="utf-8") if self.jail is None else self.jail.open_append(self._rel)
        return self

    @staticmethod
    def _read(path: Path, jail: Any, rel: Any) -> str:
        if jail is None:
            return path.read_text()
        return jail.read_text(rel, "jsonl")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._fh is None:
            self.open()
        row = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(row, sort_keys=True) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    @staticmethod
    def read(path: str | os.PathLike, jail: Any = None) -> list[dict[str, Any]]:
        """The rows of a JSON-lines file ([] when it is missing); ``jail`` as in the constructor."""
        where = Path(path) if jail is None else jail.root / path
        try:
            text = JsonlLogger._read(where, jail, path)
        except FileNotFoundError:
            return []
        return _rows(text, where)


class LineLogger:
    """Appends time-stamped text lines (a run's ``progress.log``), flushed each line so ``tail -f`` follows
    the run and a killed run keeps what it said. A symlink in the file's place is refused, not followed, so a
    run directory cannot send the writes elsewhere."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fh = None

    def open(self) -> "LineLogger":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if self.path.is_symlink():
                raise OSError(exc.errno, f"{self.path} is a symbolic link; a log is written only to a regular "
                                         "file") from None
            raise
        self._fh = os.fdopen(fd, "a", encoding="utf-8")
        return self

    def write(self, text: str) -> None:
        if self._fh is None:
            self.open()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._fh.write("".join(f"{stamp} {line}\n" for line in text.splitlines() or [""]))
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class TensorBoardLogger:
    """TensorBoard scalars via torch's SummaryWriter; a no-op without the tensorboard package."""

    def __init__(self, log_dir: str | os.PathLike):
        self.log_dir = Path(log_dir)
        self._writer = None

    @staticmethod
    def available() -> bool:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            return False
        return True

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._writer is None:
            if not self.available():
                return
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.log_dir))
        for key, value in metrics.items():
            value = _jsonable(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class PerformanceMonitor:
    """Samples CPU, memory and (when present) GPU use of this process in a background thread.

    Nothing starts in the constructor: ``start_monitoring()`` starts the
    sampler, ``stop_monitoring()`` joins it and returns a summary (means and
    peaks). Also a context manager. Samples can be streamed to a JSON-lines
    file so a long run's resource history survives a crash.
    """

    def __init__(self, interval: float = 1.0, log_path: str | os.PathLike | None = None,
                 track_gpu: bool | None = None):
        if not interval > 0:
            raise ValueError(f"PerformanceMonitor.interval={interval!r} is invalid: must be > 0")
        self.interval = float(interval)
        self.log_path = Path(log_path) if log_path is not None else None
        self.track_gpu = track_gpu
        self.samples: list[dict[str, float]] = []
        self._thread = None
        self._stop = None
        self._t0 = 0.0
        self._cpu0 = 0.0
        self._summary: dict[str, float] | None = None

    # -- sampling ---------------------------------------------------------
    @staticmethod
    def _gpu_available() -> bool:
        try:
            import torch
        except ImportError:
            return False
        return bool(torch.cuda.is_available())

    def _sample(self, proc: Any) -> dict[str, float]:
        import psutil

        with proc.oneshot():
            mem = proc.memory_info()
            row = {
                "time_s": time.perf_counter() - self._t0,
                "cpu_percent": proc.cpu_percent(None),
                # process CPU time (all threads, not children) from the ns-resolution POSIX clock
                "cpu_time_s": time.process_time() - self._cpu0,
                "rss_mb": mem.rss / 2**20,
                "num_threads": float(proc.num_threads()),
            }
        vm = psutil.virtual_memory()
        row["system_memory_percent"] = vm.percent
        row["system_cpu_percent"] = psutil.cpu_percent(None)
        if self.track_gpu:
            import torch

            for i in range(torch.cuda.device_count()):
                row[f"gpu{i}_memory_allocated_mb"] = torch.cuda.memory_allocated(i) / 2**20
                row[f"gpu{i}_max_memory_allocated_mb"] = torch.cuda.max_memory_allocated(i) / 2**20
                try:
                    row[f"gpu{i}_utilization_percent"] = float(torch.cuda.utilization(i))
                except Exception:  # needs pynvml; memory figures above still hold
                    pass
        return row

    def _loop(self, proc: Any, logger: "JsonlLogger | None") -> None:
        step = 0
        while not self._stop.wait(self.interval):
            row = self._sample(proc)
            self.samples.append(row)
            if logger is not None:
                logger.log(row, step)
            step += 1

    # -- control ----------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None

    def start_monitoring(self) -> "PerformanceMonitor":
        import threading

        psutil = require("psutil", "eval")
        if self._thread is not None:
            raise RuntimeError("PerformanceMonitor is already running; call stop_monitoring() first")
        if self.track_gpu is None:
            self.track_gpu = self._gpu_available()
        proc = psutil.Process()
        proc.cpu_percent(None)  # prime: the first call has no interval to measure against
        psutil.cpu_percent(None)
        self._cpu0 = time.process_time()
        self._t0 = time.perf_counter()
        self.samples = []
        self._summary = None
        logger = JsonlLogger(self.log_path).open() if self.log_path is not None else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(proc, logger), name="echo-rl-monitor",
                                        daemon=True)
        self._logger = logger
        self._proc = proc
        self._thread.start()
        return self

    def stop_monitoring(self) -> dict[str, float]:
        """Stop sampling; return ``{wall_time_s, cpu_time_s, cpu_percent_mean, rss_mb_peak, ...}``."""
        if self._thread is None:
            if self._summary is not None:
                return dict(self._summary)
            raise RuntimeError("PerformanceMonitor was not started; call start_monitoring() first")
        self._stop.set()
        self._thread.join()
        self._thread = None
        final = self._sample(self._proc)  # one closing sample so short runs still measure something
        self.samples.append(final)
        if self._logger is not None:
            self._logger.log(final, len(self.samples) - 1)
            self._logger.close()
        self._summary = self._summarize(final)
        return dict(self._summary)

    def get_metrics(self) -> dict[str, float]:
        """The summary so far (as :meth:`stop_monitoring` returns it) while sampling goes on; after a stop,
        the final summary. Feeds ``MetricsCollector.collect_metrics(monitor.get_metrics())``."""
        if self._thread is None:
            if self._summary is not None:
                return dict(self._summary)
            raise RuntimeError("PerformanceMonitor was not started; call start_monitoring() first")
        now = self._sample(self._proc)  # not kept: the sampler thread owns the sample list
        summary = self._summarize(now, [*self.samples, now])
        return summary

    def _summarize(self, final: dict[str, float], samples: list[dict[str, float]] | None = None) -> dict[str, float]:
        wall = final["time_s"]
        out = {"wall_time_s": wall, "cpu_time_s": final["cpu_time_s"],
               "cpu_utilization": final["cpu_time_s"] / wall if wall > 0 else 0.0,
               "num_samples": float(len(self.samples if samples is None else samples))}
        samples = self.samples if samples is None else samples
        keys = sorted({k for row in samples for k in row} - {"time_s", "cpu_time_s"})
        for key in keys:
            vals = [row[key] for row in samples if key in row]
            out[f"{key}_mean"] = sum(vals) / len(vals)
            out[f"{key}_peak"] = max(vals)
        return out

    def __enter__(self) -> "PerformanceMonitor":
        return self.start_monitoring()

    def __exit__(self, *exc: Any) -> None:
        if self._thread is not None:
            self.stop_monitoring()


class MetricsCollector:
    """Collects flat metric dicts over a run and summarises them (count, mean, std, min, max, last).

    ``collect_metrics(...)`` takes a mapping and/or keyword metrics; non-numeric
    values are rejected with the key named. Optionally forwards every row to
    loggers (JSON lines, TensorBoard) under the same names.
    """

    def __init__(self, loggers: "list[JsonlLogger | TensorBoardLogger] | None" = None):
        self.loggers = list(loggers or [])
        self.history: list[dict[str, float]] = []
        self._step = 0

    def collect_metrics(self, metrics: Mapping[str, Any] | None = None, *, step: int | None = None,
                        **kwargs: Any) -> dict[str, float]:
        row: dict[str, float] = {}
        for key, value in {**(metrics or {}), **kwargs}.items():
            value = value.item() if hasattr(value, "item") else value
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"metric {key!r}={value!r} is invalid: must be a number")
            row[str(key)] = float(value)
        step = self._step if step is None else int(step)
        self._step = step + 1
        self.history.append({"step": float(step), **row})
        for logger in self.loggers:
            logger.log(row, step)
        return row

    def values(self, key: str) -> list[float]:
        return [row[key] for row in self.history if key in row and math.isfinite(row[key])]

    def summary(self) -> dict[str, dict[str, float]]:
        keys = sorted({k for row in self.history for k in row} - {"step"})
        out: dict[str, dict[str, float]] = {}
        for key in keys:
            vals = self.values(key)
            if not vals:
                continue
            mean = sum(vals) / len(vals)
            var = sum((v - mean) ** 2 for v in vals) / len(vals)
            out[key] = {"count": float(len(vals)), "mean": mean, "std": math.sqrt(var), "min": min(vals),
                        "max": max(vals), "last": vals[-1]}
        return out

    def reset(self) -> None:
        self.history.clear()
        self._step = 0
