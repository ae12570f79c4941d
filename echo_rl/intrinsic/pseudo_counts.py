"""Count-based exploration with SimHash pseudo-counts (Tang et al. 2017, arXiv:1611.04717).

States are hashed to k-bit codes, phi(s) = sgn(A g(s)) with A a fixed k x D
Gaussian matrix and g(s) the flattened observation (images scaled to [0, 1]);
nearby states share a code, so a count over codes generalises a tabular count
(the classic bonus of Strehl & Littman 2008). Each visit increments N(phi(s))
and pays

    r(s) = 1 / sqrt( N(phi(s)) )

(counting this visit). Counts are lifelong: they persist across episodes and
rollouts and are part of the state dict. Fewer bits merge more states.
"""

from __future__ import annotations

import numpy as np
import torch

from echo_rl.intrinsic.base import IntrinsicBase, seeded


class PseudoCounts(IntrinsicBase):
    _state_keys = ("projection", "counts")

    def __init__(self, observation_space, action_space, device="cpu", *, hash_bits: int = 64, seed: int = 0):
        super().__init__(observation_space, action_space, device)
        if hash_bits < 1:
            raise ValueError(f"hash_bits={hash_bits} must be >= 1")
        dim = int(np.prod(self.obs_shape))
        with seeded(seed):
            self.projection = torch.randn(hash_bits, dim).to(self.device)  # A in phi(s) = sgn(A g(s))
        self.counts: dict[bytes, int] = {}

    def hash_codes(self, x: torch.Tensor) -> np.ndarray:
        """Preprocessed (T, N, ...) states -> (T, N, ceil(k / 8)) packed sign bits."""
        bits = (x.reshape(*x.shape[:2], -1) @ self.projection.T) > 0
        return np.packbits(bits.cpu().numpy(), axis=-1)

    @torch.no_grad()
    def compute(self, obs, actions, next_obs, dones) -> torch.Tensor:
        _, _, next_obs, _ = self._rollout(obs, actions, next_obs, dones)
        codes = self.hash_codes(next_obs)
        t_len, n = codes.shape[:2]
        visits = np.empty((t_len, n), dtype=np.float32)
        for t in range(t_len):
            for e in range(n):
                key = codes[t, e].tobytes()
                self.counts[key] = self.counts.get(key, 0) + 1
                visits[t, e] = self.counts[key]
        return torch.from_numpy(visits).to(self.device).rsqrt()

    def update(self, obs, actions, next_obs, dones) -> dict[str, float]:
        """Counting happens in ``compute`` (the bonus includes the visit); this reports the table size."""
        self._rollout(obs, actions, next_obs, dones)
        return {"distinct_hashes": float(len(self.counts))}
