"""What GiGPO's advantages cost, as a share of one learner update (objective=gigpo, ECHO λ = 0.05).

Trajectories are real MiniGrid-as-text episodes (random actions, ``--groups`` task seeds x ``--group-size``
episodes, ``--turns`` turns each) rendered through the backbone's chat template, so token counts, turn
spans and the anchor states (MiniGrid's ``info["state_key"]``) are what training sees. Timed: the
objective's advantage hook alone (trajectories -> per-token ``[B, L]``; median of ``--adv-reps``), and
whole ``LMLearner.update`` calls (median of ``--updates``, after one untimed warm-up update), which
include the hook. ``--similarity`` also times anchor matching by difflib ratio on the observation texts
(the costly path; identity on the state keys is the default).

    python benchmarks/gigpo_bench.py --backbone smollm2-135m --groups 1 --group-size 4 --turns 8 --updates 1
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time

import numpy as np
import torch

from echo_rl.config import LMConfig
from echo_rl.environments.minigrid import ACTION_WORDS, MiniGridEnvironment
from echo_rl.lm.batch import collate
from echo_rl.lm.chat_delta import ChatRenderer
from echo_rl.lm.learner import LMLearner
from echo_rl.lm.policy import load_policy
from echo_rl.lm.trajectory import TrajectoryBuilder, observation_text


def episodes(renderer: ChatRenderer, groups: int, size: int, turns: int, seed: int) -> list:
    """Random-action MiniGrid DoorKey-5x5 episodes, ``size`` per task seed, with their anchor states."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        for k in range(size):
            env = MiniGridEnvironment(task_type="key_door", grid_size=5, max_steps=turns)
            _, info = env.reset(seed=seed + g)
            b = TrajectoryBuilder(renderer, info["segments"], group_id=g, episode_id=g * size + k)
            keys, texts = [info["state_key"]], [observation_text(info["segments"])]
            for _ in range(turns):
                action = ACTION_WORDS[int(rng.integers(3))]  # turn left / turn right / move forward
                ids = renderer.encode(action)
                b.add_action(ids, [-1.0] * len(ids), text=action)
                _, reward, term, trunc, info = env.step(action)
                b.add_observation(info["segments"], reward)
                keys.append(info["state_key"])
                texts.append(observation_text(info["segments"]))
                if term or trunc:
                    break
            n = len(b.turn_texts)
            out.append(b.finish(anchor_states=keys[:n], observation_texts=texts[:n]))
    return out


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbone", default="tiny")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--turns", type=int, default=16)
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--adv-reps", type=int, default=20)
    p.add_argument("--similarity", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    model, tok = load_policy(args.backbone, args.seed)
    renderer = ChatRenderer(tok)
    trajs = episodes(renderer, args.groups, args.group_size, args.turns, args.seed)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    cfg = LMConfig(objective="gigpo", learning_rate=1e-6)
    learner = LMLearner(model, pad, cfg, lam=0.05)
    hook = learner.objective.advantages_fn()
    batch = collate(trajs, pad)
    adv_s = median_time(lambda: hook(trajs, batch, cfg), args.adv_reps)
    fuzzy_cfg = LMConfig(objective="gigpo", gigpo_similarity=args.similarity)
    by_text = [t.__class__(**{**t.__dict__, "info": {**t.info, "anchor_states": t.info["observation_texts"]}})
               for t in trajs]
    fuzzy_s = median_time(lambda: hook(by_text, batch, fuzzy_cfg), max(1, args.adv_reps // 4))
    _, metrics = hook(trajs, batch, cfg)

    def step() -> None:
        for t in trajs:  # every update trains the same batch: keep it on-policy for max_staleness
            t.policy_version = learner.version
        learner.update(trajs)

    step()  # warm-up (allocations, first-call imports)
    update_s = median_time(step, args.updates)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")),
                platform.processor())
    tokens = int(batch.attention_mask.sum())
    turns = sum(t.num_turns for t in trajs)
    print(f"cpu: {name}, torch threads {torch.get_num_threads()}")
    print(f"backbone {args.backbone}: {len(trajs)} trajectories ({args.groups} groups x {args.group_size}), "
          f"{turns} turns, {tokens} tokens; anchored share {metrics['gigpo_anchored_share']:.2f}, "
          f"{metrics['gigpo_anchor_groups']:.0f} anchor groups")
    print(f"advantages (state keys, identity): {adv_s * 1e3:.2f} ms")
    print(f"advantages (observation text, difflib ratio >= {args.similarity}): {fuzzy_s * 1e3:.2f} ms")
    print(f"one update (objective=gigpo, lambda=0.05): {update_s * 1e3:.0f} ms")
    print(f"share of the update: identity {100 * adv_s / update_s:.3g}%, similarity {100 * fuzzy_s / update_s:.3g}%")


if __name__ == "__main__":
    main()
