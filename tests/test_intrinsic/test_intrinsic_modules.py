"""The shared contract: registry, shapes, training, state dicts, image observations, bad input."""
import copy
import io

import gymnasium as gym
import numpy as np
import pytest
import torch

from echo_rl.intrinsic import INTRINSIC_REWARDS, IntrinsicReward, make_intrinsic_reward

SMALL = {"latent_dim": 16, "hidden": 32}
TRAINED = {"rnd": ("rnd_loss",), "icm": ("total_loss", "inverse_loss"), "e3b": ("inverse_loss",),
           "ride": ("total_loss", "inverse_loss"), "ngu": ("inverse_loss", "rnd_loss")}


def build(name, obs_space, act_space, **kw):
    kw = {**({} if name == "pseudo_counts" else SMALL), **kw}
    return make_intrinsic_reward(name, obs_space, act_space, "cpu", **kw)


def test_registry_names_and_errors():
    assert sorted(INTRINSIC_REWARDS) == sorted(["rnd", "icm", "re3", "e3b", "ride", "ngu", "pseudo_counts"])
    space, acts = gym.spaces.Box(0, 255, (4,), np.uint8), gym.spaces.Discrete(2)
    with pytest.raises(ValueError, match="unknown intrinsic reward 'curiosity'; allowed: rnd, icm, re3, e3b, ride"):
        make_intrinsic_reward("curiosity", space, acts, "cpu")
    with pytest.raises(ValueError, match=r"rnd: unknown hyperparameters \['ridge'\]; allowed: latent_dim, hidden"):
        make_intrinsic_reward("rnd", space, acts, "cpu", ridge=0.1)
    with pytest.raises(ValueError, match="Box observation space"):
        make_intrinsic_reward("icm", gym.spaces.Discrete(5), acts, "cpu")
    with pytest.raises(ValueError, match=r"observation shape \(2, 2\) is not supported"):
        make_intrinsic_reward("icm", gym.spaces.Box(0, 1, (2, 2)), acts, "cpu")
    with pytest.raises(ValueError, match="Discrete or a 1-D Box"):
        make_intrinsic_reward("icm", space, gym.spaces.MultiDiscrete([2, 2]), "cpu")


@pytest.mark.parametrize("name", sorted(INTRINSIC_REWARDS))
def test_compute_shape_dtype_and_no_grad(name, rollout):
    obs_space, act_space, batch = rollout
    module = build(name, obs_space, act_space)
    assert isinstance(module, IntrinsicReward)
    r = module.compute(*batch)
    assert r.shape == (16, 4) and r.dtype == torch.float32 and not r.requires_grad
    assert torch.isfinite(r).all() and (r >= 0).all()
    with pytest.raises(ValueError, match="next_obs has shape"):
        module.compute(batch[0], batch[1], batch[2][:, :, :5], batch[3])
    with pytest.raises(ValueError, match="actions have shape"):
        module.compute(batch[0], batch[1][:3], batch[2], batch[3])


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_update_reduces_its_loss_on_a_fixed_batch(name, rollout):
    obs_space, act_space, batch = rollout
    extra = {"rnd_lr": 3e-3} if name == "ngu" else {}
    module = build(name, obs_space, act_space, batch_size=64, lr=3e-3, **extra)
    history = [module.update(*batch) for _ in range(40)]
    for metric in TRAINED[name]:
        assert history[-1][metric] < 0.7 * history[0][metric], (metric, [h[metric] for h in history])


@pytest.mark.parametrize("name", sorted(INTRINSIC_REWARDS))
def test_state_dict_round_trips_through_torch_save(name, rollout):
    obs_space, act_space, (obs, actions, next_obs, dones) = rollout
    first = (obs[:8], actions[:8], next_obs[:8], dones[:8])
    second = (obs[8:], actions[8:], next_obs[8:], dones[8:])
    a = build(name, obs_space, act_space, seed=0)
    a.compute(*first)
    a.update(*first)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = build(name, obs_space, act_space, seed=7)  # different weights until loaded
    b.load_state_dict(torch.load(buf, weights_only=True))  # plain tensors and primitives only
    torch.testing.assert_close(a.compute(*second), b.compute(*second))
    assert a.update(*second) == b.update(*second)
    torch.testing.assert_close(a.compute(*first), b.compute(*first))
    with pytest.raises(ValueError, match="state lacks"):
        b.load_state_dict({})


