"""Random Network Distillation (Burda et al. 2018, arXiv:1810.12894).

A fixed, randomly initialised target network f maps a state to a vector; a
predictor f_hat is trained to match it on the states the agent visits. The
bonus for reaching s' is the prediction error

    r(s') = || f_hat(x) - f(x) ||^2,   x = clip((s' - mu) / sigma, -5, 5)

which stays high on states unlike those trained on. Observations are
normalised by a running mean/std (updated in ``update``), as in the paper;
``update_proportion`` trains the predictor on a random share of each rollout
(the paper's 0.25 with many envs) so it does not catch up too fast.
"""

from __future__ import annotations

import torch

from echo_rl.intrinsic.base import IntrinsicBase, RunningMeanStd, minibatches, seeded
from echo_rl.intrinsic.networks import encode, make_encoder


class RND(IntrinsicBase):
    _state_keys = ("obs_rms",)

    def __init__(self, observation_space, action_space, device="cpu", *, latent_dim: int = 128,
                 hidden: int = 256, lr: float = 1e-4, batch_size: int = 256, epochs: int = 1,
                 update_proportion: float = 1.0, obs_norm: bool = True, obs_clip: float = 5.0, seed: int = 0):
        super().__init__(observation_space, action_space, device)
        if not 0.0 < update_proportion <= 1.0:
            raise ValueError(f"update_proportion={update_proportion} must lie in (0, 1]")
        self.batch_size, self.epochs, self.latent_dim = int(batch_size), int(epochs), int(latent_dim)
        self.update_proportion, self.obs_norm, self.obs_clip = float(update_proportion), bool(obs_norm), obs_clip
        with seeded(seed):
            self.target = make_encoder(self.kind, self.obs_shape, latent_dim, hidden).to(self.device)
            self.predictor = make_encoder(self.kind, self.obs_shape, latent_dim, hidden).to(self.device)
        self.target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.predictor.parameters(), lr=lr)
        self.obs_rms = RunningMeanStd(self.obs_shape, self.device)
        self.generator = torch.Generator().manual_seed(seed)
        self._nets = {"target": self.target, "predictor": self.predictor}
        self._optims = {"predictor": self.optimizer}

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        if not self.obs_norm:
            return x
        return ((x - self.obs_rms.mean) / self.obs_rms.std).clamp(-self.obs_clip, self.obs_clip)

    def prediction_error(self, x: torch.Tensor) -> torch.Tensor:
        """Per-state squared error ||f_hat - f||^2 for preprocessed (..., *obs_shape) observations."""
        x = self.normalise(x)
        nd = len(self.obs_shape)
        return (encode(self.predictor, x, nd) - encode(self.target, x, nd)).pow(2).sum(-1)

    @torch.no_grad()
    def compute(self, obs, actions, next_obs, dones) -> torch.Tensor:
        _, _, next_obs, _ = self._rollout(obs, actions, next_obs, dones)
        return self.prediction_error(next_obs).float()

    def fit(self, next_obs: torch.Tensor) -> dict[str, float]:
        """Update the observation statistics, then train the predictor on preprocessed (T, N, ...) states."""
        if self.obs_norm:
            self.obs_rms.update(next_obs.reshape(-1, *self.obs_shape))
        x = next_obs.reshape(-1, *self.obs_shape)
        total, steps = 0.0, 0
        for _ in range(self.epochs):
            for idx in minibatches(x.shape[0], self.batch_size, self.generator):
                err = self.prediction_error(x[idx.to(x.device)]) / self.latent_dim  # mean over dims
                keep = (torch.rand(err.shape, generator=self.generator) < self.update_proportion).to(err.device)
                loss = (err * keep).sum() / keep.sum().clamp(min=1)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                total, steps = total + float(loss.detach()), steps + 1
        return {"rnd_loss": total / max(steps, 1)}

    def update(self, obs, actions, next_obs, dones) -> dict[str, float]:
        _, _, next_obs, _ = self._rollout(obs, actions, next_obs, dones)
        return self.fit(next_obs)
