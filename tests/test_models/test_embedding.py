"""The MiniGrid trunk's embedding: torch's forward, an index_add_ weight gradient equal bit for bit to torch's."""

import pytest
import torch
from torch import nn

from echo_rl.models.embedding import IndexAddEmbedding


@pytest.mark.parametrize("shape", [(256, 147), (20,), (40, 3)])  # over and under torch's 3,000-index switch
def test_gradient_is_torchs_bit_for_bit(shape):
    torch.manual_seed(0)
    ref = nn.Embedding(40, 8)
    ours = IndexAddEmbedding.wrap(nn.Embedding(40, 8, _weight=ref.weight.detach().clone()))
    idx = torch.randint(0, 40, shape)
    upstream = torch.randn(*shape, 8)
    out_ref, out = ref(idx), ours(idx)
    assert torch.equal(out_ref, out)
    out_ref.backward(upstream)
    out.backward(upstream)
    assert torch.equal(ref.weight.grad, ours.weight.grad)


def test_wrap_keeps_the_parameter_and_draws_nothing():
    base = nn.Embedding(10, 4)
    state = torch.get_rng_state()
    wrapped = IndexAddEmbedding.wrap(base)
    assert wrapped.weight is base.weight
    assert torch.equal(torch.get_rng_state(), state)


def test_padding_idx_falls_back_to_torch():
    emb = IndexAddEmbedding.wrap(nn.Embedding(10, 4, padding_idx=0))
    idx = torch.tensor([[0, 1, 1, 0]])
    emb(idx).sum().backward()
    assert torch.equal(emb.weight.grad[0], torch.zeros(4))  # the padding row gets no gradient
    assert torch.equal(emb.weight.grad[1], torch.full((4,), 2.0))


def test_echo_agent_trunk_uses_it():
    from echo_rl.config import TrainingConfig
    from echo_rl.environments.minigrid_vector import make_vector_env
    from echo_rl.vector.echo import EchoAgent

    cfg = TrainingConfig(env_name="minigrid:MiniGrid-Empty-5x5-v0", agent="echo-rl", num_actors=2, batch_size=16,
                         total_timesteps=1000).with_overrides({"echo_config.replay_updates": 0})
    agent = EchoAgent(cfg, make_vector_env(cfg.env_name, 2), torch.device("cpu"))
    try:
        assert isinstance(agent.lpo.policy.trunk.embed, IndexAddEmbedding)
    finally:
        agent.close()


def test_ppo_minigrid_encoder_uses_it_with_torchs_initial_weights():
    from echo_rl.models.encoders import MiniGridEncoder

    torch.manual_seed(3)
    enc = MiniGridEncoder()
    torch.manual_seed(3)
    ref = nn.Embedding(enc.embed.num_embeddings, enc.embed.embedding_dim)
    assert isinstance(enc.embed, IndexAddEmbedding) and torch.equal(enc.embed.weight, ref.weight)
