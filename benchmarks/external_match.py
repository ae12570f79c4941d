"""In-process training against training a user's own program (``--task external``) from the same start.

Both arms start from the in-process run's SFT warm start (``start`` exports it as a transformers directory;
with the config's ``sft_cache_dir`` it is the very weights the in-process run trained from), use the same
learner settings (the same ``--config``), and see the same number of episodes per update in groups of the
same size. The in-process arm is ``echo-rl train --config C``; the external arm is ``echo-rl train --task
external --config C --backbone START --command "python examples/own_agent/terminal_agent.py"``. ``heldout``
scores a transformers directory on the in-process run's held-out panel (the same episodes, greedy), and
``table`` sets the arms' training return per block of updates and held-out success side by side.

    python benchmarks/external_match.py start --config C --seed S --out runs/match/start-sS
    python benchmarks/external_match.py heldout --config C --seed S --backbone runs/match/ext-sS/export/transformers
    python benchmarks/external_match.py table --inprocess runs/terminal_l1/grpo-seed0 ...
        --external runs/match/ext-s0 ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import torch

from echo_rl.config import TrainingConfig, parse_override
from echo_rl.utils.statistics import t_interval, wilson_interval


def _config(args: argparse.Namespace, **overrides: object) -> TrainingConfig:
    return TrainingConfig.load_yaml(args.config).with_overrides(
        {**dict(parse_override(s) for s in args.set), "seed": args.seed, **overrides})


def start(args: argparse.Namespace) -> None:
    from echo_rl.lm.loop import LMAgent
    from echo_rl.models.save import write_transformers

    agent = LMAgent(_config(args), torch.device("cpu"))
    sft = agent.warm_start()
    path = write_transformers(agent.model, agent.tokenizer, Path(args.out),
                              {"echo_rl_export": 1, "format": "transformers", "sft_of": args.config,
                               "seed": args.seed, "sft": sft})
    print(f"{path}: the SFT start of seed {args.seed} ({sft})")


def heldout(args: argparse.Namespace) -> None:
    from echo_rl.lm.loop import LMAgent

    config = _config(args, backbone=args.backbone, **{"lm_config.sft_episodes": 0})
    agent = LMAgent(config, torch.device("cpu"))
    agent.sft_done = True  # the weights as given: no warm start
    m = asyncio.run(agent.evaluate(config.evaluation_episodes))  # a short-lived engine, the training run's panel
    n = config.evaluation_episodes
    k = round(m["success_rate"] * n)
    Path(args.backbone, "heldout.json").write_text(json.dumps({**m, "episodes": n, "seed": args.seed}, indent=1))
    lo, hi = wilson_interval(k, n)
    print(f"held-out: {k}/{n} = {k / n:.2f} [{lo:.2f}, {hi:.2f}] | {m}")


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train_return(run: Path) -> list[float]:
    """Each update's mean episode return (both arms log it; the terminal verifier's reward, 1 = solved)."""
    return [r["episode/return"] for r in _rows(run) if "episode/return" in r]


def table(args: argparse.Namespace) -> None:
    arms = {"in-process": [Path(p) for p in args.inprocess], "external": [Path(p) for p in args.external]}
    curves = {arm: [_train_return(run) for run in runs] for arm, runs in arms.items()}
    n = min(len(c) for runs in curves.values() for c in runs)
    blocks = [(i, min(i + args.block, n)) for i in range(0, n, args.block)]
    print(f"training return per block of {args.block} updates: mean over seeds ± t 95% half-width (per seed)")
    print("| arm | " + " | ".join(f"updates {a + 1}-{b}" for a, b in blocks) + " |")
    print("|---|" + "---|" * len(blocks))
    for arm, runs in curves.items():
        cells = []
        for a, b in blocks:
            per_seed = [sum(c[a:b]) / (b - a) for c in runs]
            mean, half = t_interval(per_seed)
            cells.append(f"{mean:.2f} ± {half:.2f} "
                         f"({', '.join(f'{v:.2f}' for v in per_seed)})")
        print(f"| {arm} | " + " | ".join(cells) + " |")
    if args.plot:
        _plot(curves, n, args.block, Path(args.plot))
    for arm, runs in arms.items():
        scores = [_heldout(run) for run in runs]
        if all(s is not None for s in scores):
            k, total = sum(s[0] for s in scores), sum(s[1] for s in scores)
            lo, hi = wilson_interval(k, total)
            print(f"{arm} held-out after training: {k}/{total} = {k / total:.2f} [{lo:.2f}, {hi:.2f}] "
                  f"(per seed {', '.join(f'{a}/{b}' for a, b in scores)})")


def _plot(curves: dict[str, list[list[float]]], n: int, block: int, path: Path) -> None:
    """Each arm's training return, a rolling mean over ``block`` updates, mean over seeds with a t band."""
    import matplotlib

    from echo_rl.experiments.terminal_report import moving_average

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, runs in curves.items():
        rolled = [moving_average(c[:n], block) for c in runs]
        mean, half = zip(*(t_interval([r[u] for r in rolled]) for u in range(n)))
        x = range(1, n + 1)
        ax.plot(x, mean, label=f"{arm} ({len(runs)} seeds)")
        ax.fill_between(x, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)], alpha=0.2)
    ax.set_xlabel("learner update")
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel(f"training return (rolling mean of {block})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _heldout(run: Path) -> tuple[int, int] | None:
    """(successes, episodes) of the run's last held-out evaluation: its own rows, or ``heldout`` of its export."""
    scored = run / "export" / "transformers" / "heldout.json"
    rows = [json.loads(scored.read_text())] if scored.is_file() else _rows(run)
    rows = [{k.removeprefix("eval/"): v for k, v in r.items()} for r in rows if "eval/success_rate" in r
            or "success_rate" in r and "episodes" in r]
    if not rows:
        return None
    n = int(rows[-1]["episodes"])
    return round(rows[-1]["success_rate"] * n), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    s = sub.add_parser("start", help="export the in-process run's SFT warm start")
    h = sub.add_parser("heldout", help="score a transformers directory on the held-out panel")
    for p in (s, h):
        p.add_argument("--config", required=True)
        p.add_argument("--seed", type=int, required=True)
        p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="as echo-rl train's")
    s.add_argument("--out", required=True)
    h.add_argument("--backbone", required=True)
    t = sub.add_parser("table", help="the arms side by side")
    t.add_argument("--inprocess", nargs="+", required=True)
    t.add_argument("--external", nargs="+", required=True)
    t.add_argument("--block", type=int, default=6)
    t.add_argument("--plot", metavar="PNG", help="also draw the curves")
    args = ap.parse_args()
    {"start": start, "heldout": heldout, "table": table}[args.step](args)


if __name__ == "__main__":
    main()
