"""PNG plots of a benchmark summary (matplotlib, no display needed).

- ``success_by_task.png``: Success@1 per task and method with CIs;
- ``aggregate.png``: median / IQM / mean / optimality gap with CIs (rliable's interval plot);
- ``performance_profile.png``: fraction of runs above each Success@1 threshold, with CI bands;
- ``learning_curves.png``: evaluation success over environment steps for trained methods.
A plot whose data is absent (e.g. no trained method finished) is not drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from echo_rl.utils.statistics import AGGREGATE_NAMES

TITLES = {"median": "Median", "iqm": "IQM", "mean": "Mean", "optimality_gap": "Optimality gap"}


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _colors(labels: list[str]) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    return {lbl: cmap(i % 10) for i, lbl in enumerate(labels)}


def _save(fig: Any, path: Path) -> str:
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    _plt().close(fig)
    tmp.replace(path)
    return str(path)


def plot_success_by_task(summary: dict[str, Any], path: Path) -> str | None:
    rows = [r for r in summary["rows"] if r.get("success_at_1")]
    if not rows:
        return None
    plt = _plt()
    tasks = [t for t in summary["tasks"] if any(r["task"] == t for r in rows)]
    labels = [lbl for lbl in summary["labels"] if any(r["label"] == lbl for r in rows)]
    colors = _colors(summary["labels"])
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(tasks) * max(1, len(labels)) ** 0.5), 3.6))
    for j, label in enumerate(labels):
        for i, task in enumerate(tasks):
            r = next((r for r in rows if r["task"] == task and r["label"] == label), None)
            if r is None:
                continue
            s = r["success_at_1"]
            x = i - 0.4 + width * (j + 0.5)
            ax.bar(x, s["point"], width * 0.9, color=colors[label], label=label)
            ax.errorbar(x, s["point"], yerr=[[s["point"] - s["low"]], [s["high"] - s["point"]]], color="black",
                        capsize=3, lw=1)
    handles, names = ax.get_legend_handles_labels()
    uniq = dict(zip(names, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="best")
    ax.set_xticks(range(len(tasks)), tasks, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("Success@1")
    ax.set_title(f"Success@1 per task ({int(summary['confidence'] * 100)}% CI over seeds)")
    return _save(fig, path)


def plot_aggregates(summary: dict[str, Any], path: Path) -> str | None:
    agg = summary["aggregates"]
    if not agg:
        return None
    plt = _plt()
    labels = list(agg)
    colors = _colors(summary["labels"])
    fig, axes = plt.subplots(1, 4, figsize=(12, 0.5 + 0.45 * len(labels) + 1.2), sharey=True)
    for ax, name in zip(axes, AGGREGATE_NAMES):
        for i, label in enumerate(labels):
            e = agg[label][name]
            ax.barh(i, max(e["high"] - e["low"], 0.004), left=e["low"], height=0.6, color=colors[label],
                    alpha=0.75)
            ax.vlines(e["point"], i - 0.3, i + 0.3, color="black", lw=2)
        ax.set_xlim(-0.03, 1.03)
        ax.set_title(TITLES[name])
        ax.set_xlabel("Success@1")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(labels)), labels)
    fig.suptitle(f"Aggregate Success@1 ({int(summary['confidence'] * 100)}% stratified-bootstrap CI)", y=1.02)
    return _save(fig, path)


def plot_profiles(summary: dict[str, Any], path: Path) -> str | None:
    profiles = summary["profiles"]
    if not profiles:
        return None
    plt = _plt()
    colors = _colors(summary["labels"])
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, p in profiles.items():
        tau = np.array(p["tau"])
        ax.plot(tau, p["profile"], color=colors[label], label=label, drawstyle="steps-post")
        ax.fill_between(tau, p["low"], p["high"], color=colors[label], alpha=0.2, step="post")
    ax.set_xlabel(r"Success@1 threshold $\tau$")
    ax.set_ylabel(r"Fraction of runs with score > $\tau$")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.set_title("Performance profiles")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_learning_curves(summary: dict[str, Any], path: Path) -> str | None:
    curves = summary["learning_curves"]
    if not curves:
        return None
    plt = _plt()
    colors = _colors(summary["labels"])
    tasks = [t for t in summary["tasks"] if t in curves]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for label, runs in curves[task].items():
            steps = sorted({p["step"] for run in runs for p in run})
            grid = np.full((len(runs), len(steps)), np.nan)
            for i, run in enumerate(runs):
                for p in run:
                    grid[i, steps.index(p["step"])] = p["success_rate"]
            mean = np.nanmean(grid, axis=0)
            ax.plot(steps, mean, color=colors.get(label), label=f"{label} (n={len(runs)})")
            ax.fill_between(steps, np.nanmin(grid, axis=0), np.nanmax(grid, axis=0), color=colors.get(label),
                            alpha=0.2)
        ax.set_title(task)
        ax.set_xlabel("environment steps")
        ax.set_ylabel("evaluation success (mean, min-max over seeds)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def write_plots(out_dir: str | Path, summary: dict[str, Any]) -> list[str]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fn, name in ((plot_success_by_task, "success_by_task.png"), (plot_aggregates, "aggregate.png"),
                     (plot_profiles, "performance_profile.png"), (plot_learning_curves, "learning_curves.png")):
        p = fn(summary, out_dir / name)
        if p:
            written.append(p)
    return written
