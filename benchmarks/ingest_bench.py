"""Replay ingestion throughput: EchoRL's replay service vs instadeep's id-echo, side by side in one run.

Sample schema (both systems): ``{obs: float32[84], action: int64[1], reward: float32[1], done: bool[1]}``.
Each case starts one server in a fresh process and N client *processes* that send as fast as they
can. **Both sides are counted at the consumer, with a learner reading**: id-echo's main thread calls
``Server.sample()`` (batches of 256, each sample delivered once); ours runs a learner thread in the
server process calling ``ReplayServer.sample(256)`` on a ``PrioritizedReplayBuffer`` of 2^20
samples (filled before timing, so each add overwrites and updates the sum tree) with the FIFO
sampler (each sample delivered once, in order) and a queue rate limiter (at most 2^16 stored and
undelivered: writers wait for the learner, as id-echo's bounded ring makes them). Cases:

* ``echo-tcp``: id-echo ``TcpClient`` -> ``Server`` (defaults: 8 threads, 32 in-flight messages,
  one write and one 1-byte ack per sample) — the anchor;
* ``echo-tcp-b64``: id-echo with 64-transition messages (the example carries a leading 64 axis);
* ``ours-tcp-1``: per sample like the anchor — one socket write per ``send``, at most 32 samples
  unacknowledged (``flush_bytes`` = one frame, ``max_unacked=32``); the server acknowledges
  cumulatively, one ACK per read (covering every frame that read brought);
* ``ours-shm``: one sample per ``send`` into the shared-memory ring (published per sample;
  acknowledged by the ring's tail);
* batched modes, labelled as such: ``ours-tcp-staged`` (per-sample ``send``, but the client stages
  ~179 frames per socket write with up to 65,536 unacknowledged — the default client settings),
  ``ours-tcp-b64`` / ``ours-shm-b64`` (``send_batch`` of 64 transitions per message).

Interleaving: within each repetition and client count the anchor runs before every contender and
once more at the end (A X1 A X2 ... A; reversed order on odd repetitions), each case in a fresh
process with its own warm-up; a contender's ratio is to the mean of the two anchor runs beside it.
The summary reports the median ratio and its spread (min–max over repetitions).

Besides samples per wall second, each case reports samples per CPU-second of the server and client
processes (all threads, from /proc) over the same window: on a shared, overloaded box the wall rate
follows other people's jobs and how many threads each side runs; the CPU cost is the steadier figure.

id-echo's TCP server binds 0.0.0.0, so by default the whole benchmark re-runs itself inside a
private network namespace with loopback only (``unshare -n``, needs root); ``--no-netns`` skips it
(then only run it on a machine with no reachable interfaces). Run it niced on a shared box:

    nice -n 10 .venv/bin/python benchmarks/ingest_bench.py --reps 3 --seconds 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

import numpy as np

D = 84
CASES_ALL = ("echo-tcp", "echo-tcp-b64", "ours-tcp-1", "ours-shm", "ours-tcp-staged", "ours-tcp-b64", "ours-shm-b64")
ANCHOR = "echo-tcp"
QUEUE = 1 << 16  # ours: stored-but-undelivered samples at most (rate limiter)
BATCHED = {"echo-tcp-b64": "64/message", "ours-tcp-staged": "staged ~179/write", "ours-tcp-b64": "64/message",
           "ours-shm-b64": "64/message"}


def example(rows: int | None = None) -> dict:
    lead = () if rows is None else (rows,)
    return {"obs": np.zeros((*lead, D), np.float32), "action": np.zeros((*lead, 1), np.int64),
            "reward": np.zeros((*lead, 1), np.float32), "done": np.zeros((*lead, 1), bool)}


def pool(rows: int | None, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    lead = () if rows is None else (rows,)
    return [{"obs": rng.standard_normal((*lead, D)).astype(np.float32),
             "action": rng.integers(0, 6, (*lead, 1)).astype(np.int64),
             "reward": rng.standard_normal((*lead, 1)).astype(np.float32),
             "done": rng.random((*lead, 1)) < 0.01} for _ in range(n)]


def client_main(case: str, port: int, idx: int, ready, start, stop) -> None:
    """One writer process: sends until ``stop`` is set."""
    rows = 64 if case.endswith("b64") else None
    samples = pool(rows, 64, seed=idx)
    if case.startswith("echo"):
        from echo import TcpClient
        cli = TcpClient("127.0.0.1", port, example(rows))
        send = cli.send
    else:
        from echo_rl.distributed import ReplayClient
        transport = "shm" if "shm" in case else "tcp"
        kw = {}
        if case == "ours-tcp-1":  # like the anchor: one write per sample, 32 in flight
            kw = {"flush_bytes": 1, "max_unacked": 32}
        cli = ReplayClient(("127.0.0.1", port), example(), transport=transport, client_id=f"bench-{idx}",
                           **kw).connect()
        send = cli.send_batch if rows else cli.send
    ready.put(idx)
    start.wait()
    while not stop.is_set():
        for s in samples:
            send(s)
    os._exit(0)  # measurement is server-side; do not wait for a graceful drain


def cpu_seconds(pids) -> float:
    """user + system CPU seconds used so far by these processes (all their threads), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def run_case(case: str, clients: int, seconds: float, warmup: float, capacity: int) -> dict:
    ctx = mp.get_context("spawn")
    ready, start, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    server = None
    if case.startswith("echo"):
        from echo import Server, TcpTransport
        rows = 64 if case.endswith("b64") else None
        per_batch = 4 if rows else 256  # 256 transitions per delivered batch either way
        server = Server(example(rows), batch_size=per_batch, transport=TcpTransport(0))
        server.start()
        port = server.port
    else:
        import threading

        from echo_rl.distributed import ReplayServer
        from echo_rl.replay import PrioritizedReplayBuffer, RateLimiter
        lim = RateLimiter.queue(QUEUE)
        buf = PrioritizedReplayBuffer(capacity, example=example(), seed=0, sampler="fifo", rate_limiter=lim)
        fill = {k: np.repeat(v[None], 1 << 16, 0) for k, v in example().items()}
        while buf.ids_issued < capacity:  # fill to capacity, untimed: measure on a full, overwriting ring
            buf.add_granted(fill)
        buf.sampler.next = buf.ids_issued  # the fill is not delivered: the learner reads what clients send
        lim.bind(buf.capacity, buf.ids_issued, buf.ids_issued)
        server = ReplayServer(buf, "127.0.0.1", 0).start()
        port = server.port
        consumed = [0]
        done = threading.Event()

        def learner():
            while not done.is_set():
                try:
                    server.sample(256, timeout=0.5)
                except TimeoutError:
                    continue
                except RuntimeError:
                    return
                consumed[0] += 256

        reader = threading.Thread(target=learner, daemon=True)
        reader.start()
    procs = [ctx.Process(target=client_main, args=(case, port, i, ready, start, stop), daemon=True)
             for i in range(clients)]
    for p in procs:
        p.start()
    for _ in procs:  # every client imported its library and connected
        ready.get(timeout=300)
    load0 = os.getloadavg()[0]
    pids = [os.getpid()] + [p.pid for p in procs]
    start.set()
    if case.startswith("echo"):
        count = 0
        per = 256
        t_begin = time.monotonic()
        t0 = c0 = None
        while True:
            s = server.sample()
            count += per
            now = time.monotonic()
            if t0 is None and now - t_begin >= warmup:
                t0, c0, cpu0 = now, count, cpu_seconds(pids)
            if t0 is not None and now - t0 >= seconds:
                t1, c1, cpu1 = now, count, cpu_seconds(pids)
                break
    else:
        time.sleep(warmup)
        t0, c0, s0, cpu0 = time.monotonic(), consumed[0], server.samples_added, cpu_seconds(pids)
        time.sleep(seconds)
        t1, c1, s1, cpu1 = time.monotonic(), consumed[0], server.samples_added, cpu_seconds(pids)
        done.set()
    stored = None if case.startswith("echo") else (s1 - s0) / (t1 - t0)
    stop.set()
    for p in procs:  # a writer blocked on a full id-echo ring never sees stop: kill it
        p.join(timeout=1.0)
        if p.is_alive():
            p.kill()
            p.join()
    server.close()
    return {"case": case, "clients": clients, "samples_per_s": (c1 - c0) / (t1 - t0), "stored_per_s": stored,
            "samples_per_cpu_s": (c1 - c0) / max(cpu1 - cpu0, 1e-9), "cpu_share": (cpu1 - cpu0) / (t1 - t0),
            "load1": load0}


