"""Prioritized vs uniform replay on the Blind Cliffwalk (Schaul et al., 2016, Fig. 1).

    python examples/prioritized_replay_demo.py --out prioritized_replay.png

A chain of n states; at each state one action (which one alternates) moves
right, the other ends the episode with reward 0; only the last right move pays
reward 1. Random play reaches it once in 2^n episodes, so the one rewarding
transition is a needle in the replay. A tabular Q-learner replays transitions
from ``PrioritizedReplayBuffer`` -- proportional to |TD error| (alpha=0.6,
annealed importance weights), or uniformly (the same buffer with alpha=0) --
and the demo counts the updates until Q is within 1e-3 MSE of the true Q*.
Prints updates-to-learn per mode (median over seeds) and plots the error
curves and where each mode spends its samples.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from echo_rl.replay import PrioritizedReplayBuffer


def transitions(n: int, episodes: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random-play transitions of the Blind Cliffwalk, plus one successful episode so the reward is present."""
    rows = []
    for ep in range(episodes + 1):
        for s in range(n):
            right = s % 2
            a = right if ep == episodes else int(rng.integers(2))
            if a != right:
                rows.append((s, a, 0.0, s, 1.0))
                break
            last = s == n - 1
            rows.append((s, a, 1.0 if last else 0.0, s + 1 if not last else s, 1.0 if last else 0.0))
    arr = np.asarray(rows)
    return {"s": arr[:, 0].astype(np.int64), "a": arr[:, 1].astype(np.int64), "r": arr[:, 2].astype(np.float64),
            "s2": arr[:, 3].astype(np.int64), "done": arr[:, 4].astype(np.float64)}


def q_star(n: int, gamma: float) -> np.ndarray:
    q = np.zeros((n, 2))
    for s in range(n):
        q[s, s % 2] = gamma ** (n - 1 - s)
    return q


def learn(data: dict, n: int, prioritized: bool, seed: int, max_updates: int, batch: int, lr: float,
          gamma: float, tol: float) -> dict:
    """Replay updates until MSE(Q, Q*) < tol; the error curve and the states of every sampled transition."""
    size = len(data["s"])
    buf = PrioritizedReplayBuffer(size, mode="proportional", alpha=0.6 if prioritized else 0.0, beta=0.4,
                                  seed=seed)
    buf.add(data)  # new samples enter at the running max priority
    q, target, errors, sampled_states, sampled_p = np.zeros((n, 2)), q_star(n, gamma), [], [], []
    solved = None
    for update in range(1, max_updates + 1):
        beta = 0.4 + 0.6 * min(1.0, update / max_updates)  # anneal the importance correction to 1
        b = buf.sample(batch, beta=beta)
        s, a, r, s2, done = (b.data[k] for k in ("s", "a", "r", "s2", "done"))
        td = r + gamma * (1.0 - done) * q[s2].max(1) - q[s, a]
        np.add.at(q, (s, a), lr * b.weights * td)
        if prioritized:
            buf.update_priorities(b.indices, np.abs(td) + 1e-4)
        sampled_states.append(s)
        sampled_p.append(b.probabilities)
        errors.append(float(((q - target) ** 2).mean()))
        if solved is None and errors[-1] < tol:
            solved = update
            break
    return {"errors": np.asarray(errors), "solved": solved, "states": np.concatenate(sampled_states),
            "probabilities": np.concatenate(sampled_p)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--states", type=int, default=10, help="n: length of the chain")
    p.add_argument("--episodes", type=int, default=2000, help="random-play episodes filling the replay")
    p.add_argument("--seeds", type=int, default=5, help="runs per mode")
    p.add_argument("--max-updates", type=int, default=6000, help="replay batches per run at most")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.5, help="Q-learning step size")
    p.add_argument("--gamma", type=float, default=0.95)
    p.add_argument("--tol", type=float, default=1e-3, help="MSE(Q, Q*) counted as learned")
    p.add_argument("--out", default="prioritized_replay.png", help="PNG to write")
    args = p.parse_args(argv)
    for name in ("states", "episodes", "seeds", "max_updates", "batch_size"):
        if getattr(args, name) < (2 if name == "states" else 1):
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} is invalid: must be >= "
                    f"{2 if name == 'states' else 1}")
    if not 0 < args.lr <= 1 or not 0 < args.gamma < 1:
        p.error("--lr must be in (0, 1] and --gamma in (0, 1)")
    t0 = time.perf_counter()
    runs = {"uniform": [], "prioritized": []}
    for seed in range(args.seeds):
        data = transitions(args.states, args.episodes, np.random.default_rng(seed))
        for mode in runs:
            runs[mode].append(learn(data, args.states, mode == "prioritized", seed, args.max_updates,
                                    args.batch_size, args.lr, args.gamma, args.tol))
    stored = len(transitions(args.states, args.episodes, np.random.default_rng(0))["s"])
    print(f"Blind Cliffwalk n={args.states}: {stored} stored transitions (1 rewarding), {args.seeds} seeds, "
          f"{time.perf_counter() - t0:.1f} s")
    medians = {}
    for mode, rs in runs.items():
        solved = [r["solved"] if r["solved"] is not None else np.inf for r in rs]
        medians[mode] = float(np.median(solved))
        last_state = np.mean([np.mean(r["states"] == args.states - 1) for r in rs])
        print(f"{mode:11s}: updates to MSE<{args.tol:g}: median {medians[mode]:.0f} "
              f"(solved {sum(np.isfinite(solved))}/{len(rs)}); share of samples at the last state {last_state:.3f}")
    if np.isfinite(medians["prioritized"]) and medians["prioritized"] > 0:
        print(f"speed-up (uniform / prioritized updates): {medians['uniform'] / medians['prioritized']:.1f}x")
    plot(args, runs)
    print(f"plot: {args.out}")
    return 0


def plot(args, runs: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {"uniform": "tab:gray", "prioritized": "tab:red"}
    for mode, rs in runs.items():
        for i, r in enumerate(rs):
            axes[0].plot(np.arange(1, len(r["errors"]) + 1), r["errors"], color=colors[mode], alpha=0.6,
                         label=mode if i == 0 else None)
    axes[0].axhline(args.tol, color="k", ls=":", lw=1)
    axes[0].set(xscale="log", yscale="log", xlabel="replay updates", ylabel="MSE(Q, Q*)",
                title="learning the needle transition")
    axes[0].legend()
    bins = np.arange(args.states + 1) - 0.5
    for mode, rs in runs.items():
        states = np.concatenate([r["states"] for r in rs])
        axes[1].hist(states, bins=bins, density=True, histtype="step", lw=2, color=colors[mode], label=mode)
    axes[1].set(xlabel="state of the sampled transition", ylabel="share of samples", yscale="log",
                title="where replay spends its samples")
    axes[1].legend()
    probs = np.concatenate([r["probabilities"] for r in runs["prioritized"]])
    axes[2].hist(probs, bins=np.geomspace(max(probs.min(), 1e-9), probs.max() * 1.01, 40), density=True,
                 histtype="stepfilled", alpha=0.6, color=colors["prioritized"], label="prioritized")
    uniform = np.concatenate([r["probabilities"] for r in runs["uniform"]])
    axes[2].axvline(float(np.median(uniform)), color=colors["uniform"], lw=3, label="uniform: every P(i) = 1/N")
    axes[2].set(xscale="log", xlabel="draw probability P(i) of sampled transitions", ylabel="density",
                title="sampled-priority distribution")
    axes[2].legend()
    fig.suptitle(f"PrioritizedReplayBuffer vs uniform replay, Blind Cliffwalk n={args.states}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
