"""Replay benchmark: EchoRL's PrioritizedReplayBuffer vs cpprb and TorchRL, side by side.

Transitions ``{obs: float32[84], action: int64[1], reward: float32[1], done: bool[1]}``, capacity
1e6, every figure on a full (overwriting) ring: add 1/call, add 1024/call, sample(256) (data +
indices + importance weights), update_priorities(256) with fresh random indices. Anchors:
cpprb ``PrioritizedReplayBuffer``, TorchRL ``PrioritizedReplayBuffer`` + ``LazyTensorStorage``
(torch pinned to 1 thread), and a plain numpy uniform ring (the floor for Python-level APIs).

Protocol (interleaved, so every ratio compares libraries under the same load): each repetition
starts one fresh process per library, all filled (untimed) and all alive at once; each process
then warms up every metric (``--warmup`` s each); then, metric by metric, the libraries take
turns running short slices (``--slice`` s each) in the order A B C ... C B A, ``--slices`` turns
in all, while the others wait idle. A library's rate in a repetition is its calls over its time
summed across its slices; ratios are taken per repetition, and the summary gives their median
and spread (min–max over repetitions). Inputs are pre-generated.

    python benchmarks/replay_bench.py [--reps 5] [--slices 4] [--slice 0.25] [--json out.json]

Needs the bench-only packages ``cpprb`` and ``torchrl`` (``pip install cpprb torchrl``); a library
that cannot be imported or built is reported as such and left out of the ratios. TorchRL 0.14.1's
prebuilt C++ extension does not load against torch 2.13; the script then rebuilds that one
extension from the sources the wheel ships (cached in .cache/torchrl_ext; needs a compiler and
ninja) and says so in its output, or reports TorchRL as not run if that fails too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

D = 84
CAPACITY = 1_000_000
BATCH_ADD = 1024
SAMPLE = 256
N_SINGLE = 1 << 16  # pre-generated single transitions, cycled
N_IDX = 256  # pre-generated index/priority sets, cycled
METRICS = ("add_1", "add_1024", "sample_256", "update_256")
LIBS = ("numpy_ring", "echo_rl", "echo_rl_numpy", "cpprb", "torchrl")
# quiet-box goals vs cpprb (issue 25, item 4: update(256) >= 2x, sample(256) >= 5x)
GOALS = {"add_1": 5.0, "add_1024": 1.5, "sample_256": 5.0, "update_256": 2.0}
TORCHRL_BUILD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".cache", "torchrl_ext")


def make_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    n = max(BATCH_ADD, N_SINGLE)
    data = {"obs": rng.normal(size=(n, D)).astype(np.float32),
            "action": rng.integers(0, 18, size=(n, 1)).astype(np.int64),
            "reward": rng.normal(size=(n, 1)).astype(np.float32),
            "done": rng.random((n, 1)) < 0.05}
    idx_u = rng.random((N_IDX, SAMPLE))  # turned into live indices per library
    prios = rng.uniform(0.01, 2.0, size=(N_IDX, SAMPLE))
    return data, idx_u, prios


def timed(fn, min_time: float, start_i: int = 0) -> tuple[int, float]:
    """(calls, seconds) of fn(i) run for at least min_time seconds."""
    n, chunk = 0, 8
    start = time.perf_counter()
    while True:
        for i in range(start_i + n, start_i + n + chunk):
            fn(i)
        n += chunk
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return n, elapsed
        chunk = min(chunk * 2, 1 << 12)


# --------------------------------------------------------------------------- libraries
def run_numpy_ring(data, idx_u, prios):
    store = {k: np.zeros((CAPACITY, *v.shape[1:]), v.dtype) for k, v in data.items()}
    pos = [0]
    batch = {k: v[:BATCH_ADD] for k, v in data.items()}
    singles = [{k: v[i] for k, v in data.items()} for i in range(N_SINGLE)]
    for k in store:  # fill
        store[k][:] = np.resize(data[k], store[k].shape)
    rng = np.random.default_rng(1)

    def add1(i):
        t = singles[i & (N_SINGLE - 1)]
        p = pos[0]
        store["obs"][p] = t["obs"]
        store["action"][p] = t["action"]
        store["reward"][p] = t["reward"]
        store["done"][p] = t["done"]
        pos[0] = (p + 1) % CAPACITY

    def add_batch(i):
        p = pos[0]
        if p + BATCH_ADD > CAPACITY:
            p = 0
        for k, v in batch.items():
            store[k][p: p + BATCH_ADD] = v
        pos[0] = (p + BATCH_ADD) % CAPACITY

    def sample(i):
        idx = rng.integers(0, CAPACITY, SAMPLE)
        return {k: v[idx] for k, v in store.items()}, idx

    return {"add_1": add1, "add_1024": add_batch, "sample_256": sample}, {}


def run_echo(data, idx_u, prios):
    from echo_rl.replay import PrioritizedReplayBuffer

    example = {k: v[0] for k, v in data.items()}
    buf = PrioritizedReplayBuffer(CAPACITY, alpha=0.6, beta=0.4, example=example, seed=1)
    batch = {k: v[:BATCH_ADD] for k, v in data.items()}
    for _ in range(CAPACITY // BATCH_ADD + 1):
        buf.add(batch)
    singles = [{k: v[i] for k, v in data.items()} for i in range(N_SINGLE)]

    offs = (idx_u * CAPACITY).astype(np.int64)
    live = [-1, None]  # ids_issued -> the pre-generated index sets as live ids

    def update(i):  # fresh random live ids (live ids are [ids_issued - CAPACITY, ids_issued))
        if live[0] != buf.ids_issued:
            live[0], live[1] = buf.ids_issued, buf.ids_issued - CAPACITY + offs
        buf.update_priorities(live[1][i % N_IDX], prios[i % N_IDX])

    return {"add_1": lambda i: buf.add_one(singles[i & (N_SINGLE - 1)]), "add_1024": lambda i: buf.add(batch),
            "sample_256": lambda i: buf.sample(SAMPLE), "update_256": update}, {"_native": buf.native}


def run_cpprb(data, idx_u, prios):
    import cpprb

    env = {"obs": {"shape": D, "dtype": np.float32}, "act": {"shape": 1, "dtype": np.int64},
           "rew": {"shape": 1, "dtype": np.float32}, "done": {"shape": 1, "dtype": np.bool_}}
    rb = cpprb.PrioritizedReplayBuffer(CAPACITY, env, alpha=0.6)
    batch = {"obs": data["obs"][:BATCH_ADD], "act": data["action"][:BATCH_ADD],
             "rew": data["reward"][:BATCH_ADD], "done": data["done"][:BATCH_ADD]}
    for _ in range(CAPACITY // BATCH_ADD + 1):
        rb.add(**batch)
    singles = [{"obs": data["obs"][i], "act": data["action"][i], "rew": data["reward"][i],
                "done": data["done"][i]} for i in range(N_SINGLE)]
    ids = (idx_u * CAPACITY).astype(np.int64)
    return {"add_1": lambda i: rb.add(**singles[i & (N_SINGLE - 1)]), "add_1024": lambda i: rb.add(**batch),
            "sample_256": lambda i: rb.sample(SAMPLE, beta=0.4),
            "update_256": lambda i: rb.update_priorities(ids[i % N_IDX], prios[i % N_IDX])}, {}


TORCHRL_NOTE = ""


def load_torchrl_extension(build_dir: str) -> str:
    """Make ``torchrl._torchrl`` (its C++ segment trees) importable; return how.

    TorchRL 0.14.1's prebuilt extension does not load against torch 2.13 (undefined symbol). When
    that happens, rebuild the same extension from the C++ sources the wheel ships (torchrl/csrc)
    against the installed torch (-O3, cached in ``build_dir``) and register it before torchrl is
    imported. Raises when neither works, so the benchmark reports TorchRL as not run.
    """
    import importlib.util

    import torch

    spec = importlib.util.find_spec("torchrl")
    if spec is None:
        raise ImportError("torchrl is not installed (pip install torchrl)")
    try:
        import torchrl._torchrl  # noqa: F401

        return "prebuilt extension"
    except ImportError as exc:
        first = str(exc).splitlines()[0].split(": ")[-1][:80]
    from torch.utils import cpp_extension

    csrc = os.path.join(os.path.dirname(spec.origin), "csrc")
    sources = [os.path.join(csrc, f) for f in ("pybind.cpp", "utils.cpp")]
    if not all(os.path.exists(f) for f in sources):
        raise ImportError(f"torchrl extension does not load ({first}) and its C++ sources are not shipped")
    os.makedirs(build_dir, exist_ok=True)
    mod = cpp_extension.load(name="_torchrl", sources=sources, extra_include_paths=[csrc],
                             extra_cflags=["-O3"], build_directory=build_dir, verbose=False)
    sys.modules["torchrl._torchrl"] = mod
    return (f"prebuilt extension failed to load ({first}); rebuilt from torchrl/csrc against torch "
            f"{torch.__version__} with -O3")


def run_torchrl(data, idx_u, prios):
    import torch

    torch.set_num_threads(1)
    global TORCHRL_NOTE
    TORCHRL_NOTE = load_torchrl_extension(TORCHRL_BUILD_DIR)
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(CAPACITY), batch_size=SAMPLE)
    tdata = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in data.items()}
    batch = TensorDict({k: v[:BATCH_ADD] for k, v in tdata.items()}, batch_size=[BATCH_ADD])
    for _ in range(CAPACITY // BATCH_ADD + 1):
        rb.extend(batch)
    n_single = 4096
    singles = [TensorDict({k: v[i] for k, v in tdata.items()}, batch_size=[]) for i in range(n_single)]
    ids = [torch.from_numpy((idx_u[j] * CAPACITY).astype(np.int64)) for j in range(N_IDX)]
    tpr = [torch.from_numpy(prios[j].astype(np.float32)) for j in range(N_IDX)]  # its trees are fp32
    return {"add_1": lambda i: rb.add(singles[i % n_single]), "add_1024": lambda i: rb.extend(batch),
            "sample_256": lambda i: rb.sample(SAMPLE),
            "update_256": lambda i: rb.update_priority(ids[i % N_IDX], tpr[i % N_IDX])}, {"_note": TORCHRL_NOTE}


RUNNERS = {"numpy_ring": run_numpy_ring, "echo_rl": run_echo, "echo_rl_numpy": run_echo,
           "cpprb": run_cpprb, "torchrl": run_torchrl}


def worker(lib: str) -> None:
    """One library's process: build and fill, say READY (or why not), then run the slices asked on stdin."""
    data, idx_u, prios = make_data()
    try:
        fns, info = RUNNERS[lib](data, idx_u, prios)
    except Exception as exc:  # report why the library could not run; the parent leaves it out
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print("ERROR " + json.dumps(f"{type(exc).__name__}: {msg[:300]}"), flush=True)
        return
    print("READY " + json.dumps(info), flush=True)
    pos = dict.fromkeys(fns, 0)  # keep cycling the pre-generated inputs across slices
    for line in sys.stdin:
        cmd = json.loads(line)
        m = cmd["metric"]
        if m not in fns:
            print("SLICE " + json.dumps(None), flush=True)
            continue
        calls, secs = timed(fns[m], cmd["seconds"], pos[m])
        pos[m] += calls
        print("SLICE " + json.dumps([calls * (BATCH_ADD if m == "add_1024" else 1), secs]), flush=True)


