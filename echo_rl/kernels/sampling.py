"""Priority sampling over a flat array: the O(N) reference rule the sum tree must reproduce.

Two rules: ``proportional`` (classic PER, ``P(i) ∝ p_i^alpha``) and ``softmax``
(``P(i) ∝ exp(s_i / T)``, computed as ``exp((s_i - max s) / T)`` so it never overflows).
Draws are stratified by default: the unit interval is cut into n equal strata and one draw
falls in each, which lowers variance without biasing any single draw's marginal.
The draw step (cumsum, search, zero step-back) is compiled when the kernels are loaded; given the
same uniforms both paths return the same indices (``use_native=False`` picks numpy).
"""

from __future__ import annotations

import numpy as np

from echo_rl.kernels._backend import resolve
from echo_rl.kernels._backend import as_c_contiguous as _c
from echo_rl.kernels._validate import as_float_array, check_finite

MODES = ("proportional", "softmax")


def priority_probabilities(priorities, mode: str = "proportional", alpha: float = 1.0,
                           temperature: float = 1.0) -> np.ndarray:
    """The target distribution P(i) for ``priorities`` [N] under ``mode``."""
    p = as_float_array(priorities, "priorities", ndim=1)
    if p.size == 0:
        raise ValueError("priorities is empty: nothing to sample")
    if mode == "proportional":
        check_finite(p, "priorities", nonnegative=True)
        if alpha < 0:
            raise ValueError(f"alpha={alpha!r} is invalid: must be >= 0")
        w = np.power(p, alpha) if alpha != 1.0 else p.copy()
        if alpha == 0:
            w = (p > 0).astype(np.float64) if (p > 0).any() else np.ones_like(p)
    elif mode == "softmax":
        check_finite(p, "priorities")
        if not temperature > 0:
            raise ValueError(f"temperature={temperature!r} is invalid: must be > 0")
        w = np.exp((p - p.max()) / temperature)
    else:
        raise ValueError(f"mode={mode!r} is invalid: allowed: {', '.join(MODES)}")
    total = w.sum()
    if total <= 0:
        raise ValueError("priorities are all zero: nothing to sample")
    return w / total


def priority_sample(priorities, n: int, rng: np.random.Generator | int | None = None, *,
                    mode: str = "proportional", alpha: float = 1.0, temperature: float = 1.0,
                    stratified: bool = True, use_native: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` indices with replacement; return ``(indices int64[n], P(indices) float64[n])``."""
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n={n!r} is invalid: must be an integer >= 1")
    n = int(n)
    probs = priority_probabilities(priorities, mode, alpha, temperature)
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    u = rng.random(n)
    nat = resolve(use_native)
    if nat is not None:
        idx, pv = np.empty(n, np.int64), np.empty(n)
        nat.cdf_sample(_c(probs), u, bool(stratified), idx, pv)
        return idx, pv
    if stratified:
        u = (np.arange(n) + u) / n
    cdf = np.cumsum(probs)
    idx = np.searchsorted(cdf, u * cdf[-1], side="right")
    idx = np.minimum(idx, probs.size - 1)
    # rounding can land on a zero-probability tail: step back to the last positive entry
    zero = probs[idx] == 0
    if zero.any():
        last = np.flatnonzero(probs > 0)
        idx[zero] = last[np.searchsorted(last, idx[zero], side="right") - 1]
    return idx.astype(np.int64), probs[idx]
