"""The parts themselves: encoders (shapes, defaults, refusals) and pixel augmentations (shapes, dtype, seeded
determinism, hand-checked effects)."""

import numpy as np
import pytest
import torch

from echo_rl.environments.minigrid_vector import MiniGridObsEncoding
from echo_rl.models.augmentation import ColorJitter, RandomCrop, RandomShift, make_augmentation
from echo_rl.models.encoders import ImpalaCNN, MiniGridCNN, NatureCNN, default_encoder, make_encoder

SYMBOLIC = (MiniGridObsEncoding().size,)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def images(shape, seed=0):
    return torch.as_tensor(np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8))


# -- encoders ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, shape, out_dim", [
    ("mlp", (4,), 4), ("minigrid", SYMBOLIC, 128), ("minigrid_cnn", SYMBOLIC, 64 + 4 + MiniGridObsEncoding().mission_words),
    ("nature_cnn", (56, 56, 3), 512), ("nature_cnn", (4, 84, 84), 512),
    ("impala_cnn", (56, 56, 3), 256), ("impala_cnn", (4, 84, 84), 256)])
def test_encoders_map_a_batch_to_out_dim_features(name, shape, out_dim):
    enc = make_encoder(name, shape)
    obs = images((5, *shape)) if len(shape) == 3 else torch.randint(0, 3, (5, *shape), dtype=torch.uint8)
    assert enc.out_dim == out_dim and enc(obs).shape == (5, out_dim)


def test_pixel_encoders_read_hwc_and_chw_alike():
    torch.manual_seed(0)
    hwc = NatureCNN((56, 56, 3))
    torch.manual_seed(0)
    chw = NatureCNN((3, 56, 56))
    x = images((2, 56, 56, 3))
    assert torch.allclose(hwc(x), chw(x.permute(0, 3, 1, 2)))


def test_minigrid_cnn_sees_the_grid_direction_and_mission():
    enc = MiniGridCNN()
    obs = torch.zeros(2, *SYMBOLIC, dtype=torch.uint8)
    obs[1, 147] = 2  # direction
    out = enc(obs)
    assert torch.equal(out[0, 64:68], torch.tensor([1.0, 0, 0, 0])) and torch.equal(out[1, 64:68],
                                                                                  torch.tensor([0, 0, 1.0, 0]))


def test_default_encoders_and_refusals():
    assert default_encoder(SYMBOLIC, np.uint8, "minigrid") == "minigrid"
    assert default_encoder(SYMBOLIC, np.uint8, "mlp") == "mlp"
    assert default_encoder((4,), np.float32) == "mlp"
    assert default_encoder((84, 84, 3), np.uint8) == "nature_cnn"
    with pytest.raises(ValueError, match="nature_cnn needs images of at least 36x36 pixels, got 7x7"):
        NatureCNN((7, 7, 3))
    with pytest.raises(ValueError, match="encoder 'minigrid_cnn' reads MiniGrid's flat symbolic observation"):
        make_encoder("minigrid_cnn", (4,))
    with pytest.raises(ValueError, match="a pixel encoder needs image observations"):
        ImpalaCNN((4,))
    with pytest.raises(ValueError, match="unknown encoder 'vit'; allowed: mlp, minigrid"):
        make_encoder("vit", (4,))


# -- augmentations ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["random_shift", "random_crop", "color_jitter"])
@pytest.mark.parametrize("shape", [(6, 56, 56, 3), (6, 4, 84, 84)])
def test_augmentations_keep_shape_and_dtype_and_follow_the_generator(name, shape):
    aug, x = make_augmentation(name), images(shape)
    a, b, c = aug(x, gen(1)), aug(x, gen(1)), aug(x, gen(2))
    assert a.shape == x.shape and a.dtype == torch.uint8
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, x)


def test_random_shift_is_an_integer_shift_of_the_edge_padded_image():
    x = images((4, 12, 10, 3))
    out = RandomShift(pad=2)(x, gen(0))
    padded = np.pad(x.numpy(), ((0, 0), (2, 2), (2, 2), (0, 0)), mode="edge")
    for i in range(4):
        found = [(dy, dx) for dy in range(5) for dx in range(5)
                 if np.array_equal(out[i].numpy(), padded[i, dy:dy + 12, dx:dx + 10])]
        assert found, f"image {i} is no shift of its padded input"


def test_random_crop_and_jitter_hand_cases():
    flat = torch.full((3, 40, 40, 3), 90, dtype=torch.uint8)
    assert torch.equal(RandomCrop(0.5)(flat, gen(0)), flat)  # any window of a flat image, resized, is that image
    x = images((3, 40, 40, 3))
    assert torch.equal(ColorJitter(0, 0, 0)(x, gen(0)), x)  # all factors 1: unchanged
    grey = torch.full((2, 40, 40, 3), 100, dtype=torch.uint8)
    out = ColorJitter(brightness=0.5, contrast=0, saturation=0.5)(grey, gen(3))
    f = 0.5 + torch.rand(2, generator=gen(3))  # the brightness factors drawn first, uniform in [0.5, 1.5]
    expected = (100 * f).round().clamp(0, 255).to(torch.uint8)
    assert torch.equal(out[:, 0, 0, 0], expected) and (out == out[:, :1, :1, :1]).all()  # grey stays grey


def test_augmentation_refusals():
    with pytest.raises(ValueError, match="unknown augmentation 'mixup'; allowed: random_shift, random_crop"):
        make_augmentation("mixup")
    with pytest.raises(ValueError, match="augmentation needs a batch of images"):
        RandomShift()(torch.zeros(4, 7, dtype=torch.uint8), gen(0))
    with pytest.raises(ValueError, match="scale=1.5 is invalid"):
        RandomCrop(1.5)
