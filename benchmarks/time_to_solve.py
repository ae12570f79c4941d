"""Time to solve: the wall-clock seconds each (method, env, seed) cell trains before its first evaluation >= 0.9.

What a user of the EchoRL vector agent asks is how soon it solves the task, not how many env
steps per second it runs; this measures that, side by side with PPO, on the sample-efficiency
study's cells (``sample_efficiency.py``: the same settings, budgets, evaluation and ``run_cell``)::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/time_to_solve.py run --out runs/time_to_solve \\
        --methods ppo echo-rl --seeds 0 1 2 3 4 --workers 2 \\
        --budget MiniGrid-MultiRoom-N2-S4-v0=250000 MiniGrid-KeyCorridorS3R1-v0=500000 \\
        MiniGrid-DoorKey-8x8-v0=1000000
    python benchmarks/time_to_solve.py report --out runs/time_to_solve

A cell's time is the seconds spent in ``train_iteration`` up to the first evaluation at or above
the threshold (evaluations excluded: how many there are is the protocol's choice, not the
agent's). A cell that never gets there counts at the time it took to spend its whole budget and
is flagged. Each process runs torch and the BLAS on one thread and records the CPU (``lscpu``).
Cells run in an interleaved order — per seed and env every method once, the methods' order
reversed on every other seed — so load that changes during the run falls on all methods alike.
Aggregates: IQM over seeds x envs with 95% stratified-bootstrap CIs (``echo_rl.utils.statistics``),
pooled and per env; env steps per training second is the secondary column.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sample_efficiency as se  # noqa: E402 - the study's cells, budgets and provenance

import numpy as np  # noqa: E402

DEFAULT_METHODS = ["ppo", "echo-rl/no-plan"]  # PPO and the default EchoRL agent (the study's "echo-rl" has the plan)


def interleaved(methods: list[str], envs: list[str], seeds: list[int]) -> list[tuple[str, str, int]]:
    """Every (method, env, seed) cell, ordered seed by seed and env by env with every method once in each
    group, the methods reversed on every other seed: with two workers, neighbouring cells of different
    methods run side by side and each method goes first as often as second."""
    order = []
    for i, seed in enumerate(seeds):
        for env in envs:
            order += [(m, env, seed) for m in (methods if i % 2 == 0 else methods[::-1])]
    return order


def time_to_threshold(cell: dict, threshold: float) -> tuple[float, bool]:
    """(training seconds to the first evaluation >= threshold, True), else (the whole cell's training seconds,
    False): a cell that never solves counts at its budget's time."""
    if "train_s" not in cell:
        raise ValueError(f"cell {se.cell_name(cell['method'], cell['env'], cell['seed'])} has no training time "
                         "(train_s): it was made by a runner older than time_to_solve.py; run it again")
    for point in cell["curve"]:
        if point["success_rate"] >= threshold:
            return float(point["train_s"]), True
    return float(cell["train_s"]), False


def steps_per_second(cell: dict) -> float:
    """Env steps the cell trained per second of training (evaluations excluded)."""
    steps = cell["curve"][-1]["step"] if cell["curve"] else 0
    return steps / cell["train_s"] if cell["train_s"] > 0 else float("nan")


