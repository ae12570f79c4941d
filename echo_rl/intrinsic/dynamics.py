"""An embedding trained by inverse (and optionally forward) dynamics, shared by ICM, RIDE, E3B and NGU.

The inverse model (predict a_t from phi(s_t), phi(s_t+1)) makes phi keep only
what the agent can affect (Pathak et al. 2017). ICM and RIDE add a forward
model (predict phi(s_t+1) from phi(s_t), a_t) and mix the two losses as
``(1 - fw) * L_inverse + fw * L_forward`` (ICM's beta = 0.2). As in ICM's
reference code, the forward loss also trains phi (no stop-gradient on
phi(s_t+1)); the larger inverse weight keeps phi from collapsing to zero.
"""

from __future__ import annotations

import torch

from echo_rl.intrinsic.base import minibatches
from echo_rl.intrinsic.networks import ForwardHead, InverseHead, encode, inverse_loss, make_encoder


class DynamicsEmbedding:
    def __init__(self, kind: str, obs_shape: tuple[int, ...], action_dim: int, discrete: bool, *,
                 latent_dim: int, hidden: int, lr: float, device: torch.device, with_forward: bool,
                 forward_weight: float = 0.2):
        if with_forward and not 0.0 <= forward_weight <= 1.0:
            raise ValueError(f"forward_weight={forward_weight} must lie in [0, 1]")
        self.obs_ndim = len(obs_shape)
        self.discrete = discrete
        self.forward_weight = float(forward_weight) if with_forward else 0.0
        self.encoder = make_encoder(kind, obs_shape, latent_dim, hidden).to(device)
        self.inverse = InverseHead(latent_dim, action_dim, hidden).to(device)
        self.forward = ForwardHead(latent_dim, action_dim, hidden).to(device) if with_forward else None
        params = [*self.encoder.parameters(), *self.inverse.parameters()]
        if self.forward is not None:
            params += list(self.forward.parameters())
        self.optimizer = torch.optim.Adam(params, lr=lr)

    def nets(self) -> dict[str, torch.nn.Module]:
        nets = {"encoder": self.encoder, "inverse": self.inverse}
        if self.forward is not None:
            nets["forward"] = self.forward
        return nets

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return encode(self.encoder, x, self.obs_ndim)

    def losses(self, obs: torch.Tensor, actions: torch.Tensor, next_obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Losses on a flat batch (B, ...): 'inverse', 'forward' (when built) and their weighted 'total'."""
        phi, phi_next = self.embed(obs), self.embed(next_obs)
        out = {"inverse": inverse_loss(self.inverse(phi, phi_next), actions, self.discrete)}
        if self.forward is not None:
            pred = self.forward(phi, actions)
            out["forward"] = 0.5 * (pred - phi_next).pow(2).sum(-1).mean()
            out["total"] = (1 - self.forward_weight) * out["inverse"] + self.forward_weight * out["forward"]
        else:
            out["total"] = out["inverse"]
        return out

    def train(self, obs: torch.Tensor, actions: torch.Tensor, next_obs: torch.Tensor, *, epochs: int,
              batch_size: int, generator: torch.Generator) -> dict[str, float]:
        """Minibatch Adam over a (T, N, ...) rollout; returns each loss averaged over the steps taken."""
        o = obs.reshape(-1, *obs.shape[2:])
        a = actions.reshape(-1, actions.shape[-1])
        no = next_obs.reshape(-1, *next_obs.shape[2:])
        sums: dict[str, float] = {}
        steps = 0
        for _ in range(epochs):
            for idx in minibatches(o.shape[0], batch_size, generator):
                idx = idx.to(o.device)
                losses = self.losses(o[idx], a[idx], no[idx])
                self.optimizer.zero_grad()
                losses["total"].backward()
                self.optimizer.step()
                for k, v in losses.items():
                    sums[k] = sums.get(k, 0.0) + float(v.detach())
                steps += 1
        return {f"{k}_loss": v / max(steps, 1) for k, v in sums.items()}
