"""Random Encoders for Efficient Exploration (Seo et al. 2021, arXiv:2102.09430).

A randomly initialised encoder that is never trained maps each state to
y = f(s); state entropy is estimated with the k-nearest-neighbour (Kozachenko-
Leonenko) estimator over the rollout's states, giving each state the bonus

    r(s_i) = log( || y_i - y_i^{k-NN} ||_2 + 1 )

where y_i^{k-NN} is y_i's k-th nearest neighbour among the other states of
the same rollout (all T x N of them). A random encoder suffices because
distances in its space still separate different states (the paper's point),
so ``update`` has nothing to train.
"""

from __future__ import annotations

import torch

from echo_rl.intrinsic.base import IntrinsicBase, seeded
from echo_rl.intrinsic.networks import encode, make_encoder


def knn_distance(y: torch.Tensor, k: int, chunk: int = 1024) -> torch.Tensor:
    """Euclidean distance from each row of y (B, D) to its k-th nearest other row (B,)."""
    if not 1 <= k < y.shape[0]:
        raise ValueError(f"k={k} needs at least {k + 1} states; the rollout has {y.shape[0]}")
    out = []
    for start in range(0, y.shape[0], chunk):
        d = torch.cdist(y[start:start + chunk], y)
        rows = torch.arange(d.shape[0], device=y.device)
        d[rows, rows + start] = float("inf")  # a state is not its own neighbour
        out.append(d.topk(k, dim=1, largest=False).values[:, k - 1])
    return torch.cat(out)


class RE3(IntrinsicBase):
    def __init__(self, observation_space, action_space, device="cpu", *, latent_dim: int = 128, hidden: int = 256,
                 k: int = 3, seed: int = 0):
        super().__init__(observation_space, action_space, device)
        if k < 1:
            raise ValueError(f"k={k} must be >= 1")
        self.k = int(k)
        with seeded(seed):
            self.encoder = make_encoder(self.kind, self.obs_shape, latent_dim, hidden).to(self.device)
        self.encoder.requires_grad_(False)
        self._nets = {"encoder": self.encoder}

    @torch.no_grad()
    def compute(self, obs, actions, next_obs, dones) -> torch.Tensor:
        _, _, next_obs, _ = self._rollout(obs, actions, next_obs, dones)
        t, n = next_obs.shape[:2]
        y = encode(self.encoder, next_obs, len(self.obs_shape)).reshape(t * n, -1)
        return torch.log(knn_distance(y, self.k) + 1.0).reshape(t, n).float()

    def update(self, obs, actions, next_obs, dones) -> dict[str, float]:
        """The encoder stays random by design (RE3); only the inputs are checked."""
        self._rollout(obs, actions, next_obs, dones)
        return {}
