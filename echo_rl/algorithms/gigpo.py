"""GiGPO (Feng et al. 2025, arXiv 2505.10978): step-level credit without a critic or extra rollouts.

Two advantages, both relative within a group, then summed per step::

    A_E(τ_i)   = (R(τ_i) - mean_g R) / F        over the trajectories of one task group g      (episode)
    R_t^(i)    = Σ_k γ^k r_{t+k}^(i)            the discounted return from step t of τ_i
    A_S(t, i)  = (R_t^(i) - mean_G R) / F       over the anchor group G: the steps of g's
                                                trajectories that start from the same state      (step)
    A(t, i)    = A_E(τ_i) + ω · A_S(t, i)       on the action tokens of step t

``F`` is the group's sample standard deviation (``scale="std"``) or 1 (``"none"``, the paper's mean-only
variant). A group of one, or one whose values are all equal, gets 0 (the GRPO rule of
:func:`~echo_rl.algorithms.grpo.group_advantages`, reused for both levels): a state seen once carries no
step-level credit. A truncated episode has no value beyond its last reward (no critic to bootstrap), so
its steps' returns are the rewards it saw.

Anchor states are strings, one per step, chosen by the task (the observation text, or the task's
canonical ``info["state_key"]``); steps match by identity, or with ``similarity`` in (0, 1) by
``difflib`` ratio against each cluster's first member (greedy, in step order).
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Sequence

import numpy as np
import torch

from echo_rl.algorithms.grpo import ADVANTAGE_SCALES, group_advantages


def discounted_returns(rewards: Sequence[float], gamma: float) -> np.ndarray:
    """``R_t = r_t + γ R_{t+1}`` for every step of one episode (0 after its last step)."""
    out = np.zeros(len(rewards), np.float64)
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = float(rewards[t]) + gamma * acc
        out[t] = acc
    return out


def anchor_groups(states: Sequence[str], groups: Sequence[int], similarity: float | None = None) -> np.ndarray:
    """An anchor-group id per step: the same id for steps of the same task group whose states match."""
    ids = np.empty(len(states), np.int64)
    exact: dict[tuple[Any, str], int] = {}
    clusters: dict[Any, list[tuple[str, int]]] = {}  # task group -> [(representative state, anchor id)]
    fuzzy = similarity is not None and similarity < 1.0
    for n, (state, group) in enumerate(zip(states, groups)):
        key = (group, state)
        if key in exact:
            ids[n] = exact[key]
            continue
        found = None
        if fuzzy:
            for rep, gid in clusters.setdefault(group, []):
                m = SequenceMatcher(None, rep, state)
                if m.real_quick_ratio() >= similarity and m.quick_ratio() >= similarity and m.ratio() >= similarity:
                    found = gid
                    break
        if found is None:
            found = n  # a new cluster is named by its first step
            if fuzzy:
                clusters[group].append((state, found))
        exact[key] = ids[n] = found
    return ids


@dataclass
class GiGPOAdvantages:
    episode: torch.Tensor        # [B] A_E per trajectory
    steps: list[np.ndarray]      # per trajectory, A_E + ω·A_S of each step
    step_only: list[np.ndarray]  # per trajectory, A_S of each step
    anchored_share: float        # share of steps whose anchor group holds another step
    anchor_groups: int           # distinct anchor groups in the batch


def gigpo_advantages(rewards: Sequence[Sequence[float]], group_ids: Sequence[int], states: Sequence[Sequence[str]],
                     *, gamma: float = 0.95, omega: float = 1.0, scale: str = "std",
                     similarity: float | None = None) -> GiGPOAdvantages:
    """Both levels for a batch of whole groups: per trajectory its step rewards, task group and step states."""
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale={scale!r} is invalid: allowed: {', '.join(ADVANTAGE_SCALES)}")
    if not 0 <= gamma <= 1 or not np.isfinite(omega) or omega < 0:
        raise ValueError(f"gamma={gamma}, omega={omega} are invalid: gamma in [0, 1], omega finite and >= 0")
    if similarity is not None and not 0 < similarity <= 1:
        raise ValueError(f"similarity={similarity} is invalid: must be None (identity) or in (0, 1]")
    if not len(rewards) == len(group_ids) == len(states):
        raise ValueError(f"rewards ({len(rewards)}), group_ids ({len(group_ids)}) and states ({len(states)}) "
                         "need one entry per trajectory")
    for i, (r, s) in enumerate(zip(rewards, states)):
        if len(r) != len(s):
            raise ValueError(f"trajectory {i} has {len(r)} step rewards but {len(s)} anchor states (one per step)")
    totals = torch.tensor([float(np.sum(r, dtype=np.float64)) for r in rewards], dtype=torch.float32)
    episode = group_advantages(totals, torch.as_tensor(list(group_ids)), scale=scale)
    lengths = [len(r) for r in rewards]
    flat_states = [s for traj in states for s in traj]
    flat_groups = np.repeat(np.asarray(group_ids), lengths)
    anchors = anchor_groups(flat_states, flat_groups, similarity)
    returns = np.concatenate([discounted_returns(r, gamma) for r in rewards]) if flat_states else np.zeros(0)
    step = group_advantages(torch.as_tensor(returns, dtype=torch.float32), torch.as_tensor(anchors), scale=scale)
    step = step.numpy().astype(np.float64)
    inverse = np.unique(anchors, return_inverse=True)[1]
    sizes = np.bincount(inverse)
    share = float((sizes[inverse] > 1).mean()) if len(anchors) else 0.0
    bounds = np.cumsum([0] + lengths)
    ep = episode.numpy().astype(np.float64)
    step_only = [step[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    combined = [ep[i] + omega * s for i, s in enumerate(step_only)]
    return GiGPOAdvantages(episode, combined, step_only, share, int(len(sizes)))


def token_advantages(per_step: Sequence[np.ndarray], spans: Sequence[Sequence[tuple[int, int]]],
                     shape: tuple[int, int]) -> torch.Tensor:
    """``[B, L]``: each step's advantage on its action tokens (``spans``: each row's [start, end) per turn)."""
    out = np.zeros(shape, np.float32)
    for row, (values, turns) in enumerate(zip(per_step, spans)):
        if len(values) != len(turns):
            raise ValueError(f"row {row} has {len(turns)} action turns but {len(values)} step advantages")
        for v, (a, b) in zip(values, turns):
            out[row, a:b] = v
    return torch.from_numpy(out)
