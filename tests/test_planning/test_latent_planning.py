import numpy as np
import pytest
import torch
from torch.distributions import Independent, Normal, kl_divergence

from echo_rl.config import ConfigError, PlanningConfig
from echo_rl.kernels.planning import temporal_kl_batch
from echo_rl.planning import (
    LatentPlanningOptimizer,
    PlanDistribution,
    PolicyNetwork,
    StateWindow,
    TrajectoryEncoder,
    consecutive_plan_kl,
    gaussian_kl,
)

CFG = PlanningConfig(embedding_dim=6, state_window_size=4)


def _dist(gen, shape):
    return PlanDistribution(torch.randn(shape, generator=gen), 0.5 * torch.randn(shape, generator=gen))


def test_kl_matches_torch_distributions():
    gen = torch.Generator().manual_seed(0)
    p, q = _dist(gen, (5, 6)), _dist(gen, (5, 6))
    ref = kl_divergence(Independent(Normal(p.mean, p.std), 1), Independent(Normal(q.mean, q.std), 1))
    torch.testing.assert_close(gaussian_kl(p, q), ref)
    assert torch.all(gaussian_kl(p, p).abs() < 1e-6)
    # the numpy kernel (log-variance parameterisation) agrees
    k = temporal_kl_batch(p.mean.numpy(), 2 * p.log_std.numpy(), q.mean.numpy(), 2 * q.log_std.numpy())
    np.testing.assert_allclose(k, ref.numpy(), rtol=1e-5)


def test_encoder_kl_matches_torch_on_real_plans():
    torch.manual_seed(1)
    enc = TrajectoryEncoder(3, CFG)
    w = torch.randn(7, 5, 3)
    m = torch.ones(7, 5, dtype=torch.bool)
    cur, prev = enc(w[:, 1:], m[:, 1:]), enc(w[:, :-1], m[:, :-1])
    ref = kl_divergence(Independent(Normal(cur.mean, cur.std), 1), Independent(Normal(prev.mean, prev.std), 1))
    opt = LatentPlanningOptimizer(3, 2, CFG)
    opt.encoder.load_state_dict(enc.state_dict())
    torch.testing.assert_close(opt.kl_loss(w, m), ref.mean())


def test_consecutive_kl_skips_pairs_across_episode_start():
    gen = torch.Generator().manual_seed(2)
    p, q = _dist(gen, (4, 6)), _dist(gen, (4, 6))
    same = torch.tensor([1.0, 0.0, 1.0, 0.0])
    full = gaussian_kl(p, q)
    assert torch.isclose(consecutive_plan_kl(p, q, same), (full[0] + full[2]) / 2)
    assert consecutive_plan_kl(p, q, torch.zeros(4)) == 0


def test_plan_ignores_states_of_other_episodes():
    torch.manual_seed(3)
    enc = TrajectoryEncoder(3, CFG)
    w = torch.randn(2, 4, 3)
    m = torch.tensor([[False, False, True, True]] * 2)
    w2 = w.clone()
    w2[:, :2] = 100 * torch.randn(2, 2, 3)  # change only the previous episode's states
    a, b = enc(w, m), enc(w2, m)
    torch.testing.assert_close(a.mean, b.mean)
    torch.testing.assert_close(a.log_std, b.log_std)
    w3 = w.clone()
    w3[:, 2] += 1.0  # a valid state does matter
    assert not torch.allclose(enc(w3, m).mean, a.mean)


def test_state_window_clears_at_episode_start():
    sw = StateWindow(num_envs=2, state_dim=1, window=3)
    sw.push(np.array([[1.0], [1.0]]), [True, True])
    sw.push(np.array([[2.0], [2.0]]), [False, False])
    w, m = sw.push(np.array([[3.0], [9.0]]), [False, True])
    assert m.tolist() == [[True, True, True], [False, False, True]]
    assert w[0, :, 0].tolist() == [1.0, 2.0, 3.0]
    assert w[1, :, 0].tolist() == [0.0, 0.0, 9.0]
    w, m = sw.push(np.array([[4.0], [10.0]]), [False, False])
    assert w[0, :, 0].tolist() == [2.0, 3.0, 4.0] and m[1].tolist() == [False, True, True]


