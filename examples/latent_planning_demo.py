"""Latent planning on real MiniGrid trajectories: train the plan encoder, watch plan surprise.

    python examples/latent_planning_demo.py --out latent_planning.png

Collects the MiniGrid expert's trajectories (DoorKey: fetch the key, open the
door, reach the goal), then trains ``LatentPlanningOptimizer`` -- the plan
encoder F(s_{t-k+1:t}) and the plan-conditioned policy -- to imitate them with
the plan KL between consecutive plans, beside the same network with the plan
switched off (soft_prefix_alpha=0). Prints the losses, held-out action accuracy
and plan surprise ||tau - tau_ema||^2 right after the expert's subgoal switches
(pick up the key, open the door) against the rest of held-out episodes, and
plots all three (surprise along three held-out episodes, switches marked).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from echo_rl.config import ConfigError, PlanningConfig
from echo_rl.environments.minigrid import plan_next_action
from echo_rl.environments.minigrid_vector import make_minigrid_env
from echo_rl.kernels import EMAPlanTracker
from echo_rl.planning import LatentPlanningOptimizer

SUBGOAL_ACTIONS = {3: "pickup", 5: "toggle"}  # MiniGrid action ids at which the expert's subgoal changes


def collect(task: str, seeds: range, max_steps: int = 100) -> list[dict[str, np.ndarray]]:
    """One expert episode per seed: flat observations and the expert's actions."""
    env = make_minigrid_env(task)
    episodes = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        states, actions = [], []
        for _ in range(max_steps):
            action = plan_next_action(env.unwrapped)
            states.append(obs)
            actions.append(action)
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        episodes.append({"states": np.asarray(states, np.float32), "actions": np.asarray(actions, np.int64)})
    env.close()
    return episodes


def windows(episodes: list[dict[str, np.ndarray]], k: int, scale: float) -> dict[str, torch.Tensor]:
    """Windows of the last k+1 states of every step (zero-padded before the episode start) and masks."""
    wins, masks, actions = [], [], []
    for ep in episodes:
        states, n = ep["states"] / scale, len(ep["states"])
        padded = np.concatenate([np.zeros((k, states.shape[1]), np.float32), states])
        for t in range(n):
            wins.append(padded[t:t + k + 1])
            masks.append(np.arange(t - k, t + 1) >= 0)
        actions.append(ep["actions"])
    return {"win": torch.as_tensor(np.stack(wins)), "mask": torch.as_tensor(np.stack(masks)),
            "act": torch.as_tensor(np.concatenate(actions))}


def train(data: dict, heldout: dict, state_dim: int, cfg: PlanningConfig, steps: int, seed: int) -> dict:
    """Behaviour cloning through the plan: CE(pi(a | s, tau), a_expert) + kl_weight * KL(tau_t || tau_t-1)."""
    torch.manual_seed(seed)
    opt = LatentPlanningOptimizer(state_dim, 7, cfg, policy_lr=3e-3, hidden_dim=64)
    log = {"step": [], "ce": [], "kl": [], "heldout_acc": []}
    for step in range(steps):
        win, mask = data["win"], data["mask"]
        eps = torch.randn(len(win), cfg.embedding_dim)
        logits, _, _, _ = opt.forward(win[:, -1], win[:, 1:], mask[:, 1:], eps)
        ce = F.cross_entropy(logits, data["act"])
        kl = opt.kl_loss(win, mask)
        opt.step(ce + cfg.kl_weight * kl)
        if step % 10 == 0 or step == steps - 1:
            with torch.no_grad():
                dist = opt.plan(heldout["win"][:, 1:], heldout["mask"][:, 1:])
                logits, _ = opt.policy(heldout["win"][:, -1], dist.mean)
                acc = (logits.argmax(-1) == heldout["act"]).float().mean().item()
            for key, value in (("step", step), ("ce", ce.item()), ("kl", kl.item()), ("heldout_acc", acc)):
                log[key].append(value)
    log["optimizer"] = opt
    return log


