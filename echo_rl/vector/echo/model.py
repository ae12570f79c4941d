"""The EchoRL vector agent's networks: PPO's actor-critic under a FiLM plan layer, the plan encoder, the world model.

The actor and the learner both read the heads through :class:`EchoModel`, so acting and
learning compute a step's logits the same way (the learner rebuilds exactly the plan the
actor used from the stored noise).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.planning import LatentPlanningOptimizer, PlanDistribution, consecutive_plan_kl
from echo_rl.environments.minigrid_vector import MiniGridObsEncoding
from echo_rl.models.policies import ActorCritic, FlatEncoder, MiniGridEncoder, build_actor_critic
from echo_rl.vector.rollout import flat_heads

STATE_SCALE = 0.1  # MiniGrid indices are < 11: keep the plan encoder's inputs O(1)


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


class EchoModel:
    """Plan encoder + FiLM-conditioned actor-critic + world model, and their optimiser (``lpo``).

    Built in PPO's order after ``torch.manual_seed(config.seed)`` — the base actor-critic
    first — so its initial weights are PPO's (``TrainingConfig.policy_network``).
    """

    def __init__(self, config: TrainingConfig, obs_dim: int, num_actions: int, device: torch.device):
        self.config, self.echo, self.plan_cfg, self.device = config, config.echo_config, config.planning_config, device
        self.obs_dim, self.num_actions = obs_dim, num_actions
        self.k, self.latent = self.plan_cfg.state_window_size, self.plan_cfg.embedding_dim
        self.encoding = MiniGridObsEncoding()
        if config.encoder is None:
            base = self._base_network(config.policy_network)
        else:
            try:
                base = self.base_network(config.encoder)
            except ValueError as exc:
                raise ConfigError(f"TrainingConfig.encoder={config.encoder!r} does not fit the echo-rl agent: "
                                  f"{exc}") from None
        self._build(base)

    def _build(self, base: ActorCritic) -> None:
        """World model, plan encoder and the plan-conditioned policy around ``base``'s encoder and heads, and
        their optimiser (in this order: the initial weights are PPO's, then the plan's)."""
        plan_cfg = self.plan_cfg if self.echo.latent_plan else self.plan_cfg.replace(soft_prefix_alpha=0.0)
        wm_dim = base.encoder.out_dim + (self.latent if self.echo.latent_plan else 0)
        self.wm_head = WorldModelHead(wm_dim, self.num_actions, self.encoding)
        ppo = self.config.ppo_config
        self.lpo = LatentPlanningOptimizer(
            self.obs_dim, self.num_actions, plan_cfg, policy_lr=ppo.learning_rate,
            policy_max_grad_norm=ppo.max_grad_norm, trunk=base.encoder, heads=(base.actor, base.critic),
            extra_modules=[self.wm_head])
        self.lpo.modules().to(self.device)
        acting = {"encoder": self.lpo.encoder, "policy": self.lpo.policy}
        if hasattr(self, "acting"):  # a swap: the same container, so whoever holds it sends the new weights
            self.acting.update(acting)
        else:
            #: what the actors act with (plan encoder, trunk, FiLM, heads): the weights sent to remote actors
            self.acting = nn.ModuleDict(acting)
        self.refresh_heads()

    def refresh_heads(self) -> None:
        """Rebuild the heads' flat path (``rollout.flat_heads``, PPO's) from the policy's current heads and
        distribution. Called after a swap and once per iteration and evaluation, as PPO rebuilds its own."""
        pol = self.lpo.policy
        self._flat_heads = flat_heads(pol.policy_head, pol.value_head, getattr(pol, "distribution", None))

    def _base_network(self, network: str) -> ActorCritic:
        """PPO's actor-critic for TrainingConfig.policy_network; its encoder is the trunk under the FiLM layer.

        ``minigrid``: per-cell embeddings -> ``echo_config.hidden_dim`` features, 64-unit heads
        (``make_actor_critic``'s shape at the default width 128); ``mlp``: the flat observation, 64x64 heads.
        """
        if network == "minigrid":
            encoder = MiniGridEncoder(self.encoding, hidden=self.echo.hidden_dim)
            return ActorCritic(self.num_actions, encoder, hidden=(64,))
        if network == "mlp":
            return ActorCritic(self.num_actions, FlatEncoder(self.obs_dim), hidden=(64, 64))
        raise ConfigError(f"TrainingConfig.policy_network={network!r} is invalid for echo-rl: allowed: minigrid, mlp")

    def base_network(self, encoder: str | nn.Module) -> ActorCritic:
        """Fresh heads around ``encoder``: a name (``echo_rl.models.encoders``; ``minigrid`` and ``mlp`` are
        :meth:`_base_network`'s, at ``echo_config.hidden_dim``) or a module with ``out_dim``, used as it is.
        ValueError (one line) when it does not fit MiniGrid's symbolic observation."""
        if encoder in ("minigrid", "mlp"):
            return self._base_network(encoder)
        return build_actor_critic(encoder, (self.obs_dim,), np.uint8, self.num_actions)

    def replace_network(self, base: ActorCritic) -> None:
        """The policy becomes ``base``'s encoder and heads under a fresh (zero, so inert) FiLM layer, with a fresh
        optimiser. The plan encoder, its EMA plan and the world model keep what they learned (the world model
        starts afresh only when the trunk's width, its input, changed); a distribution stays with the new heads."""
        old_lpo, old_wm = self.lpo, self.wm_head
        distribution = getattr(old_lpo.policy, "distribution", None)
        self._build(base)
        self.lpo.encoder.load_state_dict(old_lpo.encoder.state_dict())
        self.lpo.ema_plan.load_state_dict(old_lpo.ema_plan.state_dict())
        if old_wm.net[0].in_features == self.wm_head.net[0].in_features:
            self.wm_head.load_state_dict(old_wm.state_dict())
        if distribution is not None:
            self.lpo.policy.distribution = distribution
            self.refresh_heads()

    @property
    def encoder(self):
        return self.lpo.encoder

    def tensor(self, a) -> torch.Tensor:
        return torch.as_tensor(a, device=self.device)

    def states(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float() * STATE_SCALE

    def plan(self, windows: torch.Tensor, masks: torch.Tensor) -> PlanDistribution | None:
        """Plan distribution from windows of k states (uint8); None when the plan is switched off."""
        if not self.echo.latent_plan:
            return None
        return self.lpo.encoder(self.states(windows), masks)

    def heads(self, obs: torch.Tensor, plan: PlanDistribution | None, eps: torch.Tensor | None):
        """-> (logits, values, world-model input).

        The policy and value heads read the plan *mean*, detached; the world model reads
        (trunk features, detached; the plan sample mu + sigma*eps, eps None: the mean).
        So the RL loss trains the trunk, FiLM and heads, and the world model and plan KL
        train the plan encoder (see the package docstring for the measurements).
        """
        pol = self.lpo.policy
        h = pol.trunk(obs)
        if plan is None:
            features, wm_in = h, h.detach()
        else:
            tau = plan.rsample(eps if eps is not None else torch.zeros_like(plan.mean))
            features, wm_in = pol.condition(h, plan.mean.detach()), torch.cat([h.detach(), tau], -1)
        return (*self._outputs(features), wm_in)

    def heads_on_plan_means(self, obs: torch.Tensor, plan_mean: torch.Tensor | None):
        """-> (logits, values) of steps whose plan means are given: the ones the actors acted with
        (``echo_config.plan_pass=rollout``), so PPO's pass computes no plan."""
        pol = self.lpo.policy
        h = pol.trunk(obs)
        return self._outputs(h if plan_mean is None else pol.condition(h, plan_mean))

    def _outputs(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, values) of conditioned features: PPO's flat head path where the heads allow it."""
        if self._flat_heads is not None:
            return self._flat_heads(features)
        pol = self.lpo.policy
        logits = pol.policy_head(features)
        distribution = getattr(pol, "distribution", None)  # agent.set(distribution=...): normalised log-probs
        if distribution is not None:
            logits = distribution(logits)
        return logits, pol.value_head(features).squeeze(-1)

    def chunk_plan_terms(self, obs: torch.Tensor, ep: torch.Tensor, eps: torch.Tensor, actions: torch.Tensor,
                         wm_target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Plan KL and world-model CE of whole stretches of G envs' rollouts, each state embedded once.

        ``obs [k+T, G, D]`` (uint8; the k context states first) and ``ep [k+T, G]``;
        ``eps``, ``actions``, ``wm_target`` are the T steps' ``[T, G, ...]``. The plan of step t reads the
        window of k states ending at s_t; the plan it is pulled towards is step t-1's, the neighbouring window
        (where s_{t-1} is in s_t's episode both windows' masks agree, and elsewhere the KL does not count).
        The world model reads the trunk's features (no gradient: they are the policy's) and the plan sample.
        """
        k = self.k
        T, G = obs.shape[0] - k, obs.shape[1]
        kl, tau = torch.zeros((), device=obs.device), None
        if self.echo.latent_plan:
            enc = self.lpo.encoder
            emb = enc.embed_states(self.states(obs))  # [k+T, G, H]
            win, mask = unfold_windows(emb, ep, k)  # [T+1, G, k, H]: windows ending at s_{-1} .. s_{T-1}
            plans = enc.plan_from_embeddings(win.reshape(-1, k, win.shape[-1]), mask.reshape(-1, k))
            mean, log_std = plans.mean.view(T + 1, G, -1), plans.log_std.view(T + 1, G, -1)
            current = PlanDistribution(mean[1:], log_std[1:])
            if self.plan_cfg.kl_weight > 0:
                same = (ep[k - 1:-1] == ep[k:]) & (ep[k - 1:-1] >= 0)
                kl = consecutive_plan_kl(current, PlanDistribution(mean[:-1], log_std[:-1]), same)
            tau = current.rsample(eps).reshape(T * G, -1)
        wm = torch.zeros((), device=obs.device)
        if self.echo.world_model_coef > 0:
            with torch.no_grad():
                h = self.lpo.policy.trunk(obs[k:].reshape(T * G, -1))
            wm_in = h if tau is None else torch.cat([h, tau], -1)
            wm = self.wm_head.loss(wm_in, actions.reshape(-1), wm_target.reshape(T * G, -1))
        return kl, wm

    @torch.no_grad()
    def rollout_plan_means(self, obs: torch.Tensor, ep: torch.Tensor) -> torch.Tensor:
        """The current encoder's plan means of every rollout step, ``[T*N, latent]`` in flat order t*N + n, from
        ``obs [k+T, N, D]`` (uint8; the k context states first) and ``ep [k+T, N]``: each state embedded once,
        the windows the actors read (``echo_config.plan_refresh=epoch``)."""
        k, enc = self.k, self.lpo.encoder
        emb = enc.embed_states(self.states(obs))  # [k+T, N, H]
        win, mask = unfold_windows(emb, ep, k)  # [T+1, N, k, H]: windows ending at s_{-1} .. s_{T-1}
        win, mask = win[1:], mask[1:]
        return enc.plan_from_embeddings(win.reshape(-1, k, win.shape[-1]), mask.reshape(-1, k)).mean

    def draw_eps(self, n: int, generator: torch.Generator) -> torch.Tensor | None:
        """Plan noise for n plans (None when the plan is off: no draw, so the actions match PPO's)."""
        if not self.echo.latent_plan:
            return None
        return torch.randn(n, self.latent, generator=generator).to(self.device)

    def window_heads(self, windows: np.ndarray, mask: np.ndarray):
        """Logits and values of steps given as their k-state windows (the newest slot is s_t).

        The heads read the plan mean detached and the world-model input is dropped, so no gradient
        reaches the plan encoder from here: its forward pass runs without autograd's records."""
        w, m = self.tensor(windows), self.tensor(mask)
        with torch.no_grad():
            plan = self.plan(w, m)
        logits, values, _ = self.heads(w[:, -1], plan, None)
        return logits, values

    def plan_and_kl(self, win: torch.Tensor, mask: torch.Tensor) -> tuple[PlanDistribution, torch.Tensor]:
        """Plan for s_t (slots 1..k) and, when weighted, the KL to the plan for s_{t-1} (slots 0..k-1)."""
        return self.plan_and_kl_states(self.states(win), mask)

    def plan_and_kl_states(self, states: torch.Tensor, mask: torch.Tensor) -> tuple[PlanDistribution, torch.Tensor]:
        """:meth:`plan_and_kl` of windows already scaled by :meth:`states` (PPO's epochs scale a rollout's
        windows once, not once per minibatch)."""
        if self.plan_cfg.kl_weight == 0:
            return self.lpo.encoder(states[:, 1:], mask[:, 1:]), torch.zeros((), device=states.device)
        current, previous = self.lpo.encoder.consecutive(states, mask)
        return current, consecutive_plan_kl(current, previous, mask[:, -2])

    def gather_windows(self, full_obs: torch.Tensor, full_ep: torch.Tensor, t: np.ndarray, env: np.ndarray,
                       width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows of ``width`` states ending at rollout step t (full index t + k) for each (t, env)."""
        k = self.k
        rows = torch.as_tensor(t[:, None] + (k + 1 - width) + np.arange(width)[None], device=full_obs.device)
        cols = torch.as_tensor(env[:, None].repeat(width, 1), device=full_obs.device)
        w, e = full_obs[rows, cols], full_ep[rows, cols]
        mask = (e == e[:, -1:]) & (e >= 0)
        return w, mask

    def sequence_forward(self, data: dict, sequence_length: int):
        """Logits/values of replayed sequences: ``[L + 1, B]`` (last row: the bootstrap state), plans, plan KL.

        The L+1 windows of a sequence overlap: each of its k+L+1 states is embedded once.
        """
        L, k = sequence_length, self.k
        obs = self.tensor(data["obs"]).transpose(0, 1)  # [k+L+1, B, D]
        ep = self.tensor(data["ep"]).transpose(0, 1)
        B = obs.shape[1]
        cur = obs[k:]  # [L+1, B, D]
        eps = self.tensor(data["eps"].astype(np.float32)).transpose(0, 1)
        eps = torch.cat([eps, torch.zeros(1, B, self.latent, device=self.device)])  # bootstrap: plan mean
        plan, kl = None, torch.zeros((), device=self.device)
        if self.echo.latent_plan:
            enc = self.lpo.encoder
            emb = enc.embed_states(self.states(obs))  # [k+L+1, B, H]
            win, mask = unfold_windows(emb, ep, k + 1)  # [L+1, B, k+1, H]
            win, mask = win.reshape(-1, k + 1, win.shape[-1]), mask.reshape(-1, k + 1)
            plan = enc.plan_from_embeddings(win[:, 1:], mask[:, 1:])
            if self.plan_cfg.kl_weight > 0:
                previous = enc.plan_from_embeddings(win[:, :-1], mask[:, :-1])
                kl = consecutive_plan_kl(plan, previous, mask[:, -2])
        logits, values, _ = self.heads(cur.reshape(-1, self.obs_dim), plan, eps.reshape(-1, self.latent))
        return logits.view(L + 1, B, -1), values.view(L + 1, B), plan, kl
