"""Each module against its paper's formula on a case small enough to work out by hand."""
import math

import gymnasium as gym
import pytest
import torch
from intrinsic_helpers import linear, steps, vector_space

from echo_rl.intrinsic import E3B, ICM, NGU, RE3, RIDE, RND, PseudoCounts
from echo_rl.intrinsic.ngu import episodic_kernel_bonus

D2, A2 = vector_space(2), gym.spaces.Discrete(2)


def _no_dones(t, n=1):
    return torch.zeros(t, n, dtype=torch.bool)


def test_rnd_bonus_is_squared_error_between_fixed_target_and_predictor():
    rnd = RND(D2, A2, obs_norm=False)
    rnd.target = linear([[1, 0], [0, 1]])  # f(x) = x
    rnd.predictor = linear([[0, 0], [0, 0]], [1, -1])  # f_hat(x) = (1, -1)
    nxt = steps((1, 2), (4, 1))
    r = rnd.compute(nxt, torch.zeros(2, 1), nxt, _no_dones(2))
    # (1-1)^2 + (2+1)^2 = 9 ; (4-1)^2 + (1+1)^2 = 13
    assert r.dtype == torch.float32 and r.shape == (2, 1)
    assert r[:, 0].tolist() == pytest.approx([9.0, 13.0])


def test_rnd_normalises_observations_with_running_stats():
    rnd = RND(D2, A2, obs_norm=True)
    rnd.target = linear([[1, 0]])
    rnd.predictor = linear([[0, 1]], [0.5])
    rnd.obs_rms.mean = torch.tensor([1.0, 1.0])
    rnd.obs_rms.var = torch.tensor([4.0, 4.0])
    nxt = steps((1, 2), (31, 1))
    r = rnd.compute(nxt, torch.zeros(2, 1), nxt, _no_dones(2))
    # x = (s - 1) / 2: (0, 0.5) -> (0 - 1.0)^2 = 1 ; (15 -> clipped to 5, 0) -> (5 - 0.5)^2 = 20.25
    assert r[:, 0].tolist() == pytest.approx([1.0, 20.25], rel=1e-5)


def test_icm_bonus_is_half_eta_forward_error_in_feature_space():
    icm = ICM(D2, A2, eta=2.0)
    icm.dynamics.encoder = linear([[1, 0], [0, 1]])
    icm.dynamics.forward.net = linear([[1, 0, 1, 0], [0, 1, 0, 2]])  # phi + (a0, 2 a1), a one-hot
    obs, nxt = steps((1, 1), (0, 0)), steps((2, 3), (1, 0))
    r = icm.compute(obs, torch.tensor([[1], [0]]), nxt, _no_dones(2))
    # pred (1, 3) vs (2, 3): eta/2 * 1 = 1 ; pred (1, 0) vs (1, 0): 0
    assert r[:, 0].tolist() == pytest.approx([1.0, 0.0])


@pytest.mark.parametrize("k, distances", [(1, [1, 1, 2, 2]), (2, [2, 2, math.sqrt(5), 3])])
def test_re3_bonus_is_log_of_kth_neighbour_distance(k, distances):
    re3 = RE3(D2, A2, k=k)
    re3.encoder = linear([[1, 0], [0, 1]])
    pts = torch.tensor([[[0, 0], [1, 0]], [[0, 2], [3, 0]]], dtype=torch.uint8)  # (T=2, N=2): 4 points
    r = re3.compute(pts, torch.zeros(2, 2), pts, _no_dones(2, 2))
    assert r.reshape(-1).tolist() == pytest.approx([math.log(d + 1) for d in distances], rel=1e-6)


def test_re3_needs_more_states_than_k():
    re3 = RE3(D2, A2, k=3)
    pts = steps((0, 0), (1, 1), (2, 2))
    with pytest.raises(ValueError, match="k=3 needs at least 4 states"):
        re3.compute(pts, torch.zeros(3, 1), pts, _no_dones(3))


def test_e3b_bonus_is_elliptical_norm_and_resets_per_episode():
    e3b = E3B(D2, A2, latent_dim=2, ridge=0.1)
    e3b.dynamics.encoder = linear([[1, 0], [0, 1]])
    obs = steps((0, 1), (1, 0), (1, 0), (2, 0))
    nxt = steps((1, 0), (1, 0), (0, 1), (1, 0))
    dones = torch.tensor([[False], [False], [True], [False]])
    r = e3b.compute(obs, torch.zeros(4, 1), nxt, dones)
    # C starts as 0.1 I + e2 e2^T (the episode's first obs) = diag(0.1, 1.1): b((1,0)) = 1/0.1 = 10
    # then diag(1.1, 1.1): 1/1.1 ; then diag(2.1, 1.1): b((0,1)) = 1/1.1 ; episode ends.
    # new episode seeded with (2,0): diag(4.1, 0.1): b((1,0)) = 1/4.1
    assert r[:, 0].tolist() == pytest.approx([10, 1 / 1.1, 1 / 1.1, 1 / 4.1], rel=1e-5)


