"""The EchoRL learner: PPO's update on the fresh rollout (plus plan KL and world model), then replay and
self-imitation steps.

The PPO part is :func:`echo_rl.vector.ppo_update.ppo_epochs`, the loop ``--agent ppo``
runs; only the forward pass is EchoRL's (plan-conditioned heads, the k+1-state windows
for the plan KL, the world-model input).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from echo_rl.algorithms.gae import bootstrap_values, compute_gae
from echo_rl.algorithms.vtrace import next_values_from, vtrace
from echo_rl.config import TrainingConfig
from echo_rl.vector.echo.actor import EchoRollout
from echo_rl.vector.echo.adder import SelfImitationAdder, SequenceAdder
from echo_rl.vector.echo.model import EchoModel
from echo_rl.vector.ppo_update import Forward, PPOBatch, ppo_epochs
from echo_rl.vector.self_imitation import self_imitation_loss


class EchoLearner:
    """Updates :class:`EchoModel`'s weights from rollouts and the replays its adders fill."""

    def __init__(self, config: TrainingConfig, model: EchoModel, num_steps: int, num_envs: int,
                 np_rng: np.random.Generator, replay: SequenceAdder | None, sil: SelfImitationAdder | None):
        self.model, self.num_steps, self.num_envs = model, num_steps, num_envs
        self.ppo, self.echo, self.plan_cfg = config.ppo_config, config.echo_config, config.planning_config
        self.np_rng, self.replay, self.sil = np_rng, replay, sil
        self.num_updates_total = math.ceil(config.total_timesteps / config.batch_size)
        self.ppo_advantage_std = 0.0

    def set_lr(self, updates: int) -> None:
        """Linear decay to 0 over the run (``ppo_config.anneal_lr``) of every parameter group."""
        frac = max(1.0 - updates / self.num_updates_total, 0.0) if self.ppo.anneal_lr else 1.0
        self.model.lpo.set_learning_rate_scale(frac)

    # -- PPO on the fresh rollout -------------------------------------------------------------
    def ppo_update(self, roll: EchoRollout, updates: int) -> dict[str, float]:
        """Clipped surrogate + value - entropy; with ``plan_pass=minibatch`` also ``kl_weight`` * plan KL +
        ``world_model_coef`` * world-model CE in every minibatch, with ``plan_pass=rollout`` those in
        :meth:`plan_update` after PPO's epochs."""
        m, ppo, k = self.model, self.ppo, self.model.k
        T, N = self.num_steps, self.num_envs
        self.set_lr(updates)
        full_obs, full_ep = roll.full()
        with torch.no_grad():
            w, mask = m.gather_windows(m.tensor(full_obs), m.tensor(full_ep), np.full(N, T), np.arange(N), k)
            _, boot, _ = m.heads(m.tensor(roll.next_obs), m.plan(w, mask), None)
        next_values = bootstrap_values(roll.values, boot.cpu().numpy(), roll.terminated, roll.truncated,
                                       roll.final_values)
        adv, ret = compute_gae(roll.rewards, roll.values, next_values, roll.terminated | roll.truncated,
                               ppo.gamma, ppo.gae_lambda)
        self.ppo_advantage_std = float(np.std(adv))  # self-imitation's advantages are kept to this scale
        flat = lambda a: m.tensor(a.reshape(T * N, *a.shape[2:]))  # noqa: E731
        batch = PPOBatch(flat(roll.actions), flat(roll.logprobs), flat(roll.values), flat(adv), flat(ret))
        if self.echo.plan_pass == "rollout":
            forward, extra = self._acting_plan_forward(roll, flat, full_obs, full_ep), ()
        else:
            forward, extra = self._minibatch_plan_forward(roll, flat, full_obs, full_ep, batch), \
                ("loss/plan_kl", "loss/world_model")
        out = ppo_epochs(ppo, batch, self.np_rng, forward, lambda loss: m.lpo.step(loss)["grad_norm_policy"],
                         extra_metrics=extra)
        plan_metrics = self.plan_update(roll, full_obs, full_ep) if self.echo.plan_pass == "rollout" else {}
        return {**out.means, **plan_metrics, "loss/learning_rate": m.lpo.optimizer.param_groups[0]["lr"],
                "loss/minibatches": float(out.minibatches)}

    def _acting_plan_forward(self, roll: EchoRollout, flat, full_obs: np.ndarray, full_ep: np.ndarray):
        """PPO's forward pass on given plan means, no gradient to the encoder: the ones the actors acted with, or
        with ``plan_refresh=epoch`` the current encoder's, recomputed at the start of each PPO epoch."""
        m, obs, k, T = self.model, flat(roll.obs), self.model.k, self.num_steps
        plan_means = flat(roll.plan_mean) if self.echo.latent_plan else None
        refresh = plan_means is not None and self.echo.plan_refresh == "epoch"
        per_epoch = math.ceil(len(obs) / min(self.ppo.batch_size, len(obs)))  # ppo_epochs' minibatches per epoch
        state = {"calls": 0, "means": plan_means}
        if refresh:
            ctx_obs, ctx_ep = m.tensor(full_obs[:k + T]), m.tensor(full_ep[:k + T])

        def forward(idx: np.ndarray, it: torch.Tensor) -> Forward:
            if refresh and state["calls"] % per_epoch == 0:
                state["means"] = m.rollout_plan_means(ctx_obs, ctx_ep)
            state["calls"] += 1
            plans = None if state["means"] is None else state["means"].index_select(0, it)
            return Forward(*m.heads_on_plan_means(obs.index_select(0, it), plans))
        return forward

    def _minibatch_plan_forward(self, roll: EchoRollout, flat, full_obs, full_ep, batch: PPOBatch):
        """PPO's forward pass with the current encoder's plans, their KL and the world model, per minibatch."""
        m, k, T, N = self.model, self.model.k, self.num_steps, self.num_envs
        obs, eps, wm_target = flat(roll.obs), flat(roll.eps), flat(roll.wm_target)
        if self.echo.latent_plan:  # every step's k+1-state window, scaled once for all epochs (flat index t*N + n)
            win, win_mask = m.gather_windows(m.tensor(full_obs), m.tensor(full_ep), np.repeat(np.arange(T), N),
                                             np.tile(np.arange(N), T), k + 1)
            win_states = m.states(win)

        def forward(idx: np.ndarray, it: torch.Tensor) -> Forward:
            kl, wm, plan = torch.zeros((), device=m.device), torch.zeros((), device=m.device), None
            # index_select: the values of x[it] at a fraction of fancy indexing's cost on the CPU
            if self.echo.latent_plan:
                plan, kl = m.plan_and_kl_states(win_states.index_select(0, it), win_mask.index_select(0, it))
            logits, values, h = m.heads(obs.index_select(0, it), plan, eps.index_select(0, it))
            losses = [self.plan_cfg.kl_weight * kl]
            if self.echo.world_model_coef > 0:
                wm = m.wm_head.loss(h, batch.actions.index_select(0, it), wm_target.index_select(0, it))
                losses.append(self.echo.world_model_coef * wm)
            return Forward(logits, values, losses, (kl, wm))
        return forward

    def plan_update(self, roll: EchoRollout, full_obs: np.ndarray, full_ep: np.ndarray) -> dict[str, float]:
        """``plan_pass=rollout``: one pass of plan-KL + world-model steps over the rollout, in chunks of whole
        envs (``ppo_config.batch_size`` steps each), so each state is embedded once, not once per window
        (the minibatch pass embeds k+1 states per sample, in each of PPO's epochs)."""
        m, echo, k, T, N = self.model, self.echo, self.model.k, self.num_steps, self.num_envs
        if not (echo.world_model_coef > 0 or (echo.latent_plan and self.plan_cfg.kl_weight > 0)):
            return {}
        obs, ep = m.tensor(full_obs[:k + T]), m.tensor(full_ep[:k + T])  # the bootstrap state is nobody's input
        eps, actions, target = m.tensor(roll.eps), m.tensor(roll.actions), m.tensor(roll.wm_target)
        width = max(1, min(N, self.ppo.batch_size // T))
        sums, count, order = torch.zeros(2), 0, self.np_rng.permutation(N)
        for start in range(0, N, width):
            cols = torch.as_tensor(order[start:start + width], device=m.device)
            kl, wm = m.chunk_plan_terms(obs[:, cols], ep[:, cols], eps[:, cols], actions[:, cols], target[:, cols])
            m.lpo.step(self.plan_cfg.kl_weight * kl + echo.world_model_coef * wm)
            sums += torch.stack([kl.detach(), wm.detach()])
            count += 1
        kl, wm = (sums / count).tolist()
        return {"loss/plan_kl": kl, "loss/world_model": wm}

    # -- replay ---------------------------------------------------------------------------------
    def replay_update(self) -> dict[str, float]:
        """``replay_updates`` steps of value + plan-KL learning on replayed sequences, then re-scoring.

        No policy gradient on replayed data: measured, it wrecked PPO's learning on
        DoorKey-8x8 both unclipped and with GePPO's trust region (package docstring). The
        value targets are V-trace's v_s for the current policy (clipped importance ratios),
        weighted by the buffer's importance weights.
        """
        m, replay, adder = self.model, self.replay.replay, self.replay
        if not replay.ready:
            return {"replay/size": float(len(replay))}
        ppo, echo, L = self.ppo, self.echo, self.echo.sequence_length
        sums, weight_sum = torch.zeros(3, device=m.device), np.float32(0)  # on the device: read once, at the end
        for _ in range(echo.replay_updates):
            batch = replay.sample(echo.replay_batch_sequences)
            d = batch.data
            logits, values, plan, kl = m.sequence_forward(d, L)
            t = lambda a: m.tensor(a).transpose(0, 1)  # noqa: E731
            actions, behav, rewards = t(d["actions"]), t(d["logprobs"]), t(d["rewards"])
            term, trunc, final_v = t(d["terminated"]), t(d["truncated"]), t(d["final_values"])
            v = values[:-1]
            with torch.no_grad():
                logp = torch.log_softmax(logits[:-1], -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
                nxt = next_values_from(v, values[-1], final_v, trunc)
                out = vtrace(behav, logp, rewards, v, nxt, ppo.gamma * (~term).float(),
                             (~(term | trunc)).float(), clip_rho_threshold=echo.vtrace_rho_bar,
                             clip_pg_rho_threshold=echo.vtrace_rho_bar, clip_c_threshold=echo.vtrace_c_bar)
            w = torch.as_tensor(batch.weights, dtype=torch.float32, device=m.device)[None]  # [1, B]
            value_loss = 0.5 * (w * (out.vs - v).pow(2)).mean()
            m.lpo.step(ppo.value_loss_coef * value_loss + self.plan_cfg.kl_weight * kl)
            # re-score with the plans of this learning pass (as PER re-scores with the pass's TD errors)
            seq_plans = None if plan is None else plan.mean.detach().view(L + 1, -1, m.latent)[:-1].mean(0)
            replay.update_priorities(batch.indices, adder.scores(seq_plans, d, update=False))
            sums += torch.stack([value_loss.detach(), out.rhos.mean(), (out.rhos > echo.vtrace_rho_bar).float().mean()])
            weight_sum += np.float32(np.mean(batch.weights))
        vl, rho, clipped = (sums / echo.replay_updates).tolist()
        wmean = float(weight_sum / np.float32(echo.replay_updates))
        return {"replay/value_loss": vl, "replay/rho_mean": rho, "replay/rho_clipped_fraction": clipped,
                "replay/importance_weight_mean": wmean, "replay/size": float(len(replay))}

    # -- self-imitation ---------------------------------------------------------------------------
    def self_imitation_update(self) -> dict[str, float]:
        """Learn where stored returns beat the critic. Runs after PPO's epochs, so PPO's clipped ratio
        is always to the policy that acted."""
        m, sil = self.model, self.sil.sil
        out = {"self_imitation/size": float(len(sil)), "self_imitation/episodes": float(sil.episodes)}
        if len(sil) == 0:
            return out
        sums = torch.zeros(3, device=m.device)  # on the device: read once, at the end
        for _ in range(self.echo.self_imitation_updates):
            batch = sil.buffer.sample(self.ppo.batch_size)
            d = batch.data
            logits, values = m.window_heads(d["windows"], d["mask"])
            loss, adv = self_imitation_loss(logits, values, m.tensor(d["action"]), m.tensor(d["return"]),
                                            m.tensor(batch.weights).float(), self.echo.self_imitation_value_coef,
                                            min_scale=self.ppo_advantage_std)
            m.lpo.step(loss)
            sil.buffer.update_priorities(batch.indices, adv.cpu().numpy())
            sums += torch.stack([loss.detach(), adv.mean(), (adv > 0).float().mean()])
        loss, adv_mean, positive = (sums / self.echo.self_imitation_updates).tolist()
        out.update({"self_imitation/loss": loss, "self_imitation/advantage_mean": adv_mean,
                    "self_imitation/positive_fraction": positive})
        return out

    def update(self, roll: EchoRollout, updates: int) -> dict[str, float]:
        """One iteration's learning: PPO, then the replay's steps, then self-imitation's."""
        metrics = self.ppo_update(roll, updates)
        if self.replay is not None:
            self.replay.add(roll)
            metrics.update(self.replay_update())
        if self.sil is not None:
            metrics.update(self.self_imitation_update())
        return metrics
