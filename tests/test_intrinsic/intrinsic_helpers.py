"""Small builders shared by the intrinsic-reward tests (a module, not conftest: the suite has several)."""
import gymnasium as gym
import numpy as np
import torch


def vector_space(dim: int) -> gym.spaces.Box:
    return gym.spaces.Box(0, 255, (dim,), np.uint8)


def linear(weight, bias=None) -> torch.nn.Linear:
    """A Linear layer with the given (out, in) weight and bias (zero when None)."""
    w = torch.tensor(weight, dtype=torch.float32)
    layer = torch.nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(torch.zeros(w.shape[0]) if bias is None else torch.tensor(bias, dtype=torch.float32))
    return layer


def steps(*rows):
    """(T, N=1, D) uint8 observations from a list of D-tuples."""
    return torch.tensor([[list(r)] for r in rows], dtype=torch.uint8)