def summarize_times(cells: list[dict], threshold: float = 0.9, reps: int = 50_000) -> list[dict]:
    """Per method, pooled over envs and per env: IQM [95% CI] of time to ``threshold``, cells solved, steps/s.

    The pooled score matrix is seeds x envs, so only seeds every env has enter it (the per-env rows
    use all of theirs). ``ratio_to_ppo`` is the method's IQM over PPO's on the same envs and seeds, when PPO
    ran them, with a 95% CI from resampling each method's seeds independently within each env (the issue's
    goal is a pooled ratio of at most 0.5).
    """
    from echo_rl.utils.statistics import aggregate_iqm, stratified_bootstrap_ci

    methods = [m for m in se.METHODS if any(c["method"] == m for c in cells)]
    methods += sorted({c["method"] for c in cells} - set(methods))
    rows, matrices = [], {}
    for method in methods:
        mine = [c for c in cells if c["method"] == method]
        envs = [e for e in se.ENVS if any(c["env"] == e for c in mine)]
        envs += sorted({c["env"] for c in mine} - set(envs))
        by_env = {e: {c["seed"]: c for c in mine if c["env"] == e} for e in envs}
        common = sorted(set.intersection(*(set(v) for v in by_env.values())))
        scopes = [("all", envs, common)] if common else []
        if len(envs) > 1 or not common:
            scopes += [(e, [e], sorted(by_env[e])) for e in envs]
        for scope, scope_envs, seeds in scopes:
            grid = [[by_env[e][s] for e in scope_envs] for s in seeds]
            hits = [[time_to_threshold(c, threshold) for c in row] for row in grid]
            secs = np.array([[h[0] for h in row] for row in hits])
            matrices[method, tuple(scope_envs)] = (seeds, secs)
            point, ci = stratified_bootstrap_ci(secs, aggregate_iqm, reps=reps, seed=0)
            used = [c for row in grid for c in row]
            rows.append({"method": method, "scope": scope, "envs": scope_envs, "seeds": seeds,
                         "solved": int(sum(h[1] for row in hits for h in row)), "cells": len(used),
                         "time_to_threshold_s": (float(point), float(ci[0]), float(ci[1])),
                         "steps_per_s": float(np.median([steps_per_second(c) for c in used])),
                         "cpus": sorted({c.get("cpu", "unrecorded") for c in used}),
                         "threads": sorted({c.get("torch_threads", 0) for c in used})})
    for r in rows:
        mine, base = matrices[r["method"], tuple(r["envs"])], matrices.get(("ppo", tuple(r["envs"])))
        r["ratio_to_ppo"] = None
        if base is not None and base[0] == mine[0] and aggregate_iqm(base[1]) > 0:
            envs = mine[1].shape[1]  # both matrices side by side: the bootstrap resamples each column on its own
            ratio = lambda m: aggregate_iqm(m[..., :envs]) / aggregate_iqm(m[..., envs:])  # noqa: E731
            point, ci = stratified_bootstrap_ci(np.hstack([mine[1], base[1]]), ratio, reps=reps, seed=0)
            r["ratio_to_ppo"] = (float(point), float(ci[0]), float(ci[1]))
    return rows


def summary_table(rows: list[dict], threshold: float = 0.9) -> list[str]:
    lines = [f"| method | scope (seeds) | solved (>= {threshold}) | time to {threshold} IQM [95% CI] | "
             "× PPO's IQM [95% CI] | env steps/s (median) |", "|---|---|---|---|---|---|"]
    for r in rows:
        t = r["time_to_threshold_s"]
        scope = ", ".join(map(se._short, r["envs"]))
        scope = f"**pooled**: {scope}" if len(r["envs"]) > 1 else scope
        seeds = ",".join(map(str, r["seeds"]))
        q = r["ratio_to_ppo"]
        ratio = "–" if q is None else f"{q[0]:.2f}x [{q[1]:.2f}, {q[2]:.2f}]"
        lines.append(f"| `{r['method']}` | {scope} ({seeds}) | {r['solved']}/{r['cells']} | "
                     f"{t[0]:,.0f} s [{t[1]:,.0f}, {t[2]:,.0f}] | {ratio} | {r['steps_per_s']:,.0f} |")
    return lines


def per_cell_table(cells: list[dict], threshold: float = 0.9) -> list[str]:
    """Each cell's seconds to ``threshold``; one that never got there: its budget's seconds, flagged '(not solved)'."""
    seeds = sorted({c["seed"] for c in cells})
    lines = ["| env | method | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|---|" + "---|" * len(seeds)]
    envs = [e for e in se.ENVS if any(c["env"] == e for c in cells)] + sorted({c["env"] for c in cells} - set(se.ENVS))
    for env in envs:
        for method in sorted({c["method"] for c in cells if c["env"] == env}):
            entry = {}
            for c in cells:
                if c["env"] == env and c["method"] == method:
                    secs, solved = time_to_threshold(c, threshold)
                    entry[c["seed"]] = f"{secs:,.0f} s" if solved else f"{secs:,.0f} s (not solved)"
            lines.append(f"| {se._short(env)} | `{method}` | " + " | ".join(entry.get(s, "–") for s in seeds) + " |")
    return lines


