"""PPO-RLHF for token trajectories: a value head, GAE over action tokens or over turns, clipped losses.

The policy acts only at action tokens, so the decision sequence GAE runs over
is the action tokens (``level="token"``: every sampled token is a step; the
observation in between is the environment's transition) or the turns
(``level="turn"``: one step per action turn, valued at its first token, the
advantage shared by all its tokens). A turn's reward sits on its last action
token; an optional per-token KL penalty to a reference policy is folded into
the rewards, as in InstructGPT-style RLHF. The GAE recursion itself is
:func:`echo_rl.algorithms.gae.compute_gae`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from echo_rl.algorithms.gae import compute_gae
from echo_rl.algorithms.grpo import grpo_loss
from echo_rl.algorithms.token_logprobs import reduce_tokens

LEVELS = ("token", "turn")


class ValueHead(torch.nn.Module):
    """A scalar value per position on top of a backbone's hidden states, aligned like the log-probs.

    ``forward(hidden)[:, t]`` is V of the context before token ``t`` (read from
    the hidden state at ``t - 1``); entry 0 is 0.
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        v = self.proj(hidden[:, :-1].float()).squeeze(-1)
        return torch.cat([v.new_zeros(v.shape[0], 1), v], dim=1)


def _runs(row: torch.Tensor) -> list[tuple[int, int]]:
    m = torch.cat([row.new_zeros(1), (row > 0).to(row.dtype), row.new_zeros(1)])
    edges = torch.nonzero(m[1:] != m[:-1]).flatten().tolist()
    return list(zip(edges[::2], edges[1::2]))


def rewards_at_turn_ends(action_mask: torch.Tensor, turn_rewards: Sequence[Sequence[float]]) -> torch.Tensor:
    """``[B, L]`` with each turn's reward on its last action token (turns = runs of action tokens)."""
    out = torch.zeros_like(action_mask, dtype=torch.float32)
    for i, rewards in enumerate(turn_rewards):
        runs = _runs(action_mask[i])
        if len(runs) != len(rewards):
            raise ValueError(f"row {i} has {len(runs)} action turns but {len(rewards)} turn rewards")
        for (a, b), r in zip(runs, rewards):
            out[i, b - 1] = float(r)
    return out


@torch.no_grad()
def rlhf_advantages(token_rewards: torch.Tensor, values: torch.Tensor, action_mask: torch.Tensor, *,
                    gamma: float = 1.0, lam: float = 0.95, level: str = "token",
                    logprobs: torch.Tensor | None = None, ref_logprobs: torch.Tensor | None = None,
                    kl_coef: float = 0.0, last_values: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GAE advantages, value targets and the value-loss mask, all ``[B, L]``.

    Each row ends its episode at its last step: the bootstrap there is 0
    (termination) or ``last_values[i]`` (a truncated episode). With
    ``kl_coef`` the reward of every action token gets ``-kl_coef·(logp - ref)``.
    """
    if level not in LEVELS:
        raise ValueError(f"level={level!r} is invalid: allowed: {', '.join(LEVELS)}")
    if not (0 <= gamma <= 1 and 0 <= lam <= 1):
        raise ValueError(f"gamma={gamma}, lam={lam} are invalid: must be in [0, 1]")
    rewards = token_rewards.float().clone()
    if kl_coef:
        if logprobs is None or ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs logprobs and ref_logprobs")
        rewards -= kl_coef * (logprobs - ref_logprobs).float() * action_mask.float()
    adv = torch.zeros_like(rewards)
    ret = torch.zeros_like(rewards)
    vmask = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        runs = _runs(action_mask[i])
        if not runs:
            continue
        if level == "token":
            steps = [list(range(a, b)) for a, b in runs]
            steps = [[p] for s in steps for p in s]
        else:
            steps = [list(range(a, b)) for a, b in runs]
        first = [s[0] for s in steps]
        r = np.array([float(rewards[i, s].sum()) for s in steps], dtype=np.float64)[:, None]
        v = values[i, first].double().cpu().numpy()[:, None]
        nxt = np.empty_like(v)
        nxt[:-1] = v[1:]
        nxt[-1] = float(last_values[i]) if last_values is not None else 0.0
        dones = np.zeros_like(v)
        dones[-1] = 1.0
        a, g = compute_gae(r, v, nxt, dones, gamma, lam)
        for k, s in enumerate(steps):
            adv[i, s] = float(a[k, 0])
            ret[i, s[0]] = float(g[k, 0])
            vmask[i, s[0]] = 1.0
    return adv, ret, vmask


@dataclass
class PPORLHFLossTerms:
    loss: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    clip_fraction: torch.Tensor
    kl: torch.Tensor


def ppo_rlhf_loss(logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, values: torch.Tensor,
                  old_values: torch.Tensor, advantages: torch.Tensor, returns: torch.Tensor,
                  action_mask: torch.Tensor, value_mask: torch.Tensor, *, clip: float = 0.2,
                  value_clip: float | None = 0.2, vf_coef: float = 0.5, normalize_advantages: bool = True,
                  ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
                  reduction: str = "token_mean", weights: torch.Tensor | None = None) -> PPORLHFLossTerms:
    """Clipped policy loss on action tokens + ``vf_coef`` · (clipped) value loss on ``value_mask``.

    ``weights`` ``[B]``: per-trajectory importance weights (prioritized replay), on both terms.
    """
    mask = action_mask.float()
    if normalize_advantages:
        n = mask.sum().clamp(min=1)
        mean = (advantages * mask).sum() / n
        var = (((advantages - mean) * mask) ** 2).sum() / (n - 1).clamp(min=1)
        advantages = (advantages - mean) / (var.sqrt() + 1e-8) if mask.sum() > 1 else advantages - mean
    pg = grpo_loss(logprobs, behavior_logprobs, advantages, mask, clip_low=clip, clip_high=clip,
                   ref_logprobs=ref_logprobs, kl_coef=kl_coef, reduction=reduction, weights=weights)
    err = (values - returns) ** 2
    if value_clip is not None:
        clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        err = torch.max(err, (clipped - returns) ** 2)
    if weights is not None:
        err = err * weights.to(err.dtype).unsqueeze(1)
    value_loss = 0.5 * reduce_tokens(err, value_mask.float(), "token_mean")
    return PPORLHFLossTerms(pg.loss + vf_coef * value_loss, pg.pg_loss, value_loss, pg.clip_fraction, pg.kl)
