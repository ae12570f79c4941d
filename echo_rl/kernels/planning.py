"""Plan-space kernels: the EMA plan tau_bar, plan surprise and the temporal KL between plans.

Plans are float vectors ``tau`` of size D. Gaussian plans are given by mean and
*log-variance* (the usual VAE parameterisation: unconstrained and stable to exponentiate).
``EMAPlanTracker.update_batch`` and ``plan_surprise_batch`` use the compiled kernels when loaded
(``use_native=False`` picks numpy); the one-plan forms stay numpy, a C call saves nothing there.
"""

from __future__ import annotations

import numpy as np

from echo_rl.kernels._backend import resolve
from echo_rl.kernels._backend import as_c_contiguous as _c
from echo_rl.kernels._validate import as_float_array, check_finite


class EMAPlanTracker:
    """Exponential moving average of plans, ``tau_bar <- d * tau_bar + (1 - d) * tau``.

    The first plan seen initialises ``tau_bar`` (no zero-bias warm-up), so the surprise of
    early plans is measured against real plans rather than against the origin.
    """

    def __init__(self, decay: float = 0.99, dim: int | None = None, *, use_native: bool | None = None):
        if not (0.0 <= float(decay) <= 1.0):
            raise ValueError(f"decay={decay!r} is invalid: must be in [0, 1]")
        if dim is not None and int(dim) < 1:
            raise ValueError(f"dim={dim!r} is invalid: must be >= 1")
        self.decay = float(decay)
        resolve(use_native)  # use_native=True without the compiled kernels fails here, not later
        self.use_native = use_native  # a flag, not the module: the tracker stays copyable
        self.dim = None if dim is None else int(dim)
        self._mean: np.ndarray | None = None
        self.count = 0

    @property
    def initialized(self) -> bool:
        return self._mean is not None

    @property
    def mean(self) -> np.ndarray:
        if self._mean is None:
            raise RuntimeError("EMAPlanTracker has seen no plan yet: call update(plan) first")
        return self._mean.copy()

    def _check(self, plans: np.ndarray, name: str) -> None:
        check_finite(plans, name)
        d = plans.shape[-1]
        if self.dim is None:
            self.dim = d
        elif d != self.dim:
            raise ValueError(f"{name} has dimension {d}, expected {self.dim}")

    def update(self, plan) -> np.ndarray:
        """Fold one plan (shape [D]) into the average; return the new ``tau_bar``."""
        p = as_float_array(plan, "plan", ndim=1)
        self._check(p, "plan")
        if self._mean is None:
            self._mean = p.copy()
        else:
            self._mean = self.decay * self._mean + (1.0 - self.decay) * p
        self.count += 1
        return self._mean.copy()

    def update_batch(self, plans) -> np.ndarray:
        """Fold plans [N, D] in row order (same result as N calls to ``update``), vectorised.

        Compiled: the row-by-row recursion, bit for bit N ``update`` calls. numpy: the closed form
        ``d^n tau_bar + (1-d) sum_i d^(n-1-i) x_i`` (equal within rounding).
        """
        p = as_float_array(plans, "plans", ndim=2)
        if p.shape[0] == 0:
            return self.mean
        nat = resolve(self.use_native)
        if nat is not None and p.shape[1] >= 1 and self.dim in (None, p.shape[1]):
            p = _c(p)
            fresh = self._mean is None
            new, rest = (p[0].copy(), p[1:]) if fresh else (self._mean.copy(), p)
            if nat.ema_update(new, rest, self.decay) < 0 and not (fresh and not np.isfinite(new).all()):
                self._mean, self.dim = new, p.shape[1]
                self.count += p.shape[0]
                return new.copy()
        self._check(p, "plans")
        if self._mean is None:
            self._mean, p = p[0].copy(), p[1:]
            self.count += 1
        n = p.shape[0]
        if n:
            d = self.decay
            # tau_bar_n = d^n tau_bar_0 + (1-d) sum_i d^(n-1-i) x_i
            w = (1.0 - d) * d ** np.arange(n - 1, -1, -1, dtype=np.float64)
            self._mean = d**n * self._mean + w @ p
            self.count += n
        return self._mean.copy()

    def state_dict(self) -> dict:
        return {"decay": self.decay, "dim": self.dim, "count": self.count,
                "mean": None if self._mean is None else self._mean.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.decay = float(state["decay"])
        self.dim = state["dim"]
        self.count = int(state["count"])
        mean = state["mean"]
        self._mean = None if mean is None else np.asarray(mean, dtype=np.float64).copy()


def plan_surprise(plan, ema_plan, reward: float = 0.0, surprise_weight: float = 1.0,
                  reward_weight: float = 1.0) -> float:
    """``surprise_weight * ||tau - tau_bar||^2 + reward_weight * |r|`` for one plan."""
    p = as_float_array(plan, "plan", ndim=1)
    m = as_float_array(ema_plan, "ema_plan", ndim=1)
    if p.shape != m.shape:
        raise ValueError(f"plan has shape {p.shape} but ema_plan has shape {m.shape}")
    check_finite(p, "plan")
    r = float(reward)
    if not np.isfinite(r):
        raise ValueError(f"reward={r!r} is invalid: must be finite")
    diff = p - m
    return float(surprise_weight * (diff @ diff) + reward_weight * abs(r))


def plan_surprise_batch(plans, ema_plan, rewards=None, surprise_weight: float = 1.0,
                        reward_weight: float = 1.0, *, use_native: bool | None = None) -> np.ndarray:
    """Scores for plans [N, D] against one ``tau_bar`` [D]; ``rewards`` [N] (default 0)."""
    p = as_float_array(plans, "plans", ndim=2)
    m = as_float_array(ema_plan, "ema_plan", ndim=1)
    nat = resolve(use_native)
    if nat is not None and p.shape[1] == m.shape[0] >= 1:
        r = None if rewards is None else _c(as_float_array(rewards, "rewards"))
        if r is None or r.shape == (p.shape[0],):
            out = np.empty(p.shape[0])
            if nat.plan_surprise(_c(p), p.shape[1], _c(m), r,
                                 float(surprise_weight), float(reward_weight), out) < 0:
                return out
    if p.shape[1] != m.shape[0]:
        raise ValueError(f"plans have dimension {p.shape[1]} but ema_plan has {m.shape[0]}")
    check_finite(p, "plans")
    diff = p - m
    score = surprise_weight * np.einsum("nd,nd->n", diff, diff)
    if rewards is not None:
        r = as_float_array(rewards, "rewards", ndim=1)
        if r.shape[0] != p.shape[0]:
            raise ValueError(f"rewards has {r.shape[0]} entries, plans has {p.shape[0]} rows")
        check_finite(r, "rewards")
        score = score + reward_weight * np.abs(r)
    return score


def _kl_terms(mu_p, logvar_p, mu_q, logvar_q):
    arrs = [as_float_array(a, n) for a, n in
            ((mu_p, "mu_p"), (logvar_p, "logvar_p"), (mu_q, "mu_q"), (logvar_q, "logvar_q"))]
    shape = arrs[0].shape
    for a, n in zip(arrs, ("mu_p", "logvar_p", "mu_q", "logvar_q")):
        if a.shape != shape:
            raise ValueError(f"{n} has shape {a.shape}, expected {shape} (same as mu_p)")
        check_finite(a, n)
    mp, lp, mq, lq = arrs
    return 0.5 * (lq - lp + (np.exp(lp) + (mp - mq) ** 2) * np.exp(-lq) - 1.0)


def temporal_kl(mu_p, logvar_p, mu_q, logvar_q) -> float:
    """``KL(N(mu_p, e^logvar_p) || N(mu_q, e^logvar_q))`` for diagonal Gaussians of shape [D].

    In the planning loss p is the current plan distribution and q the previous one.
    """
    terms = _kl_terms(mu_p, logvar_p, mu_q, logvar_q)
    if terms.ndim != 1:
        raise ValueError(f"mu_p must have 1 dimension, got shape {terms.shape}; use temporal_kl_batch")
    return float(terms.sum())


def temporal_kl_batch(mu_p, logvar_p, mu_q, logvar_q) -> np.ndarray:
    """Row-wise diagonal-Gaussian KL for inputs [..., D]; returns [...]."""
    terms = _kl_terms(mu_p, logvar_p, mu_q, logvar_q)
    if terms.ndim < 1:
        raise ValueError("mu_p must have at least 1 dimension")
    return terms.sum(axis=-1)