def test_e3b_matches_the_explicit_inverse_on_random_embeddings():
    g = torch.Generator().manual_seed(0)
    e3b = E3B(vector_space(3), A2, latent_dim=3, ridge=0.5)
    e3b.dynamics.encoder = linear([[1, 0, 0], [0, 1, 0], [0, 0, 1]])
    seq = torch.randint(0, 5, (7, 1, 3), generator=g, dtype=torch.uint8)
    r = e3b.compute(seq[:-1], torch.zeros(6, 1), seq[1:], _no_dones(6))
    phis = seq[:, 0].double()
    for t in range(6):
        cov = 0.5 * torch.eye(3, dtype=torch.float64) + phis[:t + 1].T @ phis[:t + 1]
        expected = phis[t + 1] @ torch.linalg.inv(cov) @ phis[t + 1]
        assert float(r[t, 0]) == pytest.approx(float(expected), rel=1e-4)


def test_ride_bonus_is_impact_over_sqrt_episodic_count():
    ride = RIDE(D2, A2)
    ride.dynamics.encoder = linear([[1, 0], [0, 1]])
    obs = steps((0, 0), (1, 0), (0, 0), (1, 0))
    nxt = steps((1, 0), (0, 0), (1, 0), (1, 1))
    r = ride.compute(obs, torch.zeros(4, 1), nxt, _no_dones(4))
    # (0,0) counted at the episode start; impacts are all 1; counts of next: 1, 2, 2, 1
    assert r[:, 0].tolist() == pytest.approx([1, 1 / math.sqrt(2), 1 / math.sqrt(2), 1], rel=1e-6)
    ride2 = RIDE(D2, A2)
    ride2.dynamics.encoder = linear([[1, 0], [0, 1]])
    dones = torch.tensor([[False], [True], [False], [False]])
    r2 = ride2.compute(obs, torch.zeros(4, 1), nxt, dones)
    assert r2[:, 0].tolist() == pytest.approx([1, 1 / math.sqrt(2), 1, 1], rel=1e-6)  # counts reset after t=1


def test_ngu_kernel_formula_on_a_given_memory():
    d2 = torch.tensor([0.0, 1.0, 4.0])  # squared distances to the 3 nearest neighbours
    r = episodic_kernel_bonus(d2, dm2=2.0, eps=1e-3, xi=0.008, c=1e-3, s_max=8.0)
    kernels = [1e-3 / (0 + 1e-3), 1e-3 / (0.5 - 0.008 + 1e-3), 1e-3 / (2.0 - 0.008 + 1e-3)]
    assert float(r) == pytest.approx(1 / (math.sqrt(sum(kernels)) + 1e-3), rel=1e-6)
    crowded = episodic_kernel_bonus(torch.zeros(100), dm2=1.0)  # s = sqrt(100) + c > s_max = 8
    assert float(crowded) == 0.0


def test_ngu_episodic_memory_on_a_hand_sequence():
    ngu = NGU(D2, A2, latent_dim=2, k=2, max_modulation=1.0)  # L = 1: the RND modulator is exactly 1
    ngu.dynamics.encoder = linear([[1, 0], [0, 1]])
    obs = steps((0, 0), (1, 0), (1, 0))
    nxt = steps((1, 0), (1, 0), (3, 0))
    r = ngu.compute(obs, torch.zeros(3, 1), nxt, _no_dones(3))

    def ep(d2s, dm2):
        ks = [1e-3 / (max(d / dm2 - 0.008, 0) + 1e-3) for d in d2s]
        return 1 / (math.sqrt(sum(ks)) + 1e-3)

    # memory {(0,0)}: d2 = [1], d_m^2 = 1 | memory {(0,0),(1,0)}: d2 = [0, 1], d_m^2 = 2/3
    # memory {(0,0),(1,0),(1,0)}: d2 = [4, 4], d_m^2 = (1 + 0 + 1 + 4 + 4) / 5 = 2
    assert r[:, 0].tolist() == pytest.approx([ep([1], 1), ep([0, 1], 2 / 3), ep([4, 4], 2)], rel=1e-5)


def test_ngu_lifelong_modulator_scales_episodic_bonus(rollout):
    obs_space, act_space, batch = rollout
    plain = NGU(obs_space, act_space, max_modulation=1.0, hidden=32)
    modulated = NGU(obs_space, act_space, max_modulation=5.0, hidden=32)
    episodic, r = plain.compute(*batch), modulated.compute(*batch)
    err = modulated.rnd.prediction_error(batch[2].float())
    alpha = 1 + (err - err.mean()) / err.std(unbiased=False)
    torch.testing.assert_close(r, episodic * alpha.clamp(1, 5), rtol=1e-3, atol=1e-5)
    assert (r >= episodic - 1e-6).all() and (r <= 5 * episodic + 1e-6).all()


def test_pseudo_counts_pay_one_over_sqrt_visits_per_hash():
    pc = PseudoCounts(D2, A2, hash_bits=2)
    pc.projection = torch.eye(2)  # phi(s) = sgn(s): (1,1) and (2,3) share a code, (0,1) does not
    nxt = steps((1, 1), (2, 3), (0, 1), (1, 1))
    r = pc.compute(nxt, torch.zeros(4, 1), nxt, _no_dones(4))
    assert r[:, 0].tolist() == pytest.approx([1, 1 / math.sqrt(2), 1, 1 / math.sqrt(3)])
    again = pc.compute(steps((5, 5)), torch.zeros(1, 1), steps((5, 5)), _no_dones(1))
    assert float(again) == pytest.approx(0.5)  # counts are lifelong: 4th visit
    assert pc.update(nxt, torch.zeros(4, 1), nxt, _no_dones(4)) == {"distinct_hashes": 2.0}
