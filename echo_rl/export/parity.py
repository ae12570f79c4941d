"""Parity of an exported policy with the run's PyTorch policy on recorded observations.

Observations are recorded by acting with the run's own policy (sampled actions,
seeded) in the run's env, so they are states the policy visits, with real
episode boundaries: the EchoRL agent's plan windows are exercised across them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from echo_rl.export.loading import load_policy
from echo_rl.export.runs import run_config


def record_observations(policy, env_name: str, steps: int = 256, num_envs: int = 4, seed: int = 0,
                        env_config: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(observations [steps, num_envs, D], episode starts [steps, num_envs]) from acting with ``policy``."""
    # gymnasium, minigrid: loaded on first use
    from echo_rl.environments.minigrid_vector import actor_seeds, make_vector_env

    envs = make_vector_env(env_name, num_envs, **(env_config or {}))
    try:
        obs, _ = envs.reset(seed=actor_seeds(seed, num_envs))
        starts = np.ones(num_envs, bool)
        policy.reset()
        policy.seed(seed)
        rec_obs, rec_starts = [], []
        for _ in range(steps):
            rec_obs.append(obs.copy())
            rec_starts.append(starts.copy())
            obs, _, term, trunc, _ = envs.step(policy.act(obs, starts, deterministic=False))
            starts = term | trunc
    finally:
        envs.close()
        policy.reset()
    return np.stack(rec_obs), np.stack(rec_starts)


def compare(reference, candidate, observations: np.ndarray, starts: np.ndarray) -> dict:
    """Max |diff| of logits and values and greedy-action agreement over a recorded sequence."""
    ref_l, ref_v, got_l, got_v = [], [], [], []
    for pol, logits, values in ((reference, ref_l, ref_v), (candidate, got_l, got_v)):
        pol.reset()
        for obs, st in zip(observations, starts):
            lg, v = pol.logits_and_values(obs, st)
            logits.append(lg)
            values.append(v)
        pol.reset()
    a, b, va, vb = np.stack(ref_l), np.stack(got_l), np.stack(ref_v), np.stack(got_v)
    return {"observations": int(observations.shape[0] * observations.shape[1]),
            "max_logit_diff": float(np.abs(a - b).max()), "max_value_diff": float(np.abs(va - vb).max()),
            "action_agreement": float((a.argmax(-1) == b.argmax(-1)).mean())}


def run_env_config(run_dir: str | Path) -> dict:
    return dict(run_config(run_dir).env_config)


def check_parity(run_dir: str | Path, exported: str | Path, steps: int = 128) -> dict:
    reference = load_policy(run_dir)
    obs, starts = record_observations(reference, reference.meta["env_name"], steps=steps,
                                      env_config=run_env_config(run_dir))
    return compare(reference, load_policy(exported), obs, starts)
