"""Sample-efficiency study: EchoRL vs PPO vs IMPALA (+ EchoRL ablations) on MiniGrid, many seeds.

One command runs the whole study and writes the table and plots::

    nice -n 10 python benchmarks/sample_efficiency.py run --out runs/sample_efficiency_s2 --seeds 0 1 2 3 4 \\
        --budget MiniGrid-MultiRoom-N2-S4-v0=250000 MiniGrid-KeyCorridorS3R1-v0=500000 \\
        MiniGrid-DoorKey-8x8-v0=1000000 --eval-every 25000 --early-stop 2 --workers 2
    python benchmarks/sample_efficiency.py report --out runs/sample_efficiency_s2 \\
        --plot docs/results_sample_efficiency.png

(docs/results.md gives the per-method snapshot commands the published table was made with.)

``run`` trains every (method, env, seed) cell not already finished in ``--out``
(each cell writes ``cells/<method>__<env>__<seed>.json`` when done, so a killed
study resumes where it stopped); ``report`` aggregates whatever cells exist.
``snapshot`` exports a commit (``git archive``) to run from, so edits landing in
a shared checkout cannot leak into cells that are still training. Every cell
records the git commit it ran from and a SHA-256 of its agent's source file;
``report`` refuses to pool cells of one method whose agent files differ
(``--allow-mixed`` overrides, and the table then says so).

``--budget ENV=STEPS`` sets a per-env step budget (it also sets the LR-annealing
horizon, so it is part of the cell's definition). ``--early-stop K`` ends a cell
after K consecutive evaluations >= the threshold: its "final" number is then
the success at its last evaluation, not at the budget, and the report labels
it that way.
Every method gets the same settings (the shared block below, PPO's
rl-starter-files MiniGrid recipe) and no per-method tuning.

Per cell: greedy-free (sampled) evaluation every ``--eval-every`` env steps on
``--eval-episodes`` fixed-seed episodes; "steps to 0.9" is the first evaluation
at which success >= 0.9 (cells that never get there count as the budget, and
the table also says how many did not). Aggregates: IQM over seeds x envs with
95% stratified-bootstrap CIs (``echo_rl.utils.statistics``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ENVS = ("MiniGrid-DoorKey-8x8-v0", "MiniGrid-KeyCorridorS3R1-v0", "MiniGrid-MultiRoom-N2-S4-v0")

# Shared by every method: the only settings the study fixes (no per-method tuning).
SHARED = {
    "num_actors": 16, "batch_size": 2048,
    "ppo_config.learning_rate": 1e-3, "ppo_config.num_epochs": 4, "ppo_config.batch_size": 256,
    "ppo_config.entropy_coef": 0.01, "ppo_config.gamma": 0.99, "ppo_config.gae_lambda": 0.95,
    "planning_config.embedding_dim": 64, "planning_config.state_window_size": 8,
    "replay_config.age_threshold": 256, "replay_config.max_replay_age": 2048,
    "replay_config.min_experiences": 256,
}

# Every echo-rl method's agent is the one the study measured: with the latent plan, whatever
# echo_config.latent_plan's default is (the ablations below switch parts off from it).
ECHO_STUDY_AGENT = {"echo_config.latent_plan": True}

# method -> (agent, overrides on top of SHARED, and of ECHO_STUDY_AGENT for echo-rl methods)
METHODS = {
    "echo-rl": ("echo-rl", {}),
    "ppo": ("ppo", {}),
    "impala": ("impala", {}),
    "echo-rl/no-plan": ("echo-rl", {"echo_config.latent_plan": False}),
    "echo-rl/no-kl": ("echo-rl", {"planning_config.kl_weight": 0.0}),
    "echo-rl/no-replay": ("echo-rl", {"echo_config.replay_updates": 0}),
    "echo-rl/no-world-model": ("echo-rl", {"echo_config.world_model_coef": 0.0}),
    "echo-rl/no-self-imitation": ("echo-rl", {"echo_config.self_imitation_updates": 0}),
    # the plan and world model learn in one pass per rollout; PPO reads the acting plans (docs/benchmarks.md)
    "echo-rl/rollout-plan": ("echo-rl", {"echo_config.plan_pass": "rollout"}),
    # PPO + self-imitation alone: without the plan the world model reads only detached trunk features, so
    # nothing the policy uses learns from it, and the sequence replay trains only the value
    "echo-rl/si-only": ("echo-rl", {"echo_config.latent_plan": False, "echo_config.replay_updates": 0,
                                    "echo_config.world_model_coef": 0.0}),
}
# PPO + an intrinsic reward (echo_rl.intrinsic) at the documented defaults (beta 0.05, no decay,
# running-std normalisation): the hard-exploration study in docs/results.md. Not in the default run.
INTRINSIC = ("rnd", "pseudo_counts", "e3b", "ngu", "icm", "re3", "ride")
METHODS.update({f"ppo+{name}": ("ppo", {"intrinsic_reward": name}) for name in INTRINSIC})
# PPO fine-tuned on the task reward from a PPO pre-trained on that intrinsic reward alone (RLLTE's
# pretraining, then init_from: weights only, a fresh optimiser and LR schedule). The cell's budget and
# curve count fine-tuning steps; the pre-training steps (--pretrain-steps) are recorded beside them.
PRETRAINED = {f"ppo/pretrained+{name}": name for name in INTRINSIC}
METHODS.update({method: ("ppo", {}) for method in PRETRAINED})
DEFAULT_METHODS = [m for m in METHODS if "+" not in m]


ROOT = Path(__file__).resolve().parent.parent


def code_commit() -> str:
    """HEAD of the checkout this file runs from, or the COMMIT file a ``snapshot`` wrote."""
    import subprocess

    marker = ROOT / "COMMIT"
    if marker.exists():
        return marker.read_text().strip()
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "echo_rl"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def agent_source(agent: str) -> dict:
    """Path and SHA-256 of the module that defines ``agent`` (what ``report`` refuses to mix)."""
    import hashlib
    import inspect

    from echo_rl.training.agents import agent_class

    path = Path(inspect.getsourcefile(agent_class(agent)))
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    return {"agent_file": rel, "agent_file_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def intrinsic_source(name: str | None) -> dict:
    """Path and SHA-256 of the intrinsic reward module a cell used (recorded beside the agent's), or nothing."""
    if not name:
        return {}
    import hashlib
    import inspect

    from echo_rl.intrinsic import INTRINSIC_REWARDS

    path = Path(inspect.getsourcefile(INTRINSIC_REWARDS[name]))
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    return {"intrinsic_file": rel, "intrinsic_file_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def cpu_name() -> str:
    """The CPU's model name as ``lscpu`` gives it (a timing means nothing without it), else the platform's."""
    import platform
    import subprocess

    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name" and value.strip():
            return f"{value.strip()} ({os.cpu_count()} CPUs)"
    return f"{platform.processor() or platform.machine() or 'unknown'} ({os.cpu_count()} CPUs)"


def parse_budgets(items: list[str], envs: list[str], default: int) -> dict[str, int]:
    """``--budget`` items for the run's envs; budgets naming other known envs are accepted and unused."""
    budgets = {e: default for e in envs}
    known = sorted({*envs, *ENVS})
    for item in items:
        env, sep, steps = item.partition("=")
        if not sep or env not in known or not steps.isdigit() or int(steps) < 1:
            raise ValueError(f"--budget {item!r} is invalid: expected ENV=STEPS with ENV one of {known}, "
                             f"STEPS a positive integer")
        if env in budgets:
            budgets[env] = int(steps)
    return budgets


def cell_name(method: str, env: str, seed: int) -> str:
    return f"{method.replace('/', '+')}__{env}__{seed}"


def build_config(method: str, env: str, seed: int, total_steps: int):
    from echo_rl.config import TrainingConfig

    agent, extra = METHODS[method]
    cfg = TrainingConfig(env_name=f"minigrid:{env}", agent=agent, seed=seed, total_timesteps=total_steps)
    return cfg.with_overrides({**SHARED, **(ECHO_STUDY_AGENT if agent == "echo-rl" else {}), **extra})


def pretrain(name: str, env: str, seed: int, steps: int) -> tuple[dict, dict]:
    """PPO trained ``steps`` env steps on intrinsic reward ``name`` alone: its network weights, and what to record."""
    import torch

    from echo_rl.environments.minigrid_vector import make_vector_env
    from echo_rl.training.agents import agent_class

    cfg = build_config(f"ppo+{name}", env, seed, steps).with_overrides({"pretraining": True})
    t0 = time.perf_counter()
    agent = agent_class(cfg.agent)(cfg, make_vector_env(cfg.env_name, cfg.num_actors), torch.device("cpu"))
    try:
        while agent.env_steps < steps:
            agent.train_iteration()
        weights = {k: v.clone() for k, v in agent.network.state_dict().items()}
        done = agent.env_steps
    finally:
        agent.close()
    return weights, {"pretrain_reward": name, "pretrain_steps": done, **intrinsic_source(name),
                     "pretrain_wall_s": round(time.perf_counter() - t0, 1)}


def run_cell(method: str, env: str, seed: int, total_steps: int, eval_every: int, eval_episodes: int,
             out: str, early_stop: int = 0, threshold: float = 0.9, pretrain_steps: int = 250_000) -> dict:
    """Train one cell; evaluate on fixed seeds every ``eval_every`` steps; write its JSON.

    ``early_stop`` > 0 ends the cell after that many consecutive evaluations >= ``threshold``.
    A ``ppo/pretrained+<reward>`` cell first pre-trains ``pretrain_steps`` on that reward alone.
    """
    import torch

    from echo_rl.environments.minigrid_vector import make_vector_env
    from echo_rl.training.agents import agent_class

    torch.set_num_threads(1)
    cfg = build_config(method, env, seed, total_steps)
    meta = {"method": method, "env": env, "seed": seed, "total_steps": total_steps, "git_commit": code_commit(),
            **agent_source(cfg.agent), **intrinsic_source(cfg.intrinsic_reward), "early_stop": early_stop, "threshold": threshold,
            "eval_every": eval_every, "eval_episodes": eval_episodes, "cpu": cpu_name(),
            "torch_threads": torch.get_num_threads()}
    weights = None
    if method in PRETRAINED:
        weights, pre = pretrain(PRETRAINED[method], env, seed, pretrain_steps)
        meta.update(pre)
    envs = make_vector_env(cfg.env_name, cfg.num_actors)
    agent = agent_class(cfg.agent)(cfg, envs, torch.device("cpu"))
    if weights is not None:
        agent.network.load_state_dict(weights)  # what init_from loads: the weights, not the optimiser
    make = lambda n: make_vector_env(cfg.env_name, n)  # noqa: E731
    eval_seed = 1_000_000 + seed

    def evaluate() -> dict:  # every vector agent evaluates itself (EchoRL passes episode starts to its plans)
        return agent.evaluate(make, eval_episodes, eval_seed)

    curve, t0, next_eval, streak, stopped = [], time.perf_counter(), eval_every, 0, False
    train_s = 0.0  # in train_iteration alone: evaluations excluded (their count is the protocol's, not the agent's)
    while agent.env_steps < total_steps and not stopped:
        t_it = time.perf_counter()
        agent.train_iteration()
        train_s += time.perf_counter() - t_it
        if agent.env_steps >= next_eval or agent.env_steps >= total_steps:
            ev = evaluate()
            curve.append({"step": agent.env_steps, "success_rate": ev["success_rate"],
                          "avg_reward": ev["avg_reward"], "wall_s": round(time.perf_counter() - t0, 1),
                          "train_s": round(train_s, 2)})
            print(f"[{method} {env} s{seed}] {agent.env_steps} success={ev['success_rate']:.3f} "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
            while next_eval <= agent.env_steps:
                next_eval += eval_every
            streak = streak + 1 if ev["success_rate"] >= threshold else 0
            stopped = early_stop > 0 and streak >= early_stop
            if agent.env_steps < total_steps and not stopped:  # unfinished: keep the curve so far (reported as such)
                _write(Path(out) / "partial" / f"{cell_name(method, env, seed)}.json",
                       {**meta, "curve": curve, "wall_s": round(time.perf_counter() - t0, 1)})
    agent.close()
    result = {**meta, "curve": curve, "stopped_early": stopped, "config": cfg.to_dict(),
              "wall_s": round(time.perf_counter() - t0, 1), "train_s": round(train_s, 2)}
    _write(Path(out) / "cells" / f"{cell_name(method, env, seed)}.json", result)
    (Path(out) / "partial" / f"{cell_name(method, env, seed)}.json").unlink(missing_ok=True)
    return result


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- analysis
def steps_to_threshold(curve: list[dict], threshold: float, budget: int) -> tuple[float, bool]:
    for point in curve:
        if point["success_rate"] >= threshold:
            return float(point["step"]), True
    return float(budget), False


def load_cells(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]


class MixedCellsError(ValueError):
    pass


def check_provenance(cells: list[dict], allow_mixed: bool = False) -> dict[str, dict]:
    """Per method: the agent-file hashes and commits its cells ran from; refuse mixtures unless allowed.

    Cells without provenance (from before the runner recorded it) are refused outright.
    """
    out: dict[str, dict] = {}
    for c in cells:
        if "agent_file_sha256" not in c:
            raise MixedCellsError(f"cell {cell_name(c['method'], c['env'], c['seed'])} has no recorded agent "
                                  "source (made by an older runner); move it out of the study directory")
        rec = out.setdefault(c["method"], {"sha": set(), "commits": set(), "file": c["agent_file"]})
        rec["sha"].add(c["agent_file_sha256"])
        rec["commits"].add(c["git_commit"])
    for method, rec in out.items():
        if len(rec["sha"]) > 1 and not allow_mixed:
            raise MixedCellsError(f"method {method!r} has cells from {len(rec['sha'])} different versions of "
                                  f"{rec['file']} (commits {sorted(rec['commits'])}); pass --allow-mixed to pool them")
    return out


def final_success(cell: dict) -> float:
    """Success at the cell's last evaluation (at the budget unless the cell stopped early)."""
    return float(cell["curve"][-1]["success_rate"])


def summarize(cells: list[dict], threshold: float = 0.9, reps: int = 50_000) -> list[dict]:
    """Per method: IQM (95% stratified-bootstrap CI) of last-evaluation success and of steps to threshold.

    Only envs with at least one finished seed count; the score matrix is seeds x envs, so when envs
    have different numbers of finished seeds only the first ``min`` seeds (by seed number) of each
    env enter the pooled row (the per-env rows use all of them).
    """
    from echo_rl.utils.statistics import aggregate_iqm, stratified_bootstrap_ci

    rows = []
    for method in METHODS:
        mine = [c for c in cells if c["method"] == method]
        if not mine:
            continue
        envs = [e for e in ENVS if any(c["env"] == e for c in mine)]
        envs += sorted({c["env"] for c in mine} - set(envs))
        by_env = {e: sorted((c for c in mine if c["env"] == e), key=lambda c: c["seed"]) for e in envs}
        scopes = [("all", envs, min(len(v) for v in by_env.values()))]
        if len(envs) > 1:
            scopes += [(e, [e], len(by_env[e])) for e in envs]
        for scope, scope_envs, n in scopes:
            grid = [[by_env[e][i] for e in scope_envs] for i in range(n)]
            final = np.array([[final_success(c) for c in row] for row in grid])
            hits = [[steps_to_threshold(c["curve"], threshold, c["total_steps"]) for c in row] for row in grid]
            steps = np.array([[h[0] for h in row] for row in hits])
            used = [c for row in grid for c in row]
            rec = {"method": method, "scope": scope, "envs": scope_envs, "seeds": n,
                   "reached": int(sum(h[1] for row in hits for h in row)), "cells": n * len(scope_envs),
                   "stopped_early": sum(bool(c.get("stopped_early")) for c in used),
                   "budgets": {e: int(by_env[e][0]["total_steps"]) for e in scope_envs},
                   "wall_s": float(sum(c["wall_s"] for c in used)),
                   "commits": sorted({c["git_commit"] for c in used})}
            for name, mat in (("final_success", final), ("steps_to_threshold", steps)):
                point, ci = stratified_bootstrap_ci(mat, aggregate_iqm, reps=reps, seed=0)
                rec[name] = (float(point), float(ci[0]), float(ci[1]))
            rows.append(rec)
    return rows


def per_seed_table(cells: list[dict], threshold: float = 0.9) -> list[str]:
    """Markdown rows per (env, method): each seed's env steps at the first evaluation >= ``threshold``
    ("501k"), or its success at the last evaluation ("0.22") when it never got there; "–": not run.

    Why: at five seeds the aggregates hide which seeds a method solves, and methods that
    solve different seeds (the DoorKey-8x8 lottery) read the same in an IQM.
    """
    seeds = sorted({c["seed"] for c in cells})
    known = {m: i for i, m in enumerate(METHODS)}
    envs = [e for e in ENVS if any(c["env"] == e for c in cells)] + sorted({c["env"] for c in cells} - set(ENVS))
    lines = ["| env | method | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|---|" + "---|" * len(seeds)]
    for env in envs:
        mine = [c for c in cells if c["env"] == env]
        for method in sorted({c["method"] for c in mine}, key=lambda m: (known.get(m, len(known)), m)):
            entry = {}
            for c in mine:
                if c["method"] == method:
                    step, hit = steps_to_threshold(c["curve"], threshold, c["total_steps"])
                    entry[c["seed"]] = f"{int(step) // 1000}k" if hit else f"{final_success(c):.2f}"
            lines.append(f"| {_short(env)} | `{method}` | " + " | ".join(entry.get(s, "–") for s in seeds) + " |")
    return lines


def plot(cells: list[dict], path: Path, unfinished: list[dict] = ()) -> None:
    """Mean (+- s.e.) curve of finished cells per method and env; unfinished cells as dotted single curves.

    A cell stopped early (``--early-stop``) is held at its last evaluation for the rest of the
    x-axis; the legend counts those cells.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = [e for e in ENVS if any(c["env"] == e for c in [*cells, *unfinished])]
    fig, axes = plt.subplots(1, max(1, len(envs)), figsize=(5 * max(1, len(envs)), 3.8), squeeze=False)
    for ax, env in zip(axes[0], envs):
        present = [m for m in METHODS if any(c["method"] == m for c in [*cells, *unfinished])]
        for k, method in enumerate(present):  # colours by the methods present, so they stay distinct
            mine = [c for c in cells if c["method"] == method and c["env"] == env]
            color = f"C{k}"
            if mine:
                longest = max(mine, key=lambda c: len(c["curve"]))
                steps = np.array([p["step"] for p in longest["curve"]])
                succ = np.array([[p["success_rate"] for p in c["curve"]]
                                 + [c["curve"][-1]["success_rate"]] * (len(steps) - len(c["curve"])) for c in mine])
                mean = succ.mean(0)
                held = sum(len(c["curve"]) < len(steps) for c in mine)
                label = f"{method} (n={len(mine)}" + (f", {held} held after early stop)" if held else ")")
                ax.plot(steps, mean, color=color, label=label)
                if len(mine) > 1:
                    se = succ.std(0, ddof=1) / np.sqrt(len(mine))
                    ax.fill_between(steps, mean - se, mean + se, color=color, alpha=0.2)
            for c in unfinished:
                if c["env"] == env and c["method"] == method:
                    ax.plot([p["step"] for p in c["curve"]], [p["success_rate"] for p in c["curve"]], ls=":",
                            color=color, label=f"{method} s{c['seed']} (unfinished)")
        ax.axhline(0.9, color="grey", lw=0.8, ls="--")
        ax.set_title(_short(env))
        ax.set_xlabel("env steps")
        ax.set_ylabel("eval success rate")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _short_commit(commit: str) -> str:
    head, _, rest = commit.partition("+")
    return head[:10] + (f"+{rest}" if rest else "")


def _short(env: str) -> str:
    return env.replace("MiniGrid-", "").replace("-v0", "")


def report(out: Path, md: Path | None, reps: int, allow_mixed: bool = False, plot_path: Path | None = None) -> str:
    cells = load_cells(out) if (out / "cells").is_dir() else []
    check_provenance(cells, allow_mixed)
    rows = summarize(cells, reps=reps) if cells else []
    early = any(c.get("stopped_early") for c in cells)
    last = "success at last eval" if early else "final success"
    lines = [f"| method | scope (budget) | seeds | reached 0.9 | stopped early | {last} IQM [95% CI] | "
             "steps to 0.9 IQM [95% CI] | CPU-process time |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fs, st = r["final_success"], r["steps_to_threshold"]
        scope = "; ".join(f"{_short(e)} ({b // 1000}k)" for e, b in r["budgets"].items())
        if r["scope"] == "all" and len(r["envs"]) > 1:
            scope = f"**pooled**: {scope}"
        lines.append(f"| {r['method']} | {scope} | {r['seeds']} | {r['reached']}/{r['cells']} | "
                     f"{r['stopped_early']}/{r['cells']} | {fs[0]:.3f} [{fs[1]:.3f}, {fs[2]:.3f}] | "
                     f"{st[0]:,.0f} [{st[1]:,.0f}, {st[2]:,.0f}] | {r['wall_s'] / 60:.0f} min |")
    prov = check_provenance(cells, allow_mixed) if cells else {}
    if prov:
        lines += ["", "Code each method's cells ran from (git commit; SHA-256 of the agent file):", ""]
        for method, rec in prov.items():
            shas = ", ".join(sorted(h[:12] for h in rec["sha"]))
            mixed = " **(MIXED versions, pooled with --allow-mixed)**" if len(rec["sha"]) > 1 else ""
            lines.append(f"- `{method}`: commit {', '.join(_short_commit(c) for c in sorted(rec['commits']))}; "
                         f"`{rec['file']}` {shas}{mixed}")
    if cells:
        lines += ["", "Per cell: env steps at the first evaluation >= 0.9, else success at the last evaluation:",
                  "", *per_seed_table(cells)]
    partial = sorted((out / "partial").glob("*.json")) if (out / "partial").is_dir() else []
    if partial:
        lines += ["", "Unfinished cells (not in the aggregates above; last evaluation so far):", "",
                  "| method | env | seed | steps reached / budget | success at last eval | first eval >= 0.9 |",
                  "|---|---|---|---|---|---|"]
        for p in partial:
            c = json.loads(p.read_text())
            last_pt = c["curve"][-1] if c["curve"] else {"step": 0, "success_rate": float("nan")}
            s, ok = steps_to_threshold(c["curve"], 0.9, c["total_steps"])
            lines.append(f"| {c['method']} | {_short(c['env'])} | {c['seed']} | "
                         f"{last_pt['step']:,} / {c['total_steps']:,} | {last_pt['success_rate']:.3f} | "
                         f"{f'{s:,.0f}' if ok else 'not yet'} |")
    table = "\n".join(lines)
    partial_cells = [json.loads(p.read_text()) for p in partial]
    plot(cells, plot_path or out / "sample_efficiency.png", [c for c in partial_cells if c["curve"]])
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(table)
    if md is not None:
        print(f"(table and plot written under {out}; paste into {md} with the command that made them)")
    return table


def snapshot(dest: Path, rev: str) -> None:
    """Export ``rev`` to ``dest`` with a COMMIT file, to run cells from a frozen tree."""
    import subprocess

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], capture_output=True, text=True,
                            check=True).stdout.strip()
    dest.mkdir(parents=True, exist_ok=False)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    (dest / "COMMIT").write_text(commit + "\n")
    print(f"{commit} -> {dest}; run with PYTHONPATH={dest} python {dest}/benchmarks/sample_efficiency.py run ...")


def _agent(method: str, env: str, seed: int):
    """A fresh agent of ``method`` with the study's settings (1M-step LR schedule), torch on one thread."""
    import torch

    from echo_rl.environments.minigrid_vector import make_vector_env
    from echo_rl.training.agents import agent_class

    torch.set_num_threads(1)
    cfg = build_config(method, env, seed, 1_000_000)
    return agent_class(cfg.agent)(cfg, make_vector_env(cfg.env_name, cfg.num_actors), torch.device("cpu"))


def speed(methods: list[str], env: str, seed: int, iterations: int, max_warmup: int) -> dict[str, float]:
    """Env steps/s of each method's ``train_iteration`` with the study's settings, timed interleaved.

    Each agent first trains until every part it has is learning — EchoRL's replay holds
    ``min_experiences`` sequences and its self-imitation store holds a terminated episode —
    or ``max_warmup`` iterations pass (then the report says which parts were idle). The
    methods' iterations then alternate, so a change in machine load hits them alike.
    """
    import time

    learning = {"replay": "replay/value_loss", "sil": "self_imitation/loss"}  # agent attribute -> its loss key
    agents, idle = {}, {}
    for m in methods:
        agent = _agent(m, env, seed)
        waiting = []
        for _ in range(max_warmup):
            metrics = agent.train_iteration()
            waiting = [part for part, key in learning.items()
                       if getattr(agent, part, None) is not None and key not in metrics]
            if not waiting:
                break
        agents[m], idle[m] = agent, waiting
    secs = dict.fromkeys(methods, 0.0)
    steps = dict.fromkeys(methods, 0)
    for _ in range(iterations):
        for m, agent in agents.items():
            t0, n0 = time.perf_counter(), agent.env_steps
            agent.train_iteration()
            secs[m] += time.perf_counter() - t0
            steps[m] += agent.env_steps - n0
    rates = {m: steps[m] / secs[m] for m in methods}
    for m in methods:
        note = f" (idle during timing: {', '.join(idle[m])})" if idle[m] else ""
        print(f"{m}: {rates[m]:,.0f} env steps/s, {rates[m] / rates[methods[0]]:.2f}x {methods[0]}{note}")
    return rates


def digest(method: str, env: str, seed: int, iterations: int) -> str:
    """SHA-256 over ``iterations`` training iterations' metrics and the final weights, with the study's settings.

    Why: two code versions that print the same digest train bit-identically, so cells of one
    may stand for the other. Run it with ``PYTHONPATH=<snapshot>`` to digest that snapshot's agent.
    """
    import hashlib

    agent = _agent(method, env, seed)
    h = hashlib.sha256()
    for _ in range(iterations):
        h.update(json.dumps(agent.train_iteration(), sort_keys=True).encode())
    modules = agent.lpo.modules() if hasattr(agent, "lpo") else agent.network
    for p in modules.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    agent.close()
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train every missing cell, then report")
    r.add_argument("--out", default="runs/sample_efficiency")
    r.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=list(METHODS))
    r.add_argument("--envs", nargs="+", default=list(ENVS))
    r.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    r.add_argument("--total-steps", type=int, default=1_000_000, help="budget of envs without a --budget")
    r.add_argument("--budget", nargs="*", default=[], metavar="ENV=STEPS", help="per-env step budgets")
    r.add_argument("--eval-every", type=int, default=50_000)
    r.add_argument("--eval-episodes", type=int, default=32)
    r.add_argument("--early-stop", type=int, default=0, metavar="K",
                   help="end a cell after K consecutive evaluations >= 0.9 (0: never)")
    r.add_argument("--workers", type=int, default=1, help="cells trained in parallel (one core each)")
    r.add_argument("--pretrain-steps", type=int, default=250_000,
                   help="intrinsic-only pre-training of the ppo/pretrained+<reward> cells (not in their budget)")
    r.add_argument("--reps", type=int, default=50_000, help="bootstrap resamples")
    p = sub.add_parser("report", help="aggregate the finished cells")
    p.add_argument("--out", default="runs/sample_efficiency")
    p.add_argument("--md", default=None)
    p.add_argument("--plot", default=None, help="where to write the curves png (default: OUT/sample_efficiency.png)")
    p.add_argument("--reps", type=int, default=50_000)
    p.add_argument("--allow-mixed", action="store_true",
                   help="pool cells of one method that ran different versions of its agent file")
    sp = sub.add_parser("speed", help="env steps/s of each method's training iteration, relative to the first")
    sp.add_argument("--methods", nargs="+", default=["ppo", "echo-rl"], choices=list(METHODS))
    sp.add_argument("--env", default="MiniGrid-DoorKey-8x8-v0")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--iterations", type=int, default=8, help="timed iterations per method")
    sp.add_argument("--max-warmup", type=int, default=200, help="untimed iterations at most before timing")
    dg = sub.add_parser("digest", help="SHA-256 of a method's first training iterations (bit-identity checks)")
    dg.add_argument("--method", required=True, choices=list(METHODS))
    dg.add_argument("--env", default="MiniGrid-DoorKey-8x8-v0")
    dg.add_argument("--seed", type=int, default=0)
    dg.add_argument("--iterations", type=int, default=6)
    sn = sub.add_parser("snapshot", help="export a commit to a directory to run the study from")
    sn.add_argument("dest")
    sn.add_argument("--rev", default="HEAD")
    args = parser.parse_args(argv)

    from echo_rl.config import ConfigError
    from echo_rl.environments.registry import check_task_name

    if args.cmd == "snapshot":
        snapshot(Path(args.dest), args.rev)
        return 0
    if args.cmd == "digest":
        print(digest(args.method, args.env, args.seed, args.iterations))
        return 0
    if args.cmd == "speed":
        try:
            check_task_name(f"minigrid:{args.env}")
        except ConfigError as exc:
            print(f"sample_efficiency: error: {exc}", file=sys.stderr)
            return 2
        speed(args.methods, args.env, args.seed, args.iterations, args.max_warmup)
        return 0
    out = Path(args.out)
    if args.cmd == "report":
        try:
            report(out, Path(args.md) if args.md else None, args.reps, args.allow_mixed,
                   Path(args.plot) if args.plot else None)
        except MixedCellsError as exc:
            print(f"sample_efficiency: error: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        for env in args.envs:
            check_task_name(f"minigrid:{env}")
        budgets = parse_budgets(args.budget, args.envs, args.total_steps)
        for m in args.methods:
            build_config(m, args.envs[0], 0, args.total_steps)
        if args.early_stop < 0:
            raise ConfigError(f"--early-stop={args.early_stop} is invalid: must be >= 0")
        if args.pretrain_steps < 1:
            raise ConfigError(f"--pretrain-steps={args.pretrain_steps} is invalid: must be >= 1")
    except (ConfigError, ValueError) as exc:
        print(f"sample_efficiency: error: {exc}", file=sys.stderr)
        return 2
    todo = [(m, e, s) for m in args.methods for e in args.envs for s in args.seeds
            if not (out / "cells" / f"{cell_name(m, e, s)}.json").exists()]
    print(f"{len(todo)} cells to train -> {out} (commit {code_commit()})", flush=True)
    job = dict(eval_every=args.eval_every, eval_episodes=args.eval_episodes, out=str(out),
               early_stop=args.early_stop, pretrain_steps=args.pretrain_steps)
    if args.workers <= 1:
        for m, e, s in todo:
            run_cell(m, e, s, total_steps=budgets[e], **job)
    else:
        with ProcessPoolExecutor(args.workers) as pool:
            futures = [pool.submit(run_cell, m, e, s, total_steps=budgets[e], **job) for m, e, s in todo]
            for f in futures:
                f.result()
    report(out, None, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
