"""Adding an intrinsic bonus to the extrinsic reward, as RLeXplore does.

    r_t = r_ext_t + beta_t * r_int_t / sigma(R_int),     beta_t = beta * (1 - kappa) ** global_step

sigma(R_int) is the running standard deviation of the discounted intrinsic
return R_t = gamma * R_{t-1} + r_int_t, kept per env across rollouts and never
cut at episode ends (RND's normalisation: intrinsic returns are treated as
non-episodic). Dividing by it keeps the bonus on a fixed scale whatever the
module's raw magnitude, so one beta suits every module; kappa decays the
bonus so the task reward takes over. ``global_step`` is whatever counter the
caller advances (env steps or updates): kappa's scale follows it.

``pretraining=True`` drops the extrinsic term (RLLTE's pre-training mode: learn
from the bonus alone). The flag is not part of the state, so a pre-training
mixer's state loads into a fine-tuning one and the statistics carry on.
"""

from __future__ import annotations

import numpy as np
import torch

from echo_rl.intrinsic.base import IntrinsicReward, RunningMeanStd


class IntrinsicMixer:
    def __init__(self, module: IntrinsicReward, beta: float = 0.05, kappa: float = 0.0, normalize: bool = True,
                 gamma: float = 0.99, pretraining: bool = False):
        if beta < 0 or not 0.0 <= kappa < 1.0 or not 0.0 <= gamma <= 1.0:
            raise ValueError(f"need beta >= 0, 0 <= kappa < 1, 0 <= gamma <= 1; got beta={beta}, kappa={kappa}, "
                             f"gamma={gamma}")
        self.module, self.beta, self.kappa = module, float(beta), float(kappa)
        self.normalize, self.gamma, self.pretraining = bool(normalize), float(gamma), bool(pretraining)
        self.returns: np.ndarray | None = None  # (N,) running discounted intrinsic return per env
        self.return_rms = RunningMeanStd(())

    def weight(self, global_step: int) -> float:
        """beta_t = beta * (1 - kappa) ** global_step."""
        if global_step < 0:
            raise ValueError(f"global_step={global_step} must be >= 0")
        return self.beta * (1.0 - self.kappa) ** global_step

    def normalise(self, intrinsic: np.ndarray) -> np.ndarray:
        """Divide a (T, N) bonus by the running std of discounted intrinsic returns (updated with this rollout)."""
        t_len, n = intrinsic.shape
        if self.returns is None:
            self.returns = np.zeros(n)
        elif self.returns.shape[0] != n:
            raise ValueError(f"the mixer was run with {self.returns.shape[0]} envs and now gets {n}")
        rets = np.empty_like(intrinsic)
        for t in range(t_len):
            self.returns = self.gamma * self.returns + intrinsic[t]
            rets[t] = self.returns
        self.return_rms.update(torch.from_numpy(rets))
        return intrinsic / float(self.return_rms.std)

    def mix(self, extrinsic: np.ndarray, intrinsic: torch.Tensor, global_step: int) -> np.ndarray:
        """extrinsic (T, N) + beta_t * normalised intrinsic (T, N), in extrinsic's float dtype.

        With ``pretraining`` the extrinsic term is left out (its shape and dtype still apply)."""
        ext = np.asarray(extrinsic)
        bonus = (intrinsic.detach().cpu().double().numpy() if isinstance(intrinsic, torch.Tensor)
                 else np.asarray(intrinsic, dtype=np.float64))
        if ext.ndim != 2 or bonus.shape != ext.shape:
            raise ValueError(f"extrinsic {ext.shape} and intrinsic {bonus.shape} must both be (T, N)")
        weight = self.weight(global_step)  # checked before any statistic moves
        if self.normalize:
            bonus = self.normalise(bonus)
        dtype = ext.dtype if np.issubdtype(ext.dtype, np.floating) else np.float32
        base = np.zeros_like(ext, dtype=dtype) if self.pretraining else ext
        return (base + weight * bonus).astype(dtype)

    def state_dict(self) -> dict:
        """The mixer's running statistics and, under 'module', the reward module's state: one entry to save."""
        return {"returns": None if self.returns is None else self.returns.copy(),
                "return_rms": self.return_rms.state_dict(), "module": self.module.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        missing = [k for k in ("returns", "return_rms", "module") if k not in state]
        if missing:
            raise ValueError(f"IntrinsicMixer state lacks {missing}")
        self.returns = None if state["returns"] is None else np.array(state["returns"], dtype=np.float64)
        self.return_rms.load_state_dict(state["return_rms"])
        self.module.load_state_dict(state["module"])
