"""Bandwidth accounting kernels.

Attending over a context of t states costs ``b(t) = scale * t(t+1)/2`` (every new state
attends to all earlier ones). Reusing a cached prefix of length t' saves its cost:
``b_eff = b(t) - b(t')``. The scheduler ranks requests by ``r / (b_eff + q + eps)`` and the
run is judged by ``eta_bw = E[sum r] / (E[sum b_eff] + E_B[w * |l_PG|])``.

The array forms use the compiled kernels when they are loaded (one pass that checks and computes;
``use_native=False`` or ``ECHO_RL_DISABLE_NATIVE=1`` picks the numpy reference). A bad input sends
them back to numpy, which raises the named error, so both paths fail with the same message.
"""

from __future__ import annotations

import numpy as np

from echo_rl.kernels._backend import resolve
from echo_rl.kernels._backend import as_c_contiguous as _c
from echo_rl.kernels._validate import as_float_array, check_finite


def _check_scale(scale: float) -> float:
    s = float(scale)
    if not (np.isfinite(s) and s > 0):
        raise ValueError(f"scale={scale!r} is invalid: must be finite and > 0")
    return s


def _valid_scale(scale) -> bool:
    try:
        _check_scale(scale)
    except (TypeError, ValueError):
        return False
    return True


def attention_bandwidth_cost(t: int, scale: float = 1.0) -> float:
    """``scale * t(t+1)/2`` for one context length ``t >= 0``."""
    if isinstance(t, bool) or int(t) != t or t < 0:
        raise ValueError(f"t={t!r} is invalid: must be an integer >= 0")
    t = int(t)
    return _check_scale(scale) * t * (t + 1) / 2.0


def attention_bandwidth_cost_batch(t, scale: float = 1.0, *, use_native: bool | None = None) -> np.ndarray:
    """Vectorised ``attention_bandwidth_cost`` over an array of lengths (float64 out)."""
    arr = as_float_array(t, "t")
    nat = resolve(use_native)
    if nat is not None and _valid_scale(scale):  # a bad scale: numpy raises, after checking t
        arr = _c(arr)
        out = np.empty(arr.shape)
        if nat.attention_cost(arr, float(scale), out) < 0:
            return out if out.ndim else out[()]
    check_finite(arr, "t", nonnegative=True)
    if np.any(arr != np.floor(arr)):
        bad = int(np.flatnonzero((arr != np.floor(arr)).ravel())[0])
        raise ValueError(f"t[{bad}]={arr.ravel()[bad]!r} is invalid: must be an integer >= 0")
    return _check_scale(scale) * arr * (arr + 1.0) / 2.0


def effective_bandwidth_cost(t=None, t_prefix=None, scale: float = 1.0, *, seq_len=None, reuse_len=None,
                             use_native: bool | None = None):
    """``b(t) - b(t')``: the cost left after reusing a cached prefix of length ``t' <= t``.

    Scalars give a float; arrays broadcast and give float64 arrays. ``seq_len`` /
    ``reuse_len`` are the product's keyword names for ``t`` / ``t_prefix``
    (``effective_bandwidth_cost(seq_len=128, reuse_len=96)`` = 3600); ``t_prefix``
    defaults to 0 (nothing reused).
    """
    t = _one_of("t", t, "seq_len", seq_len)
    t_prefix = _one_of("t_prefix", t_prefix, "reuse_len", reuse_len, default=0)
    nat = resolve(use_native)
    if nat is not None and _valid_scale(scale):
        a = _c(as_float_array(t, "t"))
        b = _c(as_float_array(t_prefix, "t_prefix"))
        if a.shape == b.shape:  # broadcasting shapes go the numpy way
            out = np.empty(a.shape)
            if nat.effective_cost(a, b, float(scale), out) < 0:
                return float(out) if out.ndim == 0 else out
    tt = attention_bandwidth_cost_batch(t, scale, use_native=False)
    tp = attention_bandwidth_cost_batch(t_prefix, scale, use_native=False)
    t_arr, p_arr = np.broadcast_arrays(as_float_array(t, "t"), as_float_array(t_prefix, "t_prefix"))
    if np.any(p_arr > t_arr):
        bad = int(np.flatnonzero((p_arr > t_arr).ravel())[0])
        raise ValueError(f"t_prefix[{bad}]={p_arr.ravel()[bad]!r} is invalid: must be <= t "
                         f"({t_arr.ravel()[bad]!r})")
    out = tt - tp
    return float(out) if np.ndim(out) == 0 else out


def _one_of(name: str, value, alias: str, alias_value, default=None):
    """The value given under either of a parameter's two names (never both)."""
    if value is not None and alias_value is not None:
        raise TypeError(f"pass {name} or {alias}, not both")
    out = value if value is not None else alias_value
    if out is None:
        if default is None:
            raise TypeError(f"missing argument: {alias} (or {name})")
        return default
    return out


