"""sample_categorical: torch.multinomial's draws without its checks; sample_policy refuses NaN probabilities."""

import numpy as np
import pytest
import torch

from echo_rl.models.distributions import sample_categorical
from echo_rl.vector.rollout import sample_policy, torch_generator


def test_sample_categorical_draws_what_multinomial_draws():
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(500, 8, 7, generator=g) * 3, -1)
    probs[0, 0] = torch.tensor([0, 0, 1, 0, 0, 0, 0.0])  # zero probabilities are never drawn
    a, b = torch_generator(11), torch_generator(11)
    for p in probs:
        ours = sample_categorical(p, a)
        assert ours.shape == (8, 1) and ours.dtype == torch.int64
        assert torch.equal(ours, torch.multinomial(p, 1, generator=b))
    assert torch.equal(a.get_state(), b.get_state())  # the same generator draws were consumed
    assert sample_categorical(probs[0, :1], torch_generator(0)).item() == 2


class NaNPolicy(torch.nn.Module):
    def forward(self, obs):
        return torch.full((obs.shape[0], 3), float("nan")), torch.zeros(obs.shape[0])


def test_sample_policy_refuses_nan_logits():
    with pytest.raises(ValueError, match="NaN or inf"):
        sample_policy(NaNPolicy(), torch_generator(0), torch.zeros(2, 4))


def test_sample_policy_returns_flat_numpy():
    class Uniform(torch.nn.Module):
        def forward(self, obs):
            return torch.zeros(obs.shape[0], 3), torch.ones(obs.shape[0])

    actions, logprobs, values = sample_policy(Uniform(), torch_generator(0), torch.zeros(5, 4))
    assert actions.shape == logprobs.shape == values.shape == (5,)
    np.testing.assert_allclose(logprobs, np.log(1 / 3), rtol=1e-6)
