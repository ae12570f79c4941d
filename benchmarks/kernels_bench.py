"""Compiled vs numpy kernels: where the C++ batch path pays (issue 19).

Each kernel runs through its public function with ``use_native=True`` and ``use_native=False``
on the same pre-generated inputs. n is the number of elements: lengths for the bandwidth
kernels, episodes for bandwidth_efficiency (n/4 policy-gradient losses), plan values for the plan
kernels (n/16 plans of D=16), tokens for prefix_match_batch (n/64 candidates of 64 tokens against
a 64-token query, prefixes shared at random lengths), priorities for priority_sample (1024 draws).
Within every repetition both paths run back to back, in alternating order; each timing is the
mean of a loop of >= --min-time seconds; the table shows the median over --reps repetitions and
the median of the per-repetition ratios numpy/compiled (> 1: compiled is faster).

    python benchmarks/kernels_bench.py [--reps 5] [--min-time 0.05] [--sizes 100 10000 1000000]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

from echo_rl.kernels import (
    EMAPlanTracker,
    attention_bandwidth_cost_batch,
    bandwidth_aware_priorities,
    bandwidth_efficiency,
    effective_bandwidth_cost,
    kernels_available,
    kernels_status,
    plan_surprise_batch,
    prefix_match_batch,
    priority_sample,
)

D = 16


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown CPU"


def cases(n: int, rng: np.random.Generator):
    """name -> fn(use_native) for size n, inputs made up front."""
    t = rng.integers(0, 4096, n).astype(np.float64)
    tp = np.floor(t * rng.random(n))
    r, b, q = rng.normal(size=n), rng.exponential(size=n) * 1e3, rng.exponential(size=n) * 1e3
    lo = rng.normal(size=max(1, n // 4))
    rows = max(1, n // D)
    plans, mean, rew = rng.normal(size=(rows, D)), rng.normal(size=D), rng.normal(size=rows)
    query = rng.integers(0, 100, 64)
    cands = [np.concatenate([query[: int(k)], rng.integers(100, 200, 64 - int(k))])
             for k in rng.integers(0, 65, max(1, n // 64))]
    prios = rng.exponential(size=n)

    def ema(use):
        tr = EMAPlanTracker(0.99, use_native=use)
        tr.update(mean)
        return tr.update_batch(plans)

    return {
        "attention_bandwidth_cost_batch": lambda use: attention_bandwidth_cost_batch(t, use_native=use),
        "effective_bandwidth_cost": lambda use: effective_bandwidth_cost(t, tp, use_native=use),
        "bandwidth_aware_priorities": lambda use: bandwidth_aware_priorities(r, b, q, use_native=use),
        "bandwidth_efficiency": lambda use: bandwidth_efficiency(r, b, lo, 0.5, use_native=use),
        "plan_surprise_batch": lambda use: plan_surprise_batch(plans, mean, rew, use_native=use),
        "EMAPlanTracker.update_batch": ema,
        "prefix_match_batch": lambda use: prefix_match_batch(query, cands, use_native=use),
        "priority_sample (1024 draws)": lambda use: priority_sample(prios, 1024, 0, use_native=use),
    }


def time_it(fn, use: bool, min_time: float) -> float:
    """Mean seconds per call over a loop of at least ``min_time`` seconds."""
    fn(use)
    k, total = 0, 0.0
    start = time.perf_counter()
    while True:
        fn(use)
        k += 1
        total = time.perf_counter() - start
        if total >= min_time:
            return total / k


def fmt(sec: float) -> str:
    return f"{sec * 1e6:.1f} us" if sec < 1e-3 else f"{sec * 1e3:.2f} ms"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.05)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000, 1_000_000])
    args = ap.parse_args(argv)
    if args.reps < 1 or args.min_time <= 0 or any(s < 1 for s in args.sizes):
        print("--reps must be >= 1, --min-time > 0 and every size >= 1", file=sys.stderr)
        return 2
    if not kernels_available():
        print(f"cannot compare: {kernels_status()}", file=sys.stderr)
        return 2
    print(f"CPU: {cpu_model()}; numpy {np.__version__}; python {platform.python_version()}")
    print(f"median of {args.reps} reps, paths interleaved; ratio = numpy / compiled (> 1: compiled faster)\n")
    print("| kernel | n | compiled | numpy | ratio |\n|---|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for n in args.sizes:
        for name, fn in cases(n, rng).items():
            nat, ref, ratio = [], [], []
            for rep in range(args.reps):
                order = (True, False) if rep % 2 == 0 else (False, True)
                got = {use: time_it(fn, use, args.min_time) for use in order}
                nat.append(got[True])
                ref.append(got[False])
                ratio.append(got[False] / got[True])
            print(f"| {name} | {n:.0e} | {fmt(statistics.median(nat))} | {fmt(statistics.median(ref))} | "
                  f"{statistics.median(ratio):.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
