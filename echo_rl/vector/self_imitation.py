"""Self-imitation replay (Oh et al. 2018, "Self-Imitation Learning") for the EchoRL vector agent.

Why: on sparse-reward tasks (MiniGrid DoorKey-8x8) the early policy succeeds in a
few lucky episodes and then forgets them; whether PPO ever locks on is a coin
flip per seed (docs/results.md). SIL keeps the steps of finished episodes with
their Monte Carlo return R and learns, off-policy, only where R beat the critic:

    L = E[ -log pi(a|s) (R - V(s))+  +  value_coef * 1/2 ((R - V(s))+)^2 ],

sampled by priority (R - V)+ and weighted by the prioritized replay's importance
weights. Steps whose return fell short of V contribute nothing, so stale data
cannot drag the policy towards worse actions — the failure of plain policy
gradients on replayed sequences measured in session 3.

Only episodes that *terminated* are stored: a time-limit truncation has no
Monte Carlo return (its tail is unknown), and in MiniGrid those are the
episodes with reward 0, which SIL could not learn from anyway.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from echo_rl.replay.buffer import PrioritizedReplayBuffer
from echo_rl.utils.jail import check_npz


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """R_t = sum_i gamma^i r_{t+i} to the episode's end."""
    out = np.zeros(len(rewards), dtype=np.float64)
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = float(rewards[t]) + gamma * acc
        out[t] = acc
    return out.astype(np.float32)


def episode_windows(obs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of the last k states for each step of one episode: ``[L, k, D]`` + validity ``[L, k]``.

    Slots before the episode's first state are zeros and masked out, as the actors'
    windows are at an episode start.
    """
    L, D = obs.shape
    padded = np.concatenate([np.zeros((k - 1, D), obs.dtype), obs])
    idx = np.arange(L)[:, None] + np.arange(k)[None]
    return padded[idx], idx >= k - 1


def self_imitation_loss(logits: torch.Tensor, values: torch.Tensor, actions: torch.Tensor, returns: torch.Tensor,
                        weights: torch.Tensor, value_coef: float, min_scale: float = 0.0
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (loss, clipped advantage (R - V)+ detached: the new priorities).

    The policy term's advantages are divided by max(their mean over the batch's positive
    ones, ``min_scale``). PPO normalises its advantages per minibatch, so raw (R - V)+
    (0.03-0.3 on DoorKey-8x8) left self-imitation too weak to move the policy; but
    dividing by the batch mean alone turns tiny leftover advantages into full-strength
    imitation of old random actions once the critic has caught up (MultiRoom-N2-S4).
    The agent passes the std of PPO's own raw advantages as ``min_scale``: self-imitation
    is then never stronger, in PPO's units, than the returns it has to show.
    """
    adv = (returns - values).clamp(min=0.0)
    logp = F.log_softmax(logits, -1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    a = adv.detach()
    positive = a > 0
    scale = a[positive].mean() if positive.any() else a.new_ones(())
    scale = scale.clamp(min=min_scale)
    policy = -(weights * logp * a / scale).mean()
    value = 0.5 * (weights * adv.pow(2)).mean()
    return policy + value_coef * value, adv.detach()


class SelfImitationReplay:
    """Per-env episodes in progress, and a prioritized store of the steps of finished ones.

    ``collect`` is fed each rollout; the steps of an episode wait in ``pending`` until it
    ends (an episode may span many rollouts), then its steps become items
    ``{windows [k, D], mask [k], action, return}``. The store is a proportional
    :class:`PrioritizedReplayBuffer` (PER's alpha and beta from ``ReplayConfig``).
    """

    def __init__(self, num_envs: int, obs_dim: int, k: int, capacity: int, gamma: float, *, alpha: float,
                 beta: float, priority_epsilon: float, seed: int):
        self.k, self.gamma, self.capacity = k, gamma, capacity
        example = {"windows": np.zeros((k, obs_dim), np.uint8), "mask": np.zeros(k, bool),
                   "action": np.zeros((), np.int64), "return": np.zeros((), np.float32)}
        self.buffer = PrioritizedReplayBuffer(capacity, mode="proportional", alpha=alpha, beta=beta,
                                              priority_epsilon=priority_epsilon, example=example, seed=seed)
        self.pending = [self._empty(obs_dim) for _ in range(num_envs)]
        self.episodes = 0

    @staticmethod
    def _empty(obs_dim: int) -> dict:
        return {"obs": np.zeros((0, obs_dim), np.uint8), "actions": np.zeros(0, np.int64),
                "rewards": np.zeros(0, np.float32)}

    def __len__(self) -> int:
        return len(self.buffer)

    def collect(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, terminated: np.ndarray,
                truncated: np.ndarray) -> dict | None:
        """Rollout arrays ``[T, N, ...]`` -> the items of the episodes that terminated in it (None: none did)."""
        done = terminated | truncated
        finished = []
        for i in range(obs.shape[1]):
            start = 0
            for t in np.nonzero(done[:, i])[0]:
                ep = self._extend(self.pending[i], obs[start:t + 1, i], actions[start:t + 1, i],
                                  rewards[start:t + 1, i])
                if terminated[t, i]:
                    finished.append(ep)
                self.pending[i] = self._empty(obs.shape[2])
                start = t + 1
            self.pending[i] = self._extend(self.pending[i], obs[start:, i], actions[start:, i], rewards[start:, i])
        if not finished:
            return None
        self.episodes += len(finished)
        items = {"windows": [], "mask": [], "action": [], "return": []}
        for ep in finished:
            w, m = episode_windows(ep["obs"], self.k)
            items["windows"].append(w)
            items["mask"].append(m)
            items["action"].append(ep["actions"])
            items["return"].append(discounted_returns(ep["rewards"], self.gamma))
        return {name: np.concatenate(v) for name, v in items.items()}

    def _extend(self, ep: dict, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray) -> dict:
        """Append steps; an episode longer than the store keeps its last ``capacity`` steps (their returns
        are still exact: they are summed from the episode's end)."""
        return {"obs": np.concatenate([ep["obs"], obs])[-self.capacity:],
                "actions": np.concatenate([ep["actions"], actions])[-self.capacity:],
                "rewards": np.concatenate([ep["rewards"], rewards])[-self.capacity:]}

    # -- checkpointing: everything, so a resumed run continues exactly -----------------------
    def state(self) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "sil.npz"
            self.buffer.save(path)
            data = path.read_bytes()
        return {"pending": [dict(p) for p in self.pending], "episodes": self.episodes, "buffer_npz": data}

    def load_state(self, state: dict) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "sil.npz"
            check_npz(state["buffer_npz"], where="the checkpoint's self-imitation store")  # before it inflates
            path.write_bytes(state["buffer_npz"])
            self.buffer.load(path)
        self.pending = [dict(p) for p in state["pending"]]
        self.episodes = int(state["episodes"])