def report(out: Path, reps: int, allow_mixed: bool = False, threshold: float = 0.9) -> str:
    cells = se.load_cells(out) if (out / "cells").is_dir() else []
    if not cells:
        raise ValueError(f"{out} holds no finished cells (cells/*.json); run the benchmark first")
    se.check_provenance(cells, allow_mixed)
    rows = summarize_times(cells, threshold, reps)
    cpus = sorted({cpu for r in rows for cpu in r["cpus"]})
    threads = sorted({t for r in rows for t in r["threads"]})
    lines = [f"CPU: {'; '.join(cpus)}; torch threads per process: {', '.join(map(str, threads))}", "",
             *summary_table(rows, threshold), "",
             f"Per cell: training seconds to the first evaluation >= {threshold} (evaluations excluded):", "",
             *per_cell_table(cells, threshold)]
    (out / "time_to_solve.json").write_text(json.dumps(rows, indent=1))
    text = "\n".join(lines)
    print(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train every missing cell (interleaved), then report")
    r.add_argument("--out", default="runs/time_to_solve")
    r.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=list(se.METHODS))
    r.add_argument("--envs", nargs="+", default=list(se.ENVS))
    r.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    r.add_argument("--total-steps", type=int, default=1_000_000, help="budget of envs without a --budget")
    r.add_argument("--budget", nargs="*", default=[], metavar="ENV=STEPS", help="per-env step budgets")
    r.add_argument("--eval-every", type=int, default=25_000)
    r.add_argument("--eval-episodes", type=int, default=32)
    r.add_argument("--early-stop", type=int, default=1, metavar="K",
                   help="end a cell after K consecutive evaluations >= 0.9 (default 1: once it is solved)")
    r.add_argument("--workers", type=int, default=1, help="cells trained side by side (one core each)")
    r.add_argument("--reps", type=int, default=50_000, help="bootstrap resamples")
    p = sub.add_parser("report", help="aggregate the finished cells")
    p.add_argument("--out", default="runs/time_to_solve")
    p.add_argument("--reps", type=int, default=50_000)
    p.add_argument("--allow-mixed", action="store_true",
                   help="pool cells of one method that ran different versions of its agent file")
    args = parser.parse_args(argv)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # before torch loads (workers inherit)
        os.environ[var] = "1"

    from echo_rl.config import ConfigError
    from echo_rl.environments.registry import check_task_name

    out = Path(args.out)
    try:
        if args.cmd == "run":
            for env in args.envs:
                check_task_name(f"minigrid:{env}")
            budgets = se.parse_budgets(args.budget, args.envs, args.total_steps)
            for name, value, low in (("--early-stop", args.early_stop, 1), ("--workers", args.workers, 1),
                                     ("--eval-every", args.eval_every, 1), ("--eval-episodes", args.eval_episodes, 1)):
                if value < low:
                    raise ConfigError(f"{name}={value} is invalid: must be >= {low}")
        else:
            report(out, args.reps, args.allow_mixed)
            return 0
    except (ConfigError, ValueError) as exc:
        print(f"time_to_solve: error: {exc}", file=sys.stderr)
        return 2
    todo = [(m, e, s) for m, e, s in interleaved(args.methods, args.envs, args.seeds)
            if not (out / "cells" / f"{se.cell_name(m, e, s)}.json").exists()]
    print(f"{len(todo)} cells to train -> {out} (commit {se.code_commit()}; {se.cpu_name()})", flush=True)
    job = dict(eval_every=args.eval_every, eval_episodes=args.eval_episodes, out=str(out), early_stop=args.early_stop)
    if args.workers <= 1:
        for m, e, s in todo:
            se.run_cell(m, e, s, total_steps=budgets[e], **job)
    else:
        with ProcessPoolExecutor(args.workers) as pool:
            for f in [pool.submit(se.run_cell, m, e, s, total_steps=budgets[e], **job) for m, e, s in todo]:
                f.result()
    try:
        report(out, args.reps)
    except se.MixedCellsError as exc:
        print(f"time_to_solve: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
