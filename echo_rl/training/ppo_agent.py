"""PPO for vector environments (CleanRL-style, with truncation bootstrapping).

The agent interface and the scaffolding (network, acting, rollouts,
checkpoints) live in :mod:`echo_rl.training.actor_critic_agent`; this module
is only PPO's learner: GAE over the fresh rollout, then ``num_epochs`` passes
of clipped-surrogate minibatch updates.
"""

from __future__ import annotations

import numpy as np
import torch

from echo_rl.algorithms.gae import bootstrap_values, compute_gae
from echo_rl.algorithms.ppo import ppo_loss
from echo_rl.training.actor_critic_agent import ActorCriticAgent
from echo_rl.training.rollout import RolloutBuffer


class PPOAgent(ActorCriticAgent):
    update_rule = "an on-policy learner updates every batch_size env steps"

    def learn(self, buf: RolloutBuffer) -> dict[str, float]:
        next_values = bootstrap_values(buf.values, self._value(self.collector.next_obs), buf.terminated,
                                       buf.truncated, buf.final_values)
        advantages, returns = compute_gae(buf.rewards, buf.values, next_values, buf.terminated | buf.truncated,
                                          self.ppo.gamma, self.ppo.gae_lambda)
        return self._update(buf, advantages, returns)

    def _update(self, buf, advantages: np.ndarray, returns: np.ndarray) -> dict[str, float]:
        ppo = self.ppo
        self.anneal_lr()
        flat = lambda a: torch.as_tensor(a.reshape(-1, *a.shape[2:]), device=self.device)  # noqa: E731
        obs, actions, old_logp, old_values = flat(buf.obs), flat(buf.actions), flat(buf.logprobs), flat(buf.values)
        adv, ret = flat(advantages), flat(returns)
        n = obs.shape[0]
        mb = min(ppo.batch_size, n)
        sums = torch.zeros(6)
        count = 0
        stop = False
        for _ in range(ppo.num_epochs):
            perm = torch.as_tensor(self.np_rng.permutation(n), device=self.device)
            for start in range(0, n, mb):
                idx = perm[start:start + mb]
                logits, values = self.network(obs[idx])
                terms = ppo_loss(logits, values, actions[idx], old_logp[idx], old_values[idx], adv[idx], ret[idx],
                                 clip_epsilon=ppo.clip_epsilon, value_loss_coef=ppo.value_loss_coef,
                                 entropy_coef=ppo.entropy_coef, kl_coef=ppo.kl_coef, value_clip=ppo.value_clip,
                                 normalize_advantages=ppo.normalize_advantages)
                grad_norm = self.clipped_step(terms.loss)
                sums += torch.stack([terms.policy_loss.detach(), terms.value_loss.detach(), terms.entropy.detach(),
                                     terms.approx_kl, terms.clip_fraction, grad_norm])
                count += 1
                if ppo.target_kl is not None and terms.approx_kl.item() > ppo.target_kl:
                    stop = True
                    break
            if stop:
                break
        self.updates += 1
        pl, vl, ent, kl, cf, gn = (sums / count).tolist()
        var_ret = float(np.var(returns))
        explained = float("nan") if var_ret == 0 else 1.0 - float(np.var(returns - buf.values)) / var_ret
        return {"loss/policy": pl, "loss/value": vl, "loss/entropy": ent, "loss/approx_kl": kl,
                "loss/clip_fraction": cf, "loss/grad_norm": gn, "loss/explained_variance": explained,
                "loss/learning_rate": self.optimizer.param_groups[0]["lr"], "loss/minibatches": float(count),
                "loss/early_stop": float(stop)}