def one_process(case: str, clients: int, args) -> dict | None:
    """Run one case in a fresh interpreter (no threads or sockets left over from other cases)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--one", case, str(clients), "--seconds", str(args.seconds),
           "--warmup", str(args.warmup), "--capacity", str(args.capacity), "--no-netns"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=args.case_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the case and its client processes
        proc.communicate()
        return None
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    print(stderr[-2000:], file=sys.stderr)
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="measured window per case")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before the window")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (median and spread reported)")
    ap.add_argument("--clients", default="1,4", help="client process counts, comma separated")
    ap.add_argument("--cases", default=",".join(CASES_ALL), help=f"subset of {','.join(CASES_ALL)}")
    ap.add_argument("--capacity", type=int, default=1 << 20, help="EchoRL buffer capacity (filled before timing)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--case-timeout", type=float, default=180.0,
                    help="seconds before a case's process is killed and the case reported as stalled")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "CLIENTS"), help=argparse.SUPPRESS)
    ap.add_argument("--no-netns", action="store_true", help="do not re-run inside a private network namespace")
    args = ap.parse_args(argv)
    if not args.no_netns and os.environ.get("ECHO_RL_BENCH_NETNS") != "1":
        # id-echo binds 0.0.0.0: run everything in a namespace whose only interface is loopback
        cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable,
               os.path.abspath(__file__), *(argv if argv is not None else sys.argv[1:])]
        env = dict(os.environ, ECHO_RL_BENCH_NETNS="1")
        try:
            return subprocess.call(cmd, env=env)
        except FileNotFoundError:
            print("unshare not found: install util-linux, or pass --no-netns on an isolated machine", file=sys.stderr)
            return 2
    if args.one:  # child: run one case in this fresh process and print its result as JSON
        print(json.dumps(run_case(args.one[0], int(args.one[1]), args.seconds, args.warmup, args.capacity)),
              flush=True)
        return 0
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES_ALL:
            print(f"--cases: {c!r} is not one of {', '.join(CASES_ALL)}", file=sys.stderr)
            return 2
    try:
        counts = [int(x) for x in args.clients.split(",")]
    except ValueError:
        counts = [0]
    if min(counts) < 1:
        print(f"--clients={args.clients!r} is invalid: comma-separated client counts >= 1", file=sys.stderr)
        return 2
    try:
        import echo  # noqa: F401
    except ImportError:
        print("id-echo is needed for this benchmark: pip install id-echo", file=sys.stderr)
        return 2
    loads: list[float] = []
    stalled: list[str] = []
    rows: list[dict] = []  # every run: case, clients, rep, samples/s, per CPU-s, and its ratio to the anchor
    contenders = [c for c in cases if c != ANCHOR]
    for rep in range(args.reps):
        for n in counts:
            cs = [c for c in contenders if not (c == "echo-tcp-b64" and n > 1)]
            cs = cs if rep % 2 == 0 else cs[::-1]
            seq = [ANCHOR] + [x for c in cs for x in (c, ANCHOR)]  # A X1 A X2 ... A
            got = []
            for case in seq:
                r = one_process(case, n, args)
                if r is None:
                    print(f"rep {rep} {case:16s} clients={n}  STALLED (killed after {args.case_timeout:.0f}s)",
                          flush=True)
                    stalled.append(f"{case}/{n}")
                loads.append(r["load1"] if r else float("nan"))
                got.append(r)
                if r:
                    print(f"rep {rep} {case:16s} clients={n}  {r['samples_per_s'] / 1e3:10.1f}k delivered/s  "
                          f"{r['samples_per_cpu_s'] / 1e3:9.1f}k per CPU-s  (CPUs used {r['cpu_share']:.2f}, "
                          f"load1 {r['load1']:.1f})", flush=True)
            for i, (case, r) in enumerate(zip(seq, got)):
                if r is None:
                    continue
                row = {"case": case, "clients": n, "rep": rep, "samples_per_s": r["samples_per_s"],
                       "per_cpu_s": r["samples_per_cpu_s"], "stored_per_s": r.get("stored_per_s"), "load1": r["load1"]}
                if case != ANCHOR:
                    beside = [got[j] for j in (i - 1, i + 1) if 0 <= j < len(got) and got[j] is not None]
                    if beside:
                        row["ratio"] = r["samples_per_s"] / statistics.mean(a["samples_per_s"] for a in beside)
                        row["ratio_cpu"] = r["samples_per_cpu_s"] / statistics.mean(a["samples_per_cpu_s"]
                                                                                    for a in beside)
                rows.append(row)
    good = [x for x in loads if x == x]
    print(f"\n{args.reps} reps, {args.seconds}s windows after {args.warmup}s warm-up; load1 during runs: "
          f"min {min(good):.1f} median {statistics.median(good):.1f} max {max(good):.1f}; {os.cpu_count()} CPUs")
    print("delivered = samples read by the consumer (id-echo Server.sample / our learner's ReplayServer.sample)")
    print(f"{'case':16s} {'mode':18s} {'clients':>7s} {'delivered/s':>12s} {'x echo-tcp (min-max)':>24s} "
          f"{'per CPU-s':>10s} {'x echo (CPU)':>12s}")
    summary = {}
    for n in counts:
        for case in [ANCHOR] + contenders:
            rs = [r for r in rows if r["case"] == case and r["clients"] == n]
            if not rs:
                continue
            v = statistics.median(r["samples_per_s"] for r in rs)
            cpu = statistics.median(r["per_cpu_s"] for r in rs)
            ratios = [r["ratio"] for r in rs if "ratio" in r]
            rc = [r["ratio_cpu"] for r in rs if "ratio_cpu" in r]
            mode = BATCHED.get(case, "per sample")
            if ratios:
                rtxt = f"{statistics.median(ratios):6.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
                ctxt = f"{statistics.median(rc):6.2f}x"
            else:
                rtxt, ctxt = "1.00x (anchor)", "1.00x"
            print(f"{case:16s} {mode:18s} {n:7d} {v / 1e3:11.1f}k {rtxt:>24s} {cpu / 1e3:9.1f}k {ctxt:>12s}")
            summary[f"{case}/{n}"] = {"median_per_s": v, "ratios": ratios, "median_per_cpu_s": cpu, "ratios_cpu": rc}
    if stalled:
        print(f"stalled (not counted): {', '.join(stalled)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "summary": summary, "load1": loads, "stalled": stalled}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
