"""The EchoRL agent for vector environments: PPO + latent plan + prioritized replay + world model.

Why PPO for the fresh data: it is the learner whose MiniGrid behaviour is best
documented (rl-starter-files, the SB3 zoo), so the parts EchoRL adds can be
measured against a strong, well-understood base.

One iteration:

1. **Act**: each env keeps its last k states (cut at episode starts); the plan
   encoder turns them into p(tau_t) = N(mu, sigma). The policy and value heads
   read the plan *mean*, detached (FiLM); the world model reads the sample
   tau = mu + sigma*eps (eps stored, so the learner rebuilds exactly that plan).
   Evaluation acts the same way, so the policy evaluated is the policy trained.
2. **PPO update** on the rollout: clipped surrogate + value loss − entropy
   + ``kl_weight`` · KL[p(tau_t) || p(tau_{t-1})] (pairs inside one episode)
   + ``world_model_coef`` · CE(next observation's image tokens | s_t, a_t, tau_t).
3. **Replay**: the rollout is cut into sequences of ``sequence_length`` steps
   (with the k states before each, for the plan windows) and added to the
   hot/cold buffer, scored by plan surprise ``||tau - tau_bar||^2 + alpha|r|``
   of the plans the actors used; ``replay_updates`` minibatches of sequences are
   then learned — value (V-trace targets for the current policy, clipped
   importance ratios, times the buffer's importance weights) and plan KL — and
   re-scored with the plans of that learning pass.
4. **Self-imitation** (``self_imitation.py``): the steps of episodes that
   terminated wait with their Monte Carlo return R in a prioritized store;
   ``self_imitation_updates`` minibatches learn -log pi(a|s)(R - V)+ plus a
   small value term, where R beat the critic — the one policy-gradient signal
   taken from old data, because it can only pull towards actions that did
   better than expected.

Two choices were made by measurement (DoorKey-8x8, the study's settings;
docs/results.md, "session 3"):

- **No policy gradient on replayed data.** An unclipped V-trace policy-gradient
  step on replayed sequences (session 2), and then GePPO's clipped surrogate
  (Queeney et al. 2021: ratio to the policy before this iteration's update
  clipped at ±clip_epsilon, times min(pi_old/mu, rho_bar) and V-trace advantages),
  both kept PPO + replay at 0.00–0.03 success on seeds where PPO alone reaches
  0.97–1.0 by 425k–575k steps. Stale sequences still teach the critic and the
  plan, which no trust region on the policy has to protect.
- **The policy reads a detached plan mean.** With the policy gradient flowing
  into the encoder through the sample (or only the sample detached) the policy's
  entropy fell to 1.58 by 100k steps in the reward-free phase (PPO: 1.74), the
  policy fitting the plan noise it was given; with the detached mean, 1.64–1.69.
  The encoder is trained by the world model and the plan KL only: the plan is a
  self-supervised summary of the last k states that the RL loss reads but does
  not shape.

The network is PPO's (``TrainingConfig.policy_network``: the same encoder, heads
and initialisation) with a zero-initialised FiLM layer between the encoder and
the heads, so each part is measured against exactly the PPO baseline.

Ablations (``echo_config`` / ``planning_config`` fields): ``latent_plan=false``
(no encoder, no KL), ``planning_config.kl_weight=0``, ``world_model_coef=0``,
``replay_updates=0``, ``self_imitation_updates=0``. All of them off is PPO: the
same network, initial weights, actions and updates as ``--agent ppo`` with that
seed (a test checks it).
"""

from __future__ import annotations

import math
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from echo_rl.algorithms.gae import bootstrap_values, compute_gae
from echo_rl.algorithms.ppo import ppo_loss
from echo_rl.algorithms.vtrace import next_values_from, vtrace
from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.core.latent_planning import (
    LatentPlanningOptimizer,
    PlanDistribution,
    StateWindow,
    consecutive_plan_kl,
)
from echo_rl.environments.minigrid_vector import MiniGridObsEncoding, actor_seeds
from echo_rl.models.policies import ActorCritic, FlatEncoder, MiniGridEncoder
from echo_rl.training.protocol import VectorAgentBase
from echo_rl.training.rollout import EpisodeStats, evaluate_policy, torch_generator
from echo_rl.training.self_imitation import SelfImitationReplay, self_imitation_loss

STATE_SCALE = 0.1  # MiniGrid indices are < 11: keep the plan encoder's inputs O(1)
REPLAY_MEMORY_LIMIT = 4 * 2**30
# checkpoints carry the replay's storage when it is at most this big (the study's settings: ~26 MiB)
REPLAY_CHECKPOINT_LIMIT = 256 * 2**20


