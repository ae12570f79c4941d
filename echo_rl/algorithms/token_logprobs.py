"""Per-token log-probs and role masks for language-model losses, position-aligned.

Every token-level tensor here is ``[B, L]`` and aligned with ``input_ids``:
entry ``t`` concerns token ``t`` (``log p(x_t | x_<t)``, its role, its
behaviour log-prob); entry 0 has no prediction and is 0. Aligning once, here,
keeps the off-by-one out of every loss.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint

from echo_rl.types import ACTION, ENV_OUTPUT, WARNING

CE_TARGETS = ("env_only", "warning_only", "warning_plus_env")


def sequence_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``out[:, t] = log softmax(logits[:, t-1] / temperature)[x_t]``; ``out[:, 0] = 0``.

    ``logits`` is ``[B, L, V]`` from one forward pass over ``input_ids``.
    """
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be [B, L, V] over input_ids {tuple(input_ids.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} is invalid: must be > 0")
    scaled = logits[:, :-1].float()
    if temperature != 1.0:
        scaled = scaled / temperature
    lp = torch.log_softmax(scaled, dim=-1).gather(-1, input_ids[:, 1:].long().unsqueeze(-1)).squeeze(-1)
    return torch.cat([lp.new_zeros(lp.shape[0], 1), lp], dim=1)


def response_mask(prompt_length: torch.Tensor, length: int, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """1 on positions ``>= prompt_length`` (and inside ``attention_mask``), ``[B, L]`` float."""
    pos = torch.arange(length, device=prompt_length.device).unsqueeze(0)
    m = (pos >= prompt_length.unsqueeze(1)).float()
    return m * attention_mask.float() if attention_mask is not None else m


def action_mask(roles: torch.Tensor, resp: torch.Tensor) -> torch.Tensor:
    return (roles == ACTION).float() * resp


def ce_mask(roles: torch.Tensor, resp: torch.Tensor, target: str = "env_only") -> torch.Tensor:
    """Which observation-body tokens the world-model CE trains on (paper default: env output only)."""
    if target == "env_only":
        m = roles == ENV_OUTPUT
    elif target == "warning_only":
        m = roles == WARNING
    elif target == "warning_plus_env":
        m = (roles == ENV_OUTPUT) | (roles == WARNING)
    else:
        raise ValueError(f"ce_target={target!r} is invalid: allowed: {', '.join(CE_TARGETS)}")
    return m.float() * resp


def reduce_tokens(per_token: torch.Tensor, mask: torch.Tensor, reduction: str) -> torch.Tensor:
    """``token_mean``: over all selected tokens of the batch; ``sequence_mean``: per row, then over rows.

    Rows or batches with nothing selected give a graph-connected zero, so a
    backward pass (and data-parallel ranks) never see a missing gradient.
    """
    if reduction == "token_mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if reduction == "sequence_mean":
        per_row = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return per_row.mean()
    raise ValueError(f"reduction={reduction!r} is invalid: allowed: token_mean, sequence_mean")


def needed_positions(roles: torch.Tensor, resp: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` bool: the tokens any LM loss or metric reads (action, env-output and warning bodies)."""
    return ((roles == ACTION) | (roles == ENV_OUTPUT) | (roles == WARNING)) & (resp > 0)


def hidden_logprobs(hidden: torch.Tensor, head: torch.nn.Module, input_ids: torch.Tensor, needed: torch.Tensor,
                    temperatures: tuple[float, ...] = (1.0,), chunk_tokens: int = 1024) -> list[torch.Tensor]:
    """:func:`sequence_logprobs` from final hidden states, only where ``needed`` (0 elsewhere).

    ``hidden`` is ``[B, L, H]`` (row ``t-1`` predicts token ``t``), ``head`` the LM head. The head and the
    log-softmax run on the gathered rows only, ``chunk_tokens`` at a time, each chunk recomputed in the
    backward pass (activation checkpointing), so no ``[B, L, V]`` tensor ever exists: with a 49k vocabulary
    and thousands of tokens per trajectory that tensor (fp32, and its log-softmax and gradient) is what
    does not fit. One ``[B, L]`` tensor per temperature, each equal to the full path's at those positions.
    """
    if hidden.dim() != 3 or hidden.shape[:2] != input_ids.shape or needed.shape != input_ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be [B, L, H] over input_ids {tuple(input_ids.shape)} "
                         f"and needed {tuple(needed.shape)}")
    if any(t <= 0 for t in temperatures) or chunk_tokens < 1:
        raise ValueError(f"temperatures={temperatures}, chunk_tokens={chunk_tokens} are invalid: must be > 0")
    need = needed.clone()
    need[:, 0] = False  # token 0 has no prediction
    b, t = need.nonzero(as_tuple=True)
    rows = hidden[b, t - 1]
    targets = input_ids[b, t].long()

    def chunk(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = head(h).float()
        return torch.stack([torch.log_softmax(logits if T == 1.0 else logits / T, -1)
                            .gather(-1, y.unsqueeze(-1)).squeeze(-1) for T in temperatures])

    parts = []
    for s in range(0, rows.shape[0], chunk_tokens):
        h, y = rows[s:s + chunk_tokens], targets[s:s + chunk_tokens]
        parts.append(torch.utils.checkpoint.checkpoint(chunk, h, y, use_reentrant=False)
                     if torch.is_grad_enabled() and h.requires_grad else chunk(h, y))
    vals = torch.cat(parts, 1) if parts else hidden.new_zeros(len(temperatures), 0, dtype=torch.float32)
    base = torch.zeros(input_ids.shape, dtype=torch.float32, device=hidden.device)
    return [base.index_put((b, t), v) for v in vals]
