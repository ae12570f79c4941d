"""The baseline table: ReAct, Act-only and ToT with one backbone on every text task, one `echo-rl benchmark` per cell.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/baseline_table.py            # smollm2-135m, the default counts
    .venv/bin/python benchmarks/baseline_table.py --dry-run                    # print the commands only

Each cell (task x method) is one ``echo-rl benchmark`` command, run as a
subprocess exactly as printed, into its own run directory (rerunning resumes:
finished cells are kept). The table — Success@1 with a 95% Wilson interval
over the cell's episodes (one seed, so there is no bootstrap over seeds),
ETPS and Cost/Success — goes to ``OUTPUT_DIR/table.md`` and ``table.json``,
each row with its command. Cost is the benchmark's: measured process CPU time
priced at ``cpu_hour_usd`` (a configuration value, stated in the table).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from echo_rl.evaluation.records import CellStore
from echo_rl.utils.statistics import wilson_interval

ROOT = Path(__file__).resolve().parents[1]
CLI = [str(Path(sys.executable).parent / "echo-rl"), "benchmark"]
METHODS = ("react", "act", "tot")


@dataclass(frozen=True)
class Row:
    label: str  # as shown in the table
    task: str  # the benchmark's task name
    max_steps: int  # the step cap every method meets (thoughts and ToT depths count against it)
    episodes: int  # per ReAct / Act-only cell
    tot_episodes: int  # per ToT cell (a ToT step is 1 propose + `breadth` value calls)
    task_config: dict = field(default_factory=dict)


# Episode counts and step caps sized so the whole table runs in well under an hour on two shared CPU cores.
ROWS = (
    Row("CRUXEval-O (output prediction)", "cruxeval", 4, 20, 6, {"task": "output"}),
    Row("CRUXEval-I (input prediction)", "cruxeval", 4, 20, 4, {"task": "input"}),
    Row("MiniGrid-as-text Empty-Random-5x5", "minigrid:MiniGrid-Empty-Random-5x5-v0", 15, 16, 3),
    Row("WebShop (synthetic catalogue)", "webshop", 10, 8, 2),
    Row("ARC evaluation", "arc", 2, 4, 1, {"split": "evaluation"}),  # prompts of up to ~8k tokens: prefill dominates
    Row("ALFWorld valid_unseen", "alfworld", 20, 8, 2, {"split": "valid_unseen", "expert": False}),
)


def slug(row: Row) -> str:
    return "".join(c if c.isalnum() else "-" for c in row.label.split(" (")[0].lower()).strip("-")


def command(row: Row, method: str, backbone: str, episodes: int, concurrency: int, out: Path,
            timeout: float, dtype: str = "auto") -> list[str]:
    cmd = [*CLI, "--tasks", row.task, "--baselines", method, "--backbones", backbone, "--num-seeds", "1",
           "--num-episodes", str(episodes), "--max-steps", str(row.max_steps), "--concurrency", str(concurrency),
           "--timeout", f"{timeout:g}", "--no-plots", "--output-dir", str(out)]
    for k, v in row.task_config.items():
        cmd += ["--set", f"task_configs.{row.task}.{k}={json.dumps(v) if isinstance(v, bool) else v}"]
    if dtype != "auto":  # the local model's weights (and so the engine's decode) in this dtype
        cmd += ["--set", f"backbone_config.dtype={dtype}"]
    return cmd


def cell_row(row: Row, method: str, cmd: list[str], out: Path) -> dict:
    records = [r for r in CellStore(out).records() if r["method"] == method]
    shown = " ".join(shlex.quote(c) for c in ["echo-rl", *cmd[1:]])
    base = {"task": row.label, "method": method, "command": shown}
    if not records:
        return {**base, "status": "not run"}
    rec = records[0]
    if rec["status"] != "ok":
        return {**base, "status": rec["status"], "reason": rec.get("reason", "")}
    m = rec["metrics"]
    n, k = int(m["num_episodes"]), int(round(m["successes"]))
    lo, hi = wilson_interval(k, n)
    notes = rec.get("notes") or {}
    return {**base, "status": "ok", "episodes": n, "successes": k, "success_at_1": m["success_at_1"],
            "ci95": [lo, hi], "etps": m["etps"], "cost_usd": m["cost_usd"], "cost_per_success": m["cost_per_success"],
            "tokens_per_episode": m["tokens_per_episode"], "wall_time_s": m["wall_time_s"],
            "cpu_time_s": m["cpu_time_s"], "rss_mb_peak": (rec.get("resources") or {}).get("rss_mb_peak"),
            "kv_reuse": (notes.get("engine") or {}).get("kv_reuse_rate"),
            "episode_errors": notes.get("num_episode_errors", 0), "benchmark": notes.get("benchmark")}


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"Backbone `{meta['backbone']}` ({meta.get('dtype', 'auto')} weights); commit {meta['commit']}; "
             f"{meta['cpu']}; one seed; "
             f"compute priced at ${meta['cpu_hour_usd']}/CPU-hour of measured process CPU time.", "",
             "| Task | Method | Success@1 (95% CI) | ETPS | Cost/Success | Episodes | KV reuse | Wall (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['task']} | {r['method']} | {r['status']}: {r.get('reason', '')} | | | | | |")
            continue
        cps = "n/a (0 successes)" if r["cost_per_success"] is None else f"${r['cost_per_success']:.5f}"
        # an episode the harness could not run (env start, backbone error) counts as a failure: say how many
        errored = f" ({r['episode_errors']} errored)" if r.get("episode_errors") else ""
        kv = "" if r["kv_reuse"] is None else f"{r['kv_reuse']:.2f}"
        lines.append(f"| {r['task']} | {r['method']} | {r['successes']}/{r['episodes']} = {r['success_at_1']:.2f} "
                     f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]{errored} | {r['etps']:.1f} | {cps} | {r['episodes']} | "
                     f"{kv} | "
                     f"{r['wall_time_s']:.0f} |")
    lines += ["", "Commands (one per cell, in table order):", "", "```"]
    lines += [r["command"] for r in rows]
    lines += ["```", ""]
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu() -> str:
    try:
        model = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "unknown CPU"
    import os

    return f"{model}, {os.cpu_count()} vCPU"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", default="smollm2-135m")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the ReAct / Act-only episode counts")
    ap.add_argument("--tot-scale", type=float, default=1.0, help="multiply the ToT episode counts")
    ap.add_argument("--collect", action="store_true", help="run nothing: build the table from the stored cells")
    ap.add_argument("--concurrency", type=int, default=16, help="episodes in flight per cell")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one cell may run (then it is reported "
                                                                "as timed out, not scored)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--rows", nargs="+", help="row slugs to run (default all): " + ", ".join(slug(r) for r in ROWS))
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="the local backbone's weight dtype (bfloat16: ~3-5x faster on CPUs with AVX512-BF16/AMX; "
                         "greedy replies may differ from float32's)")
    ap.add_argument("--output-dir", default="runs/baseline_table")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args()
    rows = [r for r in ROWS if not args.rows or slug(r) in args.rows]
    if args.rows and len(rows) != len(args.rows):
        ap.error(f"--rows: unknown slug in {args.rows}; allowed: {', '.join(slug(r) for r in ROWS)}")
    out_root = Path(args.output_dir)
    meta = {"backbone": args.backbone, "dtype": args.dtype, "commit": _commit(), "cpu": _cpu(),
            "cpu_hour_usd": 0.05}  # code as run
    table = []
    for row in rows:
        for method in args.methods:
            n = max(1, round(row.tot_episodes * args.tot_scale if method == "tot" else row.episodes * args.scale))
            out = out_root / f"{slug(row)}__{method}"
            cmd = command(row, method, args.backbone, n, args.concurrency, out, args.timeout, args.dtype)
            if not args.collect:
                print(" ".join(shlex.quote(c) for c in cmd), flush=True)
            if not (args.dry_run or args.collect):
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                tail = (proc.stderr.strip().splitlines() or [""])[-1]
                print(f"  -> rc {proc.returncode} in {time.perf_counter() - t0:.0f}s: {tail}", flush=True)
            table.append(cell_row(row, method, cmd, out))
    if args.dry_run:
        return 0
    out_root.mkdir(parents=True, exist_ok=True)
    (out_root / "table.json").write_text(json.dumps({"meta": meta, "rows": table}, indent=2))
    (out_root / "table.md").write_text(markdown(table, meta))
    print(markdown(table, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
