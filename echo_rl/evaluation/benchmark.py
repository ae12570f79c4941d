"""The benchmark harness: (task x method x backbone x seed) cells -> metrics -> statistics -> report.

``EchoRLBenchmark(config).run_benchmark()`` validates every name first (one
error listing the valid ones), plans the cells, runs the unfinished ones in
order — each under a :class:`PerformanceMonitor` for wall time, CPU time and
memory — stores each finished cell atomically (so a killed run resumes where
it stopped), then writes the report with :mod:`echo_rl.evaluation.report`.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from echo_rl.config import ConfigBase, ConfigError, TrainingConfig, spec
from echo_rl.config.base import load_yaml_text
from echo_rl.environments.registry import check_task_name
from echo_rl.evaluation import methods as _methods
from echo_rl.evaluation.backbones import check_backbone_name
from echo_rl.evaluation.metrics import cell_metrics
from echo_rl.evaluation.records import NO_BACKBONE, Cell, CellStore, episodes_to_dicts, fingerprint
from echo_rl.evaluation.report import write_report
from echo_rl.models.config import BackboneConfig
from echo_rl.utils.jail import read_regular
from echo_rl.utils.monitoring import JsonlLogger, PerformanceMonitor

RECORD_VERSION = 1


@dataclass
class BenchmarkConfig(ConfigBase):
    """One benchmark run (``echo_rl.evaluation.benchmark``); resumable from ``output_dir``."""

    tasks: list = spec(default_factory=lambda: ["minigrid"],
                       help="task names: alfworld, webshop, cruxeval, arc, minigrid, minigrid:<EnvId>, or one "
                            "registered with register_text_env")
    task_configs: dict = spec(default_factory=dict, help="{task: keyword arguments of its environment}")
    backbones: list = spec(default_factory=list, help="LM backbones for the methods that need one (or one "
                                                      "registered with echo_rl.models.register_backbone)")
    backbone_config: dict = spec(default_factory=dict,
                                 help="BackboneConfig fields for every backbone, e.g. {dtype: bfloat16} for a local "
                                      "model's weights")
    baselines: list = spec(default_factory=lambda: ["random", "expert", "ppo"],
                           help="methods to run (see `echo-rl benchmark --list-methods`; your own: "
                                "echo_rl.evaluation.methods.register_baseline)")
    num_seeds: int = spec(3, help="seeds per (task, method, backbone); seeds are 0..num_seeds-1 + seed_offset",
                          min=1)
    seed_offset: int = spec(0, help="first seed", min=0)
    num_episodes: int = spec(20, help="evaluation episodes per cell", min=1)
    max_steps_per_episode: int = spec(100, help="step cap per evaluation episode (harness-side truncation)",
                                      min=1)
    evaluation_timeout: float = spec(3600.0, help="seconds one cell may run; checked between episodes", gt=0)
    echo_rl_configs: dict = spec(default_factory=dict,
                                 help="TrainingConfig overrides for trained methods: {field: value} for all, "
                                      "or {method: {field: value}} for one")
    output_dir: str = spec("runs/benchmark", help="run directory (rerun with the same one to resume)")
    save_detailed_results: bool = spec(True, help="keep per-episode records in each cell file")
    generate_plots: bool = spec(True, help="write PNG plots")
    generate_report: bool = spec(True, help="write report.md, results.json/csv and statistics")
    bootstrap_reps: int = spec(50_000, help="stratified-bootstrap resamples for the confidence intervals", min=100)
    confidence: float = spec(0.95, help="confidence level of the intervals", gt=0, max=0.999)
    cpu_hour_usd: float = spec(0.05, help="price of one CPU-hour of measured process CPU time (local runs)",
                               min=0)
    gpu_hour_usd: float = spec(2.5, help="price of one GPU-hour of cell wall time when a cell used a GPU", min=0)
    device: str = spec("cpu", help="torch device for trained methods")
    max_episode_error_fraction: float = spec(0.1, help="a cell whose errored episodes (env start, backbone, "
                                             "agent crash) exceed this fraction is 'failed', not a low score: a "
                                             "broken method must not pass for a weak one (1: never)", min=0, max=1)
    concurrency: int = spec(8, help="episodes a prompting method runs at once in a cell (a local backbone decodes "
                                    "them together on the execution engine)", min=1)

    def validate(self) -> None:
        for name in ("tasks", "baselines"):
            if not getattr(self, name):
                self._fail(name, getattr(self, name), "needs at least one name")
        for name in ("tasks", "backbones", "baselines"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                self._fail(name, values, "names must be unique")
            for v in values:
                if not isinstance(v, str):
                    self._fail(name, values, "must be a list of names")
        for task in self.tasks:
            check_task_name(task)
        for method in self.baselines:
            _methods.get_method(method)
        for backbone in self.backbones:
            check_backbone_name(backbone)

        # an unknown field or a bad value fails before any cell runs
        BackboneConfig.from_dict(self.backbone_config, prefix="backbone_config")
        unknown = sorted(set(self.task_configs) - set(self.tasks))
        if unknown:
            self._fail("task_configs", unknown[0], f"is not one of tasks: {', '.join(self.tasks)}")
        for key, value in self.echo_rl_configs.items():
            if key in _methods.method_names() and not isinstance(value, dict):
                self._fail(f"echo_rl_configs.{key}", value, "per-method overrides must be a mapping")
        self._check_training_overrides()

    def _check_training_overrides(self) -> None:
        """Fail now, not after an hour of other cells, on a bad TrainingConfig field."""
        import dataclasses

        names = {f.name for f in dataclasses.fields(TrainingConfig)}
        for method in self.trained_methods():
            overrides = self.training_overrides(method)
            for key in overrides:
                if key not in names:
                    raise ConfigError(f"unknown field echo_rl_configs.{key} for {method}; "
                                      f"TrainingConfig fields: {', '.join(sorted(names))}")
            spec_ = _methods.get_method(method)
            cells = [(t, b) for t in self.tasks
                     for b in ((self.backbones or [NO_BACKBONE]) if spec_.uses_backbone(t) else [NO_BACKBONE])
                     if spec_.skip_reason(t, b) is None]
            if cells:  # the values too: build the config the first runnable cell would build
                try:
                    spec_.training_config(*cells[0], overrides)
                except ConfigError as exc:
                    raise ConfigError(f"echo_rl_configs for {method}: {exc}") from None

    def trained_methods(self) -> list[str]:
        return [m for m in self.baselines if _methods.get_method(m).trainer_agent is not None]

    def training_overrides(self, method: str) -> dict[str, Any]:
        methods = set(_methods.method_names())
        common = {k: v for k, v in self.echo_rl_configs.items() if k not in methods}
        return {**common, **dict(self.echo_rl_configs.get(method, {}))}

    @property
    def seeds(self) -> list[int]:
        return [self.seed_offset + i for i in range(self.num_seeds)]


@dataclass
class PlannedCell:
    cell: Cell
    skip_reason: str | None
    fingerprint: str


class EchoRLBenchmark:
    """Runs a :class:`BenchmarkConfig`; nothing happens until :meth:`run_benchmark`."""

    def __init__(self, config: BenchmarkConfig, progress: Callable[[str], None] | None = None):
        if not isinstance(config, BenchmarkConfig):
            raise ConfigError(f"EchoRLBenchmark needs a BenchmarkConfig, got {type(config).__name__}")
        self.config = config
        self.output_dir = Path(config.output_dir)
        self.progress = progress or (lambda msg: None)

    # -- planning ---------------------------------------------------------
    def plan(self) -> list[PlannedCell]:
        """Every cell in run order, with the reason it will be skipped (None if it will run)."""
        cfg = self.config
        planned = []
        for task in cfg.tasks:
            for method in cfg.baselines:
                m = _methods.get_method(method)
                backbones = (cfg.backbones or [NO_BACKBONE]) if m.uses_backbone(task) else [NO_BACKBONE]
                for backbone in backbones:
                    reason = m.skip_reason(task, backbone)
                    for seed in cfg.seeds:
                        cell = Cell(task, method, backbone, seed)
                        planned.append(PlannedCell(cell, reason, self._fingerprint(cell)))
        return planned

    def _fingerprint(self, cell: Cell) -> str:
        cfg = self.config
        m = _methods.get_method(cell.method)
        return fingerprint({
            "version": RECORD_VERSION, "cell": [cell.task, cell.method, cell.backbone, cell.seed],
            "num_episodes": cfg.num_episodes, "max_steps": cfg.max_steps_per_episode,
            "task_config": cfg.task_configs.get(cell.task, {}),
            "method_config": cfg.training_overrides(cell.method) if m.trainer_agent else {},
            "device": cfg.device if m.trainer_agent else "cpu",
            # only when set, so cells stored before the field existed keep their fingerprint
            **({"backbone_config": cfg.backbone_config} if cfg.backbone_config else {}),
        })

    # -- running ----------------------------------------------------------
    async def run_benchmark(self) -> dict[str, Any]:
        """Run every unfinished cell, then write the report; returns the results summary."""
        cfg = self.config
        planned = self.plan()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        cfg.save_yaml(self.output_dir / "config.yaml")
        store = CellStore(self.output_dir)
        events = JsonlLogger(self.output_dir / "events.jsonl").open()
        counts = {"reused": 0, "ok": 0, "skipped": 0, "failed": 0, "timeout": 0}
        t_start = time.perf_counter()
        try:
            for i, pc in enumerate(planned):
                tag = f"[{i + 1}/{len(planned)}] {pc.cell.task} | {pc.cell.label} | seed {pc.cell.seed}"
                if store.is_finished(pc.cell, pc.fingerprint):
                    counts["reused"] += 1
                    self.progress(f"{tag}: done earlier, kept")
                    continue
                record = await self._run_cell(pc)
                store.save(record)
                counts[record["status"]] += 1
                events.log({"event": record["status"], "cell": pc.cell.key,
                            "wall_time_s": record.get("metrics", {}).get("wall_time_s")}, i)
                self.progress(f"{tag}: {self._describe(record)}")
        finally:
            events.close()
        summary = {"cells": len(planned), **counts, "wall_time_s": time.perf_counter() - t_start,
                   "output_dir": str(self.output_dir)}
        if cfg.generate_report or cfg.generate_plots:
            summary["report"] = write_report(self.output_dir, *load_run(self.output_dir), plots=cfg.generate_plots,
                                             tables=cfg.generate_report)
        return summary

    @staticmethod
    def _describe(record: dict[str, Any]) -> str:
        if record["status"] == "ok":
            m, errors = record["metrics"], (record.get("notes") or {}).get("num_episode_errors")
            return (f"Success@1 {m['success_at_1']:.3f} in {m['wall_time_s']:.1f}s"
                    + (f" ({errors} episodes errored, counted as failures)" if errors else ""))
        return f"{record['status'].upper()}: {record.get('reason', '')}"

    async def _run_cell(self, pc: PlannedCell) -> dict[str, Any]:
        cfg = self.config
        cell = pc.cell
        base = {"task": cell.task, "method": cell.method, "backbone": cell.backbone, "seed": cell.seed,
                "label": cell.label, "fingerprint": pc.fingerprint, "version": RECORD_VERSION,
                "finished_at": None, "method_kind": _methods.get_method(cell.method).kind}
        if pc.skip_reason is not None:
            return {**base, "status": "skipped", "reason": pc.skip_reason, "finished_at": _now()}
        spec_ = _methods.get_method(cell.method)
        work_dir = self.output_dir / "work" / cell.key
        ctx = _methods.CellContext(
            cell=cell, num_episodes=cfg.num_episodes, max_steps=cfg.max_steps_per_episode,
            task_config=dict(cfg.task_configs.get(cell.task, {})),
            method_config=cfg.training_overrides(cell.method) if spec_.trainer_agent else {},
            work_dir=work_dir, deadline=time.monotonic() + cfg.evaluation_timeout, device=cfg.device,
            fingerprint=pc.fingerprint, concurrency=cfg.concurrency, backbone_config=dict(cfg.backbone_config))
        monitor = PerformanceMonitor(interval=1.0)
        monitor.start_monitoring()
        status, reason, outcome = "ok", None, None
        try:
            outcome = await asyncio.wait_for(spec_.runner(ctx), timeout=cfg.evaluation_timeout)
        except _methods.MethodUnavailable as exc:
            status, reason = "skipped", str(exc)
        except (_methods.CellTimeout, asyncio.TimeoutError) as exc:
            status, reason = "timeout", str(exc) or f"cell ran past evaluation_timeout={cfg.evaluation_timeout}s"
        except (KeyboardInterrupt, SystemExit):
            monitor.stop_monitoring()
            raise
        except Exception as exc:  # a broken method must not take the other cells down; the record says why
            status, reason = "failed", f"{type(exc).__name__}: {exc}"
            base["traceback"] = traceback.format_exc(limit=8)
        resources = monitor.stop_monitoring()
        record = {**base, "status": status, "finished_at": _now(),
                  "resources": {k: resources[k] for k in ("wall_time_s", "cpu_time_s", "rss_mb_peak")
                                if k in resources}}
        if reason is None:
            reason = self._too_many_errors(outcome)
            if reason is not None:  # the episodes stay in the record: they say what broke
                record.update(status="failed", notes=outcome.notes, episodes=episodes_to_dicts(outcome.episodes))
        if reason is not None:
            record["reason"] = reason
            return record
        record["metrics"] = cell_metrics(outcome, resources, cfg.cpu_hour_usd, cfg.gpu_hour_usd)
        record["learning_curve"] = outcome.learning_curve
        record["notes"] = outcome.notes
        if cfg.save_detailed_results and outcome.episodes:
            record["episodes"] = episodes_to_dicts(outcome.episodes)
        return record

    def _too_many_errors(self, outcome) -> str | None:
        """The failure reason when more than ``max_episode_error_fraction`` of the cell's episodes errored."""
        errors = int((outcome.notes or {}).get("num_episode_errors", 0))
        total = max(len(outcome.episodes), 1)
        limit = self.config.max_episode_error_fraction
        if errors == 0 or errors / total <= limit:
            return None
        first = (outcome.notes.get("episode_errors") or ["?"])[0]
        return (f"{errors} of {total} episodes errored, more than max_episode_error_fraction={limit:g} "
                f"(first: {first})")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def load_run(run_dir: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A benchmark run directory's config and the records of the cells that config plans (what a report shows)."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise ConfigError(f"{run_dir} is not a benchmark run directory: {cfg_path} is missing")
    config = load_yaml_text(read_regular(cfg_path, "config").decode("utf-8", "replace"), str(cfg_path)) or {}
    return config, current_records(config, CellStore(run_dir).records())


def current_records(config: dict[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the cells the config plans, made with its settings (a rerun with other
    settings leaves older cell files behind; they must not mix into the tables)."""
    planned = {(pc.cell.task, pc.cell.method, pc.cell.backbone, pc.cell.seed): pc.fingerprint
               for pc in EchoRLBenchmark(BenchmarkConfig.from_dict(config)).plan()}
    return [r for r in records
            if planned.get((r["task"], r["method"], r["backbone"], r["seed"])) == r.get("fingerprint")]
