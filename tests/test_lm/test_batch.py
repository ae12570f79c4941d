"""Trajectories from the builder, collated, feed the ECHO loss with the masks their roles say."""

import torch

from echo_rl.algorithms.echo_loss import echo_loss
from echo_rl.lm.batch import collate
from echo_rl.lm.chat_delta import ChatRenderer
from echo_rl.lm.trajectory import TrajectoryBuilder


def _traj(r, reward, obs, group):
    b = TrajectoryBuilder(r, [("env_output", "You see a key 1.")], group_id=group)
    ids = r.encode("take key 1")
    b.add_action(ids, [-0.5] * len(ids))
    b.add_observation(obs, 0.0)
    ids = r.encode("open door 1")
    b.add_action(ids, [-0.7] * len(ids))
    return b.finish(reward=reward)


def test_collated_batch_keeps_roles_and_counts(tokenizer):
    r = ChatRenderer(tokenizer)
    trajs = [_traj(r, 1.0, [("env_output", "You take the key 1.")], 0),
             _traj(r, 0.0, [("warning", "Nothing happens.")], 0)]
    pad = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    batch = collate(trajs, pad)
    assert batch.input_ids.shape == (2, max(map(len, trajs)))
    for i, t in enumerate(trajs):
        n = len(t)
        assert batch.input_ids[i, :n].tolist() == t.token_ids and batch.attention_mask[i, n:].sum() == 0
    assert batch.env_output_count.tolist() == [t.env_output_count for t in trajs]
    assert batch.returns.tolist() == [1.0, 0.0]
    torch.manual_seed(0)
    logits = torch.randn(*batch.input_ids.shape, len(tokenizer), requires_grad=True)
    terms = echo_loss(logits, batch.input_ids, batch.roles, batch.prompt_length, batch.behavior_logprobs,
                      torch.tensor([1.0, -1.0]), batch.env_output_count, attention_mask=batch.attention_mask)
    counts = [t.role_counts() for t in trajs]
    assert terms.metrics["tokens_action"] == sum(c["action"] for c in counts)
    assert terms.metrics["tokens_env_output"] == sum(c["env_output"] for c in counts) > 0
    assert terms.metrics["tokens_warning"] == counts[1]["warning"] > 0
    terms.loss.backward()
    assert logits.grad.abs().sum() > 0
