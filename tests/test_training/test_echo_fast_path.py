"""The EchoRL vector agent's heads on PPO's flat forward path (``rollout.flat_heads``): the same floats and
gradients as the module calls, rebuilt when the heads, the distribution or hooks change."""

import pytest
import torch

from echo_rl.models.policies import TemperedCategorical

from test_echo_agent import make_agent


def _outputs_and_grads(agent, obs):
    m = agent.model
    m.lpo.optimizer.zero_grad(set_to_none=True)
    logits, values, _ = m.heads(obs, None, None)
    (logits.square().sum() + values.sum()).backward()
    grads = [None if p.grad is None else p.grad.clone() for p in m.lpo.policy.parameters()]
    return logits.detach(), values.detach(), grads


def test_heads_on_the_flat_path_give_the_module_calls_floats_and_gradients():
    agent = make_agent(**{"echo_config.latent_plan": False})
    agent.train_iteration()  # trained weights, not the zero-initialised ones
    m, obs = agent.model, torch.as_tensor(agent.collect().obs[0])
    assert m._flat_heads is not None
    flat = _outputs_and_grads(agent, obs)
    m._flat_heads = None  # the module calls
    modules = _outputs_and_grads(agent, obs)
    assert torch.equal(flat[0], modules[0]) and torch.equal(flat[1], modules[1])
    assert all(torch.equal(a, b) for a, b in zip(flat[2], modules[2]) if a is not None)


def test_a_new_distribution_and_a_hook_are_seen():
    agent = make_agent()
    m = agent.model
    obs = torch.as_tensor(agent.collect().obs[0])
    plain, _, _ = m.heads(obs, None, None)
    agent.set(distribution=TemperedCategorical(2.0))
    tempered, _, _ = m.heads(obs, None, None)
    torch.testing.assert_close(tempered, torch.log_softmax(plain / 2.0, -1))
    calls = []
    m.lpo.policy.policy_head.register_forward_hook(lambda *_: calls.append(1))
    agent.train_iteration()  # an iteration rebuilds the flat path: a hooked head goes through its module call
    assert calls and m._flat_heads is None


def test_acting_refuses_a_diverged_policy_in_one_line():
    agent = make_agent()
    with torch.no_grad():
        agent.model.lpo.policy.policy_head[-1].bias.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN or inf"):
        agent.collect()
