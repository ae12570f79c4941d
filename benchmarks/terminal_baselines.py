"""Terminal baselines: ReAct and Act-only with one backbone on the generated test split and on InterCode-Bash.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/terminal_baselines.py      # smollm2-135m
    .venv/bin/python benchmarks/terminal_baselines.py --dry-run                           # the commands only

Each cell is one ``echo-rl eval`` command, run as a subprocess exactly as
printed, one at a time, into ``OUTPUT_DIR/<cell>.json`` (with its
trajectories); rerunning skips finished cells. The panel is fixed by the seed:
where a cell has fewer episodes than tasks, ``echo-rl eval`` plays a seeded
sample of them (sorted), so the same command plays the same tasks anywhere.
Generated tasks: the ``test`` split (held-out instances and the two held-out
templates), one cell per level, with the task's own turn limit (6, 8, 12).
InterCode-Bash: file systems 1, 2, 4 with upstream's 10 turns. Greedy decoding, the
weights in bf16 by default (``--dtype``).
The table (success with a 95% Wilson interval, mean reward, turns) goes to
``OUTPUT_DIR/table.md``, each row with its command.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

from echo_rl.utils.statistics import wilson_interval

CLI = [str(Path(sys.executable).parent / "echo-rl"), "eval"]
METHODS = ("react", "act")
#: upstream's released GPT-4 multi-turn runs (../shared/data/intercode_bash/SOURCE.md): all four file systems,
#: and the three used here
ANCHOR = "GPT-4 (InterCode, upstream's runs, 10 turns): 97/200 = 48.5% on fs 1-4; 66/140 = 47.1% on fs 1, 2, 4"


def cells(episodes_per_level: tuple[int, int, int], intercode_episodes: int) -> list[tuple[str, str, list[str]]]:
    """(cell name, row label, ``echo-rl eval`` arguments) in the order they run."""
    out = []
    for level, n in zip((1, 2, 3), episodes_per_level):
        for method in METHODS:
            out.append((f"terminal-{method}-L{level}", f"terminal test, level {level}",
                        ["--task", "terminal", "--agent", method, "--episodes", str(n), "--set", "split=test",
                         "--set", f"level={level}"]))
    for method in METHODS:
        out.append((f"intercode-{method}", "InterCode-Bash fs 1, 2, 4",
                    ["--task", "intercode_bash", "--agent", method, "--episodes", str(intercode_episodes),
                     "--concurrency", str(min(intercode_episodes, 24))]))
    return out


def command(args: list[str], backbone: str, out: Path, dtype: str = "auto") -> list[str]:
    return [*CLI, *args, "--backbone", backbone, "--seed", "0", "--dtype", dtype, "--output", str(out)]


def row(name: str, label: str, cmd: list[str], out: Path) -> dict:
    shown = " ".join(shlex.quote(c) for c in ["echo-rl", *cmd[1:]])
    if not out.is_file():
        return {"cell": name, "task": label, "command": shown, "status": "not run"}
    s = json.loads(out.read_text())
    lo, hi = wilson_interval(s["successes"], s["episodes"])
    turns = sum(e["turns"] for e in s["per_episode"]) / max(1, len(s["per_episode"]))
    return {"cell": name, "task": label, "method": s["agent"], "episodes": s["episodes"],
            "successes": s["successes"], "ci95": [lo, hi], "avg_reward": s["avg_reward"], "avg_turns": turns,
            "errors": s["errors"], "seconds": s["seconds"], "tasks": sorted(e["task_id"] for e in s["per_episode"]),
            "command": shown, "status": "ok"}


def table(rows: list[dict], backbone: str, dtype: str = "auto") -> str:
    lines = [f"Backbone: {backbone}, greedy, weights in {dtype}. {ANCHOR}.", "",
             "| task | method | success | 95% CI | mean reward | mean turns | wall s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['task']} | {r['cell'].split('-')[1]} | {r['status']} | | | | |")
            continue
        lo, hi = r["ci95"]
        lines.append(f"| {r['task']} | {r['method']} | {r['successes']}/{r['episodes']} = "
                     f"{r['successes'] / r['episodes']:.1%} | {lo:.1%}-{hi:.1%} | {r['avg_reward']:.3f} | "
                     f"{r['avg_turns']:.1f} | {r['seconds']:.0f} |")
    lines += ["", "Commands:", ""] + [f"- `{r['command']}`" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backbone", default="smollm2-135m")
    ap.add_argument("--episodes-per-level", default="16,4,4", help="generated test tasks per level 1,2,3")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="bfloat16",
                    help="a local backbone's weights (bf16: ~3-5x faster on a CPU with avx512_bf16)")
    ap.add_argument("--intercode-episodes", type=int, default=12, help="InterCode-Bash queries (140: all)")
    ap.add_argument("--output-dir", default="runs/terminal_baselines")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = ap.parse_args(argv)
    try:
        per_level = tuple(int(x) for x in args.episodes_per_level.split(","))
        assert len(per_level) == 3 and min(per_level) >= 1 and args.intercode_episodes >= 1
    except (ValueError, AssertionError):
        ap.error(f"--episodes-per-level={args.episodes_per_level!r} / --intercode-episodes="
                 f"{args.intercode_episodes} are invalid: three positive integers, and a positive integer")
    out_dir = Path(args.output_dir)
    plan = [(name, label, command(a, args.backbone, out_dir / f"{name}.json", args.dtype))
            for name, label, a in cells(per_level, args.intercode_episodes)]
    if args.dry_run:
        for _, _, cmd in plan:
            print(" ".join(shlex.quote(c) for c in cmd))
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, _, cmd in plan:
        out = out_dir / f"{name}.json"
        if not out.is_file():
            print(f"[{name}] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
            with open(out_dir / f"{name}.log", "w") as log:
                subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    rows = [row(name, label, cmd, out_dir / f"{name}.json") for name, label, cmd in plan]
    text = table(rows, args.backbone, args.dtype)
    (out_dir / "table.md").write_text(text)
    (out_dir / "table.json").write_text(json.dumps(rows, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
