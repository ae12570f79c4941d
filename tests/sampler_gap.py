"""The token-in/token-out check both recorders share: the learner's teacher-forced log-probs of the sampled tokens
against the log-probs the sampler reported for them."""

import torch

from echo_rl.algorithms.token_logprobs import sequence_logprobs
from echo_rl.lm.batch import collate
from echo_rl.types import ACTION


def sampled_logprob_gap(model, trajectories) -> tuple[float, int]:
    """(max |learner − sampler| log-prob over every sampled token, how many sampled tokens there were)."""
    batch = collate(trajectories, 0)
    with torch.no_grad():
        lp = sequence_logprobs(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
                               batch.input_ids)
    acts = batch.roles == ACTION
    return float((lp[acts] - batch.behavior_logprobs[acts]).abs().max()), int(acts.sum())