def surprise_along(opt: LatentPlanningOptimizer, episode: dict, k: int, scale: float) -> np.ndarray:
    """Plan surprise at each step of one episode, the EMA plan following the episode as it unfolds."""
    data = windows([episode], k, scale)
    with torch.no_grad():
        means = opt.plan(data["win"][:, 1:], data["mask"][:, 1:]).mean.numpy()
    opt.ema_plan = EMAPlanTracker(opt.config.ema_decay, opt.config.embedding_dim)  # a fresh EMA per episode
    return np.concatenate([opt.plan_surprise(m[None]) for m in means])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="minigrid:MiniGrid-DoorKey-5x5-v0", help="a MiniGrid task with a key and door")
    p.add_argument("--episodes", type=int, default=40, help="expert episodes to train on")
    p.add_argument("--heldout", type=int, default=10, help="held-out expert episodes (other seeds)")
    p.add_argument("--steps", type=int, default=150, help="optimiser steps (full batch)")
    p.add_argument("--window", type=int, default=4, help="k: states the plan encoder reads")
    p.add_argument("--plan-dim", type=int, default=16, help="dimension of the latent plan")
    p.add_argument("--kl-weight", type=float, default=0.1, help="weight of the consecutive-plan KL")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="latent_planning.png", help="PNG to write")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (tiny networks: 1 is fastest)")
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    for name in ("episodes", "heldout", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name}={getattr(args, name)} is invalid: must be >= 1")
    try:
        cfg = PlanningConfig(embedding_dim=args.plan_dim, state_window_size=args.window, kl_weight=args.kl_weight,
                             learning_rate=3e-3, ema_decay=0.7)
        t0 = time.perf_counter()
        train_eps = collect(args.task, range(args.seed, args.seed + args.episodes))
        test_eps = collect(args.task, range(10_000 + args.seed, 10_000 + args.seed + args.heldout))
    except (ConfigError, NotImplementedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scale = float(max(ep["states"].max() for ep in train_eps)) or 1.0
    state_dim = train_eps[0]["states"].shape[1]
    data, heldout = windows(train_eps, args.window, scale), windows(test_eps, args.window, scale)
    with_plan = train(data, heldout, state_dim, cfg, args.steps, args.seed)
    no_plan = train(data, heldout, state_dim, cfg.replace(soft_prefix_alpha=0.0, kl_weight=0.0), args.steps, args.seed)

    opt = with_plan["optimizer"]
    curves, at_event, elsewhere = [], [], []
    for ep in test_eps:
        s = surprise_along(opt, ep, args.window, scale)
        curves.append(s)
        event = np.isin(ep["actions"], list(SUBGOAL_ACTIONS))
        after = np.roll(event, 1) & (np.arange(len(s)) > 0)  # the plan sees the switch one step later
        at_event += list(s[after])
        elsewhere += list(s[~after & (np.arange(len(s)) > 0)])
    ratio = float(np.mean(at_event) / max(np.mean(elsewhere), 1e-12)) if at_event else float("nan")
    n_steps = int(sum(len(ep["actions"]) for ep in train_eps))
    print(f"trained on {args.episodes} expert episodes ({n_steps} steps) of {args.task} in "
          f"{time.perf_counter() - t0:.1f} s")
    print(f"final CE {with_plan['ce'][-1]:.3f} (no plan {no_plan['ce'][-1]:.3f}), plan KL {with_plan['kl'][-1]:.4f}")
    print(f"held-out action accuracy: with plan {with_plan['heldout_acc'][-1]:.3f}, "
          f"no plan {no_plan['heldout_acc'][-1]:.3f}")
    at_mean = np.mean(at_event) if at_event else float("nan")
    print(f"plan surprise right after a subgoal switch (pickup/toggle): {at_mean:.4f}"
          f" vs elsewhere {np.mean(elsewhere):.4f} (ratio {ratio:.2f})")
    plot(args, with_plan, no_plan, test_eps, curves)
    print(f"plot: {args.out}")
    return 0


def plot(args, with_plan: dict, no_plan: dict, episodes: list[dict], curves: list[np.ndarray]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    ax.plot(with_plan["step"], with_plan["ce"], label="imitation CE (plan)")
    ax.plot(no_plan["step"], no_plan["ce"], "--", label="imitation CE (no plan)")
    ax.plot(with_plan["step"], with_plan["kl"], label="plan KL(tau_t || tau_t-1)")
    ax.set_yscale("log")
    ax.set(xlabel="optimiser step", title="training losses")
    ax.legend()
    ax = axes[1]
    ax.plot(with_plan["step"], with_plan["heldout_acc"], label="with latent plan")
    ax.plot(no_plan["step"], no_plan["heldout_acc"], "--", label="no plan (alpha=0)")
    ax.set(xlabel="optimiser step", ylabel="accuracy", ylim=(0, 1), title="held-out expert-action accuracy")
    ax.legend()
    ax = axes[2]
    for i, (ep, s) in enumerate(list(zip(episodes, curves))[:3]):
        line, = ax.plot(s, label=f"held-out episode {i}")
        for t in np.flatnonzero(np.isin(ep["actions"], list(SUBGOAL_ACTIONS))):
            ax.axvline(t + 1, color=line.get_color(), ls=":", alpha=0.7)
            ax.annotate(SUBGOAL_ACTIONS[int(ep["actions"][t])], (t + 1, s.max()),
                        fontsize=7, color=line.get_color(), rotation=90, va="top")
    ax.set(xlabel="step in episode", ylabel="||tau - tau_ema||^2",
           title="plan surprise (dotted: expert picks up / toggles)")
    ax.legend(fontsize=8)
    fig.suptitle(f"Latent planning on {args.task} expert trajectories")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
