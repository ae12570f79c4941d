"""Token trajectories → right-padded tensors for one learner forward pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from echo_rl.types import TEMPLATE, TokenTrajectory


@dataclass
class TokenBatch:
    input_ids: torch.Tensor          # [B, L] long, right-padded with pad_id
    attention_mask: torch.Tensor     # [B, L] 1 on real tokens
    roles: torch.Tensor              # [B, L] role codes; padding is template
    behavior_logprobs: torch.Tensor  # [B, L]
    prompt_length: torch.Tensor      # [B]
    env_output_count: torch.Tensor   # [B] |O|
    returns: torch.Tensor            # [B] sum of the turn rewards
    group_ids: torch.Tensor          # [B]
    policy_version: torch.Tensor     # [B]

    def to(self, device: str | torch.device) -> "TokenBatch":
        return TokenBatch(**{k: v.to(device) for k, v in self.__dict__.items()})


def collate(trajectories: Sequence[TokenTrajectory], pad_id: int) -> TokenBatch:
    if not trajectories:
        raise ValueError("cannot collate an empty list of trajectories")
    B, L = len(trajectories), max(len(t) for t in trajectories)
    ids = torch.full((B, L), int(pad_id), dtype=torch.long)
    att = torch.zeros(B, L, dtype=torch.long)
    roles = torch.full((B, L), TEMPLATE, dtype=torch.long)
    blp = torch.zeros(B, L)
    for i, t in enumerate(trajectories):
        n = len(t)
        ids[i, :n] = torch.tensor(t.token_ids, dtype=torch.long)
        att[i, :n] = 1
        roles[i, :n] = torch.tensor(t.roles, dtype=torch.long)
        blp[i, :n] = torch.tensor(t.behavior_logprobs, dtype=torch.float32)
    return TokenBatch(ids, att, roles, blp,
                      torch.tensor([t.prompt_length for t in trajectories]),
                      torch.tensor([t.env_output_count for t in trajectories]),
                      torch.tensor([t.total_reward for t in trajectories], dtype=torch.float32),
                      torch.tensor([t.group_id for t in trajectories]),
                      torch.tensor([t.policy_version for t in trajectories]))
