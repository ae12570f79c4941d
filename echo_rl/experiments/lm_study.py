"""GRPO vs ECHO (λ ∈ {0.01, 0.05}) vs ECHO + latent plan on a text task, several seeds, one command.

    python -m echo_rl.experiments.lm_study --out runs/lm_study --seeds 0 1 2 --jobs 2

Each (arm, seed) is an ordinary ``echo-rl train`` run (its own process, run
directory, checkpoints; a second invocation resumes unfinished runs and skips
finished ones). The summary (``summary.md``, ``summary.json``, ``study.png``)
gives, per arm and evaluation point (learner updates), the mean over seeds
and a t-based 95% interval of held-out greedy success, held-out env-token CE
and sampled training success, plus the paired (same seed) difference to GRPO;
and per arm the held-out successes pooled over seeds with Wilson intervals, the
updates each seed took to reach ``--threshold``, GiGPO's share of steps that
found an anchor group, and the seconds per update. Opt-in arms (``--arms``):
replay, PPO-RLHF, GiGPO and GiGPO + ECHO.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from echo_rl.config import ConfigError, TrainingConfig, parse_override
from echo_rl.config.base import load_yaml_text
from echo_rl.utils.statistics import t_interval, wilson_interval

# arm -> TrainingConfig overrides; GRPO is --agent ppo on a text task (λ = 0, no plan)
ARMS: dict[str, dict] = {
    "grpo": {"agent": "ppo"},
    "echo0.01": {"agent": "echo-rl", "echo_config.latent_plan": False, "lm_config.env_loss_coef": 0.01},
    "echo0.05": {"agent": "echo-rl", "echo_config.latent_plan": False, "lm_config.env_loss_coef": 0.05},
    "echo0.05+plan": {"agent": "echo-rl", "echo_config.latent_plan": True, "lm_config.env_loss_coef": 0.05},
}
# arms run only when named with --arms (the default study is the four above)
EXTRA_ARMS: dict[str, dict] = {
    "grpo+replay": {"agent": "ppo", "lm_config.replay_updates": 2, "lm_config.max_staleness": 6},
    "ppo-rlhf": {"agent": "ppo", "lm_config.objective": "ppo-rlhf"},
    "gigpo": {"agent": "ppo", "lm_config.objective": "gigpo"},
    "gigpo+echo": {"agent": "echo-rl", "echo_config.latent_plan": False, "lm_config.objective": "gigpo",
                   "lm_config.env_loss_coef": 0.05},
}
BASELINE = "grpo"
METRICS = ("success", "heldout_env_ce", "train_success")


def base_config(args: argparse.Namespace, out: Path) -> dict:
    """The study's settings as TrainingConfig overrides (every arm and seed shares them)."""
    return {"env_name": args.task, "env_config": {"max_steps": args.max_steps}, "backbone": args.backbone,
            "num_actors": args.group_size * args.groups, "batch_size": args.group_size * args.groups,
            "total_timesteps": 10**9, "evaluation_episodes": args.eval_episodes, "torch_threads": 1,
            "lm_config.group_size": args.group_size, "lm_config.learning_rate": args.lr,
            "lm_config.temperature": args.temperature, "lm_config.eval_temperature": args.eval_temperature,
            "lm_config.max_new_tokens": 8, "lm_config.action_mode": args.action_mode,
            "lm_config.max_turns": args.max_steps, "lm_config.sft_episodes": args.sft_episodes,
            "lm_config.sft_steps": args.sft_steps, "lm_config.sft_cache_dir": str(out / "sft_cache"),
            "lm_config.heldout_pool": args.heldout_pool, "lm_config.max_updates": args.updates,
            "lm_config.eval_every_updates": args.eval_every, **extra_settings(getattr(args, "set", ()))}


def extra_settings(pairs: list[str]) -> dict:
    """``--set field=value`` pairs (values read as YAML), shared by every arm; arms still set their own fields."""
    out = {}
    for text in pairs:
        key, value = parse_override(text)
        out[key] = load_yaml_text(value, f"--set {key}")
    return out


def run_config(args: argparse.Namespace, out: Path, arm: str, seed: int) -> TrainingConfig:
    return TrainingConfig().with_overrides({**base_config(args, out), **{**ARMS, **EXTRA_ARMS}[arm], "seed": seed})