@pytest.mark.parametrize("name", sorted(INTRINSIC_REWARDS))
def test_image_observations_use_the_cnn(name):
    space, acts = gym.spaces.Box(0, 255, (3, 16, 16), np.uint8), gym.spaces.Discrete(4)
    g = np.random.default_rng(1)
    obs = torch.as_tensor(g.integers(0, 256, (6, 2, 3, 16, 16), dtype=np.uint8))
    batch = (obs[:-1], torch.as_tensor(g.integers(0, 4, (5, 2))), obs[1:], torch.zeros(5, 2, dtype=torch.bool))
    module = build(name, space, acts)
    assert module.compute(*batch).shape == (5, 2)
    assert isinstance(module.update(*batch), dict)
    if name != "pseudo_counts":
        convs = [m for m in copy.copy(module._nets).values() for m in m.modules() if isinstance(m, torch.nn.Conv2d)]
        assert convs, f"{name} built no CNN for image observations"


@pytest.mark.parametrize("name", ["icm", "e3b", "ride"])
def test_continuous_actions(name, rollout):
    obs_space, _, (obs, _, next_obs, dones) = rollout
    module = build(name, obs_space, gym.spaces.Box(-1, 1, (2,), np.float32))
    actions = torch.rand(16, 4, 2) * 2 - 1
    assert module.compute(obs, actions, next_obs, dones).shape == (16, 4)
    assert "inverse_loss" in module.update(obs, actions, next_obs, dones)


def test_episodic_modules_refuse_a_changed_env_count(rollout):
    obs_space, act_space, (obs, actions, next_obs, dones) = rollout
    for name in ("e3b", "ride", "ngu"):
        module = build(name, obs_space, act_space)
        module.compute(obs, actions, next_obs, dones)
        with pytest.raises(ValueError, match="was run with 4 envs and now gets 2"):
            module.compute(obs[:, :2], actions[:, :2], next_obs[:, :2], dones[:, :2])


def test_construction_leaves_the_global_rng_alone():
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    build("rnd", gym.spaces.Box(0, 255, (4,), np.uint8), gym.spaces.Discrete(2))
    torch.testing.assert_close(torch.rand(3), expected)


def test_rnd_bonus_separates_trained_states_from_new_ones(rollout):
    obs_space, act_space, batch = rollout
    rnd = build("rnd", obs_space, act_space, lr=3e-3, batch_size=64)
    for _ in range(60):
        rnd.update(*batch)
    g = np.random.default_rng(5)
    unseen = torch.as_tensor(g.integers(0, 6, (16, 4, 8), dtype=np.uint8))
    seen_bonus = rnd.compute(*batch).mean()
    new_bonus = rnd.compute(batch[0], batch[1], unseen, batch[3]).mean()
    assert new_bonus > 1.5 * seen_bonus, (float(seen_bonus), float(new_bonus))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", sorted(INTRINSIC_REWARDS))
def test_runs_on_cuda_and_matches_cpu(name, rollout):
    obs_space, act_space, batch = rollout
    cpu = build(name, obs_space, act_space)
    gpu = make_intrinsic_reward(name, obs_space, act_space, "cuda", **({} if name == "pseudo_counts" else SMALL))
    r_cpu, r_gpu = cpu.compute(*batch), gpu.compute(*batch)
    assert r_gpu.device.type == "cuda"
    torch.testing.assert_close(r_gpu.cpu(), r_cpu, rtol=1e-3, atol=1e-4)
    assert gpu.update(*batch).keys() == cpu.update(*batch).keys()
