import gymnasium as gym
import numpy as np
import pytest
import torch

from intrinsic_helpers import vector_space


@pytest.fixture
def rollout():
    """A fixed rollout of T=16 steps, N=4 envs, 8-dim uint8 observations, 3 actions; one episode end.

    Action a adds 3 to coordinate a, so inverse and forward dynamics are learnable."""
    g = np.random.default_rng(0)
    obs = g.integers(0, 6, (16, 4, 8), dtype=np.uint8)
    actions = g.integers(0, 3, (16, 4))
    next_obs = obs.copy()
    np.put_along_axis(next_obs, actions[..., None], np.take_along_axis(obs, actions[..., None], -1) + 3, -1)
    obs, next_obs, actions = torch.as_tensor(obs), torch.as_tensor(next_obs), torch.as_tensor(actions)
    dones = torch.zeros(16, 4, dtype=torch.bool)
    dones[7, 2] = True
    return vector_space(8), gym.spaces.Discrete(3), (obs, actions, next_obs, dones)