def extend(src: Path, run: Path, updates: int) -> bool:
    """Copy a finished run of an earlier study and raise its ``max_updates``, so resuming it continues the same
    run (same settings, weights, optimiser and sampling state) instead of starting over. False: nothing to copy."""
    old = src / run.name
    if run.exists() or not (old / "checkpoints" / "latest").is_file():
        return False
    cfg = TrainingConfig.load_yaml(old / "config.yaml")  # checked before anything is copied
    if updates <= cfg.lm_config.max_updates:
        raise SystemExit(f"--updates={updates} is invalid with --extend-from: the runs in {src} already have "
                         f"{cfg.lm_config.max_updates} updates")
    tmp = run.with_name(run.name + ".copying")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(old, tmp)
    (tmp / "summary.json").unlink(missing_ok=True)
    cfg.with_overrides({"lm_config.max_updates": updates}).save_yaml(tmp / "config.yaml")
    tmp.rename(run)
    return True


def run_one(args: argparse.Namespace, out: Path, arm: str, seed: int, config: TrainingConfig | None = None) -> str:
    """One (arm, seed) run as its own ``echo-rl train`` process; ``config``: a fresh run's settings (default:
    this study's :func:`run_config`)."""
    run = out / f"{arm}-seed{seed}"
    if args.extend_from:
        extend(Path(args.extend_from), run, args.updates)
    if (run / "summary.json").is_file():
        return f"{run.name}: done before"
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "echo_rl.cli", "train", "--run-dir", str(run), "--no-progress"]
    if (run / "checkpoints" / "latest").is_file():
        cmd.append("--resume")
    else:
        cfg_path = logs / f"{run.name}.yaml"
        (config or run_config(args, out, arm, seed)).save_yaml(cfg_path)
        cmd += ["--config", str(cfg_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    with open(logs / f"{run.name}.log", "a") as fh:
        rc = subprocess.call(["nice", "-n", str(args.nice), *cmd], stdout=fh, stderr=subprocess.STDOUT, env=env)
    return f"{run.name}: exit {rc} after {time.perf_counter() - t0:.0f} s"


def run_all(args: argparse.Namespace, out: Path, make_config=None) -> None:
    """Every (arm, seed) of ``args``, ``args.jobs`` at a time; seeds outermost, so a partial study compares arms.
    ``make_config(args, out, arm, seed)`` (default :func:`run_config`) runs here, in this thread, for every run
    before any starts: a bad setting stops the study at once, and no config is built while a worker thread
    imports (the task registry fills on first use)."""
    jobs = [(a, s) for s in args.seeds for a in args.arms]
    configs = {job: (make_config or run_config)(args, out, *job) for job in jobs}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for line in pool.map(lambda job: run_one(args, out, *job, config=configs[job]), jobs):
            print(line, flush=True)


def _per_seed(out: Path, arm: str, seed: int) -> dict[int, dict[str, float]]:
    """update -> metrics at each evaluation; train_success = mean sampled success of the updates since the
    previous evaluation."""
    path = out / f"{arm}-seed{seed}" / "metrics.jsonl"
    rows: dict[int, dict[str, float]] = {}
    if not path.is_file():
        return rows
    window: list[float] = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        u = int(r.get("train/updates", 0))
        if r.get("episode/success_rate") is not None:
            window.append(r["episode/success_rate"])
        if r.get("eval/success_rate") is None:
            continue
        cell = {"success": r["eval/success_rate"]}
        if r.get("eval/heldout_env_ce") is not None:
            cell["heldout_env_ce"] = r["eval/heldout_env_ce"]
        if window:
            cell["train_success"] = float(np.mean(window))
        rows[u] = cell
        window = []
    return rows


def summarize(out: Path, arms: list[str], seeds: list[int]) -> dict:
    """Per arm and update: mean ± 95% CI over seeds of each metric, and of the paired difference to GRPO
    (``d_<metric>``), which removes the seed-to-seed spread of the shared starting point."""
    runs = {(a, s): _per_seed(out, a, s) for a in arms for s in seeds}
    table: dict = {}
    for arm in arms:
        table[arm] = {}
        for u in sorted({u for s in seeds for u in runs[(arm, s)]}):
            cell: dict = {}
            for m in METRICS:
                vals = [runs[(arm, s)][u][m] for s in seeds if m in runs[(arm, s)].get(u, {})]
                if vals:
                    cell[m] = (*t_interval(vals), len(vals))
                if arm != BASELINE and BASELINE in arms:
                    diffs = [runs[(arm, s)][u][m] - runs[(BASELINE, s)][u][m] for s in seeds
                             if m in runs[(arm, s)].get(u, {}) and m in runs[(BASELINE, s)].get(u, {})]
                    if diffs:
                        cell[f"d_{m}"] = (*t_interval(diffs), len(diffs))
            table[arm][u] = cell
    return table


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def pooled(out: Path, arms: list[str], seeds: list[int], threshold: float) -> dict:
    """Per arm: held-out successes pooled over seeds at each evaluation (count, episodes, Wilson 95% interval),
    the first evaluated update whose success reaches ``threshold`` per seed (None: never), the mean share of
    training steps that found an anchor group (GiGPO's ``lm/gigpo_anchored_share``; None for other objectives)
    and the mean seconds per update (learner step; rollouts + learner step)."""
    res: dict = {}
    for arm in arms:
        evals: dict[int, list[int]] = {}
        reached: dict[int, int | None] = {}
        share, update_s, step_s = [], [], []
        for seed in seeds:
            run = out / f"{arm}-seed{seed}"
            rows = _jsonl(run / "metrics.jsonl")
            if not rows:
                continue
            reached[seed] = None
            for r in rows:
                if r.get("eval/success_rate") is not None:
                    u, n = int(r.get("train/updates", 0)), int(r.get("eval/episodes", 0))
                    cell = evals.setdefault(u, [0, 0])
                    cell[0] += round(r["eval/success_rate"] * n)
                    cell[1] += n
                    if reached[seed] is None and r["eval/success_rate"] >= threshold:
                        reached[seed] = u
                if r.get("lm/gigpo_anchored_share") is not None:
                    share.append(r["lm/gigpo_anchored_share"])
            for t in _jsonl(run / "timings.jsonl"):
                if t.get("time/update_s") is not None:
                    update_s.append(t["time/update_s"])
                    step_s.append(t["time/update_s"] + t.get("time/rollout_s", 0.0))
        res[arm] = {"success": {u: (k, n, *wilson_interval(k, n)) for u, (k, n) in sorted(evals.items()) if n},
                    "updates_to_threshold": reached, "threshold": threshold,
                    "anchored_share": float(np.mean(share)) if share else None,
                    "update_s": float(np.mean(update_s)) if update_s else None,
                    "step_s": float(np.mean(step_s)) if step_s else None}
    return res


def _pooled_lines(pool: dict) -> list[str]:
    lines = ["", "Pooled over seeds (Wilson 95% intervals):", "",
             "| arm | update | held-out successes | rate [95% CI] | updates to threshold (per seed) | "
             "anchored steps | s per learner update | s per update (rollouts + learner) |",
             "|---|---|---|---|---|---|---|---|"]
    for arm, p in pool.items():
        reach = ", ".join("—" if u is None else str(u) for u in p["updates_to_threshold"].values())
        fmt = {k: ("" if p[k] is None else f"{p[k]:.{d}f}") for k, d in
               (("anchored_share", 2), ("update_s", 1), ("step_s", 1))}
        for u, (k, n, lo, hi) in p["success"].items():
            lines.append(f"| {arm} | {u} | {k}/{n} | {k / n:.2f} [{lo:.2f}, {hi:.2f}] | {reach} (≥ {p['threshold']}) "
                         f"| {fmt['anchored_share']} | {fmt['update_s']} | {fmt['step_s']} |")
    return lines


def _fmt(cell: dict, m: str) -> str:
    if m not in cell:
        return ""
    mean, half, _ = cell[m]
    return f"{mean:.3f}" + ("" if math.isnan(half) else f" ± {half:.3f}")


def write_summary(out: Path, table: dict, config: dict, pool: dict | None = None) -> None:
    (out / "summary.json").write_text(json.dumps({"config": config, "table": table, "pooled": pool}, indent=1))
    lines = [f"Config: `{json.dumps(config)}`", "",
             "| arm | update | held-out success | Δ vs GRPO (paired) | held-out env CE (nats/token) | "
             "Δ vs GRPO (paired) | train success (sampled) | seeds |", "|---|---|---|---|---|---|---|---|"]
    for arm, cells in table.items():
        for u, c in cells.items():
            if "success" not in c:
                continue
            lines.append(f"| {arm} | {u} | {_fmt(c, 'success')} | {_fmt(c, 'd_success')} | "
                         f"{_fmt(c, 'heldout_env_ce')} | {_fmt(c, 'd_heldout_env_ce')} | "
                         f"{_fmt(c, 'train_success')} | {c['success'][2]} |")
    if pool:
        lines += _pooled_lines(pool)
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def plot(out: Path, table: dict) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(table.values()):
        return None
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, m, title in zip(axes, METRICS, ("held-out success", "held-out env-token CE (nats/token)",
                                            "training success (sampled)")):
        for arm, cells in table.items():
            pts = [(int(u), *c[m][:2]) for u, c in cells.items() if m in c]
            if not pts:
                continue
            u, mean, half = map(np.asarray, zip(*pts))
            ax.plot(u, mean, "o-", label=arm)
            ok = np.isfinite(half)
            ax.fill_between(u[ok], (mean - half)[ok], (mean + half)[ok], alpha=0.15)
        ax.set_title(title)
        ax.set_xlabel("learner updates")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    path = out / "study.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/lm_study")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=[*ARMS, *EXTRA_ARMS])
    p.add_argument("--jobs", type=int, default=2, help="runs at once (one process each)")
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--task", default="minigrid:MiniGrid-Empty-Random-5x5-v0")
    p.add_argument("--max-steps", type=int, default=10, help="turns per episode")
    p.add_argument("--backbone", default="tiny")
    p.add_argument("--updates", type=int, default=60)
    p.add_argument("--action-mode", default="generate", choices=("generate", "choose"),
                   help="free generation, or choosing among the admissible actions by likelihood")
    p.add_argument("--eval-every", type=int, default=10, help="updates between held-out evaluations")
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument("--heldout-pool", type=int, default=8)
    p.add_argument("--groups", type=int, default=2, help="task seeds per update")
    p.add_argument("--group-size", type=int, default=4, help="episodes per task seed (the GRPO group)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--temperature", type=float, default=0.7, help="training rollouts")
    p.add_argument("--eval-temperature", type=float, default=0.7,
                   help="held-out evaluation (0: greedy); sampled evaluations use fixed per-episode seeds")
    p.add_argument("--sft-episodes", type=int, default=8)
    p.add_argument("--sft-steps", type=int, default=30)
    p.add_argument("--threshold", type=float, default=0.8,
                   help="held-out success that counts as reached (the summary's updates to threshold)")
    p.add_argument("--set", metavar="FIELD=VALUE", action="append", default=[],
                   help="any other TrainingConfig field for every arm, e.g. --set lm_config.compute_dtype=bfloat16")
    p.add_argument("--extend-from", metavar="DIR", help="continue the finished runs of an earlier study in DIR "
                                                        "(copied into --out) up to --updates")
    p.add_argument("--summarize-only", action="store_true", help="only rebuild summary.md/json and study.png")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:  # a bad --set (unknown field, wrong type) is one line before any run starts
        config = {**base_config(args, out), "arms": {a: {**ARMS, **EXTRA_ARMS}[a] for a in args.arms},
                  "seeds": args.seeds}
        for arm in args.arms:
            run_config(args, out, arm, args.seeds[0])
    except ConfigError as exc:
        print(f"lm_study: {exc}", file=sys.stderr)
        return 2
    if args.summarize_only:  # the runs may have been launched otherwise: their own config.yaml is what they ran
        config = {"summarized": [f"{a}-seed{s}" for a in args.arms for s in args.seeds
                                 if (out / f"{a}-seed{s}" / "metrics.jsonl").is_file()],
                  "settings": "each run's config.yaml"}
    else:
        run_all(args, out)
    table = summarize(out, args.arms, args.seeds)
    write_summary(out, table, config, pooled(out, args.arms, args.seeds, args.threshold))
    plot(out, table)
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
