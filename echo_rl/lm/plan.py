"""Latent plans for language-model policies: soft-prefix embeddings placed before each action.

Before action k the :class:`~echo_rl.planning.TrajectoryEncoder`
reads the embeddings of the last ``state_window_size`` turns (turn j = the
mean input embedding of the tokens between action j-1 and action j: the
observation and its template wrapper) and returns p(τ_k | s_1:k); a
reparameterised sample τ_k = μ + σ·ε (ε drawn by the actor and stored in the
trajectory) becomes ``plan_tokens`` embedding rows, scaled by
``soft_prefix_alpha``, that the engine feeds right after the context and
before the first sampled token (its ``plan_embeddings`` injection point).

The engine does not keep a plan in the history: the next turn's context is
the plain token stream again (KV computed after a plan is not reused). So the
learner rebuilds exactly what the engine computed in one forward pass: the
whole trajectory as plain tokens (what every later turn and every observation
token saw), plus one extra block per action — its plan rows at the positions
after the context, then copies of its tokens — that attends only to the
context before that action and to itself (a 4-D attention mask and explicit
position ids). Action log-probs are read from those blocks, everything else
from the plain rows, so the learner's log-probs equal the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from echo_rl.config import PlanningConfig
from echo_rl.planning import PlanDistribution, TrajectoryEncoder, gaussian_kl


def observation_spans(action_spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) of the tokens each action's plan reads: from the previous action's end to this action."""
    out, prev = [], 0
    for a, b in action_spans:
        out.append((prev, a))
        prev = b
    return out


