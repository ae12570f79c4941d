"""Published scores: ``load(name)`` -> a :class:`Study` whose ``scores(method)`` is a runs x tasks array.

Data files (``data/<name>.json``) hold each study of ``docs/results.md`` as
measured: per method its seeds, per-seed final scores for each metric (rows =
seeds, columns = the study's tasks) and, where reported, per-seed learning
curves. Where the document rounds, the files hold the exact values the rounding
came from (evaluation steps on the 2048-step rollout grid, successes as k/32)
and say so in the metric's ``rounded_to``; ``tests/test_hub`` checks them
against the document.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from echo_rl.config import ConfigError


def names() -> list[str]:
    files = resources.files("echo_rl.hub").joinpath("data").iterdir()
    return sorted(f.name[:-5] for f in files if f.name.endswith(".json"))


@dataclass(frozen=True)
class Study:
    name: str
    data: dict

    @property
    def title(self) -> str:
        return self.data["title"]

    @property
    def command(self) -> str:
        return self.data["command"]

    @property
    def tasks(self) -> list[str]:
        return list(self.data["tasks"])

    @property
    def methods(self) -> list[str]:
        return list(self.data["methods"])

    @property
    def metrics(self) -> dict[str, dict]:
        return dict(self.data["metrics"])

    def method(self, method: str) -> dict:
        if method not in self.data["methods"]:
            raise ConfigError(f"hub:{self.name} has no method {method!r}; methods: {', '.join(self.methods)}")
        return self.data["methods"][method]

    def seeds(self, method: str) -> list[int]:
        return list(self.method(method)["seeds"])

    def default_metric(self) -> str:
        return next(iter(self.data["metrics"]))

    def scores(self, method: str, metric: str | None = None) -> np.ndarray:
        """runs x tasks float array (NaN where the study does not report a cell); ready for
        ``echo_rl.utils.statistics`` once complete (``np.isfinite(...).all()``)."""
        metric = metric or self.default_metric()
        final = self.method(method)["final"]
        if metric not in final:
            raise ConfigError(f"hub:{self.name} method {method!r} has no metric {metric!r}; metrics: "
                              f"{', '.join(final)}")
        return np.array([[np.nan if v is None else v for v in row] for row in final[metric]], dtype=float)

    def score_dict(self, metric: str | None = None) -> dict[str, np.ndarray]:
        """{method: runs x tasks} for every method whose scores on ``metric`` are complete."""
        out = {}
        for m in self.methods:
            if (metric or self.default_metric()) in self.method(m)["final"]:
                s = self.scores(m, metric)
                if np.isfinite(s).all():
                    out[m] = s
        return out

    def curves(self, method: str, metric: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(steps [T], values [seeds, T]) of a per-seed learning curve; ConfigError where none is published."""
        metric = metric or self.default_metric()
        curves = self.method(method).get("curves", {})
        if metric not in curves:
            raise ConfigError(f"hub:{self.name} publishes no {metric!r} learning curve for {method!r} "
                              f"(curves: {', '.join(curves) or 'none'})")
        return np.asarray(curves[metric]["steps"], dtype=float), np.asarray(curves[metric]["values"], dtype=float)

    def plot_summary(self, metric: str | None = None, reps: int = 2_000) -> dict[str, Any]:
        """The summary ``echo_rl.evaluation.plots`` draws from: per-seed learning curves where published, and
        aggregate intervals of methods whose scores on ``metric`` are complete (success-like metrics in [0, 1])."""
        from echo_rl.utils.statistics import interval_estimates  # scipy: loaded on first use

        metric = metric or self.default_metric()
        task = self.tasks[0]
        curves: dict[str, list] = {}
        for m in self.methods:
            if metric in self.method(m).get("curves", {}):
                steps, values = self.curves(m, metric)
                curves[m] = [[{"step": float(t), "success_rate": float(v)} for t, v in zip(steps, run)]
                             for run in values]
        scores = {m: s for m, s in self.score_dict(metric).items() if ((s >= 0) & (s <= 1)).all()}
        aggregates = {m: {k: e.to_dict() for k, e in est.items()}
                      for m, est in interval_estimates(scores, reps=reps).items()} if scores else {}
        return {"labels": self.methods, "tasks": [task] if curves else self.tasks, "rows": [],
                "learning_curves": {task: curves} if curves else {}, "aggregates": aggregates,
                "confidence": 0.95, "profiles": {}}


@lru_cache(maxsize=None)
def _read(name: str) -> dict:
    return json.loads(resources.files("echo_rl.hub").joinpath("data", f"{name}.json").read_text())


def load(name: str) -> Study:
    """A published study by name (``names()``); ``hub:`` prefix allowed."""
    name = name[4:] if name.startswith("hub:") else name
    if name not in names():
        raise ConfigError(f"unknown hub study {name!r}; allowed: {', '.join(names())}")
    return Study(name, _read(name))


def resolve(spec: str) -> tuple[Study, str]:
    """``NAME`` or ``NAME/METHOD`` (methods may hold '/': the longest study-name prefix wins) -> (study, method);
    without a method, a study with one method gives that one."""
    spec = spec[4:] if spec.startswith("hub:") else spec
    for name in sorted(names(), key=len, reverse=True):
        if spec == name or spec.startswith(name + "/"):
            study = load(name)
            method = spec[len(name) + 1:]
            if not method:
                if len(study.methods) != 1:
                    raise ConfigError(f"hub:{name} has several methods: name one as hub:{name}/METHOD; methods: "
                                      f"{', '.join(study.methods)}")
                method = study.methods[0]
            study.method(method)
            return study, method
    raise ConfigError(f"unknown hub study in {spec!r}; allowed: {', '.join(names())} (then /METHOD)")


def describe() -> list[dict[str, Any]]:
    """One row per (study, method): what a ``--against hub:...`` can name."""
    return [{"study": n, "method": m, "seeds": len(load(n).seeds(m)), "tasks": load(n).tasks}
            for n in names() for m in load(n).methods]
