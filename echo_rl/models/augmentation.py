"""Augmentations of pixel observations, applied to the learner's batch (DrQ / RAD / DrAC style).

Each is a callable ``aug(obs, generator) -> obs`` on a batch of uint8 images
(B, H, W, C) or (B, C, H, W): same shape and dtype out, every random draw from
``generator``, so a seeded learner augments the same way on every run and
after a resume. The policy acts on clean observations; only the gradient
steps see augmented ones (Laskin et al. 2020; Kostrikov et al. 2021).

- ``random_shift`` (DrQ): pad ``pad`` pixels by edge replication, crop back at a random offset;
- ``random_crop`` (RAD): a random window of ``scale`` of each side, resized back (bilinear);
- ``color_jitter`` (RAD/DrAC): random brightness, contrast and (RGB only) saturation per image.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from echo_rl.models.encoders import image_layout

AUGMENTATIONS = ("random_shift", "random_crop", "color_jitter")


def _bhwc(obs: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The batch as (B, H, W, C) and whether it came channels-last."""
    if obs.dim() != 4:
        raise ValueError(f"augmentation needs a batch of images (B, H, W, C) or (B, C, H, W), got shape "
                         f"{tuple(obs.shape)}")
    channels_last = image_layout(tuple(obs.shape[1:]))[3]
    return (obs if channels_last else obs.permute(0, 2, 3, 1)), channels_last


def _back(x: torch.Tensor, channels_last: bool, like: torch.Tensor) -> torch.Tensor:
    if like.dtype == torch.uint8:
        x = x.round().clamp(0, 255).to(torch.uint8)
    else:
        x = x.to(like.dtype)
    return (x if channels_last else x.permute(0, 3, 1, 2)).contiguous()


def _uniform(n: int, low: float, high: float, generator: torch.Generator, device) -> torch.Tensor:
    return (low + (high - low) * torch.rand(n, generator=generator)).to(device)


class RandomShift:
    """DrQ's shift: replicate-pad by ``pad`` pixels, then crop the original size at a random integer offset."""

    def __init__(self, pad: int = 4):
        if not isinstance(pad, int) or pad < 1:
            raise ValueError(f"pad={pad!r} is invalid: must be an int >= 1")
        self.pad = pad

    def __call__(self, obs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        x, last = _bhwc(obs)
        b, h, w, _ = x.shape
        p = self.pad
        padded = F.pad(x.permute(0, 3, 1, 2).float(), (p, p, p, p), mode="replicate").permute(0, 2, 3, 1)
        dy = torch.randint(0, 2 * p + 1, (b,), generator=generator).to(x.device)
        dx = torch.randint(0, 2 * p + 1, (b,), generator=generator).to(x.device)
        rows = (torch.arange(h, device=x.device)[None, :] + dy[:, None])[:, :, None]
        cols = (torch.arange(w, device=x.device)[None, :] + dx[:, None])[:, None, :]
        out = padded[torch.arange(b, device=x.device)[:, None, None], rows, cols]
        return _back(out, last, obs)


class RandomCrop:
    """RAD's crop at fixed input size: a random ``scale``-sized window of each image, resized back (bilinear)."""

    def __init__(self, scale: float = 0.84):
        if not 0 < scale < 1:
            raise ValueError(f"scale={scale!r} is invalid: must be in (0, 1)")
        self.scale = float(scale)

    def __call__(self, obs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        x, last = _bhwc(obs)
        b, h, w, _ = x.shape
        ch, cw = max(1, round(h * self.scale)), max(1, round(w * self.scale))
        top = torch.randint(0, h - ch + 1, (b,), generator=generator).tolist()
        left = torch.randint(0, w - cw + 1, (b,), generator=generator).tolist()
        chw = x.permute(0, 3, 1, 2).float()
        crops = torch.stack([chw[i, :, t:t + ch, s:s + cw] for i, (t, s) in enumerate(zip(top, left))])
        out = F.interpolate(crops, size=(h, w), mode="bilinear", align_corners=False)
        return _back(out.permute(0, 2, 3, 1), last, obs)


class ColorJitter:
    """Per image: brightness (scale), contrast (towards the image mean) and, for RGB, saturation (towards
    grey), each factor uniform in [1 - s, 1 + s]; applied in that order, clipped to [0, 255]."""

    def __init__(self, brightness: float = 0.4, contrast: float = 0.4, saturation: float = 0.4):
        for name, v in (("brightness", brightness), ("contrast", contrast), ("saturation", saturation)):
            if not 0 <= v < 1:
                raise ValueError(f"{name}={v!r} is invalid: must be in [0, 1)")
        self.brightness, self.contrast, self.saturation = float(brightness), float(contrast), float(saturation)

    def __call__(self, obs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        x, last = _bhwc(obs)
        b, c = x.shape[0], x.shape[-1]
        x = x.float()
        view = (b, 1, 1, 1)
        x = x * _uniform(b, 1 - self.brightness, 1 + self.brightness, generator, x.device).view(view)
        x = x.clamp(0, 255)
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        x = (mean + (x - mean) * _uniform(b, 1 - self.contrast, 1 + self.contrast, generator, x.device).view(view))
        x = x.clamp(0, 255)
        sat = _uniform(b, 1 - self.saturation, 1 + self.saturation, generator, x.device).view(view)
        if c == 3:
            grey = (x * torch.tensor([0.299, 0.587, 0.114], device=x.device)).sum(-1, keepdim=True)
            x = (grey + (x - grey) * sat).clamp(0, 255)
        return _back(x, last, obs)


_CLASSES = {"random_shift": RandomShift, "random_crop": RandomCrop, "color_jitter": ColorJitter}


def make_augmentation(name: str, **kwargs):
    """The augmentation ``name`` (:data:`AUGMENTATIONS`) with its keyword arguments."""
    if name not in _CLASSES:
        raise ValueError(f"unknown augmentation {name!r}; allowed: {', '.join(AUGMENTATIONS)}")
    return _CLASSES[name](**kwargs)


__all__ = ["AUGMENTATIONS", "ColorJitter", "RandomCrop", "RandomShift", "make_augmentation"]
