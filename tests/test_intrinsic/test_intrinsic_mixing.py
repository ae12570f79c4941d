"""IntrinsicMixer: r_ext + beta * (1 - kappa)^step * r_int / std(discounted intrinsic return)."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from echo_rl.intrinsic import IntrinsicMixer, PseudoCounts


def mixer(**kw) -> IntrinsicMixer:
    return IntrinsicMixer(PseudoCounts(gym.spaces.Box(0, 255, (2,), np.uint8), gym.spaces.Discrete(2)), **kw)


def test_unnormalised_mix_decays_beta():
    m = mixer(beta=0.5, kappa=0.1, normalize=False)
    ext = np.array([[1.0, 0.0]], dtype=np.float32)
    out = m.mix(ext, torch.tensor([[2.0, 4.0]]), global_step=2)
    # beta_2 = 0.5 * 0.9^2 = 0.405
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[1 + 0.405 * 2, 0.405 * 4]], rtol=1e-6)
    assert m.weight(0) == 0.5 and m.weight(10) == pytest.approx(0.5 * 0.9 ** 10)
    assert mixer(beta=0.5, kappa=0.0).weight(10 ** 6) == 0.5


def test_normalises_by_running_std_of_discounted_intrinsic_returns():
    m = mixer(beta=1.0, kappa=0.0, gamma=0.5)
    out = m.mix(np.zeros((2, 1)), torch.tensor([[2.0], [2.0]]), global_step=0)
    # returns R_1 = 2, R_2 = 0.5 * 2 + 2 = 3: std = 0.5, so each bonus 2 becomes 4
    np.testing.assert_allclose(out, [[4.0], [4.0]], rtol=1e-3)
    assert out.dtype == np.float64  # the extrinsic reward's float dtype is kept
    m.mix(np.zeros((1, 1)), torch.tensor([[0.0]]), global_step=1)
    np.testing.assert_allclose(m.returns, [1.5])  # carried across rollouts, never reset
    np.testing.assert_allclose(float(m.return_rms.mean), (2 + 3 + 1.5) / 3, rtol=1e-4)


def test_scale_of_the_bonus_does_not_change_the_mix():
    a, b = mixer(beta=0.2), mixer(beta=0.2)
    r = torch.rand(8, 3, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(a.mix(np.zeros((8, 3)), r, 0), b.mix(np.zeros((8, 3)), 1000 * r, 0), rtol=1e-4)


def test_state_dict_round_trips_with_the_module():
    a = mixer(beta=0.3, kappa=0.01)
    a.module.compute(torch.zeros(3, 2, 2, dtype=torch.uint8), torch.zeros(3, 2), torch.ones(3, 2, 2, dtype=torch.uint8),
                     torch.zeros(3, 2, dtype=torch.bool))
    a.mix(np.zeros((3, 2)), torch.rand(3, 2), global_step=0)
    b = mixer(beta=0.3, kappa=0.01)
    b.load_state_dict(a.state_dict())
    r = torch.rand(3, 2)
    np.testing.assert_array_equal(a.mix(np.ones((3, 2)), r, 5), b.mix(np.ones((3, 2)), r, 5))
    assert b.module.counts == a.module.counts
    with pytest.raises(ValueError, match="state lacks"):
        b.load_state_dict({"returns": None})


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="kappa"):
        mixer(kappa=1.5)
    m = mixer()
    with pytest.raises(ValueError, match=r"must both be \(T, N\)"):
        m.mix(np.zeros((4, 2)), torch.zeros(4, 3), 0)
    with pytest.raises(ValueError, match="global_step=-1"):
        m.mix(np.zeros((4, 2)), torch.zeros(4, 2), -1)
    m.mix(np.zeros((4, 2)), torch.zeros(4, 2), 0)
    with pytest.raises(ValueError, match="was run with 2 envs and now gets 3"):
        m.mix(np.zeros((4, 3)), torch.zeros(4, 3), 0)


def test_pretraining_uses_the_bonus_alone_and_hands_its_state_to_fine_tuning():
    pre = mixer(beta=1.0, normalize=False, pretraining=True)
    out = pre.mix(np.array([[5.0, -1.0]]), torch.tensor([[0.25, 0.5]]), global_step=0)
    np.testing.assert_allclose(out, [[0.25, 0.5]])
    pre_norm = mixer(beta=1.0, gamma=0.5, pretraining=True)
    pre_norm.mix(np.ones((2, 1)), torch.tensor([[2.0], [2.0]]), global_step=0)
    fine = mixer(beta=1.0, gamma=0.5)
    fine.load_state_dict(pre_norm.state_dict())
    out = fine.mix(np.ones((1, 1)), torch.tensor([[0.0]]), global_step=0)
    np.testing.assert_allclose(fine.returns, [1.5])  # the intrinsic return carried over from pre-training
    np.testing.assert_allclose(out, [[1.0]])  # extrinsic back in, zero bonus
