"""What a benchmark cell is, what it produces, and where it is stored.

A cell is one (task, method, backbone, seed). Each finished cell is one JSON
file written atomically under ``RUN_DIR/cells/``, so a killed benchmark loses
at most the cell it was running, and a rerun skips every cell whose file is
there with status ``ok`` and the same fingerprint (the settings that shape its
result: episodes, step cap, task config, method config).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

NO_BACKBONE = "-"
STATUSES = ("ok", "skipped", "failed", "timeout")


@dataclass(frozen=True)
class Cell:
    task: str
    method: str
    backbone: str
    seed: int

    @property
    def key(self) -> str:
        """A filesystem-safe, collision-free name."""
        raw = f"{self.task}|{self.method}|{self.backbone}|{self.seed}"
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{self.task}__{self.method}__{self.backbone}__s{self.seed}")
        return f"{safe[:120]}-{hashlib.sha1(raw.encode()).hexdigest()[:8]}"

    @property
    def label(self) -> str:
        """Method as shown in tables: the backbone joins the name when there is one."""
        return self.method if self.backbone == NO_BACKBONE else f"{self.method} ({self.backbone})"


@dataclass
class EpisodeRecord:
    """One evaluation episode; LM fields stay None for policies that use no tokens."""

    success: bool
    reward: float
    length: int
    wall_time_s: float
    seed: int | None = None
    tokens: int | None = None
    kv_reused_tokens: int | None = None
    prompt_tokens: int | None = None
    cost_usd: float | None = None


@dataclass
class CellOutcome:
    """What a method runner returns. ``episodes`` when it ran them itself; otherwise the
    aggregate fields (e.g. from the trainer's own evaluation) with ``num_episodes`` set."""

    episodes: list[EpisodeRecord] = field(default_factory=list)
    success_rate: float | None = None
    mean_reward: float | None = None
    mean_length: float | None = None
    num_episodes: int | None = None
    learning_curve: list[dict[str, float]] = field(default_factory=list)
    api_cost_usd: float | None = None
    env_steps_trained: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    # wall time of the episode loop when episodes overlapped (run concurrently); None: they ran one by one
    episodes_wall_s: float | None = None


def fingerprint(parts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(_clean(data), fh, indent=1, sort_keys=True, allow_nan=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class CellStore:
    """``RUN_DIR/cells/<key>.json``: one record per cell."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir) / "cells"

    def path(self, cell: Cell) -> Path:
        return self.dir / f"{cell.key}.json"

    def load(self, cell: Cell) -> dict[str, Any] | None:
        path = self.path(cell)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return None  # torn by an outside hand: recompute rather than trust it

    def is_finished(self, cell: Cell, fp: str) -> bool:
        rec = self.load(cell)
        return rec is not None and rec.get("status") == "ok" and rec.get("fingerprint") == fp

    def save(self, record: Mapping[str, Any]) -> None:
        cell = Cell(record["task"], record["method"], record["backbone"], int(record["seed"]))
        write_json_atomic(self.path(cell), dict(record))

    def records(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                out.append(json.loads(path.read_text()))
            except json.JSONDecodeError:
                continue
        return out


def episodes_to_dicts(episodes: Iterable[EpisodeRecord]) -> list[dict[str, Any]]:
    return [asdict(e) for e in episodes]
