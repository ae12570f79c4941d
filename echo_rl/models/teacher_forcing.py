"""Teacher-forced scoring: the log-probabilities a causal LM gives to known continuation tokens.

One implementation for every caller — the rollout worker's candidate scorer (``action_mode='choose'``),
the local backbone's echo scoring and ``score``, and the server's reported log-probs — so they agree on
positions, padding, the latent-plan prefix and precision (float32 log-softmax at temperature 1).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


@torch.inference_mode()
def continuation_logprobs(model: Any, context: Sequence[int], continuations: Sequence[Sequence[int]],
                          prefix: torch.Tensor | None = None) -> torch.Tensor:
    """``[len(continuations), longest, vocab]`` float32 log-probs on the model's device: row ``[i, k]`` is the
    distribution of continuation ``i``'s token ``k`` given ``context``, then ``prefix`` (``[P, hidden]``
    embedding rows, where the engine places a latent plan), then the continuation's earlier tokens. All
    continuations go through one padded forward; rows past a shorter continuation's end are padding."""
    if not context:
        raise ValueError("teacher-forced scoring needs at least one context token (the first prediction's input)")
    if not continuations or max(len(c) for c in continuations) == 0:
        raise ValueError("teacher-forced scoring needs at least one non-empty continuation")
    device = next(model.parameters()).device
    if prefix is not None:
        return _with_prefix(model, context, continuations, prefix, device)
    n = len(context)
    width = n + max(len(c) for c in continuations)
    ids = torch.zeros(len(continuations), width, dtype=torch.long, device=device)
    att = torch.zeros_like(ids)
    for i, c in enumerate(continuations):
        row = list(context) + list(c)
        ids[i, :len(row)] = torch.tensor(row, device=device)
        att[i, :len(row)] = 1
    return torch.log_softmax(model(input_ids=ids, attention_mask=att).logits[:, n - 1:-1].float(), -1)


def _with_prefix(model: Any, context: Sequence[int], continuations: Sequence[Sequence[int]], prefix: torch.Tensor,
                 device: torch.device) -> torch.Tensor:
    embed = model.get_input_embeddings()
    ctx = embed(torch.as_tensor(list(context), dtype=torch.long, device=device))
    prefix = prefix.to(device, ctx.dtype)
    n = len(context) + prefix.shape[0]
    width = n + max(len(c) for c in continuations) - 1
    x = ctx.new_zeros(len(continuations), width, ctx.shape[-1])
    att = torch.zeros(len(continuations), width, dtype=torch.long, device=device)
    for i, c in enumerate(continuations):
        rows = torch.cat([ctx, prefix, embed(torch.as_tensor(list(c[:-1]), dtype=torch.long, device=device))])
        x[i, :rows.shape[0]] = rows
        att[i, :rows.shape[0]] = 1
    return torch.log_softmax(model(inputs_embeds=x, attention_mask=att).logits[:, n - 1:].float(), -1)


def token_logprobs(logp: torch.Tensor, continuations: Sequence[Sequence[int]]) -> list[list[float]]:
    """Each continuation's own tokens' log-probs out of :func:`continuation_logprobs`' rows."""
    out = []
    for i, c in enumerate(continuations):
        picked = logp[i, :len(c)].gather(1, torch.as_tensor(list(c), dtype=torch.long, device=logp.device)[:, None])
        out.append(picked[:, 0].tolist())
    return out
