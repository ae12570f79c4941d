"""PPO for vector environments (CleanRL-style, with truncation bootstrapping).

The agent interface and the scaffolding (network, acting, rollouts,
checkpoints) live in :mod:`echo_rl.vector.actor_critic_agent`; this module
is only PPO's learner: GAE over the fresh rollout, then ``num_epochs`` passes
of clipped-surrogate minibatch updates (``ppo_update.ppo_epochs``, shared with the EchoRL agent).

As one of ``num_learners`` data-parallel learners (:mod:`echo_rl.distributed.data_parallel`)
it steps its share of the envs, learns on its columns of the global batch and sums the
gradients over the learners before each optimiser step; counters are global.
"""

from __future__ import annotations

import numpy as np
import torch

from echo_rl.algorithms.gae import bootstrap_values, compute_gae
from echo_rl.algorithms.reward_scaling import RewardScaler
from echo_rl.config import ConfigError
from echo_rl.distributed import learner_rank
from echo_rl.environments.minigrid_vector import actor_seeds
from echo_rl.vector.actor_critic_agent import ActorCriticAgent
from echo_rl.vector.ppo_update import Forward, PPOBatch, ppo_epochs
from echo_rl.vector.rollout import RolloutBuffer, flat_forward, torch_generator


class PPOAgent(ActorCriticAgent):
    update_rule = "an on-policy learner updates every batch_size env steps"
    continuous_actions = True  # Box actions: a DiagGaussian by default (echo_rl.models.distributions)

    def __init__(self, config, envs, device: torch.device):
        self.dp = learner_rank.current()  # with several learners scale_rewards is refused (data_parallel.check_config)
        #: ppo_config.scale_rewards: the learner's rewards / std of the discounted return (checkpointed)
        self.reward_scaler = RewardScaler(envs.num_envs, config.ppo_config.gamma) \
            if config.ppo_config.scale_rewards else None
        if self.dp is None:
            super().__init__(config, envs, device)
            return
        # one learner of several: built for its k envs and batch_size/N, then counted globally
        dp = self.dp
        super().__init__(config, envs, device)
        self.config = dp.config
        seeds = actor_seeds(dp.config.seed, dp.config.num_actors)[dp.env_slice()]
        self.collector.next_obs, _ = self.collector.envs.reset(seed=seeds)  # the envs the one learner gives it
        self.generator = torch_generator(dp.config.seed + 1 + 7919 * dp.rank)  # its own action draws

    def rollout_env_steps(self, buf) -> int:
        return super().rollout_env_steps(buf) * (1 if self.dp is None else self.dp.world_size)

    def data_parallel_step(self, loss: torch.Tensor | None) -> torch.Tensor:
        """:meth:`clipped_step` with the gradients summed over the learners between backward and clipping."""
        self.zero_grad()
        if loss is not None:
            loss.backward()
        self.dp.sum_gradients(self.network.parameters())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.network.parameters(), self.ppo.max_grad_norm)
        self.optimizer.step()
        return grad_norm.detach()

    def learn(self, buf: RolloutBuffer) -> dict[str, float]:
        next_values = bootstrap_values(buf.values, self._value(self.collector.next_obs), buf.terminated,
                                       buf.truncated, buf.final_values)
        rewards = buf.rewards if self.reward_scaler is None else \
            self.reward_scaler.scale(buf.rewards, buf.terminated | buf.truncated)
        advantages, returns = compute_gae(rewards, buf.values, next_values, buf.terminated | buf.truncated,
                                          self.ppo.gamma, self.ppo.gae_lambda)
        return self._update(buf, advantages, returns)

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.reward_scaler is not None:
            state["reward_scaler"] = self.reward_scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if ("reward_scaler" in state) != (self.reward_scaler is not None):
            has = "scaled" if "reward_scaler" in state else "did not scale"
            raise ConfigError(f"this checkpoint's run {has} its rewards; resume it with the same "
                              f"ppo_config.scale_rewards")
        super().load_state_dict(state)
        if self.reward_scaler is not None:
            self.reward_scaler.load_state_dict(state["reward_scaler"])

    def _variances(self, *arrays: np.ndarray) -> list[float]:
        """Population variance of each array, over the whole global batch with several learners."""
        if self.dp is None:
            return [float(np.var(a)) for a in arrays]
        moments = torch.tensor([[a.size, a.sum(dtype=np.float64), np.square(a, dtype=np.float64).sum()]
                                for a in arrays], dtype=torch.float64)
        n, total, sq = self.dp.all_reduce_(moments).unbind(-1)
        return (sq / n - (total / n) ** 2).tolist()

    def _update(self, buf, advantages: np.ndarray, returns: np.ndarray) -> dict[str, float]:
        self.anneal_lr()
        flat = lambda a: torch.as_tensor(a.reshape(-1, *a.shape[2:]), device=self.device)  # noqa: E731
        obs = flat(buf.obs)
        batch = PPOBatch(flat(buf.actions), flat(buf.logprobs), flat(buf.values), flat(advantages), flat(returns))
        params = list(self.network.parameters())  # listed once per update, not walked on every minibatch
        step = (lambda loss: self.clipped_step(loss, params)) if self.dp is None else self.data_parallel_step
        distribution = getattr(self.network, "distribution", None)
        network = flat_forward(self.network)
        out = ppo_epochs(self.ppo, batch, self.np_rng,
                         lambda idx, it: Forward(*network(obs.index_select(0, it)), distribution=distribution), step,
                         dp=self.dp)
        self.updates += 1
        var_ret, var_err = self._variances(returns, returns - buf.values)
        explained = float("nan") if var_ret == 0 else 1.0 - var_err / var_ret
        return {**out.means, "loss/explained_variance": explained,
                "loss/learning_rate": self.optimizer.param_groups[0]["lr"], "loss/minibatches": float(out.minibatches),
                "loss/early_stop": float(out.early_stop)}
