"""IMPALA baseline for vector environments: a V-trace actor-critic learner (Espeholt et al. 2018).

Synchronous single-process form. The actors (a vector env of N envs) collect
T steps with the policy of the last update; the learner then consumes that
rollout as consecutive *unrolls* of ``L = ppo_config.batch_size // N`` steps
from all N actors (IMPALA's batch of N trajectories of unroll length L; the
paper uses L = 20), in time order, one gradient step per unroll, each sample
used once. By the k-th unroll the learner has taken k steps since the actors'
policy, so V-trace's clipped importance ratios correct a real policy lag, as
they correct actor lag in the asynchronous original. Each unroll bootstraps
from V(x_{t+L}) of the learner's current network; terminations cut the return,
truncations bootstrap from V(final_obs) (the value recorded at collection).

Method definition (not per-study tuning), see docs/results.md:

- **one pass** over each rollout (``IMPALAAgent.passes``): IMPALA's learner
  uses every trajectory once. Several passes of an unclipped policy gradient
  over the same data have no trust region; on DoorKey that collapses the
  policy (entropy falls, success 0) — V-trace truncates the importance weights
  of the *targets* but does not bound how far the policy moves.
- the V-trace policy-gradient advantages are **normalised per unroll** when
  ``ppo_config.normalize_advantages`` is set (the shared setting PPO uses).
  MiniGrid's reward is sparse and at most 1, so raw advantages are ~1e-2 and
  the shared entropy bonus (0.01, calibrated against unit-scale advantages)
  held the policy at uniform: entropy stayed at ln 7 and nothing was learned.

Shared with PPO (same tuning budget): network, optimiser (Adam) and learning
rate, gamma, entropy/value weights, grad clip, LR annealing, unroll size
(``ppo_config.batch_size``). ``ppo_config.num_epochs``, ``gae_lambda``,
``clip_epsilon``, ``kl_coef`` and ``value_clip`` are PPO's and unused here;
V-trace's rho_bar and c_bar come from ``echo_config``.

Asynchronous (``max_policy_lag`` >= 1), as in the paper: actors keep collecting
while the learner updates (:mod:`echo_rl.vector.async_actors`; in-process an
actor process, :mod:`echo_rl.vector.actor_process`; with ``backend=ray`` the Ray workers). Each unroll carries
the policy version that acted and its behaviour log-probabilities; a batch is
the first unrolls to arrive covering ``num_actors`` envs, those more than
``max_policy_lag`` updates old dropped, and V-trace corrects the rest. The
default (None) is the synchronous learner above, unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

from echo_rl.algorithms.vtrace import next_values_from, vtrace
from echo_rl.config import ConfigError
from echo_rl.environments.minigrid_vector import actor_seeds
from echo_rl.vector.actor_critic_agent import ActorCriticAgent
from echo_rl.vector.actor_process import ProcessActor
from echo_rl.vector.async_actors import StalenessGate, UnrollBatch, gather_batch
from echo_rl.vector.rollout import RolloutBuffer


def unroll_slices(num_steps: int, num_envs: int, batch_size: int) -> list[slice]:
    """Consecutive time windows of ``batch_size // num_envs`` steps (at least 1) covering the rollout."""
    length = max(1, batch_size // num_envs)
    return [slice(t, min(num_steps, t + length)) for t in range(0, num_steps, length)]


class IMPALAAgent(ActorCriticAgent):
    """``--agent impala``; the agent interface of :class:`echo_rl.vector.actor_critic_agent.ActorCriticAgent`."""

    update_rule = "the learner consumes each rollout of batch_size env steps once"
    #: passes over each rollout; IMPALA's learner is single-pass (see the module docstring)
    passes = 1

    def __init__(self, config, envs, device: torch.device):
        lag = config.max_policy_lag
        if lag and config.intrinsic_reward:
            envs.close()
            raise ConfigError(f"TrainingConfig.intrinsic_reward={config.intrinsic_reward!r} is invalid with "
                              f"max_policy_lag={lag}: asynchronous actors do not keep the next observations it reads")
        super().__init__(config, envs, device)
        self.gate = StalenessGate(lag) if lag else None
        self._actor: ProcessActor | None = None  # started by start() (or the first asynchronous iteration)
        self._synced = False  # collector and sampler mirror the actor's (set by a checkpoint, cleared by a take)
        self._stepped = False  # self.collector has stepped (a checkpoint's): else the actor builds its own

    # -- asynchronous collection (max_policy_lag) -------------------------------
    def unroll_source(self):
        """Where asynchronous unrolls come from: an actor process over this agent's envs (Ray overrides it)."""
        if self._actor is None:
            cfg = self.config
            collector = self.collector if self._stepped else {
                "task": cfg.env_name, "num_envs": self.num_envs, "asynchronous": cfg.vector_env == "async",
                "env_config": cfg.env_config, "num_steps": self.num_steps,
                "seeds": actor_seeds(cfg.seed, self.num_envs)}
            self._actor = ProcessActor(collector, self.network, self.generator, self.updates)
        return self._actor

    def start(self) -> None:
        """An asynchronous run starts its actor here (setup, not iteration time), after ``init_from``'s weights."""
        super().start()
        if self.gate is not None:
            self.unroll_source()

    def train_iteration(self) -> dict[str, float]:
        if self.gate is None:
            return super().train_iteration()
        source = self.unroll_source()
        source.resume()
        batch, steps, metrics = gather_batch(source.take, self.gate, self.updates, self.num_envs)
        self._synced = False
        self.env_steps += steps
        if self.env_steps <= self.config.learning_starts:
            return metrics
        buf, part_metrics = self.learner_batch(batch)
        metrics.update(part_metrics)
        metrics.update(self.learn(buf))
        source.publish(self.network, self.updates)
        return metrics

    def _sync_actor(self) -> None:
        """For a checkpoint: the actor's envs mid-episode and sampler become this agent's (the actor waits
        between rollouts). The unroll it had in flight is learned from next but is not in the checkpoint:
        a resumed run continues from the envs' state after it."""
        if self._actor is not None and not self._synced:
            collector, generator_state = self._actor.sync_state()
            self.collector.envs.close()
            self.collector = collector
            self.generator.set_state(generator_state)
            self._synced = self._stepped = True

    def rollout_state(self):
        self._sync_actor()
        return super().rollout_state()

    def state_dict(self) -> dict:
        self._sync_actor()
        state = super().state_dict()
        if self.gate is not None:  # the run's count of dropped unrolls goes on after a resume
            state["async_dropped_stale"] = self.gate.dropped
        return state

    def load_state_dict(self, state: dict) -> None:
        self._stop_actor()  # a running actor would act with weights and versions of the run before
        super().load_state_dict(state)
        if self.gate is not None:
            self.gate.dropped = int(state.get("async_dropped_stale", 0))

    def load_rollout_state(self, collector) -> None:
        self._stop_actor()
        super().load_rollout_state(collector)
        self._stepped = True

    def _stop_actor(self) -> None:
        if self._actor is not None:
            self._actor.close()
            self._actor = None

    def close(self) -> None:
        self._stop_actor()
        super().close()

    def learn(self, buf: RolloutBuffer) -> dict[str, float]:
        ppo, echo = self.ppo, self.config.echo_config
        self.anneal_lr()
        t = lambda a: torch.as_tensor(a, device=self.device)  # noqa: E731
        obs, actions, behav_logp = t(buf.obs), t(buf.actions), t(buf.logprobs)
        rewards, term, trunc, final_v = t(buf.rewards), t(buf.terminated), t(buf.truncated), t(buf.final_values)
        discounts = ppo.gamma * (~term).float()
        continues = (~(term | trunc)).float()
        # an asynchronous batch bootstraps each column from its own unroll's next observation
        next_obs = t(buf.next_obs if isinstance(buf, UnrollBatch) else self.collector.next_obs)
        T, N = buf.num_steps, buf.num_envs
        sums = torch.zeros(6)
        count = 0
        for _ in range(self.passes):
            for w in unroll_slices(T, N, ppo.batch_size):
                L = w.stop - w.start
                logits, values = self.network(obs[w].reshape(-1, *obs.shape[2:]))
                logits, values = logits.view(L, N, -1), values.view(L, N)
                logp_all = torch.log_softmax(logits, -1)
                logp = logp_all.gather(-1, actions[w].unsqueeze(-1)).squeeze(-1)
                with torch.no_grad():
                    boot = self.network.value(obs[w.stop] if w.stop < T else next_obs)
                    v = values.detach()
                    out = vtrace(behav_logp[w], logp.detach(), rewards[w], v,
                                 next_values_from(v, boot, final_v[w], trunc[w]), discounts[w], continues[w],
                                 clip_rho_threshold=echo.vtrace_rho_bar, clip_pg_rho_threshold=echo.vtrace_rho_bar,
                                 clip_c_threshold=echo.vtrace_c_bar)
                    adv = out.pg_advantages
                    if ppo.normalize_advantages:
                        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = -(adv * logp).mean()
                value_loss = 0.5 * (out.vs - values).pow(2).mean()
                entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
                grad_norm = self.clipped_step(policy_loss + ppo.value_loss_coef * value_loss
                                              - ppo.entropy_coef * entropy)
                sums += torch.stack([policy_loss.detach(), value_loss.detach(), entropy.detach(),
                                     out.rhos.mean(), (out.rhos > echo.vtrace_rho_bar).float().mean(), grad_norm])
                count += 1
        self.updates += 1
        pl, vl, ent, rho, clipped, gn = (sums / count).tolist()
        return {"loss/policy": pl, "loss/value": vl, "loss/entropy": ent, "loss/rho_mean": rho,
                "loss/rho_clipped_fraction": clipped, "loss/grad_norm": gn,
                "loss/learning_rate": self.optimizer.param_groups[0]["lr"], "loss/minibatches": float(count)}
