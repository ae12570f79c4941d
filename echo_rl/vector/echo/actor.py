"""The EchoRL actor: per-env windows of the last k states, a sampled plan, then a sampled action.

It is a :class:`~echo_rl.vector.rollout.StepActor`, so the shared
:class:`~echo_rl.vector.rollout.VectorRolloutCollector` steps the envs for it (in process,
or on Ray workers) and stores, besides PPO's fields, what the learner needs to rebuild each
step's plan: the plan noise ``eps``, the plan mean (replay scores), the episode id of every
step and the k states before the rollout (``context``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from echo_rl.models.distributions import sample_categorical
from echo_rl.planning import StateWindow
from echo_rl.vector.echo.model import EchoModel
from echo_rl.vector.rollout import RolloutBuffer, evaluate_policy, torch_generator


def rollout_fields(model: EchoModel) -> dict[str, tuple[tuple, type]]:
    """The per-step fields the collector stores for this actor (``VectorRolloutCollector(extras=...)``)."""
    plan_dim = model.latent if model.echo.latent_plan else 0
    return {"ep": ((), np.int64), "eps": ((model.latent,), np.float32), "plan_mean": ((plan_dim,), np.float32)}


@dataclass
class EchoRollout:
    """One rollout as the learner reads it (views of the collector's buffer, not copies)."""

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

    @classmethod
    def from_buffer(cls, buf: RolloutBuffer, next_obs: np.ndarray) -> "EchoRollout":
        c, x = buf.context, buf.extras
        return cls(obs=buf.obs, ep=x["ep"], ctx_obs=c["ctx_obs"], ctx_ep=c["ctx_ep"], next_obs=next_obs.copy(),
                   next_ep=c["next_ep"][0], wm_target=buf.next_observations, eps=x["eps"], plan_mean=x["plan_mean"],
                   actions=buf.actions, logprobs=buf.logprobs, values=buf.values, rewards=buf.rewards,
                   terminated=buf.terminated, truncated=buf.truncated, final_values=buf.final_values)

    @property
    def next_observations(self) -> np.ndarray:
        """``RolloutBuffer``'s name for ``wm_target``: an intrinsic reward module reads it
        (``ModularAgent.learner_batch``)."""
        return self.wm_target

    def full(self) -> tuple[np.ndarray, np.ndarray]:
        """Context + rollout + bootstrap state along time: ``[k + T + 1, N, ...]``."""
        return (np.concatenate([self.ctx_obs, self.obs, self.next_obs[None]]),
                np.concatenate([self.ctx_ep, self.ep, self.next_ep[None]]))


class EchoActor:
    """Acting with the plan path, for the collector (training) and for evaluation.

    Each env keeps its last k states, cut at episode starts (episode ids, -1: padding);
    the plan encoder turns them into p(tau_t) = N(mu, sigma). The heads read the plan mean;
    the plan noise eps is drawn and stored so the learner rebuilds the sample mu + sigma*eps.
    """

    #: the window state a checkpoint carries (``EchoAgent.rollout_state``)
    STATE = ("hist_obs", "hist_ep", "cur_ep")

    def __init__(self, model: EchoModel, num_envs: int, generator: torch.Generator):
        self.model, self.num_envs, self.generator = model, num_envs, generator
        self.reset_windows()
        self._emb: torch.Tensor | None = None
        self._eval_window: StateWindow | None = None

    def reset_windows(self) -> None:
        """Empty windows: every env starts an episode (a fresh actor, or envs re-seeded after a restart)."""
        m = self.model
        self.hist_obs = np.zeros((m.k, self.num_envs, m.obs_dim), dtype=np.uint8)
        self.hist_ep = np.full((m.k, self.num_envs), -1, dtype=np.int64)
        self.cur_ep = np.zeros(self.num_envs, dtype=np.int64)

    # -- StepActor: driven by VectorRolloutCollector.run ----------------------------------------
    def begin(self) -> dict[str, np.ndarray]:
        """The k states before the rollout; their embeddings once, kept as a ring (the weights are fixed
        for the whole rollout, so each state is embedded once)."""
        m = self.model
        if m.echo.latent_plan:
            with torch.no_grad():
                self._emb = m.encoder.embed_states(m.states(m.tensor(self.hist_obs)))
        return {"ctx_obs": self.hist_obs.copy(), "ctx_ep": self.hist_ep.copy()}

    @torch.no_grad()
    def select(self, obs: np.ndarray):
        m, n = self.model, self.num_envs
        o = m.tensor(obs)
        plan = None
        plan_mean = np.zeros((n, m.latent if m.echo.latent_plan else 0), np.float32)
        if m.echo.latent_plan:
            self._emb = torch.cat([self._emb[1:], m.encoder.embed_states(m.states(o))[None]])  # [k, N, H]
            e = np.concatenate([self.hist_ep[1:], self.cur_ep[None]])
            mask = m.tensor((e == self.cur_ep[None]) & (e >= 0))
            plan = m.encoder.plan_from_embeddings(self._emb.transpose(0, 1), mask.transpose(0, 1))
            plan_mean = plan.mean.cpu().numpy()
        eps = m.draw_eps(n, self.generator)
        logits, values, _ = m.heads(o, plan, eps)
        logp_all = torch.log_softmax(logits, -1)
        # torch.multinomial's draw without its checks (each a sync), as PPO's actors draw
        actions = sample_categorical(logp_all.exp().cpu(), self.generator).squeeze(-1)
        logp = logp_all.cpu().gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        if not torch.isfinite(logp).all():  # what multinomial's checks refused: a NaN or inf logit
            raise ValueError("the policy's action probabilities contain NaN or inf (the network diverged)")
        extras = {"ep": self.cur_ep.copy(), "plan_mean": plan_mean,
                  "eps": np.zeros((n, m.latent), np.float32) if eps is None else eps.cpu().numpy()}
        # the window that ends at s_t becomes history for s_{t+1}
        self.hist_obs = np.concatenate([self.hist_obs[1:], obs[None]])
        self.hist_ep = np.concatenate([self.hist_ep[1:], self.cur_ep[None]])
        return actions.numpy(), logp.numpy(), values.cpu().numpy(), extras

    @torch.no_grad()
    def final_values(self, final_obs: np.ndarray, envs: np.ndarray) -> np.ndarray:
        """V(final_obs) for truncated envs (plan mean); its window is the env's history (already holding s_t)."""
        m = self.model
        w = np.concatenate([self.hist_obs[1:, envs], final_obs[None]])
        e = np.concatenate([self.hist_ep[1:, envs], self.cur_ep[None, envs]])
        mask = (e == self.cur_ep[None, envs]) & (e >= 0)
        plan = m.plan(m.tensor(w).transpose(0, 1), m.tensor(mask).transpose(0, 1))
        _, values, _ = m.heads(m.tensor(final_obs), plan, None)
        return values.cpu().numpy()

    def observe(self, done: np.ndarray) -> None:
        self.cur_ep[done] += 1

    def end(self) -> dict[str, np.ndarray]:
        self._emb = None
        return {"next_ep": self.cur_ep.copy()[None]}

    # -- evaluation -------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: np.ndarray, generator: torch.Generator, episode_start: np.ndarray | None = None,
            deterministic: bool = False) -> np.ndarray:
        """Evaluation acting, the way the actors act in training: a sampled plan, then a sampled action
        (``deterministic``: the plan mean and the most likely action).

        With ``episode_start`` (True where ``obs`` begins an episode) the actor keeps
        per-env windows of the last k states, as in training. Without it, it cannot
        tell where episodes end, so — rather than let plans mix episodes — each plan
        reads s_t alone (a window of one state, as at an episode's first step).
        """
        m = self.model
        o = m.tensor(obs)
        plan = None
        if m.echo.latent_plan:
            if episode_start is None:
                w = torch.zeros(o.shape[0], m.k, m.obs_dim, dtype=o.dtype, device=m.device)
                w[:, -1] = o
                mask = torch.zeros(o.shape[0], m.k, dtype=torch.bool, device=m.device)
                mask[:, -1] = True
            else:
                if self._eval_window is None or self._eval_window.states.shape[0] != len(obs):
                    self._eval_window = StateWindow(len(obs), m.obs_dim, m.k)
                    episode_start = np.ones(len(obs), dtype=bool)
                wn, mn = self._eval_window.push(obs, episode_start)
                w, mask = m.tensor(wn), m.tensor(mn)
            plan = m.plan(w, mask)
        if deterministic:
            logits, _, _ = m.heads(o, plan, None)
            return logits.argmax(-1).cpu().numpy()
        logits, _, _ = m.heads(o, plan, m.draw_eps(len(obs), generator))
        return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1).cpu().numpy()

    def evaluate(self, make_envs, episodes: int, seed: int, num_envs: int = 8,
                 deterministic: bool = False) -> dict[str, float]:
        """``rollout.evaluate_policy`` with episode starts passed to :meth:`act` (for the plan windows)."""
        generator = torch_generator(seed)
        self._eval_window = None
        try:
            return evaluate_policy(make_envs, lambda obs, start: self.act(obs, generator, start, deterministic),
                                   episodes, seed, num_envs=num_envs, episode_starts=True)
        finally:
            self._eval_window = None
