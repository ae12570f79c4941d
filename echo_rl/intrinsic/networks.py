"""Encoders and dynamics heads the intrinsic modules build on.

The encoder is picked by observation shape: an MLP for flat vectors (MiniGrid's
flattened observation), a small strided CNN for (C, H, W) images (the four
ELU conv layers of ICM, Pathak et al. 2017). Inverse and forward dynamics
heads are the ones ICM, RIDE, E3B and NGU train their embeddings with.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp(sizes: list[int], activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class ConvEncoder(nn.Module):
    """(B, C, H, W) in [0, 1] -> (B, latent_dim): 4 x (3x3 conv, stride 2, ELU), then a linear layer."""

    def __init__(self, obs_shape: tuple[int, ...], latent_dim: int, channels: int = 32):
        super().__init__()
        c = obs_shape[0]
        convs: list[nn.Module] = []
        for _ in range(4):
            convs += [nn.Conv2d(c, channels, 3, stride=2, padding=1), nn.ELU()]
            c = channels
        self.convs = nn.Sequential(*convs, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *obs_shape)).shape[1]
        self.head = nn.Linear(flat, latent_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.convs(x))


def make_encoder(kind: str, obs_shape: tuple[int, ...], latent_dim: int, hidden: int = 256) -> nn.Module:
    """MLP for 'vector' observations, ConvEncoder for 'image' ones."""
    if kind == "vector":
        return mlp([obs_shape[0], hidden, hidden, latent_dim])
    if kind == "image":
        return ConvEncoder(obs_shape, latent_dim)
    raise ValueError(f"unknown observation kind {kind!r}; allowed: vector, image")


def encode(encoder: nn.Module, x: torch.Tensor, obs_ndim: int) -> torch.Tensor:
    """Apply a (B, ...) encoder to (T, N, ...) or (B, ...) inputs, keeping the leading dims."""
    lead = x.shape[:x.dim() - obs_ndim]
    return encoder(x.reshape(-1, *x.shape[x.dim() - obs_ndim:])).reshape(*lead, -1)


class InverseHead(nn.Module):
    """(phi(s), phi(s')) -> action logits (Discrete) or action (Box)."""

    def __init__(self, latent_dim: int, action_dim: int, hidden: int = 256):
        super().__init__()
        self.net = mlp([2 * latent_dim, hidden, action_dim])

    def forward(self, phi: torch.Tensor, phi_next: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([phi, phi_next], dim=-1))


class ForwardHead(nn.Module):
    """(phi(s), a) -> predicted phi(s')."""

    def __init__(self, latent_dim: int, action_dim: int, hidden: int = 256):
        super().__init__()
        self.net = mlp([latent_dim + action_dim, hidden, latent_dim])

    def forward(self, phi: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([phi, action], dim=-1))


def inverse_loss(pred: torch.Tensor, actions: torch.Tensor, discrete: bool) -> torch.Tensor:
    """Cross-entropy against the one-hot action (Discrete) or mean squared error (Box)."""
    if discrete:
        return F.cross_entropy(pred, actions.argmax(-1))
    return F.mse_loss(pred, actions)