class LMPlanner(nn.Module):
    """Turn embeddings → plan distribution → ``num_tokens`` soft-prefix rows of the model's width."""

    def __init__(self, hidden_size: int, config: PlanningConfig | None = None, num_tokens: int = 2,
                 encoder_hidden: int = 128) -> None:
        super().__init__()
        self.config = config or PlanningConfig()
        self.hidden_size, self.num_tokens = int(hidden_size), int(num_tokens)
        self.window = self.config.state_window_size
        self.encoder = TrajectoryEncoder(self.hidden_size, self.config, hidden_dim=encoder_hidden)
        self.to_prefix = nn.Linear(self.encoder.latent_dim, self.num_tokens * self.hidden_size)
        nn.init.normal_(self.to_prefix.weight, std=0.02)
        nn.init.zeros_(self.to_prefix.bias)

    @property
    def latent_dim(self) -> int:
        return self.encoder.latent_dim

    def windows(self, turn_emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, H]`` turn embeddings → ``[T, k, H]`` windows (slot k-1 is turn t) and their ``[T, k]`` mask."""
        T, H = turn_emb.shape
        k = self.window
        padded = torch.cat([turn_emb.new_zeros(k - 1, H), turn_emb])
        states = torch.stack([padded[t: t + k] for t in range(T)]) if T else turn_emb.new_zeros(0, k, H)
        idx = torch.arange(T, device=turn_emb.device)[:, None] + torch.arange(k, device=turn_emb.device)[None]
        return states, (idx >= k - 1).to(turn_emb.dtype)

    def forward(self, turn_emb: torch.Tensor, eps: torch.Tensor) -> tuple[PlanDistribution, torch.Tensor]:
        """Plans of every turn and their prefixes ``[T, P, H]`` (``eps`` ``[T, latent]`` reproduces the actor's)."""
        states, mask = self.windows(turn_emb)
        dist = self.encoder(states, mask)
        tau = dist.rsample(eps)
        prefix = self.to_prefix(tau).view(-1, self.num_tokens, self.hidden_size)
        return dist, prefix * self.config.soft_prefix_alpha


@torch.no_grad()
def turn_embeddings(embed: nn.Module, token_ids: Sequence[int] | torch.Tensor,
                    spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Mean input embedding over each span (no gradient into the embedding table)."""
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=embed.weight.device)
    rows = embed(ids)
    return torch.stack([rows[a:b].mean(0) if b > a else rows.new_zeros(rows.shape[-1]) for a, b in spans])


@dataclass
class EpisodePlan:
    """The actor's side of one episode: turn embeddings so far and the ε it drew for each plan."""

    planner: LMPlanner
    embed: nn.Module
    rng: np.random.Generator
    turn_emb: list[torch.Tensor] = field(default_factory=list)
    eps: list[list[float]] = field(default_factory=list)
    prev_end: int = 0

    @torch.no_grad()
    def next_prefix(self, context: Sequence[int]) -> torch.Tensor:
        """The ``[P, H]`` soft prefix for the action that follows ``context``."""
        self.turn_emb.append(turn_embeddings(self.embed, context, [(self.prev_end, len(context))])[0])
        eps = torch.as_tensor(self.rng.standard_normal(self.planner.latent_dim), dtype=torch.float32)
        self.eps.append(eps.tolist())
        emb = torch.stack(self.turn_emb)
        states, mask = self.planner.windows(emb)
        dist = self.planner.encoder(states[-1:], mask[-1:])
        tau = dist.rsample(eps[None].to(emb.dtype))
        prefix = self.planner.to_prefix(tau).view(self.planner.num_tokens, self.planner.hidden_size)
        return prefix * self.planner.config.soft_prefix_alpha

    def action_done(self, context_length: int, action_length: int) -> None:
        self.prev_end = context_length + action_length


def _float_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill(~allowed, torch.finfo(dtype).min)


def planned_forward(model: Any, planner: LMPlanner, trajectories: Sequence[Any], eps: Sequence[Any],
                    length: int, return_hidden: bool = False) -> tuple[torch.Tensor, list[PlanDistribution]]:
    """Logits aligned like a plain forward (``[B, length, V]``: entry t-1 predicts token t) where every
    action token is predicted with its plan before it, as the engine sampled it; and each trajectory's
    plan distributions (one per action). ``return_hidden``: the final hidden states ``[B, length, H]``,
    aligned the same way, instead of the logits (the learner applies the LM head only where it needs to)."""
    device = next(model.parameters()).device
    embed = model.get_input_embeddings()
    seqs, poss, allows, aligned, dists = [], [], [], [], []
    for traj, e in zip(trajectories, eps):
        ids = torch.as_tensor(traj.token_ids, dtype=torch.long, device=device)
        L = len(traj.token_ids)
        tok = embed(ids)
        spans = traj.turn_spans()
        emb = turn_embeddings(embed, ids, observation_spans(spans))
        e = torch.as_tensor(np.asarray(e, dtype=np.float32), device=device).reshape(len(spans), planner.latent_dim)
        dist, prefix = planner(emb, e.to(emb.dtype))
        dists.append(dist)
        P = planner.num_tokens
        parts, pos = [tok], [torch.arange(L, device=device)]
        n = L + sum(P + (b - a - 1) for a, b in spans)
        allowed = torch.zeros(n, n, dtype=torch.bool, device=device)
        allowed[:L, :L] = torch.ones(L, L, dtype=torch.bool, device=device).tril()
        idx = torch.arange(L, device=device)  # idx[t-1] = the row whose logits predict token t
        row = L
        for k, (a, b) in enumerate(spans):
            m = P + (b - a - 1)
            parts += [prefix[k].to(tok.dtype), tok[a:b - 1]]
            pos.append(torch.arange(a, a + m, device=device))
            allowed[row:row + m, :a] = True
            allowed[row:row + m, row:row + m] = torch.ones(m, m, dtype=torch.bool, device=device).tril()
            idx[a - 1: b - 1] = torch.arange(row + P - 1, row + m, device=device)
            row += m
        seqs.append(torch.cat(parts))
        poss.append(torch.cat(pos))
        allows.append(allowed)
        aligned.append(idx)
    B, N = len(seqs), max(s.shape[0] for s in seqs)
    H = seqs[0].shape[-1]
    x = seqs[0].new_zeros(B, N, H)
    position_ids = torch.zeros(B, N, dtype=torch.long, device=device)
    allow = torch.eye(N, dtype=torch.bool, device=device).repeat(B, 1, 1)  # padding rows see themselves only
    for i, (s, p, al) in enumerate(zip(seqs, poss, allows)):
        n = s.shape[0]
        x[i, :n], position_ids[i, :n] = s, p
        allow[i, :n, :n] = al
    net = getattr(model, model.base_model_prefix) if return_hidden else model
    out = net(inputs_embeds=x, attention_mask=_float_mask(allow[:, None], x.dtype), position_ids=position_ids,
              use_cache=False)
    logits = out.last_hidden_state if return_hidden else out.logits
    gather = torch.zeros(B, length, dtype=torch.long, device=device)
    for i, idx in enumerate(aligned):
        gather[i, :len(idx)] = idx
    out = torch.gather(logits, 1, gather[..., None].expand(-1, -1, logits.shape[-1]))
    return out, dists


def plan_distributions(model: Any, planner: LMPlanner, trajectories: Sequence[Any],
                       eps: Sequence[Any]) -> list[PlanDistribution]:
    """Each trajectory's plan distributions, as :func:`planned_forward` computes them, without the transformer
    pass (cheap: turn embeddings and the plan encoder only) — for the plan KL of a micro-batched update."""
    device = next(model.parameters()).device
    embed = model.get_input_embeddings()
    out = []
    for traj, e in zip(trajectories, eps):
        ids = torch.as_tensor(traj.token_ids, dtype=torch.long, device=device)
        spans = traj.turn_spans()
        emb = turn_embeddings(embed, ids, observation_spans(spans))
        e = torch.as_tensor(np.asarray(e, dtype=np.float32), device=device).reshape(len(spans), planner.latent_dim)
        out.append(planner(emb, e.to(emb.dtype))[0])
    return out


def plan_kl(dists: Sequence[PlanDistribution]) -> torch.Tensor:
    """Mean KL[p(τ_k | s_1:k) || p(τ_k-1 | s_1:k-1)] over consecutive plans of the same episode."""
    kls = [gaussian_kl(d[1:], d[:-1]) for d in dists if d.mean.shape[0] > 1]
    if not kls:
        return dists[0].mean.sum() * 0.0
    return torch.cat(kls).mean()
