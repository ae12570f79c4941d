"""From stored cells to results: JSON, CSV, the Markdown paper table, statistics and plots.

Everything here works from a run's config and stored cells (``config.yaml`` and
``cells/*.json``, read by :func:`echo_rl.evaluation.benchmark.load_run`), so
``echo-rl report RUN_DIR`` regenerates the same report at any time, including
from a benchmark that was interrupted half way.

The score for the statistics is Success@1 per (task, seed), already in [0, 1]
so no normalisation is applied. A method's aggregate covers the tasks on which
all its seeds finished; the report lists those tasks beside each aggregate.
"""

from __future__ import annotations

import csv
import datetime as _dt
import itertools
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from echo_rl.evaluation.records import write_json_atomic
from echo_rl.utils import statistics as st

CELL_COLUMNS = ("task", "method", "backbone", "seed", "label", "status", "reason", "num_episodes", "success_at_1",
                "avg_reward", "avg_episode_length", "tokens_per_episode", "etps", "kv_reuse", "wall_time_s",
                "cpu_time_s", "env_steps_per_s", "api_cost_usd", "compute_cost_usd", "cost_usd",
                "cost_per_success", "env_steps_trained", "finished_at")
MEAN_FIELDS = ("avg_reward", "avg_episode_length", "tokens_per_episode", "etps", "kv_reuse", "wall_time_s",
               "cost_usd", "env_steps_per_s")