def test_policy_alpha_zero_ignores_plan_and_film_changes_output():
    torch.manual_seed(4)
    s = torch.randn(3, 5)
    pol0 = PolicyNetwork(5, 4, 6, hidden_dim=16, alpha=0.0)
    assert torch.equal(pol0(s, torch.randn(3, 6))[0], pol0(s, torch.randn(3, 6))[0])
    pol = PolicyNetwork(5, 4, 6, hidden_dim=16, alpha=0.5)
    torch.nn.init.normal_(pol.film.weight)
    torch.nn.init.normal_(pol.policy_head.weight)
    assert not torch.allclose(pol(s, torch.randn(3, 6))[0], pol(s, torch.randn(3, 6))[0])


def test_optimizer_groups_use_planning_lr_and_reproduce_plans():
    cfg = PlanningConfig(embedding_dim=4, state_window_size=2, learning_rate=1e-3)
    opt = LatentPlanningOptimizer(3, 2, cfg, policy_lr=2e-4)
    lrs = {g["name"]: g["lr"] for g in opt.optimizer.param_groups}
    assert lrs == {"policy": 2e-4, "encoder": 1e-3}
    s, w, m, eps = torch.randn(5, 3), torch.randn(5, 2, 3), torch.ones(5, 2), torch.randn(5, 4)
    a = opt.forward(s, w, m, eps)
    b = opt.forward(s, w, m, eps)
    torch.testing.assert_close(a[0], b[0])
    loss = a[0].logsumexp(-1).mean() + opt.kl_loss(torch.randn(5, 3, 3), torch.ones(5, 3))
    stats = opt.step(loss)
    assert stats["grad_norm_encoder"] > 0


def test_kl_training_pulls_consecutive_plans_together():
    torch.manual_seed(5)
    cfg = PlanningConfig(embedding_dim=4, state_window_size=2, learning_rate=1e-2)
    opt = LatentPlanningOptimizer(3, 2, cfg)
    w, m = torch.randn(64, 3, 3), torch.ones(64, 3)
    before = opt.kl_loss(w, m).item()
    for _ in range(50):
        opt.step(opt.kl_loss(w, m))
    assert opt.kl_loss(w, m).item() < 0.5 * before


def test_plan_surprise_against_ema():
    opt = LatentPlanningOptimizer(3, 2, PlanningConfig(embedding_dim=2, state_window_size=1, ema_decay=0.5))
    s = opt.plan_surprise(np.array([[1.0, 0.0], [-1.0, 0.0]]))
    assert s.tolist() == [1.0, 1.0]  # EMA starts at the first batch mean (0, 0)
    s = opt.plan_surprise(np.array([[2.0, 2.0]]))  # EMA now (0,0) -> compare, then (1,1)
    assert s.tolist() == [8.0]
    assert opt.ema_plan.mean.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("kwargs,field", [({"state_window_size": 0}, "state_window_size"),
                                          ({"kl_weight": -0.1}, "kl_weight")])
def test_bad_planning_config_is_one_line_error(kwargs, field):
    with pytest.raises(ConfigError) as e:
        PlanningConfig(**kwargs)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_bad_sizes_raise():
    with pytest.raises(ConfigError, match="state_dim"):
        TrajectoryEncoder(0, CFG)
    with pytest.raises(ConfigError, match="state_window_size"):
        StateWindow(2, 3, 0)
    with pytest.raises(ValueError, match="states must be"):
        TrajectoryEncoder(3, CFG)(torch.zeros(2, 3, 3), torch.ones(2, 3))
