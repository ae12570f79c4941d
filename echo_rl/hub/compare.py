"""A new run's scores against a published study: ``echo-rl report RUN_DIR ... --against hub:STUDY/METHOD``.

Each RUN_DIR is one training run (one seed). Its score on the study's metric
is read from its ``metrics.jsonl`` the way the study measured it (the last
evaluation, or the first evaluation step with success >= 0.9 and the study's
budget when never reached), for the study's task the run trained on. Both
sides become runs x 1 matrices for ``echo_rl.utils.statistics``: IQM with
stratified-bootstrap CIs for each, and the probability that a new run beats a
published one (metrics where lower is better are negated for it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from echo_rl.config import ConfigError
from echo_rl.environments.registry import minigrid_id
from echo_rl.hub.scores import resolve
from echo_rl.utils.jail import Jail
from echo_rl.utils.monitoring import JsonlLogger

# hub metric -> how a run directory yields it
RUN_METRICS = {
    "final_eval_return": "the last evaluation's avg_reward",
    "success_at_last_eval": "the last evaluation's success_rate",
    "steps_to_0.9": "the first evaluation step with success_rate >= 0.9, else the study's budget",
    "heldout_success": "the last evaluation's success_rate",
    "heldout_env_ce": "the last evaluation's heldout_env_ce",
}


def _rows(run_dir: Path) -> list[dict]:
    if not os.path.lexists(run_dir / "metrics.jsonl"):
        raise ConfigError(f"RUN_DIR {run_dir} is not a training run directory (no metrics.jsonl)")
    rows = JsonlLogger.read("metrics.jsonl", Jail(run_dir))  # a regular file inside RUN_DIR, within its cap
    return [r for r in rows if any(k.startswith("eval/") for k in r)]


def run_score(run_dir: str | Path, metric: str, budget: float | None) -> float:
    run_dir = Path(run_dir)
    evals = _rows(run_dir)
    if not evals:
        raise ConfigError(f"RUN_DIR {run_dir} has no evaluation yet (train it to its end first)")
    if metric == "steps_to_0.9":
        hit = [r["step"] for r in evals if r.get("eval/success_rate", 0.0) >= 0.9]
        if hit:
            return float(hit[0])
        if budget is None:
            raise ConfigError("steps_to_0.9 needs the study's budget")
        return float(budget)
    key = {"final_eval_return": "eval/avg_reward", "success_at_last_eval": "eval/success_rate",
           "heldout_success": "eval/success_rate", "heldout_env_ce": "eval/heldout_env_ce"}[metric]
    last = [r[key] for r in evals if key in r]
    if not last:
        raise ConfigError(f"RUN_DIR {run_dir}: its evaluations have no {key}")
    return float(last[-1])


def _task_of(run_dir: Path) -> str:
    from echo_rl.export.runs import run_config  # torch: loaded on first use

    env = run_config(run_dir, flag="RUN_DIR").env_name
    return minigrid_id(env) or env


def compare(run_dirs: list[str], against: str, metric: str | None = None, reps: int = 20_000) -> dict:
    # scipy: loaded on first use
    from echo_rl.utils.statistics import aggregate_iqm, poi_interval, stratified_bootstrap_ci

    if not against.startswith("hub:"):
        raise ConfigError(f"--against {against!r} is invalid: give hub:STUDY[/METHOD] (python -c 'from "
                          f"echo_rl.hub import scores; print(scores.names())' lists them)")
    study, method = resolve(against)
    metric = metric or study.default_metric()
    if metric not in study.metrics:
        raise ConfigError(f"--metric {metric!r} is invalid for hub:{study.name}: allowed: {', '.join(study.metrics)}")
    tasks = {_task_of(Path(d)) for d in run_dirs}
    if len(tasks) != 1:
        raise ConfigError(f"the RUN_DIRs trained on different tasks ({', '.join(sorted(tasks))}); compare one task")
    task = tasks.pop()
    column = [i for i, t in enumerate(study.tasks) if t == task or t.startswith(task + " ")]
    if not column:
        raise ConfigError(f"hub:{study.name} has no task {task!r}; its tasks: {', '.join(study.tasks)}")
    published = study.scores(method, metric)[:, column[0]]
    published = published[np.isfinite(published)]
    if published.size == 0:
        raise ConfigError(f"hub:{study.name}/{method} publishes no {metric} on {task}")
    budget = study.data.get("budgets", {}).get(study.tasks[column[0]])
    mine = np.array([run_score(d, metric, budget) for d in run_dirs])
    higher = study.metrics[metric]["higher_is_better"]
    sign = 1.0 if higher else -1.0
    out = {"against": f"hub:{study.name}/{method}", "metric": metric, "higher_is_better": higher, "task": task,
           "how_read": RUN_METRICS[metric], "source": study.data.get("source"), "command": study.command}
    for side, scores in (("runs", mine), ("published", published)):
        point, ci = stratified_bootstrap_ci(scores[:, None], aggregate_iqm, reps=reps, seed=0)
        out[side] = {"n": int(scores.size), "scores": scores.tolist(), "iqm": float(point),
                     "iqm_ci": [float(ci[0]), float(ci[1])]}
    poi = poi_interval(sign * mine[:, None], sign * published[:, None], reps=min(reps, 5_000), seed=0)
    out["probability_of_improvement"] = poi.to_dict()
    return out


def format_comparison(r: dict) -> str:
    arrow = "higher" if r["higher_is_better"] else "lower"
    lines = [f"{r['metric']} on {r['task']} ({arrow} is better; {r['how_read']}) against {r['against']}:"]
    for side in ("runs", "published"):
        s = r[side]
        lo, hi = s["iqm_ci"]
        lines.append(f"  {side:<9} n={s['n']:<3} IQM {s['iqm']:.4g} [95% CI {lo:.4g}, {hi:.4g}]")
    p = r["probability_of_improvement"]
    lines.append(f"  P(a run beats a published one) = {p['point']:.3f} [95% CI {p['low']:.3f}, {p['high']:.3f}]")
    return "\n".join(lines)