def unfold_windows(seq: torch.Tensor, ep: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding windows over time: ``seq [S, ..., D]``, ``ep [S, ...]`` -> ``[S-width+1, ..., width, D]`` + mask.

    Slot ``width-1`` is the newest state; a slot is valid when it belongs to the
    newest state's episode (same episode id, and not padding, id -1).
    """
    w = seq.unfold(0, width, 1)  # [S', ..., D, width]
    w = w.movedim(-1, -2)  # [S', ..., width, D]
    e = ep.unfold(0, width, 1)  # [S', ..., width]
    mask = (e == e[..., -1:]) & (e >= 0)
    return w, mask


class WorldModelHead(nn.Module):
    """(trunk features of s_t, tau_t, a_t) -> logits of each image token of s_{t+1} (object/colour/state).

    Its gradient reaches its own weights and, through tau_t, the plan encoder, never
    the policy's trunk: with the trunk in its path, the world model slowed PPO's
    learning (DoorKey-5x5, docs/results.md), and a plan that predicts what comes
    next is what the plan is for. With the plan off it only measures how predictable
    the next observation is from the trunk's features.

    Each cell's three channels get their own class count (11 objects, 6 colours,
    3 states), and the cross-entropy is written as logsumexp - target logit: the
    same value as ``F.cross_entropy`` at a quarter of its CPU time for these
    short class axes.
    """

    def __init__(self, in_dim: int, num_actions: int, encoding: MiniGridObsEncoding, hidden_dim: int = 128):
        super().__init__()
        self.num_actions = num_actions
        self.cells = encoding.view * encoding.view
        self.image_size = encoding.image_size
        self.classes = (encoding.num_objects, encoding.num_colors, encoding.num_states)
        self.net = nn.Sequential(nn.Linear(in_dim + num_actions, hidden_dim), nn.Tanh(),
                                 nn.Linear(hidden_dim, self.cells * sum(self.classes)))

    def loss(self, features: torch.Tensor, actions: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
        a = F.one_hot(actions.long(), self.num_actions).to(features.dtype)
        logits = self.net(torch.cat([features, a], -1)).view(-1, self.cells, sum(self.classes))
        target = next_obs[:, : self.image_size].long().view(-1, self.cells, 3)
        total, start = 0.0, 0
        for c, n in enumerate(self.classes):
            lg = logits[..., start:start + n]
            total = total + (lg.logsumexp(-1) - lg.gather(-1, target[..., c:c + 1]).squeeze(-1)).mean()
            start += n
        return total / len(self.classes)


@dataclass
class _Rollout:
    obs: np.ndarray          # [T, N, D] uint8
    ep: np.ndarray           # [T, N] episode ids
    ctx_obs: np.ndarray      # [k, N, D] the k states before step 0
    ctx_ep: np.ndarray       # [k, N]
    next_obs: np.ndarray     # [N, D] state after the last step (bootstrap)
    next_ep: np.ndarray      # [N]
    wm_target: np.ndarray    # [T, N, D] the observation that followed each step (final_obs at episode ends)
    eps: np.ndarray          # [T, N, latent]
    plan_mean: np.ndarray    # [T, N, latent] the plan means the actors used (replay scores)
    actions: np.ndarray
    logprobs: np.ndarray
    values: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_values: np.ndarray

    def full(self) -> tuple[np.ndarray, np.ndarray]:
        """Context + rollout + bootstrap state along time: ``[k + T + 1, N, ...]``."""
        return (np.concatenate([self.ctx_obs, self.obs, self.next_obs[None]]),
                np.concatenate([self.ctx_ep, self.ep, self.next_ep[None]]))


class EchoAgent(VectorAgentBase):
    """``--agent echo-rl``; the trainer's agent protocol (:class:`echo_rl.training.protocol.Agent`), as PPO has it."""

    def __init__(self, config: TrainingConfig, envs, device: torch.device):
        if config.steps_per_update != config.batch_size:
            raise ValueError(f"TrainingConfig.train_frequency={config.train_frequency} is invalid for echo-rl: "
                             f"its PPO part updates every batch_size={config.batch_size} env steps")
        self.config, self.ppo, self.echo = config, config.ppo_config, config.echo_config
        self.plan_cfg = config.planning_config
        self.device = device
        self.num_envs = envs.num_envs
        self.num_steps = config.batch_size // self.num_envs
        self.k = self.plan_cfg.state_window_size
        self.latent = self.plan_cfg.embedding_dim
        if self.echo.replay_updates and self.num_steps % self.echo.sequence_length:
            raise ConfigError(f"EchoAgentConfig.sequence_length={self.echo.sequence_length} is invalid: must divide "
                              f"the rollout length batch_size/num_actors={self.num_steps}")
        self.num_updates_total = math.ceil(config.total_timesteps / config.batch_size)
        torch.manual_seed(config.seed)
        self.encoding = MiniGridObsEncoding()
        self.obs_dim = int(envs.single_observation_space.shape[0])
        self.num_actions = int(envs.single_action_space.n)
        base = self._base_network(config.policy_network)  # first, as PPO does: the same initial weights
        plan_cfg = self.plan_cfg if self.echo.latent_plan else self.plan_cfg.replace(soft_prefix_alpha=0.0)
        wm_dim = base.encoder.out_dim + (self.latent if self.echo.latent_plan else 0)
        self.wm_head = WorldModelHead(wm_dim, self.num_actions, self.encoding)
        self.lpo = LatentPlanningOptimizer(
            self.obs_dim, self.num_actions, plan_cfg, policy_lr=self.ppo.learning_rate,
            policy_max_grad_norm=self.ppo.max_grad_norm, trunk=base.encoder, heads=(base.actor, base.critic),
            extra_modules=[self.wm_head])
        self.lpo.modules().to(device)
        self.generator = torch_generator(config.seed + 1)
        self.np_rng = np.random.default_rng(config.seed + 2)
        self.replay = self._make_replay() if self.echo.replay_updates else None
        self.sil = self._make_self_imitation() if self.echo.self_imitation_updates else None
        self.ppo_advantage_std = 0.0
        # actor state
        self.envs = envs
        self.next_obs, _ = envs.reset(seed=actor_seeds(config.seed, self.num_envs))
        self.hist_obs = np.zeros((self.k, self.num_envs, self.obs_dim), dtype=np.uint8)
        self.hist_ep = np.full((self.k, self.num_envs), -1, dtype=np.int64)
        self.cur_ep = np.zeros(self.num_envs, dtype=np.int64)
        self.ep_return = np.zeros(self.num_envs)
        self.ep_length = np.zeros(self.num_envs, dtype=np.int64)
        self.stats = EpisodeStats()
        self._eval_window: StateWindow | None = None
        self.env_steps = 0
        self.updates = 0

    # -- networks -------------------------------------------------------------
    def _base_network(self, network: str) -> ActorCritic:
        """PPO's actor-critic for TrainingConfig.policy_network; its encoder is the trunk under the FiLM layer.

        ``minigrid``: per-cell embeddings -> ``echo_config.hidden_dim`` features, 64-unit heads
        (``make_actor_critic``'s shape at the default width 128); ``mlp``: the flat observation, 64x64 heads.
        """
        if network == "minigrid":
            return ActorCritic(self.num_actions, MiniGridEncoder(self.encoding, hidden=self.echo.hidden_dim),
                               hidden=(64,))
        if network == "mlp":
            return ActorCritic(self.num_actions, FlatEncoder(self.obs_dim), hidden=(64, 64))
        raise ConfigError(f"TrainingConfig.policy_network={network!r} is invalid for echo-rl: allowed: minigrid, mlp")

    def _states(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float() * STATE_SCALE

    def _plan(self, windows: torch.Tensor, masks: torch.Tensor) -> PlanDistribution | None:
        """Plan distribution from windows of k states (uint8); None when the plan is switched off."""
        if not self.echo.latent_plan:
            return None
        return self.lpo.encoder(self._states(windows), masks)

    def _heads(self, obs: torch.Tensor, plan: PlanDistribution | None, eps: torch.Tensor | None):
        """-> (logits, values, world-model input).

        The policy and value heads read the plan *mean*, detached; the world model reads
        (trunk features, detached; the plan sample mu + sigma*eps, eps None: the mean).
        So the RL loss trains the trunk, FiLM and heads, and the world model and plan KL
        train the plan encoder (see the module docstring for the measurements).
        """
        pol = self.lpo.policy
        h = pol.trunk(obs)
        if plan is None:
            features, wm_in = h, h.detach()
        else:
            tau = plan.rsample(eps if eps is not None else torch.zeros_like(plan.mean))
            features, wm_in = pol.condition(h, plan.mean.detach()), torch.cat([h.detach(), tau], -1)
        return pol.policy_head(features), pol.value_head(features).squeeze(-1), wm_in

    def _draw_eps(self, n: int, generator: torch.Generator) -> torch.Tensor | None:
        """Plan noise for n plans (None when the plan is off: no draw, so the actions match PPO's)."""
        if not self.echo.latent_plan:
            return None
        return torch.randn(n, self.latent, generator=generator).to(self.device)

    @torch.no_grad()
    def act(self, obs: np.ndarray, generator: torch.Generator, episode_start: np.ndarray | None = None) -> np.ndarray:
        """Evaluation acting, the way the actors act in training: a sampled plan, then a sampled action.

        With ``episode_start`` (True where ``obs`` begins an episode) the agent keeps
        per-env windows of the last k states, as in training. Without it, it cannot
        tell where episodes end, so — rather than let plans mix episodes — each plan
        reads s_t alone (a window of one state, as at an episode's first step).
        """
        o = torch.as_tensor(obs, device=self.device)
        plan = None
        if self.echo.latent_plan:
            if episode_start is None:
                w = torch.zeros(o.shape[0], self.k, self.obs_dim, dtype=o.dtype, device=self.device)
                w[:, -1] = o
                m = torch.zeros(o.shape[0], self.k, dtype=torch.bool, device=self.device)
                m[:, -1] = True
            else:
                if self._eval_window is None or self._eval_window.states.shape[0] != len(obs):
                    self._eval_window = StateWindow(len(obs), self.obs_dim, self.k)
                    episode_start = np.ones(len(obs), dtype=bool)
                wn, mn = self._eval_window.push(obs, episode_start)
                w, m = torch.as_tensor(wn, device=self.device), torch.as_tensor(mn, device=self.device)
            plan = self._plan(w, m)
        logits, _, _ = self._heads(o, plan, self._draw_eps(len(obs), generator))
        return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1).cpu().numpy()

    def evaluate(self, make_envs, episodes: int, seed: int, num_envs: int = 8) -> dict[str, float]:
        """``rollout.evaluate_policy`` with episode starts passed to :meth:`act` (for the plan windows)."""
        generator = torch_generator(seed)
        self._eval_window = None
        try:
            return evaluate_policy(make_envs, lambda obs, start: self.act(obs, generator, start), episodes, seed,
                                   num_envs=num_envs, episode_starts=True)
        finally:
            self._eval_window = None

    # -- acting -----------------------------------------------------------------
    def _collect(self) -> _Rollout:
        T, N, D, k = self.num_steps, self.num_envs, self.obs_dim, self.k
        plan_on = self.echo.latent_plan
        r = _Rollout(obs=np.zeros((T, N, D), np.uint8), ep=np.zeros((T, N), np.int64),
                     ctx_obs=self.hist_obs.copy(), ctx_ep=self.hist_ep.copy(),
                     next_obs=None, next_ep=None, wm_target=np.zeros((T, N, D), np.uint8),
                     eps=np.zeros((T, N, self.latent), np.float32),
                     plan_mean=np.zeros((T, N, self.latent) if plan_on else (T, N, 0), np.float32),
                     actions=np.zeros((T, N), np.int64),
                     logprobs=np.zeros((T, N), np.float32), values=np.zeros((T, N), np.float32),
                     rewards=np.zeros((T, N), np.float32), terminated=np.zeros((T, N), bool),
                     truncated=np.zeros((T, N), bool), final_values=np.zeros((T, N), np.float32))
        enc = self.lpo.encoder
        with torch.no_grad():
            # the weights are fixed for the whole rollout: embed each state once, keep a ring of k embeddings
            emb = enc.embed_states(self._states(torch.as_tensor(self.hist_obs, device=self.device))) if plan_on else None
        for t in range(T):
            obs = self.next_obs
            with torch.no_grad():
                o = torch.as_tensor(obs, device=self.device)
                plan = None
                if plan_on:
                    emb = torch.cat([emb[1:], enc.embed_states(self._states(o))[None]])  # [k, N, H]
                    e = np.concatenate([self.hist_ep[1:], self.cur_ep[None]])
                    mask = torch.as_tensor((e == self.cur_ep[None]) & (e >= 0), device=self.device)
                    plan = enc.plan_from_embeddings(emb.transpose(0, 1), mask.transpose(0, 1))
                    r.plan_mean[t] = plan.mean.cpu().numpy()
                eps = self._draw_eps(N, self.generator)
                logits, values, _ = self._heads(o, plan, eps)
                logp_all = torch.log_softmax(logits, -1)
                actions = torch.multinomial(logp_all.exp().cpu(), 1, generator=self.generator).squeeze(-1)
                logp = logp_all.cpu().gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            next_obs, rewards, terminated, truncated, info = self.envs.step(actions.numpy())
            r.obs[t], r.ep[t] = obs, self.cur_ep
            if eps is not None:
                r.eps[t] = eps.cpu().numpy()
            r.actions[t], r.logprobs[t], r.values[t] = actions.numpy(), logp.numpy(), values.cpu().numpy()
            r.rewards[t], r.terminated[t], r.truncated[t] = rewards, terminated, truncated
            r.wm_target[t] = next_obs
            # the window that ends at s_t becomes history for s_{t+1}
            self.hist_obs = np.concatenate([self.hist_obs[1:], obs[None]])
            self.hist_ep = np.concatenate([self.hist_ep[1:], self.cur_ep[None]])
            self.ep_return += rewards
            self.ep_length += 1
            done = terminated | truncated
            if done.any():
                idx = np.nonzero(done)[0]
                final = np.stack([info["final_obs"][i] for i in idx])
                r.wm_target[t, idx] = final
                if truncated.any():
                    tr = np.nonzero(truncated)[0]
                    fo = np.stack([info["final_obs"][i] for i in tr])
                    r.final_values[t, tr] = self._final_values(fo, tr)
                for i in idx:
                    self.stats.add(self.ep_return[i], self.ep_length[i], bool(terminated[i] and rewards[i] > 0))
                self.ep_return[done] = 0.0
                self.ep_length[done] = 0
                self.cur_ep[done] += 1
            self.next_obs = next_obs
        r.next_obs, r.next_ep = self.next_obs.copy(), self.cur_ep.copy()
        return r

    @torch.no_grad()
    def _final_values(self, final_obs: np.ndarray, envs: np.ndarray) -> np.ndarray:
        """V(final_obs) for truncated envs (plan mean); its window is the env's history (already holding s_t)."""
        w = np.concatenate([self.hist_obs[1:, envs], final_obs[None]])
        e = np.concatenate([self.hist_ep[1:, envs], self.cur_ep[None, envs]])
        mask = (e == self.cur_ep[None, envs]) & (e >= 0)
        t = lambda a: torch.as_tensor(a, device=self.device)  # noqa: E731
        _, values, _ = self._heads(t(final_obs), self._plan(t(w).transpose(0, 1), t(mask).transpose(0, 1)), None)
        return values.cpu().numpy()

    # -- learning ---------------------------------------------------------------
    def train_iteration(self) -> dict[str, float]:
        roll = self._collect()
        self.env_steps += self.num_steps * self.num_envs
        metrics = self.stats.drain()
        if self.sil is not None:  # every rollout, so episodes spanning rollouts are stored whole
            self._self_imitation_store(roll)
        if self.env_steps <= self.config.learning_starts:
            return metrics
        metrics.update(self._ppo_update(roll))
        if self.replay is not None:
            metrics.update(self._replay_update(roll))
        if self.sil is not None:
            metrics.update(self._self_imitation_update())
        self.updates += 1
        return metrics

    def _set_lr(self) -> None:
        frac = max(1.0 - self.updates / self.num_updates_total, 0.0) if self.ppo.anneal_lr else 1.0
        self.lpo.set_learning_rate_scale(frac)

    def _ppo_update(self, roll: _Rollout) -> dict[str, float]:
        ppo, k = self.ppo, self.k
        self._set_lr()
        with torch.no_grad():
            full_obs, full_ep = roll.full()
            w, m = self._windows_at(full_obs, full_ep, np.arange(self.num_envs), [self.num_steps])
            _, boot, _ = self._heads(torch.as_tensor(roll.next_obs, device=self.device), self._plan(w[0], m[0]), None)
        next_values = bootstrap_values(roll.values, boot.cpu().numpy(), roll.terminated, roll.truncated,
                                       roll.final_values)
        adv, ret = compute_gae(roll.rewards, roll.values, next_values, roll.terminated | roll.truncated,
                               ppo.gamma, ppo.gae_lambda)
        self.ppo_advantage_std = float(np.std(adv))  # self-imitation's advantages are kept to this scale
        T, N = self.num_steps, self.num_envs
        flat = lambda a: torch.as_tensor(a.reshape(T * N, *a.shape[2:]), device=self.device)  # noqa: E731
        obs, actions, old_logp, old_v = flat(roll.obs), flat(roll.actions), flat(roll.logprobs), flat(roll.values)
        adv_t, ret_t, eps, wm_target = flat(adv), flat(ret), flat(roll.eps), flat(roll.wm_target)
        full_obs_t = torch.as_tensor(full_obs, device=self.device)
        full_ep_t = torch.as_tensor(full_ep, device=self.device)
        n = T * N
        mb = min(ppo.batch_size, n)
        sums = torch.zeros(8)
        count, stop = 0, False
        for _ in range(ppo.num_epochs):
            perm = self.np_rng.permutation(n)
            for start in range(0, n, mb):
                idx = perm[start:start + mb]
                it = torch.as_tensor(idx, device=self.device)
                kl = torch.zeros((), device=self.device)
                plan = None
                if self.echo.latent_plan:
                    win, mask = self._gather_windows(full_obs_t, full_ep_t, idx // N, idx % N, k + 1)
                    plan, kl = self._plan_and_kl(win, mask)
                logits, values, h = self._heads(obs[it], plan, eps[it])
                terms = ppo_loss(logits, values, actions[it], old_logp[it], old_v[it], adv_t[it], ret_t[it],
                                 clip_epsilon=ppo.clip_epsilon, value_loss_coef=ppo.value_loss_coef,
                                 entropy_coef=ppo.entropy_coef, kl_coef=ppo.kl_coef, value_clip=ppo.value_clip,
                                 normalize_advantages=ppo.normalize_advantages)
                loss = terms.loss + self.plan_cfg.kl_weight * kl
                wm = torch.zeros((), device=self.device)
                if self.echo.world_model_coef > 0:
                    wm = self.wm_head.loss(h, actions[it], wm_target[it])
                    loss = loss + self.echo.world_model_coef * wm
                g = self.lpo.step(loss)
                sums += torch.tensor([terms.policy_loss.item(), terms.value_loss.item(), terms.entropy.item(),
                                      terms.approx_kl.item(), terms.clip_fraction.item(), kl.item(), wm.item(),
                                      g["grad_norm_policy"]])
                count += 1
                if ppo.target_kl is not None and terms.approx_kl.item() > ppo.target_kl:
                    stop = True
                    break
            if stop:
                break
        pl, vl, ent, akl, cf, pkl, wml, gn = (sums / count).tolist()
        return {"loss/policy": pl, "loss/value": vl, "loss/entropy": ent, "loss/approx_kl": akl,
                "loss/clip_fraction": cf, "loss/plan_kl": pkl, "loss/world_model": wml, "loss/grad_norm": gn,
                "loss/learning_rate": self.lpo.optimizer.param_groups[0]["lr"], "loss/minibatches": float(count)}

    def _plan_and_kl(self, win: torch.Tensor, mask: torch.Tensor) -> tuple[PlanDistribution, torch.Tensor]:
        """Plan for s_t (slots 1..k) and, when weighted, the KL to the plan for s_{t-1} (slots 0..k-1)."""
        states = self._states(win)
        if self.plan_cfg.kl_weight == 0:
            return self.lpo.encoder(states[:, 1:], mask[:, 1:]), torch.zeros((), device=win.device)
        current, previous = self.lpo.encoder.consecutive(states, mask)
        return current, consecutive_plan_kl(current, previous, mask[:, -2])

    def _gather_windows(self, full_obs: torch.Tensor, full_ep: torch.Tensor, t: np.ndarray, env: np.ndarray,
                        width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows of ``width`` states ending at rollout step t (full index t + k) for each (t, env)."""
        k = self.k
        rows = torch.as_tensor(t[:, None] + (k + 1 - width) + np.arange(width)[None], device=full_obs.device)
        cols = torch.as_tensor(env[:, None].repeat(width, 1), device=full_obs.device)
        w, e = full_obs[rows, cols], full_ep[rows, cols]
        mask = (e == e[:, -1:]) & (e >= 0)
        return w, mask

    def _windows_at(self, full_obs, full_ep, envs: np.ndarray, steps: list[int]):
        """k-state windows at the given rollout steps (step T = the bootstrap state) for all ``envs``."""
        fo, fe = torch.as_tensor(full_obs, device=self.device), torch.as_tensor(full_ep, device=self.device)
        out_w, out_m = [], []
        for s in steps:
            w, m = self._gather_windows(fo, fe, np.full(len(envs), s), envs, self.k)
            out_w.append(w)
            out_m.append(m)
        return out_w, out_m

    # -- replay -------------------------------------------------------------------
    def _item_example(self) -> dict:
        L, k = self.echo.sequence_length, self.k
        return {"obs": np.zeros((k + L + 1, self.obs_dim), np.uint8), "ep": np.zeros(k + L + 1, np.int64),
                "eps": np.zeros((L, self.latent), np.float16), "actions": np.zeros(L, np.int64),
                "logprobs": np.zeros(L, np.float32), "rewards": np.zeros(L, np.float32),
                "terminated": np.zeros(L, bool), "truncated": np.zeros(L, bool),
                "final_values": np.zeros(L, np.float32)}

    def _make_replay(self):
        from echo_rl.core.prioritized_replay import HotColdBuffer

        rc = self.config.replay_config
        example = self._item_example()
        item_bytes = sum(v.nbytes for v in example.values())
        hot = min(rc.hot_buffer_size, rc.age_threshold, rc.max_replay_age)
        cold = max(0, min(rc.cold_buffer_size, rc.max_replay_age - hot))
        need = (hot + cold) * item_bytes
        self.replay_bytes = need
        if need > REPLAY_MEMORY_LIMIT:
            raise ConfigError(
                f"TrainingConfig.replay_config would preallocate {need / 2**30:.1f} GiB for {hot + cold} sequences "
                f"of {item_bytes} bytes (limit {REPLAY_MEMORY_LIMIT / 2**30:.0f} GiB): for echo-rl a replay item "
                f"is a sequence of {self.echo.sequence_length} steps; lower replay_config.max_replay_age / "
                f"cold_buffer_size")
        if need > REPLAY_CHECKPOINT_LIMIT:  # said once here, not at every checkpoint
            warnings.warn(f"echo-rl replay preallocates {need / 2**20:.0f} MiB ({hot + cold} sequences of "
                          f"{self.echo.sequence_length} steps), over the {REPLAY_CHECKPOINT_LIMIT / 2**20:.0f} MiB "
                          f"checkpoints carry: a resumed run starts with an empty replay; lower "
                          f"replay_config.max_replay_age (configs/minigrid_doorkey8x8_echo_rl.yaml keeps 2048)",
                          stacklevel=2)
        return HotColdBuffer(rc, example=example, seed=self.config.seed + 3)

    def _sequence_items(self, roll: _Rollout, full_obs: np.ndarray, full_ep: np.ndarray) -> dict:
        L, k, T, N = self.echo.sequence_length, self.k, self.num_steps, self.num_envs
        items = {name: [] for name in self._item_example()}
        for t0 in range(0, T, L):
            items["obs"].append(full_obs[t0:t0 + k + L + 1].swapaxes(0, 1))
            items["ep"].append(full_ep[t0:t0 + k + L + 1].swapaxes(0, 1))
            sl = slice(t0, t0 + L)
            items["eps"].append(roll.eps[sl].swapaxes(0, 1).astype(np.float16))
            for name in ("actions", "logprobs", "rewards", "terminated", "truncated", "final_values"):
                items[name].append(getattr(roll, name)[sl].swapaxes(0, 1))
        return {name: np.concatenate(v) for name, v in items.items()}

    def _sequence_forward(self, data: dict):
        """Logits/values of replayed sequences: ``[L + 1, B]`` (last row: the bootstrap state).

        The L+1 windows of a sequence overlap: each of its k+L+1 states is embedded once.
        """
        L, k = self.echo.sequence_length, self.k
        obs = torch.as_tensor(data["obs"], device=self.device).transpose(0, 1)  # [k+L+1, B, D]
        ep = torch.as_tensor(data["ep"], device=self.device).transpose(0, 1)
        B = obs.shape[1]
        cur = obs[k:]  # [L+1, B, D]
        eps = torch.as_tensor(data["eps"].astype(np.float32), device=self.device).transpose(0, 1)
        eps = torch.cat([eps, torch.zeros(1, B, self.latent, device=self.device)])  # bootstrap: plan mean
        plan, kl = None, torch.zeros((), device=self.device)
        if self.echo.latent_plan:
            enc = self.lpo.encoder
            emb = enc.embed_states(self._states(obs))  # [k+L+1, B, H]
            win, mask = unfold_windows(emb, ep, k + 1)  # [L+1, B, k+1, H]
            win, mask = win.reshape(-1, k + 1, win.shape[-1]), mask.reshape(-1, k + 1)
            plan = enc.plan_from_embeddings(win[:, 1:], mask[:, 1:])
            if self.plan_cfg.kl_weight > 0:
                previous = enc.plan_from_embeddings(win[:, :-1], mask[:, :-1])
                kl = consecutive_plan_kl(plan, previous, mask[:, -2])
        logits, values, _ = self._heads(cur.reshape(-1, self.obs_dim), plan, eps.reshape(-1, self.latent))
        return logits.view(L + 1, B, -1), values.view(L + 1, B), plan, kl

    def _replay_update(self, roll: _Rollout) -> dict[str, float]:
        """Add the rollout's sequences, then ``replay_updates`` steps of value + plan-KL learning on replayed ones.

        No policy gradient on replayed data: measured, it wrecked PPO's learning on
        DoorKey-8x8 both unclipped and with GePPO's trust region (module docstring). The
        value targets are V-trace's v_s for the current policy (clipped importance ratios),
        weighted by the buffer's importance weights.
        """
        full_obs, full_ep = roll.full()
        items = self._sequence_items(roll, full_obs, full_ep)
        L = self.echo.sequence_length
        # score new sequences by the plans the actors used (mean over the sequence's steps)
        plans = None
        if self.echo.latent_plan:
            T, N = self.num_steps, self.num_envs
            plans = roll.plan_mean.reshape(T // L, L, N, -1).mean(1).reshape((T // L) * N, -1)
        self.replay.add(items, self._scores(plans, items))
        if not self.replay.ready:
            return {"replay/size": float(len(self.replay))}
        ppo, echo = self.ppo, self.echo
        sums = torch.zeros(4)
        for _ in range(echo.replay_updates):
            batch = self.replay.sample(echo.replay_batch_sequences)
            d = batch.data
            logits, values, plan, kl = self._sequence_forward(d)
            t = lambda a: torch.as_tensor(a, device=self.device).transpose(0, 1)  # noqa: E731
            actions, behav, rewards = t(d["actions"]), t(d["logprobs"]), t(d["rewards"])
            term, trunc, final_v = t(d["terminated"]), t(d["truncated"]), t(d["final_values"])
            v = values[:-1]
            with torch.no_grad():
                logp = torch.log_softmax(logits[:-1], -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
                nxt = next_values_from(v, values[-1], final_v, trunc)
                out = vtrace(behav, logp, rewards, v, nxt, ppo.gamma * (~term).float(),
                             (~(term | trunc)).float(), clip_rho_threshold=echo.vtrace_rho_bar,
                             clip_pg_rho_threshold=echo.vtrace_rho_bar, clip_c_threshold=echo.vtrace_c_bar)
            w = torch.as_tensor(batch.weights, dtype=torch.float32, device=self.device)[None]  # [1, B]
            value_loss = 0.5 * (w * (out.vs - v).pow(2)).mean()
            self.lpo.step(ppo.value_loss_coef * value_loss + self.plan_cfg.kl_weight * kl)
            # re-score with the plans of this learning pass (as PER re-scores with the pass's TD errors)
            seq_plans = None if plan is None else plan.mean.detach().view(L + 1, -1, self.latent)[:-1].mean(0)
            self.replay.update_priorities(batch.indices, self._scores(seq_plans, d, update=False))
            sums += torch.tensor([value_loss.item(), out.rhos.mean().item(),
                                  (out.rhos > echo.vtrace_rho_bar).float().mean().item(),
                                  float(np.mean(batch.weights))])
        vl, rho, clipped, wmean = (sums / echo.replay_updates).tolist()
        return {"replay/value_loss": vl, "replay/rho_mean": rho, "replay/rho_clipped_fraction": clipped,
                "replay/importance_weight_mean": wmean, "replay/size": float(len(self.replay))}

    # -- self-imitation -----------------------------------------------------------------
    def _make_self_imitation(self) -> SelfImitationReplay:
        rc = self.config.replay_config
        return SelfImitationReplay(self.num_envs, self.obs_dim, self.k, self.echo.self_imitation_capacity,
                                   self.ppo.gamma, alpha=rc.priority_alpha, beta=rc.importance_sampling_beta,
                                   priority_epsilon=rc.priority_epsilon, seed=self.config.seed + 4)

    def _window_heads(self, windows: np.ndarray, mask: np.ndarray):
        """Logits and values of steps given as their k-state windows (the newest slot is s_t)."""
        w, m = torch.as_tensor(windows, device=self.device), torch.as_tensor(mask, device=self.device)
        logits, values, _ = self._heads(w[:, -1], self._plan(w, m), None)
        return logits, values

    def _self_imitation_store(self, roll: _Rollout) -> None:
        """Add the steps of the episodes that terminated in this rollout, at priority (R - V)+."""
        items = self.sil.collect(roll.obs, roll.actions, roll.rewards, roll.terminated, roll.truncated)
        if items is None:
            return
        with torch.no_grad():
            _, values = self._window_heads(items["windows"], items["mask"])
        self.sil.buffer.add(items, np.maximum(items["return"] - values.cpu().numpy(), 0.0))

    def _self_imitation_update(self) -> dict[str, float]:
        """Learn where stored returns beat the critic. Runs after PPO's epochs, so PPO's clipped ratio
        is always to the policy that acted."""
        out = {"self_imitation/size": float(len(self.sil)), "self_imitation/episodes": float(self.sil.episodes)}
        if len(self.sil) == 0:
            return out
        sums = torch.zeros(3)
        for _ in range(self.echo.self_imitation_updates):
            batch = self.sil.buffer.sample(self.ppo.batch_size)
            d = batch.data
            logits, values = self._window_heads(d["windows"], d["mask"])
            t = lambda a: torch.as_tensor(a, device=self.device)  # noqa: E731
            loss, adv = self_imitation_loss(logits, values, t(d["action"]), t(d["return"]),
                                            t(batch.weights).float(), self.echo.self_imitation_value_coef,
                                            min_scale=self.ppo_advantage_std)
            self.lpo.step(loss)
            self.sil.buffer.update_priorities(batch.indices, adv.cpu().numpy())
            sums += torch.tensor([loss.item(), adv.mean().item(), (adv > 0).float().mean().item()])
        loss, adv_mean, positive = (sums / self.echo.self_imitation_updates).tolist()
        out.update({"self_imitation/loss": loss, "self_imitation/advantage_mean": adv_mean,
                    "self_imitation/positive_fraction": positive})
        return out

    def _scores(self, plans, items: dict, update: bool = True) -> np.ndarray:
        """Plan-surprise score per sequence: its mean plan ``[B, latent]`` against tau_bar, plus |summed reward|."""
        B = items["actions"].shape[0]
        plans = np.zeros((B, 1)) if plans is None else np.asarray(plans.cpu() if torch.is_tensor(plans) else plans)
        return self.replay.surprise.score_batch(plans, items["rewards"].sum(1), update=update)

    # -- checkpointing ------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"lpo": self.lpo.state_dict(), "generator": self.generator.get_state(),
                "np_rng": self.np_rng.bit_generator.state, "env_steps": self.env_steps, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.lpo.load_state_dict(state["lpo"])
        self.generator.set_state(state["generator"])
        self.np_rng.bit_generator.state = state["np_rng"]
        self.env_steps, self.updates = int(state["env_steps"]), int(state["updates"])

    def rollout_state(self) -> "_ActorState":
        """Envs mid-episode, the actors' windows and the replay's contents (picklable), so a resumed run
        continues exactly where the checkpoint left it.

        The replay is written whole (its preallocated storage), so it is carried only up to
        ``REPLAY_CHECKPOINT_LIMIT``; a bigger one is left out (the agent warned when it built it) and a
        run resumed from that checkpoint starts with an empty replay — the only thing such a resume loses.
        """
        replay = self.replay
        if replay is not None and self.replay_bytes > REPLAY_CHECKPOINT_LIMIT:
            replay = None
        return _ActorState(self.envs, {name: getattr(self, name) for name in _ActorState.FIELDS}, replay,
                           None if self.sil is None else self.sil.state())

    def load_rollout_state(self, state: "_ActorState") -> None:
        self.envs.close()
        self.envs = state.envs
        for name, value in state.arrays.items():
            setattr(self, name, value)
        if self.replay is not None and state.replay_npz is not None:
            state.load_replay(self.replay)
        if self.sil is not None and state.sil is not None:
            self.sil.load_state(state.sil)

    def close(self) -> None:
        self.envs.close()


class _ActorState:
    """What the actors hold between iterations, plus the replay's contents.

    The envs are snapshotted the way the PPO collector does; the replay (and the
    self-imitation buffer) as the bytes of its own exact ``save`` file (contents,
    priorities, sampling RNG, EMA plan), held as uint8 arrays in checkpoints so
    that they are plain data (``echo_rl.training.state_codec``), not opaque bytes.
    """

    FIELDS = ("next_obs", "hist_obs", "hist_ep", "cur_ep", "ep_return", "ep_length")

    def __init__(self, envs, arrays: dict, replay=None, sil: dict | None = None):
        self.envs, self.arrays = envs, {k: np.copy(v) for k, v in arrays.items()}
        self.sil = sil
        self.replay_npz: bytes | None = None
        if replay is not None:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "replay.npz"
                replay.save(path)
                self.replay_npz = path.read_bytes()

    def load_replay(self, replay) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "replay.npz"
            path.write_bytes(self.replay_npz)
            replay.load(path)

    def __getstate__(self) -> dict:
        from echo_rl.environments.minigrid_vector import snapshot_vector_env

        sil = None if self.sil is None else {**self.sil, "buffer_npz": _as_array(self.sil["buffer_npz"])}
        return {"envs": snapshot_vector_env(self.envs), "arrays": self.arrays,
                "replay_npz": _as_array(self.replay_npz), "sil": sil}

    def __setstate__(self, state: dict) -> None:
        from echo_rl.environments.minigrid_vector import restore_vector_env

        self.envs, self.arrays = restore_vector_env(state["envs"]), state["arrays"]
        self.replay_npz = _as_bytes(state.get("replay_npz"))
        sil = state.get("sil")
        self.sil = None if sil is None else {**sil, "buffer_npz": _as_bytes(sil["buffer_npz"])}


def _as_array(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=np.uint8)


def _as_bytes(blob: np.ndarray | bytes | None) -> bytes | None:
    return None if blob is None else bytes(blob) if isinstance(blob, bytes) else np.asarray(blob, np.uint8).tobytes()