def _order(config: dict[str, Any], records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Tasks and labels in the order the config names them (records of dropped names last)."""
    tasks = list(dict.fromkeys([*config.get("tasks", []), *(r["task"] for r in records)]))
    method_rank = {m: i for i, m in enumerate(config.get("baselines", []))}
    labels = sorted({(method_rank.get(r["method"], 999), r["label"]) for r in records})
    return tasks, list(dict.fromkeys(lbl for _, lbl in labels))


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def summarize(config: dict[str, Any], records: list[dict[str, Any]], reps: int | None = None,
              confidence: float | None = None, seed: int = 0) -> dict[str, Any]:
    """Per-(task, method) rows with CIs, aggregates over tasks, PoI and performance profiles."""
    reps = int(reps or config.get("bootstrap_reps", 50_000))
    confidence = float(confidence or config.get("confidence", 0.95))
    planned_seeds = [config.get("seed_offset", 0) + i for i in range(int(config.get("num_seeds", 1)))]
    tasks, labels = _order(config, records)
    by = defaultdict(list)
    for r in records:
        by[(r["task"], r["label"])].append(r)

    rows = []
    complete: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)  # label -> task -> seed -> score
    for task in tasks:
        for label in labels:
            recs = sorted(by.get((task, label), []), key=lambda r: r["seed"])
            if not recs:
                continue
            ok = [r for r in recs if r["status"] == "ok"]
            row: dict[str, Any] = {"task": task, "label": label, "method": recs[0]["method"],
                                   "backbone": recs[0]["backbone"], "seeds_ok": len(ok), "seeds": len(recs),
                                   "status": _row_status(recs)}
            bad = [r for r in recs if r["status"] != "ok"]
            if bad:
                row["reason"] = bad[0].get("reason", "")
            errored = [r.get("notes") or {} for r in ok if (r.get("notes") or {}).get("num_episode_errors")]
            if errored:  # episodes the harness could not run count as failures in Success@1: say so
                row["episode_errors"] = sum(int(n["num_episode_errors"]) for n in errored)
                row["first_episode_error"] = (errored[0].get("episode_errors") or [""])[0]
            if ok:
                scores = np.array([[r["metrics"]["success_at_1"]] for r in ok])
                point, ci = st.stratified_bootstrap_ci(scores, st.aggregate_mean, reps, confidence, seed)
                row["success_at_1"] = {"point": float(point), "low": float(ci[0]), "high": float(ci[1])}
                for f in MEAN_FIELDS:
                    row[f] = _mean([r["metrics"].get(f) for r in ok])
                costs = [r["metrics"]["cost_usd"] for r in ok]
                cost = None if any(c is None for c in costs) else sum(costs)
                succ = sum(r["metrics"]["successes"] for r in ok)
                row["total_cost_usd"] = cost
                row["total_successes"] = succ
                row["cost_per_success"] = cost / succ if cost is not None and succ > 0 else None
                row["episodes_per_seed"] = ok[0]["metrics"]["num_episodes"]
                seeds_ok = {r["seed"] for r in ok}
                if all(s in seeds_ok for s in planned_seeds):
                    complete[label][task] = {r["seed"]: r["metrics"]["success_at_1"] for r in ok}
            rows.append(row)

    matrices: dict[str, tuple[list[str], np.ndarray]] = {}
    for label in labels:
        ts = [t for t in tasks if t in complete.get(label, {})]
        if ts:
            matrices[label] = (ts, np.array([[complete[label][t][s] for t in ts] for s in planned_seeds]))
    aggregates = {}
    for i, (label, (ts, m)) in enumerate(matrices.items()):
        est = st.interval_estimates({label: m}, reps=reps, confidence=confidence, seed=seed + i)[label]
        aggregates[label] = {"tasks": ts, "runs": int(m.shape[0]),
                             **{k: v.to_dict() for k, v in est.items()}}

    poi = []
    for (lx, (tx, mx)), (ly, (ty, my)) in itertools.combinations(matrices.items(), 2):
        common = [t for t in tx if t in ty]
        if not common:
            continue
        x = mx[:, [tx.index(t) for t in common]]
        y = my[:, [ty.index(t) for t in common]]
        est = st.poi_interval(x, y, reps=min(reps, 10_000), confidence=confidence, seed=seed)
        poi.append({"x": lx, "y": ly, "tasks": common, **est.to_dict()})

    taus = np.linspace(0.0, 1.0, 51)
    profiles = {}
    for label, (ts, m) in matrices.items():
        prof, band = st.performance_profile(m, taus, reps=min(reps, 2_000), confidence=confidence, seed=seed)
        profiles[label] = {"tasks": ts, "tau": taus.tolist(), "profile": prof.tolist(), "low": band[0].tolist(),
                           "high": band[1].tolist()}

    benchmarks = {}
    for r in records:
        label = (r.get("notes") or {}).get("benchmark")
        if r["status"] == "ok" and label:
            benchmarks.setdefault(r["task"], label)

    curves = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r["status"] == "ok" and r.get("learning_curve"):
            curves[r["task"]][r["label"]].append(r["learning_curve"])

    return {"rows": rows, "aggregates": aggregates, "probability_of_improvement": poi, "profiles": profiles,
            "learning_curves": {t: dict(v) for t, v in curves.items()}, "tasks": tasks, "labels": labels,
            "task_benchmarks": benchmarks,
            "bootstrap_reps": reps, "confidence": confidence, "planned_seeds": planned_seeds}


def _row_status(recs: list[dict[str, Any]]) -> str:
    statuses = {r["status"] for r in recs}
    if statuses == {"ok"}:
        return "ok"
    if statuses == {"skipped"}:
        return "skipped"
    return "partial" if "ok" in statuses else sorted(statuses - {"skipped"} or statuses)[0]


# ---------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------

def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return f"{v:.{digits}f}"


def _fmt_ci(est: dict[str, float] | None) -> str:
    if not est:
        return "n/a"
    return f"{est['point']:.3f} [{est['low']:.3f}, {est['high']:.3f}]"


def _fmt_usd(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"${v:.2e}" if 0 < v < 0.01 else f"${v:.2f}"


def _fmt_big(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def markdown(config: dict[str, Any], summary: dict[str, Any], plots: list[str]) -> str:
    pct = int(round(summary["confidence"] * 100))
    lines = [
        "# EchoRL benchmark report", "",
        f"Generated {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')} from the cells stored in this "
        f"run directory (`echo-rl report RUN_DIR` regenerates it).", "",
        f"- Tasks: {', '.join(summary['tasks'])}",
        *[f"- `{t}` is {b} (as its environment reports)" for t, b in summary.get("task_benchmarks", {}).items()],
        f"- Methods: {', '.join(config.get('baselines', []))}; backbones: "
        f"{', '.join(config.get('backbones') or []) or 'none'}",
        f"- Seeds per cell: {len(summary['planned_seeds'])} ({', '.join(map(str, summary['planned_seeds']))}); "
        f"evaluation episodes per seed: {config.get('num_episodes')}; step cap {config.get('max_steps_per_episode')}",
        f"- Intervals: {pct}% percentile stratified bootstrap over seeds, {summary['bootstrap_reps']:,} resamples "
        f"(Agarwal et al. 2021)",
        f"- Cost: API cost reported by the backbone + local compute at ${config.get('cpu_hour_usd')}/CPU-hour of "
        f"measured process CPU time (${config.get('gpu_hour_usd')}/GPU-hour when a GPU was used); prices are "
        f"configuration, not measurements", "",
        "## Results", "",
        f"| Task | Method | Success@1 ({pct}% CI) | ETPS | Cost/Success | Seeds |",
        "|---|---|---|---|---|---|",
    ]
    named = summary.get("task_benchmarks", {})
    for row in summary["rows"]:
        task = f"{row['task']} [{named[row['task']]}]" if row["task"] in named else row["task"]
        if row["status"] == "skipped":
            lines.append(f"| {task} | {row['label']} | skipped | | | 0/{row['seeds']} |")
            continue
        if not row["seeds_ok"]:
            lines.append(f"| {task} | {row['label']} | {row['status']} | | | 0/{row['seeds']} |")
            continue
        errored = f" ({row['episode_errors']} episodes errored)" if row.get("episode_errors") else ""
        lines.append(f"| {task} | {row['label']} | {_fmt_ci(row.get('success_at_1'))}{errored} | "
                     f"{_fmt(row.get('etps'), 1)} | {_fmt_usd(row.get('cost_per_success'))} | "
                     f"{row['seeds_ok']}/{row['seeds']} |")
    lines += ["", "ETPS (effective tokens per second) is n/a for policies that do not use tokens; Cost/Success is n/a when nothing succeeded or an API model has no price.", ""]
    for row in summary["rows"]:
        if row.get("episode_errors"):
            first = " ".join(str(row["first_episode_error"]).split())[:200]
            lines += [f"{row['task']}, {row['label']}: {row['episode_errors']} episodes errored (the harness could "
                      f"not run them; Success@1 counts them as failures). First: {first}", ""]
    if summary["aggregates"]:
        lines += [f"## Aggregate Success@1 over tasks ({pct}% CI)", "",
                  "| Method | Tasks | IQM | Mean | Median | Optimality gap |", "|---|---|---|---|---|---|"]
        for label, a in summary["aggregates"].items():
            lines.append(f"| {label} | {', '.join(a['tasks'])} | {_fmt_ci(a['iqm'])} | {_fmt_ci(a['mean'])} | "
                         f"{_fmt_ci(a['median'])} | {_fmt_ci(a['optimality_gap'])} |")
        lines += ["", "Aggregates over different task sets are not comparable; compare methods on the same tasks.",
                  ""]
    if summary["probability_of_improvement"]:
        lines += ["## Probability of improvement", "", f"| X | Y | Tasks | P(X > Y) ({pct}% CI) |", "|---|---|---|---|"]
        for p in summary["probability_of_improvement"]:
            lines.append(f"| {p['x']} | {p['y']} | {', '.join(p['tasks'])} | {_fmt_ci(p)} |")
        lines.append("")
    lines += ["## Details (means over finished seeds)", "",
              "| Task | Method | Avg reward | Episode length | Tokens/episode | KV reuse | Env steps/s | "
              "Wall time/seed (s) | Cost/seed |", "|---|---|---|---|---|---|---|---|---|"]
    for row in summary["rows"]:
        if row["seeds_ok"]:
            lines.append(f"| {row['task']} | {row['label']} | {_fmt(row.get('avg_reward'))} | "
                         f"{_fmt(row.get('avg_episode_length'), 1)} | {_fmt(row.get('tokens_per_episode'), 1)} | "
                         f"{_fmt(row.get('kv_reuse'))} | {_fmt_big(row.get('env_steps_per_s'))} | "
                         f"{_fmt(row.get('wall_time_s'), 1)} | {_fmt_usd(row.get('cost_usd'))} |")
    lines.append("")
    not_ok = [r for r in summary["rows"] if r["status"] != "ok"]
    if not_ok:
        lines += ["## Skipped and failed cells", "", "| Task | Method | Status | Reason |", "|---|---|---|---|"]
        for row in not_ok:
            reason = str(row.get("reason", "")).replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {row['task']} | {row['label']} | {row['status']} "
                         f"({row['seeds'] - row['seeds_ok']}/{row['seeds']}) | {reason} |")
        lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def _cell_row(r: dict[str, Any]) -> dict[str, Any]:
    m = r.get("metrics", {})
    out = {k: r.get(k) for k in ("task", "method", "backbone", "seed", "label", "status", "reason", "finished_at")}
    out.update({k: m.get(k) for k in CELL_COLUMNS if k not in out})
    return out


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    tmp.replace(path)


def write_report(run_dir: str | Path, config: dict[str, Any], records: list[dict[str, Any]], plots: bool = True,
                 tables: bool = True, reps: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Write results.json/csv, summary.csv, report.md and plots/*.png of ``records`` (the run's current cells,
    :func:`echo_rl.evaluation.benchmark.load_run`) into ``run_dir``; returns the paths written."""
    run_dir = Path(run_dir)
    summary = summarize(config, records, reps=reps, seed=seed)
    written: dict[str, Any] = {}
    plot_files: list[str] = []
    if plots:
        from echo_rl.evaluation.plots import write_plots  # needed on this path only

        plot_files = write_plots(run_dir / "plots", summary)
        written["plots"] = [str(run_dir / p) for p in plot_files]
        plot_files = [f"plots/{Path(p).name}" for p in plot_files]
    if tables:
        cells = sorted(records, key=lambda r: (r["task"], r["label"], r["seed"]))
        write_json_atomic(run_dir / "results.json", {
            "config": config, "summary": {k: v for k, v in summary.items() if k != "learning_curves"},
            "learning_curves": summary["learning_curves"],
            "cells": [{k: v for k, v in r.items() if k != "episodes"} for r in cells]})
        _write_csv(run_dir / "results.csv", [_cell_row(r) for r in cells], list(CELL_COLUMNS))
        flat = []
        for row in summary["rows"]:
            f = {k: v for k, v in row.items() if k != "success_at_1"}
            s = row.get("success_at_1") or {}
            f.update({"success_at_1": s.get("point"), "success_at_1_low": s.get("low"),
                      "success_at_1_high": s.get("high")})
            flat.append(f)
        cols = ["task", "label", "method", "backbone", "status", "seeds_ok", "seeds", "episodes_per_seed",
                "success_at_1", "success_at_1_low", "success_at_1_high", *MEAN_FIELDS, "total_cost_usd",
                "total_successes", "cost_per_success", "reason"]
        _write_csv(run_dir / "summary.csv", flat, cols)
        md = run_dir / "report.md"
        tmp = md.with_suffix(".md.tmp")
        tmp.write_text(markdown(config, summary, plot_files))
        tmp.replace(md)
        written.update({"report": str(md), "results_json": str(run_dir / "results.json"),
                        "results_csv": str(run_dir / "results.csv"), "summary_csv": str(run_dir / "summary.csv")})
    return written
