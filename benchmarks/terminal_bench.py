"""Terminal tasks: sandboxed shell latency, episode throughput, and the oracle checks.

    nice -n 10 .venv/bin/python benchmarks/terminal_bench.py --commands 500 --episodes 60
    .venv/bin/python benchmarks/terminal_bench.py --oracle            # every generated task (all splits)
    .venv/bin/python benchmarks/terminal_bench.py --intercode         # InterCode-Bash gold commands as agents

Latency: wall time of ``ShellSession.run`` (send the command, read its output
up to the sentinel) in one long-lived sandboxed bash, per kind of command: a
builtin (``true``), one external program (``ls -la``) and a three-stage
pipeline. Episodes: the oracle plays generated tasks through the env
(``reset`` = private work dir + setup sandbox + shell start; each ``step`` one
tool call; the last step runs the verifier in a fresh sandbox), reporting env
steps/s over the whole episode and the mean time of reset and verification.

``--oracle`` plays the oracle on every generated task and prints how many score
1.0. ``--intercode`` plays each InterCode-Bash gold command as the agent's one
command and lists the queries where it does not score 1 here, with the reason
read from the output (a tool the host lacks, a system file of upstream's
image, or a run-to-run difference).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from echo_rl.environments.terminal.env import TerminalEnvironment
from echo_rl.environments.terminal.generator import TEMPLATES, build_task, task_keys
from echo_rl.environments.terminal.shell import Limits, ShellSession, episode_uid

KINDS = {"builtin": "true", "external": "ls -la", "pipeline": "seq 1 200 | grep 7 | wc -l"}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor()


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def latency(commands: int) -> dict:
    work = tempfile.mkdtemp()
    uid = episode_uid()
    if os.geteuid() == 0:
        os.chown(work, uid, uid)
    out = {}
    start = time.perf_counter()
    session = ShellSession(work, limits=Limits(), uid=uid).start()
    session.run("true")
    out["shell_start_ms"] = (time.perf_counter() - start) * 1000
    for kind, command in KINDS.items():
        times = []
        for _ in range(commands):
            t = time.perf_counter()
            session.run(command)
            times.append((time.perf_counter() - t) * 1000)
        out[kind] = {"p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99),
                     "mean_ms": statistics.mean(times)}
    session.close()
    os.rmdir(work) if not os.listdir(work) else None
    return out


def episodes(n: int) -> dict:
    keys = [(t, i) for i in range(n) for t in TEMPLATES][:n]
    env = TerminalEnvironment(tasks=[build_task(t, i) for t, i in keys])
    steps, resets, finals, wins = 0, [], [], 0
    t0 = time.perf_counter()
    for k in range(len(keys)):
        t = time.perf_counter()
        env.reset(options={"task_index": k})
        resets.append(time.perf_counter() - t)
        while True:
            action = env.expert_action()
            t = time.perf_counter()
            _, reward, term, trunc, info = env.step(action)
            steps += 1
            if term or trunc:
                finals.append(time.perf_counter() - t)
                wins += reward == 1.0
                break
    total = time.perf_counter() - t0
    env.close()
    return {"episodes": len(keys), "oracle_success": wins, "env_steps": steps, "env_steps_per_s": steps / total,
            "episodes_per_s": len(keys) / total, "reset_ms": 1000 * statistics.mean(resets),
            "final_step_ms": 1000 * statistics.mean(finals)}


def oracle_all(per_template: int) -> dict:
    keys = task_keys("all", per_template=per_template)
    env = TerminalEnvironment(tasks=[build_task(t, i) for t, i in keys])
    failed = []
    for k, (t, i) in enumerate(keys):
        env.reset(options={"task_index": k})
        while True:
            _, reward, term, trunc, info = env.step(env.expert_action())
            if term or trunc:
                break
        if reward != 1.0:
            failed.append(f"{t}-{i}: {info['verifier']}")
    env.close()
    return {"tasks": len(keys), "oracle_1.0": len(keys) - len(failed), "failed": failed}


def why(gold: str, output: str) -> str | None:
    """Why a gold command cannot behave here as in upstream's image (None: nothing seen in its output)."""
    if "command not found" in output:
        return "tool missing on this host"
    if "Could not resolve host" in output or "Network is unreachable" in output:
        return "needs the network"
    if any(p in gold for p in ("/etc/", "/var/")) and "No such file" in output:
        return "system file of upstream's image"
    if "Permission denied" in output or "Read-only file system" in output:
        return "needs root or a read-only system folder"
    return None


def intercode() -> dict:
    from echo_rl.environments.terminal.intercode import InterCodeBashEnvironment

    env = InterCodeBashEnvironment()
    rows, solved = [], 0
    for k, task in enumerate(env.tasks):
        env.reset(options={"task_index": k})
        obs = env.step(env.expert_action())[0]
        _, reward, _, _, info = env.step("<submit></submit>")
        solved += reward == 1.0
        reason = why(task.metadata["gold"], env.last_verdict.output)
        if reward != 1.0 or reason:  # a gold that fails the same way twice still scores 1: listed too
            rows.append({"task": task.name, "gold": task.metadata["gold"], "reward": reward,
                         "why": reason or "output or files differ between two runs (time, order, pid)",
                         "parts": json.loads(info["verifier"]["detail"]), "output": obs[:200]})
    env.close()
    return {"queries": len(env.tasks), "gold_scores_1": solved, "not_reproduced": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commands", type=int, default=300, help="commands per kind for the latency figures")
    ap.add_argument("--episodes", type=int, default=48, help="oracle episodes for the throughput figures")
    ap.add_argument("--oracle", action="store_true", help="play the oracle on every generated task instead")
    ap.add_argument("--per-template", type=int, default=200, help="--oracle: instances per template")
    ap.add_argument("--intercode", action="store_true", help="play InterCode-Bash's gold commands instead")
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    args = ap.parse_args()
    if args.commands < 1 or args.episodes < 1 or args.per_template < 1:
        ap.error("--commands, --episodes and --per-template must be >= 1")
    result: dict = {"cpu": cpu_model(), "cores": os.cpu_count(), "root": os.geteuid() == 0}
    if args.oracle:
        result["oracle"] = oracle_all(args.per_template)
    elif args.intercode:
        result["intercode"] = intercode()
    else:
        result["latency"] = latency(args.commands)
        result["episodes"] = episodes(args.episodes)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
