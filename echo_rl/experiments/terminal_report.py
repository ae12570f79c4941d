"""The terminal study's summary: per arm and level, before and after RL, from the runs' ``metrics.jsonl``.

- held-out success, pooled over seeds (every run sees the same panel), with a Wilson 95% interval;
- held-out env-token CE per level, mean over seeds with a t-based 95% interval;
- InterCode-Bash success (fixed subset) before and after RL, pooled Wilson;
- updates to threshold: the first update where an arm's training success (sampled rollouts, mean over seeds,
  moving average over ``window`` updates) reaches the GRPO arm's peak of the same curve; the ratio is GRPO's
  updates over the arm's (> 1: sooner than GRPO); undefined (reported as such) while GRPO's peak is 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from echo_rl.utils.statistics import t_interval, wilson_interval

BASELINE = "grpo"
EXTRA = "intercode_bash"


def read_run(path: Path) -> dict:
    """``{"evals": {update: {metric: value}}, "train": [sampled success of update 1, 2, ...]}`` of one run's
    metrics.jsonl (``eval/`` prefix dropped); missing file: empty."""
    evals: dict[int, dict[str, float]] = {}
    train: dict[int, float] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            u = int(r.get("train/updates", 0))
            if r.get("episode/success_rate") is not None:
                train[u] = float(r["episode/success_rate"])
            ev = {k[5:]: v for k, v in r.items() if k.startswith("eval/")}
            if ev:
                evals.setdefault(u, {}).update(ev)
    return {"evals": evals, "train": [train[u] for u in sorted(train)]}


def levels(runs: list[dict]) -> list[str]:
    return sorted({k.split("/", 1)[1] for r in runs for e in r["evals"].values() for k in e
                   if k.startswith("episodes/")})


def pooled(evals: list[dict], rate: str, count: str) -> tuple[int, int] | None:
    """Successes and episodes summed over runs (rate × count per run); None when no run has them."""
    cells = [(e[rate], e[count]) for e in evals if rate in e and count in e]
    if not cells:
        return None
    return sum(round(r * n) for r, n in cells), sum(round(n) for _, n in cells)


def _before_after(run: dict) -> tuple[dict, dict]:
    """The evaluation before RL (update 0) and the last one."""
    ev = run["evals"]
    if not ev:
        return {}, {}
    return ev.get(0, {}), ev[max(ev)] if max(ev) > 0 else {}


def moving_average(xs: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values (the first values average what there is)."""
    return [float(np.mean(xs[max(0, i + 1 - window):i + 1])) for i in range(len(xs))]


def first_reaching(curve: list[float], threshold: float) -> int | None:
    """1-based update at which ``curve`` first reaches ``threshold`` (None: never)."""
    return next((i + 1 for i, v in enumerate(curve) if v >= threshold - 1e-12), None)


def summarize(out: Path, arms: list[str], seeds: list[int], window: int = 3) -> dict:
    runs = {a: [read_run(out / f"{a}-seed{s}" / "metrics.jsonl") for s in seeds] for a in arms}
    lvls = levels([r for rs in runs.values() for r in rs])
    table: dict = {"levels": lvls, "arms": {}, "window": window}
    curves = {}
    for arm, rs in runs.items():
        n = min((len(r["train"]) for r in rs if r["train"]), default=0)
        curves[arm] = moving_average(list(np.mean([r["train"][:n] for r in rs if r["train"]], axis=0)), window) \
            if n else []
    threshold = max(curves.get(BASELINE) or [math.nan])
    if not threshold > 0:  # a curve that never leaves 0 has no peak to reach
        threshold = math.nan
    table["threshold"] = threshold
    for arm, rs in runs.items():
        pairs = [_before_after(r) for r in rs]
        if any(after for _, after in pairs):  # runs still going count once they finish: before and after pair up
            pairs = [(before, after) for before, after in pairs if after]
        phases = list(zip(*pairs)) or [(), ()]
        row: dict = {"seeds": sum(bool(b) for b, _ in pairs), "finished": sum(bool(a) for _, a in pairs),
                     "updates": max((len(r["train"]) for r in rs), default=0)}
        for phase, evals in zip(("before", "after"), phases):
            evals = [e for e in evals if e]
            cell: dict = {}
            for lvl in [*lvls, "all"]:
                rate, count = (f"success_rate/{lvl}", f"episodes/{lvl}") if lvl != "all" else ("success_rate",
                                                                                                "episodes")
                got = pooled(evals, rate, count)
                ce_key = f"heldout_env_ce/{lvl}" if lvl != "all" else "heldout_env_ce"
                ces = [e[ce_key] for e in evals if ce_key in e]
                cell[lvl] = {**({"wins": got[0], "n": got[1], "ci": wilson_interval(*got)} if got else {}),
                             **({"ce": t_interval(ces)} if ces else {})}
            ic = pooled(evals, f"{EXTRA}/success_rate", f"{EXTRA}/episodes")
            if ic:
                cell[EXTRA] = {"wins": ic[0], "n": ic[1], "ci": wilson_interval(*ic)}
            row[phase] = cell
        hit = first_reaching(curves[arm], threshold) if curves[arm] and not math.isnan(threshold) else None
        base_hit = first_reaching(curves.get(BASELINE, []), threshold) if not math.isnan(threshold) else None
        row["curve"], row["to_threshold"] = curves[arm], hit
        row["speedup"] = base_hit / hit if hit and base_hit else None
        table["arms"][arm] = row
    return table


