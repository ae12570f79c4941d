"""Never Give Up's intrinsic reward (Badia et al. 2020, arXiv:2002.06038).

Episodic novelty: each env keeps a memory M of the controllable embeddings
f(s) (trained by inverse dynamics) seen in its current episode. For a new
state, with d_i^2 the squared distances to its k nearest neighbours in M and
d_m^2 a running mean of those squared k-NN distances,

    K(x, y) = eps / ( max(d^2 / d_m^2 - xi, 0) + eps )
    s = sqrt( sum_{i<=k} K(f(s), n_i) ) + c
    r_episodic = 1 / s   (0 when s > s_m)

Lifelong novelty modulates it through RND: with err the RND error and its
running mean/std, alpha = 1 + (err - mean(err)) / std(err), and

    r = r_episodic * min( max(alpha, 1), L ).

Paper defaults: k = 10, eps = 1e-3, xi = 0.008, c = 1e-3, s_m = 8, L = 5.
"""

from __future__ import annotations

import torch

from echo_rl.intrinsic.base import IntrinsicBase, RunningMeanStd, seeded
from echo_rl.intrinsic.dynamics import DynamicsEmbedding
from echo_rl.intrinsic.rnd import RND


def episodic_kernel_bonus(knn_d2: torch.Tensor, dm2: float, *, eps: float = 1e-3, xi: float = 0.008,
                          c: float = 1e-3, s_max: float = 8.0, valid: torch.Tensor | None = None) -> torch.Tensor:
    """NGU's episodic reward from squared k-NN distances (..., k); ``valid`` masks unfilled neighbours."""
    dn = (knn_d2 / max(float(dm2), 1e-8) - xi).clamp(min=0.0)
    kernel = eps / (dn + eps)
    if valid is not None:
        kernel = kernel * valid
    s = kernel.sum(-1).sqrt() + c
    return torch.where(s > s_max, torch.zeros_like(s), 1.0 / s)


class NGU(IntrinsicBase):
    _state_keys = ("memory", "memory_size", "fresh", "dm2_sum", "dm2_count", "err_rms")

    def __init__(self, observation_space, action_space, device="cpu", *, latent_dim: int = 32, hidden: int = 256,
                 lr: float = 1e-3, batch_size: int = 256, epochs: int = 1, k: int = 10, kernel_epsilon: float = 1e-3,
                 cluster_distance: float = 0.008, c: float = 1e-3, s_max: float = 8.0, max_modulation: float = 5.0,
                 capacity: int = 5000, rnd_latent_dim: int = 128, rnd_lr: float = 1e-4, seed: int = 0):
        super().__init__(observation_space, action_space, device)
        if k < 1 or capacity < 1 or max_modulation < 1:
            raise ValueError(f"NGU needs k >= 1, capacity >= 1, max_modulation >= 1; got {k}, {capacity}, "
                             f"{max_modulation}")
        self.batch_size, self.epochs, self.latent_dim = int(batch_size), int(epochs), int(latent_dim)
        self.k, self.eps, self.xi, self.c, self.s_max = int(k), kernel_epsilon, cluster_distance, c, s_max
        self.max_modulation, self.capacity = float(max_modulation), int(capacity)
        with seeded(seed):
            self.dynamics = DynamicsEmbedding(self.kind, self.obs_shape, self.action_dim, self.discrete,
                                              latent_dim=latent_dim, hidden=hidden, lr=lr, device=self.device,
                                              with_forward=False)
        self.rnd = RND(observation_space, action_space, device, latent_dim=rnd_latent_dim, hidden=hidden, lr=rnd_lr,
                       batch_size=batch_size, epochs=epochs, seed=seed + 1)
        self.generator = torch.Generator().manual_seed(seed)
        self._nets = self.dynamics.nets()
        self._optims = {"dynamics": self.dynamics.optimizer}
        self.memory: torch.Tensor | None = None  # (N, capacity, d) ring buffers
        self.memory_size: torch.Tensor | None = None  # (N,) states written this episode
        self.fresh: torch.Tensor | None = None
        self.dm2_sum, self.dm2_count = 0.0, 0
        self.err_rms = RunningMeanStd((), self.device)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "rnd": self.rnd.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.rnd.load_state_dict(state["rnd"])

    def _write(self, f: torch.Tensor, envs: torch.Tensor) -> None:
        slot = self.memory_size[envs] % self.capacity
        self.memory[envs, slot] = f
        self.memory_size[envs] += 1

    def _episodic(self, f: torch.Tensor) -> torch.Tensor:
        """r_episodic for each env's query f (N, d) against its memory; updates the running d_m^2."""
        filled = self.memory_size.clamp(max=self.capacity)
        width = int(filled.max())  # only the slots some env has written
        d2 = (self.memory[:, :width] - f[:, None]).pow(2).sum(-1)  # (N, width)
        valid = torch.arange(width, device=self.device)[None] < filled[:, None]
        d2 = d2.masked_fill(~valid, float("inf"))
        k = min(self.k, width)
        knn = d2.topk(k, dim=1, largest=False).values
        ok = torch.isfinite(knn)
        self.dm2_sum += float(knn[ok].sum())
        self.dm2_count += int(ok.sum())
        dm2 = self.dm2_sum / max(self.dm2_count, 1)
        return episodic_kernel_bonus(knn.masked_fill(~ok, 0.0), dm2, eps=self.eps, xi=self.xi, c=self.c,
                                     s_max=self.s_max, valid=ok.float())

    def modulator(self, next_obs: torch.Tensor) -> torch.Tensor:
        """min(max(alpha, 1), L) from RND's error on preprocessed (T, N, ...) states; updates its statistics."""
        err = self.rnd.prediction_error(next_obs)
        self.err_rms.update(err)
        alpha = 1.0 + (err - self.err_rms.mean) / self.err_rms.std
        return alpha.clamp(1.0, self.max_modulation)

    @torch.no_grad()
    def compute(self, obs, actions, next_obs, dones) -> torch.Tensor:
        obs, _, next_obs, dones = self._rollout(obs, actions, next_obs, dones)
        t_len, n = obs.shape[:2]
        if self.memory is None:
            self.memory = torch.zeros(n, self.capacity, self.latent_dim, device=self.device)
            self.memory_size = torch.zeros(n, dtype=torch.long, device=self.device)
            self.fresh = torch.ones(n, dtype=torch.bool, device=self.device)
        elif self.memory.shape[0] != n:
            raise ValueError(f"NGU was run with {self.memory.shape[0]} envs and now gets {n}")
        f, f_next = self.dynamics.embed(obs), self.dynamics.embed(next_obs)
        everyone = torch.arange(n, device=self.device)
        episodic = torch.zeros(t_len, n, device=self.device)
        for t in range(t_len):
            if self.fresh.any():
                first = self.fresh.nonzero().squeeze(-1)
                self._write(f[t, first], first)
                self.fresh[first] = False
            episodic[t] = self._episodic(f_next[t])
            self._write(f_next[t], everyone)
            if dones[t].any():
                ended = dones[t].nonzero().squeeze(-1)
                self.memory_size[ended] = 0
                self.fresh[ended] = True
        return (episodic * self.modulator(next_obs)).float()

    def update(self, obs, actions, next_obs, dones) -> dict[str, float]:
        obs, actions, next_obs, _ = self._rollout(obs, actions, next_obs, dones)
        metrics = self.dynamics.train(obs, actions, next_obs, epochs=self.epochs, batch_size=self.batch_size,
                                      generator=self.generator)
        return {**metrics, **self.rnd.fit(next_obs)}
