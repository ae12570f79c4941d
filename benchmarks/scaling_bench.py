"""How EchoRL's distributed parts scale: Ray rollout workers, and many light writers against one replay server.

Two studies, each case in a fresh process, cases interleaved within every repetition (order reversed
on odd repetitions) so a change in the box's load hits all of them alike:

* ``actors``: ``echo-rl train --backend ray`` (PPO, MiniGrid-Empty-5x5, a fixed number of envs) with
  1, 2, 4, 8 Ray workers, beside the in-process backend on the same envs. The figure is the trainer's
  ``iteration_env_steps_per_s`` (collection + learning, Ray start-up and evaluation excluded), so it
  answers "what do more workers buy per update" on this machine. Every Ray worker holds one CPU's worth
  of work: on a 2-core box more than two workers can only add overhead, and the table shows how much.
* ``clients``: M writers, each a ``ReplayClient`` over TCP sending one sample per ``send`` at a fixed
  rate (a light rollout worker: ``--rate`` samples/s, default 200, i.e. a MiniGrid env stepping at its
  own pace), spread as threads over ``--procs`` processes, against one ``ReplayServer`` whose learner
  thread reads FIFO batches of 256. Counted **at the consumer**: samples the learner read per second,
  against what the writers offered (M x rate); plus the server process's CPU share and the per-writer
  spread of stored samples (fairness). This is the 100+-worker question asked of one server, as far as
  two cores allow: threads stand in for hosts, so client CPU competes with the server's here, which a
  real cluster would not do.

Run niced on a shared box; both studies print a JSON line per case and a summary table:

    nice .venv/bin/python benchmarks/scaling_bench.py actors --workers 1 2 4 8 --reps 2
    nice .venv/bin/python benchmarks/scaling_bench.py clients --clients 1 16 64 128 256 --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

D = 84  # the ingestion benchmark's sample: obs float32[84], action, reward, done


def example() -> dict:
    return {"obs": np.zeros(D, np.float32), "action": np.zeros(1, np.int64), "reward": np.zeros(1, np.float32),
            "done": np.zeros(1, bool)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------- actors


def run_actors(workers: int | None, args) -> dict:
    """One training run in a fresh ``echo-rl train`` process; ``workers=None`` is the in-process backend."""
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        cmd = [sys.executable, "-m", "echo_rl.cli", "train", "--task", "minigrid:MiniGrid-Empty-5x5-v0",
               "--agent", "ppo", "--num-actors", str(args.envs), "--batch-size", str(args.batch_size),
               "--timesteps", str(args.timesteps), "--seed", "0", "--no-progress", "--run-dir", f"{tmp}/run",
               "--set", "evaluation_frequency=0", "--set", "evaluation_episodes=1"]
        if workers is not None:
            cmd += ["--backend", "ray", "--set", f"ray_num_workers={workers}"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        with open(f"{tmp}/run/summary.json") as f:
            summary = json.load(f)
    return {"case": "local" if workers is None else f"ray-{workers}", "workers": workers,
            "env_steps_per_s": summary["iteration_env_steps_per_s"], "process_wall_s": wall,
            "load1": os.getloadavg()[0]}


# --------------------------------------------------------------------------------------------- clients


def writers_main(port: int, first: int, count: int, rate: float, seconds: float, warmup: float, out) -> None:
    """``count`` writer threads in this process, each its own TCP connection, sending at ``rate``/s."""
    from echo_rl.distributed import ReplayClient

    rng = np.random.default_rng(first)
    pool = [{"obs": rng.standard_normal(D).astype(np.float32), "action": np.array([i % 6]),
             "reward": np.array([0.5], np.float32), "done": np.array([False])} for i in range(32)]
    sent = [0] * count
    barrier = threading.Barrier(count)

    def writer(k: int) -> None:
        with ReplayClient(("127.0.0.1", port), example(), transport="tcp", client_id=f"w{first + k}",
                          flush_bytes=1, max_unacked=32) as cli:
            barrier.wait()
            period = 1.0 / rate
            start = time.monotonic() + (k % 97) * period / 97  # spread the writers over a period
            end = start + warmup + seconds
            i = 0
            while True:
                due = start + i * period
                now = time.monotonic()
                if due > end:
                    break
                if due > now:
                    time.sleep(due - now)
                cli.send(pool[i % len(pool)])
                i += 1
            sent[k] = i
            cli.flush(wait=True, timeout=30)

    threads = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(sent)


def run_clients(clients: int, args) -> dict:
    """One server + learner thread here; ``clients`` rate-limited writers over ``args.procs`` processes."""
    import multiprocessing as mp

    from echo_rl.distributed import ReplayServer
    from echo_rl.replay import PrioritizedReplayBuffer

    buf = PrioritizedReplayBuffer(1 << 20, example=example(), seed=0, sampler="fifo")
    server = ReplayServer(buf, "127.0.0.1", 0, max_connections=max(256, clients + 8)).start()
    consumed, stop = [0], threading.Event()

    def learner() -> None:
        while not stop.is_set():
            try:
                server.sample(64, timeout=0.2)
            except TimeoutError:
                continue
            consumed[0] += 64

    reader = threading.Thread(target=learner, daemon=True)
    reader.start()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs, first = [], 0
    nproc = min(args.procs, clients)
    for j in range(nproc):
        n = clients // nproc + (j < clients % nproc)
        procs.append(ctx.Process(target=writers_main, args=(server.port, first, n, args.rate, args.seconds,
                                                            args.warmup, out), daemon=True))
        first += n
    for p in procs:
        p.start()
    # writers connect, then send for warmup + seconds; measure the consumer over the last ``seconds``
    while server.samples_added == 0:
        time.sleep(0.01)
    time.sleep(args.warmup)
    t0, c0, cpu0 = time.monotonic(), consumed[0], cpu_seconds(os.getpid())
    time.sleep(args.seconds)
    t1, c1, cpu1 = time.monotonic(), consumed[0], cpu_seconds(os.getpid())
    sent = [s for _ in procs for s in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=30)
    stop.set()
    reader.join(timeout=5)
    server.close()
    offered = clients * args.rate
    return {"case": f"clients-{clients}", "clients": clients, "offered_per_s": offered,
            "consumed_per_s": (c1 - c0) / (t1 - t0), "delivered_fraction": (c1 - c0) / (t1 - t0) / offered,
            "server_cpu_share": (cpu1 - cpu0) / (t1 - t0), "sent_min": min(sent), "sent_max": max(sent),
            "load1": os.getloadavg()[0]}


# ------------------------------------------------------------------------------------------------ main


def one_case(study: str, value: str, args) -> dict:
    """Run one case in a fresh interpreter (no threads, sockets or Ray state left over from others)."""
    cmd = [sys.executable, os.path.abspath(__file__), study, "--one", value]
    for k in ("timesteps", "envs", "batch_size", "rate", "seconds", "warmup", "procs"):
        if getattr(args, k, None) is not None:
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"case {study} {value} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="study", required=True)
    a = sub.add_parser("actors", help="Ray rollout workers vs the in-process backend")
    a.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    a.add_argument("--envs", type=int, default=8)
    a.add_argument("--batch-size", type=int, default=1024)
    a.add_argument("--timesteps", type=int, default=16384)
    c = sub.add_parser("clients", help="many rate-limited TCP writers against one replay server")
    c.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64, 128, 256])
    c.add_argument("--rate", type=float, default=200.0, help="samples/s each writer offers")
    c.add_argument("--seconds", type=float, default=5.0)
    c.add_argument("--warmup", type=float, default=1.0)
    c.add_argument("--procs", type=int, default=2, help="processes the writer threads are spread over")
    for s in (a, c):
        s.add_argument("--reps", type=int, default=2)
        s.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.one is not None:
        if args.study == "actors":
            res = run_actors(None if args.one == "local" else int(args.one), args)
        else:
            res = run_clients(int(args.one), args)
        print(json.dumps(res))
        return 0

    values = (["local"] + [str(w) for w in args.workers]) if args.study == "actors" else [str(n) for n in args.clients]
    rows: dict[str, list[dict]] = {}
    for rep in range(args.reps):
        for v in (values if rep % 2 == 0 else values[::-1]):
            res = one_case(args.study, v, args)
            res["rep"] = rep
            print(json.dumps(res), flush=True)
            rows.setdefault(res["case"], []).append(res)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
    print(f"\n{args.study} on {model}, {os.cpu_count()} CPUs, {args.reps} repetitions (median [min, max])")
    if args.study == "actors":
        local = [r["env_steps_per_s"] for r in rows["local"]]
        print("| backend | env steps/s | vs in-process (per rep) |\n|---|---|---|")
        for case, rs in rows.items():
            sps = [r["env_steps_per_s"] for r in rs]
            ratios = [s / l for s, l in zip(sps, local)]
            print(f"| {case} | {statistics.median(sps):,.0f} [{min(sps):,.0f}, {max(sps):,.0f}] | "
                  f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}] |")
    else:
        print("| writers | offered/s | read by the learner/s | delivered | server CPU | sent per writer min-max |\n"
              "|---|---|---|---|---|---|")
        for case, rs in rows.items():
            got = [r["consumed_per_s"] for r in rs]
            frac = [r["delivered_fraction"] for r in rs]
            print(f"| {rs[0]['clients']} | {rs[0]['offered_per_s']:,.0f} | {statistics.median(got):,.0f} "
                  f"[{min(got):,.0f}, {max(got):,.0f}] | {statistics.median(frac):.2f} | "
                  f"{statistics.median(r['server_cpu_share'] for r in rs):.2f} | "
                  f"{min(r['sent_min'] for r in rs)}-{max(r['sent_max'] for r in rs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
