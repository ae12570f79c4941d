"""Observation encoders of the vector policies: observation batch -> feature vector (``out_dim`` wide).

Chosen by name (``TrainingConfig.encoder``, :func:`make_encoder`) or injected
(``agent.set(encoder=module)``: any ``nn.Module`` with an ``out_dim`` attribute).

- ``mlp``: the observation as a float vector (Stable-Baselines3's MlpPolicy input);
- ``minigrid``: per-index embeddings of MiniGrid's flat symbolic observation;
- ``minigrid_cnn``: a small CNN over MiniGrid's 7x7x3 symbolic grid (the
  rl-starter-files architecture), plus direction and mission words;
- ``nature_cnn``: Mnih et al. 2015's three-layer CNN for pixels (CleanRL's Atari encoder);
- ``impala_cnn``: Espeholt et al. 2018's residual CNN (15 layers) for pixels.

Pixel encoders take uint8 images, HWC (gymnasium's image spaces) or CHW
(stacked Atari frames), and scale them to [0, 1].
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from echo_rl.environments.minigrid_vector import MiniGridObsEncoding
from echo_rl.models.embedding import IndexAddEmbedding

ENCODERS = ("mlp", "minigrid", "minigrid_cnn", "nature_cnn", "impala_cnn")
PIXEL_ENCODERS = ("nature_cnn", "impala_cnn")


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal init as in CleanRL: stabilises early PPO updates."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class FlatEncoder(nn.Module):
    """Observation as a float vector, unchanged (Stable-Baselines3's MlpPolicy input)."""

    def __init__(self, obs_dim: int):
        super().__init__()
        self.out_dim = obs_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.flatten(1).float()


class MiniGridEncoder(nn.Module):
    """Flat MiniGrid observation -> feature vector.

    Each image cell's object, colour and state index gets its own learned
    embedding (offset into one table); direction and mission words are
    embedded the same way, so the network never sees a 1k-wide one-hot.
    """

    def __init__(self, encoding: MiniGridObsEncoding = MiniGridObsEncoding(), embed_dim: int = 8,
                 hidden: int = 128):
        super().__init__()
        self.encoding = encoding
        e = encoding
        cells = e.view * e.view
        # Table layout: [objects | colours | states] per channel, then directions.
        channel_offsets = torch.tensor([0, e.num_objects, e.num_objects + e.num_colors])
        self.register_buffer("image_offsets", channel_offsets.repeat(cells), persistent=False)
        self.direction_offset = e.num_objects + e.num_colors + e.num_states
        self.embed = IndexAddEmbedding(self.direction_offset + e.num_directions, embed_dim)  # torch's init
        self.mission = nn.Linear(e.mission_words, embed_dim, bias=False)
        in_dim = (e.image_size + 2) * embed_dim
        self.net = nn.Sequential(layer_init(nn.Linear(in_dim, hidden)), nn.Tanh())
        self.out_dim = hidden

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        e = self.encoding
        obs = obs.long()
        image = self.embed(obs[:, : e.image_size] + self.image_offsets)
        direction = self.embed(obs[:, e.image_size] + self.direction_offset).unsqueeze(1)
        mission = self.mission(obs[:, e.image_size + 1:].float()).unsqueeze(1)
        return self.net(torch.cat([image, direction, mission], dim=1).flatten(1))


class MiniGridCNN(nn.Module):
    """MiniGrid's 7x7x3 symbolic grid through a 3-layer CNN (2x2 kernels, one max-pool: 64 features),
    concatenated with the one-hot direction and the mission-word bag of the flat observation."""

    def __init__(self, encoding: MiniGridObsEncoding = MiniGridObsEncoding()):
        super().__init__()
        self.encoding = encoding
        c = encoding.image_channels
        self.conv = nn.Sequential(
            nn.Conv2d(c, 16, 2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 2), nn.ReLU(),
            nn.Conv2d(32, 64, 2), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            conv_dim = self.conv(torch.zeros(1, c, encoding.view, encoding.view)).shape[1]
        self.out_dim = conv_dim + encoding.num_directions + encoding.mission_words

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        e = self.encoding
        image = obs[:, : e.image_size].float().view(-1, e.view, e.view, e.image_channels).permute(0, 3, 1, 2)
        direction = nn.functional.one_hot(obs[:, e.image_size].long(), e.num_directions).float()
        return torch.cat([self.conv(image), direction, obs[:, e.image_size + 1:].float()], dim=1)


def image_layout(obs_shape: tuple) -> tuple[int, int, int, bool]:
    """(channels, height, width, channels_last) of an image observation shape (HWC or CHW).

    Channels are the short axis: (84, 84, 9) is three stacked RGB frames channels-last, (4, 84, 84) four
    stacked grey frames channels-first."""
    if len(obs_shape) != 3:
        raise ValueError(f"a pixel encoder needs image observations (H, W, C) or (C, H, W), got shape {obs_shape}")
    if obs_shape[-1] < obs_shape[0]:
        h, w, c = obs_shape
        return c, h, w, True
    c, h, w = obs_shape
    return c, h, w, False


class _PixelEncoder(nn.Module):
    """uint8 images -> float CHW in [0, 1], then ``self.net``."""

    def __init__(self, obs_shape: tuple):
        super().__init__()
        self.channels, self.height, self.width, self.channels_last = image_layout(tuple(obs_shape))

    def _chw(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() / 255.0
        return x.permute(0, 3, 1, 2) if self.channels_last else x

    def _out_dim(self) -> int:
        with torch.no_grad():
            return int(self.net(torch.zeros(1, self.channels, self.height, self.width)).shape[1])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self._chw(obs))


class NatureCNN(_PixelEncoder):
    """Mnih et al. 2015: conv 8x8/4 (32), 4x4/2 (64), 3x3/1 (64), linear 512; needs images of at least 36x36."""

    def __init__(self, obs_shape: tuple, features: int = 512):
        super().__init__(obs_shape)
        if min(self.height, self.width) < 36:
            raise ValueError(f"nature_cnn needs images of at least 36x36 pixels, got {self.height}x{self.width}")
        conv = nn.Sequential(
            layer_init(nn.Conv2d(self.channels, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten())
        self.net = conv
        flat = self._out_dim()
        self.net = nn.Sequential(conv, layer_init(nn.Linear(flat, features)), nn.ReLU())
        self.out_dim = features


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def _impala_stack(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                         _ResidualBlock(out_channels), _ResidualBlock(out_channels))


class ImpalaCNN(_PixelEncoder):
    """Espeholt et al. 2018: three stacks (16, 32, 32 channels) of conv + max-pool + two residual blocks,
    then ReLU and a linear layer of 256 (the Procgen baseline's encoder)."""

    def __init__(self, obs_shape: tuple, channels: tuple[int, ...] = (16, 32, 32), features: int = 256):
        super().__init__(obs_shape)
        stacks, c = [], self.channels
        for out in channels:
            stacks.append(_impala_stack(c, out))
            c = out
        conv = nn.Sequential(*stacks, nn.ReLU(), nn.Flatten())
        self.net = conv
        flat = self._out_dim()
        self.net = nn.Sequential(conv, layer_init(nn.Linear(flat, features)), nn.ReLU())
        self.out_dim = features


def default_encoder(obs_shape: tuple, obs_dtype, policy_network: str = "minigrid") -> str:
    """The encoder a space gets when none is named: ``policy_network`` for MiniGrid's flat symbolic vector,
    ``mlp`` for any other vector, ``nature_cnn`` for images."""
    if len(obs_shape) == 1 and obs_shape[0] == MiniGridObsEncoding().size and np.dtype(obs_dtype) == np.uint8:
        return policy_network
    return "nature_cnn" if len(obs_shape) == 3 else "mlp"


def make_encoder(name: str, obs_shape: tuple) -> nn.Module:
    """The encoder ``name`` (:data:`ENCODERS`) for observations of ``obs_shape``; ValueError (one line) when the
    two do not fit."""
    obs_shape = tuple(obs_shape)
    symbolic = (MiniGridObsEncoding().size,)
    if name == "mlp":
        return FlatEncoder(int(np.prod(obs_shape)))
    if name in ("minigrid", "minigrid_cnn"):
        if obs_shape != symbolic:
            raise ValueError(f"encoder {name!r} reads MiniGrid's flat symbolic observation of shape {symbolic}, got "
                             f"{obs_shape}; for pixels use nature_cnn or impala_cnn, for vectors mlp")
        return MiniGridEncoder() if name == "minigrid" else MiniGridCNN()
    if name == "nature_cnn":
        return NatureCNN(obs_shape)
    if name == "impala_cnn":
        return ImpalaCNN(obs_shape)
    raise ValueError(f"unknown encoder {name!r}; allowed: {', '.join(ENCODERS)}")


__all__ = ["ENCODERS", "FlatEncoder", "ImpalaCNN", "MiniGridCNN", "MiniGridEncoder", "NatureCNN", "default_encoder",
           "image_layout", "layer_init", "make_encoder"]
