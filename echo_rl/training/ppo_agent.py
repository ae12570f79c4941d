"""PPO for vector environments (CleanRL-style, with truncation bootstrapping).

The agent interface and the scaffolding (network, acting, rollouts,
checkpoints) live in :mod:`echo_rl.training.actor_critic_agent`; this module
is only PPO's learner: GAE over the fresh rollout, then ``num_epochs`` passes
of clipped-surrogate minibatch updates (``ppo_update.ppo_epochs``, shared with the EchoRL agent).
"""

from __future__ import annotations

import numpy as np
import torch

from echo_rl.algorithms.gae import bootstrap_values, compute_gae
from echo_rl.training.actor_critic_agent import ActorCriticAgent
from echo_rl.training.ppo_update import Forward, PPOBatch, ppo_epochs
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
        self.anneal_lr()
        flat = lambda a: torch.as_tensor(a.reshape(-1, *a.shape[2:]), device=self.device)  # noqa: E731
        obs = flat(buf.obs)
        batch = PPOBatch(flat(buf.actions), flat(buf.logprobs), flat(buf.values), flat(advantages), flat(returns))
        out = ppo_epochs(self.ppo, batch, self.np_rng, lambda idx, it: Forward(*self.network(obs[it])),
                         self.clipped_step)
        self.updates += 1
        var_ret = float(np.var(returns))
        explained = float("nan") if var_ret == 0 else 1.0 - float(np.var(returns - buf.values)) / var_ret
        return {**out.means, "loss/explained_variance": explained,
                "loss/learning_rate": self.optimizer.param_groups[0]["lr"], "loss/minibatches": float(out.minibatches),
                "loss/early_stop": float(out.early_stop)}
