"""PPO's fast paths compute bit for bit what the plain code computes: foreach Adam, per-epoch gathers,
the flattened acting forward."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from echo_rl.algorithms.ppo import ppo_loss
from echo_rl.config import PPOConfig, TrainingConfig
from echo_rl.models.policies import EpsilonCategorical, make_actor_critic
from echo_rl.training.agents import build_agent
from echo_rl.vector.ppo_update import BASE_METRICS, Forward, PPOBatch, ppo_epochs
from echo_rl.vector.rollout import flat_forward


def _random_grads(params, g: torch.Generator) -> None:
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 10.0 ** torch.randint(-6, 2, (), generator=g).item()


def test_agents_foreach_adam_steps_like_single_tensor_adam():
    agent = build_agent(TrainingConfig(env_name="minigrid:MiniGrid-Empty-5x5-v0", agent="ppo", num_actors=2,
                                       batch_size=32, total_timesteps=64, policy_network="mlp", loggers=[]),
                        torch.device("cpu"))
    try:
        fast = agent.optimizer
        plain_net = copy.deepcopy(agent.network)
        plain = torch.optim.Adam(plain_net.parameters(), lr=fast.param_groups[0]["lr"], eps=1e-5, foreach=False)
        g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
        for i in range(60):
            _random_grads(agent.network.parameters(), g1)
            _random_grads(plain_net.parameters(), g2)
            for opt in (fast, plain):
                opt.param_groups[0]["lr"] = 1e-3 * (1 - i / 60)  # annealed, as PPO does
            fast.step(), plain.step()
        assert all(torch.equal(a, b) for a, b in zip(agent.network.parameters(), plain_net.parameters()))
    finally:
        agent.close()


def _plain_epochs(ppo, batch, obs, np_rng, net, opt):
    """ppo_epochs as it was written first: every minibatch indexes the rollout tensors with ``t[idx]``."""
    sums, count = torch.zeros(len(BASE_METRICS)), 0
    for _ in range(ppo.num_epochs):
        perm = np_rng.permutation(len(batch))
        for start in range(0, len(batch), ppo.batch_size):
            it = torch.as_tensor(perm[start:start + ppo.batch_size])
            logits, values = net(obs[it])
            t = ppo_loss(logits, values, batch.actions[it], batch.old_logprobs[it], batch.old_values[it],
                         batch.advantages[it], batch.returns[it], clip_epsilon=ppo.clip_epsilon,
                         value_loss_coef=ppo.value_loss_coef, entropy_coef=ppo.entropy_coef, kl_coef=ppo.kl_coef,
                         value_clip=ppo.value_clip, normalize_advantages=ppo.normalize_advantages)
            opt.zero_grad(set_to_none=True)
            t.loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(net.parameters(), ppo.max_grad_norm).detach()
            opt.step()
            sums += torch.stack([t.policy_loss.detach(), t.value_loss.detach(), t.entropy.detach(), t.approx_kl,
                                 t.clip_fraction, norm])
            count += 1
    return dict(zip(BASE_METRICS, (sums / count).tolist()))


def test_ppo_epochs_trains_like_indexing_every_minibatch():
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    n = 200  # not a multiple of the minibatch: the last slice is short
    obs = torch.as_tensor(rng.integers(0, 9, (n, 20)).astype(np.uint8))
    f = lambda: torch.as_tensor(rng.standard_normal(n).astype(np.float32))  # noqa: E731
    batch = PPOBatch(torch.as_tensor(rng.integers(0, 5, n)), f() - 1.6, f(), f(), f())
    ppo = PPOConfig(num_epochs=3, batch_size=64)
    nets = [make_actor_critic("mlp", 20, 5) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-5) for net in nets]

    def step(loss):
        opts[0].zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(nets[0].parameters(), ppo.max_grad_norm)
        opts[0].step()
        return norm.detach()

    seen = []

    def forward(idx, it):
        assert np.array_equal(idx, it.numpy())  # the caller's numpy and tensor indices agree
        seen.append(idx)
        return Forward(*nets[0](obs.index_select(0, it)))

    out = ppo_epochs(ppo, batch, np.random.default_rng(7), forward, step)
    plain = _plain_epochs(ppo, batch, obs, np.random.default_rng(7), nets[1], opts[1])
    assert out.minibatches == len(seen) == 12 and [len(i) for i in seen[:4]] == [64, 64, 64, 8]
    assert out.means == plain
    assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters()))


def test_ppo_batch_select_and_rows_are_the_indexed_rows():
    batch = PPOBatch(*(torch.arange(10) * k for k in range(1, 6)))
    index = torch.tensor([3, 1, 7])
    for picked, full in zip(batch.select(index)._fields(), batch._fields()):
        assert torch.equal(picked, full[index])
    assert [t.tolist() for t in batch.rows(2, 4)._fields()] == [[2 * k, 3 * k] for k in range(1, 6)]


def _obs(network: str, n: int = 8) -> torch.Tensor:
    from echo_rl.environments.minigrid_vector import make_minigrid_env

    env = make_minigrid_env("minigrid:MiniGrid-DoorKey-5x5-v0")
    rows = [env.reset(seed=s)[0] for s in range(n)]
    return torch.as_tensor(np.stack(rows))


@pytest.mark.parametrize("network", ["mlp", "minigrid"])
@pytest.mark.parametrize("distribution", [None, EpsilonCategorical(0.1)])
def test_flat_forward_is_the_networks_forward(network, distribution):
    torch.manual_seed(0)
    obs = _obs(network)
    net = make_actor_critic(network, obs.shape[1], 7)
    net.distribution = distribution
    forward = flat_forward(net)
    assert forward is not net  # the flattened path is the one under test
    with torch.no_grad():
        for got, want in zip(forward(obs), net(obs)):
            assert torch.equal(got, want)
    twin = copy.deepcopy(net)
    for model, run in ((net, forward), (twin, twin)):  # learning through it: the same gradients
        logits, values = run(obs)
        (torch.log_softmax(logits, -1)[:, 2].sum() + (values ** 2).mean()).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(net.parameters(), twin.parameters()))
    torch.optim.Adam(net.parameters(), lr=0.1).step()  # in place: the flattened forward reads the updated weights
    with torch.no_grad():
        for got, want in zip(forward(obs), net(obs)):
            assert torch.equal(got, want)


def test_flat_forward_keeps_the_module_calls_where_it_cannot_flatten():
    net = make_actor_critic("mlp", 10, 3)
    handle = net.actor[0].register_forward_hook(lambda *a: None)
    assert flat_forward(net) is net  # a hook would be skipped
    handle.remove()
    assert flat_forward(net) is not net
    net.critic[1] = torch.nn.ReLU()
    assert flat_forward(net) is net  # a layer it does not know
    other = torch.nn.Linear(4, 2)
    assert flat_forward(other) is other


def test_clip_grad_norm_is_torchs():
    from echo_rl.vector.actor_critic_agent import clip_grad_norm

    g = torch.Generator().manual_seed(5)
    for trial in range(40):
        nets = [make_actor_critic("mlp", 12, 4) for _ in range(2)]
        nets[1].load_state_dict(nets[0].state_dict())
        _random_grads(nets[0].parameters(), g)
        for a, b in zip(nets[0].parameters(), nets[1].parameters()):
            b.grad = a.grad.clone()
        if trial % 5 == 0:  # a parameter without a gradient is skipped alike
            next(nets[0].parameters()).grad = next(nets[1].parameters()).grad = None
        ours = clip_grad_norm(nets[0].parameters(), 0.5)
        theirs = torch.nn.utils.clip_grad_norm_(nets[1].parameters(), 0.5)
        assert torch.equal(ours, theirs)
        assert all((a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)
                   for a, b in zip(nets[0].parameters(), nets[1].parameters()))
    mixed = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, dtype=torch.float64))]
    for p in mixed:
        p.grad = torch.full_like(p, 2.0)
    assert torch.isclose(clip_grad_norm(mixed, 1.0), torch.tensor(2 * 5 ** 0.5, dtype=torch.float64))  # torch's path