# --------------------------------------------------------------------------- driver
class Worker:
    def __init__(self, lib: str):
        env = dict(os.environ)
        if lib == "echo_rl_numpy":
            env["ECHO_RL_DISABLE_NATIVE"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")
        self.lib = lib
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", lib], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def ready(self) -> tuple[dict | None, str | None]:
        for line in self.proc.stdout:
            if line.startswith("READY "):
                return json.loads(line[6:]), None
            if line.startswith("ERROR "):
                return None, json.loads(line[6:])
        tail = self.proc.stderr.read().strip().splitlines()[-1:]
        return None, f"worker exited {self.proc.wait()}: {tail}"

    def run(self, metric: str, seconds: float):
        self.proc.stdin.write(json.dumps({"metric": metric, "seconds": seconds}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("SLICE "):
                return json.loads(line[6:])
        raise RuntimeError(f"{self.lib} worker died: {self.proc.stderr.read()[-500:]}")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_rep(libs, errors, args) -> dict[str, dict]:
    """One repetition: fresh processes for every library, warm-up, then ABC..CBA slices per metric."""
    workers = [Worker(lib) for lib in libs if lib not in errors]
    live, infos = [], {}
    for w in workers:
        info, err = w.ready()
        if err:
            errors[w.lib] = err
            print(f"  {w.lib}: could not run: {err}", flush=True)
            w.close()
        else:
            live.append(w)
            infos[w.lib] = info
    out = {w.lib: dict(infos[w.lib]) for w in live}
    try:
        for w in live:  # warm-up for all, every metric
            for m in METRICS:
                w.run(m, args.warmup)
        for m in METRICS:
            tot = {w.lib: [0, 0.0] for w in live}
            for turn in range(args.slices):
                for w in (live if turn % 2 == 0 else live[::-1]):
                    r = w.run(m, args.slice)
                    if r is None:
                        tot[w.lib] = None
                    elif tot[w.lib] is not None:
                        tot[w.lib][0] += r[0]
                        tot[w.lib][1] += r[1]
            for lib, t in tot.items():
                out[lib][m] = None if t is None else t[0] / t[1]
    finally:
        for w in live:
            w.close()
    return out


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions, each with fresh processes")
    ap.add_argument("--slices", type=int, default=4, help="turns per metric per repetition (ABC..CBA)")
    ap.add_argument("--slice", type=float, default=0.25, help="seconds per turn")
    ap.add_argument("--warmup", type=float, default=0.2, help="seconds of warm-up per metric per process")
    ap.add_argument("--libs", default=",".join(LIBS), help=f"comma list from {LIBS}")
    ap.add_argument("--json", default=None, help="write all per-rep results here")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    libs = [x for x in args.libs.split(",") if x]
    for x in libs:
        if x not in LIBS:
            ap.error(f"--libs: unknown library {x!r}; allowed: {', '.join(LIBS)}")
    if args.reps < 1 or args.slices < 1 or args.slice <= 0 or args.warmup < 0:
        ap.error("--reps and --slices must be >= 1, --slice > 0 and --warmup >= 0")

    print(f"# replay_bench: D={D}, capacity={CAPACITY:,}, python {platform.python_version()}, "
          f"numpy {np.__version__}, {os.cpu_count()} CPUs, load avg at start {os.getloadavg()}; "
          f"interleaved: {args.slices} x {args.slice}s turns per metric per rep")
    runs: dict[str, list[dict]] = {lib: [] for lib in libs}
    errors: dict[str, str] = {}
    for rep in range(args.reps):
        order = libs if rep % 2 == 0 else libs[::-1]
        res = run_rep(order, errors, args)
        load = os.getloadavg()[0]
        for lib, r in res.items():
            r["load"] = load
            runs[lib].append(r)
            print(f"  rep {rep} {lib}: " + ", ".join(f"{m} {fmt(r.get(m))}" for m in METRICS) + f" (load1 {load:.1f})",
                  flush=True)

    def med(lib, m):
        vals = [r[m] for r in runs.get(lib, []) if r.get(m) is not None]
        return statistics.median(vals) if vals else None

    def ratios(lib, base, m):  # per repetition: both ran in the same rep, interleaved
        return [a[m] / b[m] for a, b in zip(runs.get(lib, []), runs.get(base, [])) if a.get(m) and b.get(m)]

    def ratio(lib, base, m):
        vals = ratios(lib, base, m)
        return statistics.median(vals) if vals else None

    print("\n## medians (per second; add columns in transitions/s, sample/update in calls/s)")
    print("| library | " + " | ".join(METRICS) + " |")
    print("|---|" + "---|" * len(METRICS))
    for lib in libs:
        if runs[lib]:
            print(f"| {lib} | " + " | ".join(fmt(med(lib, m)) for m in METRICS) + " |")
    for lib, err in errors.items():
        print(f"| {lib} | not run: {err} |")

    summary = {"ratios": {}, "goals": {}}
    for base in ("cpprb", "torchrl", "numpy_ring"):
        if not runs.get(base) or not runs.get("echo_rl"):
            continue
        rs = {m: ratio("echo_rl", base, m) for m in METRICS}
        summary["ratios"][base] = rs
        summary.setdefault("per_rep", {})[base] = {m: ratios("echo_rl", base, m) for m in METRICS}
        print(f"\necho_rl / {base}, median of per-rep ratios (min-max): " + ", ".join(
            f"{m} {rs[m]:.2f}x ({min(v):.2f}-{max(v):.2f})" for m in METRICS
            if rs[m] is not None for v in [ratios("echo_rl", base, m)]))
    if "cpprb" in summary["ratios"]:
        print("\n## goals")
        for m, goal in GOALS.items():
            r = summary["ratios"]["cpprb"][m]
            ok = r is not None and r >= goal
            summary["goals"][m] = ok
            print(f"- {m} vs cpprb: {r:.2f}x (goal >= {goal}x): {'met' if ok else 'NOT met'}")
        r = summary["ratios"].get("numpy_ring", {}).get("sample_256")
        if r is not None:
            summary["goals"]["sample_vs_ring"] = r >= 0.7
            print(f"- sample_256 vs numpy uniform ring: {r:.2f}x (goal >= 0.7x): {'met' if r >= 0.7 else 'NOT met'}")
    notes = {lib: r["_note"] for lib in libs for r in runs[lib][:1] if r.get("_note")}
    for lib, note in notes.items():
        print(f"\nnote ({lib}): {note}")
    if errors:
        print("\nnot compared: " + "; ".join(f"{k} ({v})" for k, v in errors.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"runs": runs, "errors": errors, "summary": summary}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