def _rate(c: dict) -> str:
    if "n" not in c:
        return "–"
    lo, hi = c["ci"]
    return f"{c['wins']}/{c['n']} = {c['wins'] / c['n']:.2f} [{lo:.2f}, {hi:.2f}]"


def _ce(c: dict) -> str:
    if "ce" not in c:
        return "–"
    mean, half = c["ce"]
    return f"{mean:.2f}" + ("" if math.isnan(half) else f" ± {half:.2f}")


def markdown(table: dict) -> str:
    lines = ["| arm | level | success before RL | success after RL | gain (CIs apart?) | env CE before | "
             "env CE after |", "|---|---|---|---|---|---|---|"]
    for arm, row in table["arms"].items():
        for lvl in [*table["levels"], "all"]:
            b, a = row.get("before", {}).get(lvl, {}), row.get("after", {}).get(lvl, {})
            apart = ""
            if "n" in b and "n" in a:
                d = a["wins"] / a["n"] - b["wins"] / b["n"]
                apart = f"{d:+.2f} ({'yes' if a['ci'][0] > b['ci'][1] or a['ci'][1] < b['ci'][0] else 'no'})"
            lines.append(f"| {arm} | {lvl} | {_rate(b)} | {_rate(a)} | {apart} | {_ce(b)} | {_ce(a)} |")
    peak = "undefined: GRPO's curve stays at 0" if math.isnan(table["threshold"]) else f"{table['threshold']:.3f}"
    lines += ["", f"| arm | runs finished | InterCode-Bash before RL | after RL | training success (MA{table['window']}) by "
                  f"update | updates to GRPO's peak ({peak}) | speed-up vs GRPO |",
              "|---|---|---|---|---|---|---|"]
    for arm, row in table["arms"].items():
        curve = " ".join(f"{v:.2f}" for v in row["curve"])
        hit = row["to_threshold"] if row["to_threshold"] is not None else (
            "–" if math.isnan(table["threshold"]) else "not reached")
        speed = f"{row['speedup']:.2f}×" if row["speedup"] else "–"
        lines.append(f"| {arm} | {row['finished']} | {_rate(row.get('before', {}).get(EXTRA, {}))} | "
                     f"{_rate(row.get('after', {}).get(EXTRA, {}))} | {curve} | {hit} | {speed} |")
    return "\n".join(lines) + "\n"


def plot(out: Path, table: dict) -> Path | None:
    """Training-success curves (moving average) per arm, the GRPO-peak threshold dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(r["curve"] for r in table["arms"].values()):
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for arm, row in table["arms"].items():
        ax.plot(range(1, len(row["curve"]) + 1), row["curve"], "o-", label=arm)
    if not math.isnan(table["threshold"]):
        ax.axhline(table["threshold"], ls="--", color="grey", label="GRPO's peak")
    ax.set_xlabel("RL update")
    ax.set_ylabel(f"training success (sampled, MA{table['window']})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "study.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def report(out: Path, arms: list[str], seeds: list[int], config: dict, window: int = 3) -> str:
    """Write summary.json, summary.md and study.png into ``out``; return the markdown."""
    table = summarize(out, arms, seeds, window)
    (out / "summary.json").write_text(json.dumps({"config": config, "table": table}, indent=1, default=str))
    md = f"Config: `{json.dumps(config)}`\n\n" + markdown(table)
    (out / "summary.md").write_text(md)
    plot(out, table)
    return md