def bandwidth_aware_priorities(rewards, b_eff, queue, eps: float = 1e-6, *,
                               use_native: bool | None = None) -> np.ndarray:
    """``r / (b_eff + q + eps)`` element-wise: expected reward per unit of attention bandwidth.

    ``queue`` is the queueing cost q in bandwidth units, like b_eff (see :func:`queue_costs`); b_eff, q >= 0.
    """
    r = as_float_array(rewards, "rewards")
    b = as_float_array(b_eff, "b_eff")
    q = as_float_array(queue, "queue")
    nat = resolve(use_native)
    e = float(eps)
    if nat is not None and r.shape == b.shape == q.shape and np.isfinite(e) and e > 0:
        out = np.empty(r.shape)
        if nat.bw_priorities(_c(r), _c(b), _c(q),
                             e, out) < 0:
            return out if out.ndim else out[()]
    check_finite(r, "rewards")
    check_finite(b, "b_eff", nonnegative=True)
    check_finite(q, "queue", nonnegative=True)
    e = float(eps)
    if not (np.isfinite(e) and e > 0):
        raise ValueError(f"eps={eps!r} is invalid: must be finite and > 0")
    r, b, q = np.broadcast_arrays(r, b, q)
    return r / (b + q + e)


def queue_costs(b_eff) -> np.ndarray:
    """q for waiting requests in arrival order: the b_eff of every request ahead of each one.

    The one definition of q in EchoRL. It is in bandwidth units, so it adds to
    b_eff, and it grows for a newer request by the whole cost of every older one,
    which is what keeps an older request from being starved (docs/engine.md).
    """
    b = np.atleast_1d(as_float_array(b_eff, "b_eff"))
    check_finite(b, "b_eff", nonnegative=True)
    return np.concatenate([[0.0], np.cumsum(b)[:-1]])


def schedule_priorities(priorities, k: int | None = None) -> np.ndarray:
    """Dispatch order: indices by descending priority, ties by lower index (first come first).

    ``k`` keeps only the first k (the batch the engine can admit now).
    """
    p = as_float_array(priorities, "priorities", ndim=1)
    if np.isnan(p).any():
        bad = int(np.flatnonzero(np.isnan(p))[0])
        raise ValueError(f"priorities[{bad}]=nan is invalid: must not be NaN")
    order = np.argsort(-p, kind="stable")
    if k is not None:
        if isinstance(k, bool) or int(k) != k or k < 0:
            raise ValueError(f"k={k!r} is invalid: must be an integer >= 0")
        order = order[: int(k)]
    return order


def bandwidth_efficiency(episode_rewards, episode_bandwidth, pg_losses=None,
                         pg_weights=1.0, *, use_native: bool | None = None) -> float:
    """``eta_bw = E[sum r] / (E[sum b_eff] + E_B[w * |l_PG|])``.

    ``episode_rewards`` and ``episode_bandwidth`` hold one total per episode (sum of r_t and of
    b_eff over the episode); ``pg_losses`` one policy-gradient loss per learner batch with
    weight(s) ``pg_weights``. Raises when the denominator is zero (nothing was spent).
    """
    r = as_float_array(episode_rewards, "episode_rewards", ndim=1)
    b = as_float_array(episode_bandwidth, "episode_bandwidth", ndim=1)
    nat = resolve(use_native)
    if nat is not None:
        eta = _efficiency_native(nat, r, b, pg_losses, pg_weights)
        if eta is not None:
            return eta
    if r.size == 0:
        raise ValueError("episode_rewards is empty: need at least one episode")
    if b.size == 0:
        raise ValueError("episode_bandwidth is empty: need at least one episode")
    check_finite(r, "episode_rewards")
    check_finite(b, "episode_bandwidth", nonnegative=True)
    denom = float(b.mean())
    if pg_losses is not None:
        lo = as_float_array(pg_losses, "pg_losses", ndim=1)
        check_finite(lo, "pg_losses")
        if lo.size:
            w = as_float_array(pg_weights, "pg_weights")
            check_finite(w, "pg_weights", nonnegative=True)
            denom += float(np.mean(np.broadcast_to(w, lo.shape) * np.abs(lo)))
    if denom == 0.0:
        raise ValueError("bandwidth_efficiency: denominator is zero (no bandwidth and no loss recorded)")
    return float(r.mean()) / denom


def _efficiency_native(nat, r, b, pg_losses, pg_weights):
    """eta_bw from the compiled kernel, or None (bad input, zero denominator, odd weight shape)."""
    lo = w_arr = None
    w0 = 1.0
    if pg_losses is not None:
        try:  # odd losses/weights: numpy decides (it ignores the weights when there are no losses)
            lo = as_float_array(pg_losses, "pg_losses", ndim=1)
            w = as_float_array(pg_weights, "pg_weights")
        except ValueError:
            return None
        if w.ndim == 0:
            w0 = float(w)
        elif w.shape == lo.shape:
            w_arr = _c(w)
        else:
            return None
        lo = _c(lo)
    return nat.bw_efficiency(_c(r), _c(b), lo, w_arr, w0)
