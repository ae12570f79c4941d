"""A new on-policy vector algorithm: one agent file plus a pure loss (docs/architecture.md, "Extending EchoRL").

A2C (Mnih et al. 2016, synchronous): one gradient step per rollout on GAE advantages, no ratio
clipping, no epochs. ``ActorCriticAgent`` (PPO's and IMPALA's scaffolding) already acts, collects
rollouts, anneals the learning rate and checkpoints; the agent writes only ``learn``.
``register_agent`` makes ``--agent a2c`` valid in ``echo-rl train`` and ``TrainingConfig``;
``register_trained`` makes ``a2c`` a benchmark method.
"""

import torch

from echo_rl.algorithms.gae import bootstrap_values, compute_gae
from echo_rl.evaluation.methods import register_trained
from echo_rl.vector.actor_critic_agent import ActorCriticAgent
from echo_rl.training.agents import register_agent


def a2c_loss(logits, values, actions, advantages, returns, *, value_coef: float, entropy_coef: float):
    """Policy gradient + value regression - entropy bonus, as a pure function of tensors."""
    logp = torch.log_softmax(logits, -1)
    chosen = logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1).mean()
    policy_loss = -(advantages * chosen).mean()
    value_loss = 0.5 * ((values - returns) ** 2).mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    return loss, {"loss/policy": policy_loss.item(), "loss/value": value_loss.item(), "loss/entropy": entropy.item()}


class A2CAgent(ActorCriticAgent):
    def learn(self, buf) -> dict[str, float]:
        cfg = self.ppo  # gamma, gae_lambda, value_loss_coef, entropy_coef, max_grad_norm, learning_rate
        next_values = bootstrap_values(buf.values, self._value(self.collector.next_obs), buf.terminated,
                                       buf.truncated, buf.final_values)
        advantages, returns = compute_gae(buf.rewards, buf.values, next_values, buf.terminated | buf.truncated,
                                          cfg.gamma, cfg.gae_lambda)
        flat = lambda a: torch.as_tensor(a.reshape(-1, *a.shape[2:]), device=self.device)  # noqa: E731
        logits, values = self.network(flat(buf.obs))
        loss, metrics = a2c_loss(logits, values, flat(buf.actions), flat(advantages), flat(returns),
                                 value_coef=cfg.value_loss_coef, entropy_coef=cfg.entropy_coef)
        self.anneal_lr()
        grad_norm = self.clipped_step(loss)
        self.updates += 1
        return {**metrics, "loss/grad_norm": float(grad_norm)}


register_agent("a2c", A2CAgent)
register_trained("a2c", description="A2C (synchronous advantage actor-critic) trained by EchoRLTrainer")
