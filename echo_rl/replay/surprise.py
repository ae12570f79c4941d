"""Plan-surprise scores for replay: ``surprise_weight * ||tau - tau_bar||^2 + reward_weight * |r|``."""

from __future__ import annotations

import numpy as np

from echo_rl.kernels import EMAPlanTracker, plan_surprise, plan_surprise_batch


class SurpriseCalculator:
    """Scores plans against the EMA plan ``tau_bar`` and then folds them into it.

    A plan is scored against ``tau_bar`` *before* it is folded in (a plan cannot explain itself
    away). The very first plan has no ``tau_bar`` yet: its surprise term is 0. A batch is scored
    against ``tau_bar`` as it stood before the batch, then folded in row order.
    """

    def __init__(self, surprise_weight: float = 1.0, reward_weight: float = 1.0, ema_decay: float = 0.99):
        for name, v in (("surprise_weight", surprise_weight), ("reward_weight", reward_weight)):
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"{name}={v!r} is invalid: must be finite and >= 0")
        self.surprise_weight = float(surprise_weight)
        self.reward_weight = float(reward_weight)
        self.tracker = EMAPlanTracker(decay=ema_decay)

    @classmethod
    def from_config(cls, config) -> "SurpriseCalculator":
        return cls(config.surprise_weight, config.reward_weight, config.ema_decay)

    def score(self, plan, reward: float, update: bool = True) -> float:
        plan = np.asarray(plan, dtype=np.float64).reshape(-1)
        ref = self.tracker.mean if self.tracker.initialized else plan
        s = plan_surprise(plan, ref, float(np.asarray(reward).reshape(-1)[0]) if np.ndim(reward) else
                          float(reward), self.surprise_weight, self.reward_weight)
        if update:
            self.tracker.update(plan)
        return s

    def score_batch(self, plans, rewards, update: bool = True) -> np.ndarray:
        plans = np.asarray(plans, dtype=np.float64)
        plans = plans.reshape(plans.shape[0], -1)
        ref = self.tracker.mean if self.tracker.initialized else plans[0]
        s = plan_surprise_batch(plans, ref, np.asarray(rewards, dtype=np.float64).reshape(-1),
                                self.surprise_weight, self.reward_weight)
        if update:
            self.tracker.update_batch(plans)
        return s

    def state_json(self) -> dict:
        st = self.tracker.state_dict()
        return {"surprise_weight": self.surprise_weight, "reward_weight": self.reward_weight,
                "decay": st["decay"], "dim": st["dim"], "count": st["count"],
                "mean": None if st["mean"] is None else st["mean"].tolist()}

    def load_state_json(self, data: dict) -> None:
        self.surprise_weight = data["surprise_weight"]
        self.reward_weight = data["reward_weight"]
        self.tracker.load_state_dict({k: data[k] for k in ("decay", "dim", "count", "mean")})
