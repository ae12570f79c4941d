"""Aggregate metrics with stratified-bootstrap confidence intervals.

The estimators of Agarwal et al. 2021 ("Deep RL at the Edge of the Statistical
Precipice"), with rliable's definitions, written with numpy/scipy so the
harness does not need rliable (and its ``arch``/pandas pins) at run time;
``tests/test_evaluation/test_statistics.py`` cross-checks them against rliable.

Scores are a ``runs x tasks`` matrix (one column per task, one row per seed).
Every estimator also accepts a stack ``(..., runs, tasks)`` and returns one
value per leading index, which is what makes 50,000 bootstrap resamples cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import scipy.stats

__all__ = [
    "aggregate_mean", "aggregate_median", "aggregate_iqm", "aggregate_optimality_gap",
    "aggregate_metrics", "AGGREGATE_NAMES", "probability_of_improvement", "score_distribution",
    "average_score_distribution", "stratified_bootstrap_ci", "interval_estimates",
    "poi_interval", "performance_profile", "IntervalEstimate", "wilson_interval",
]


def _check(scores: np.ndarray) -> np.ndarray:
    scores = np.asarray(scores, dtype=float)
    if scores.ndim < 2 or scores.shape[-1] == 0 or scores.shape[-2] == 0:
        raise ValueError(f"scores must be a non-empty (..., runs, tasks) array, got shape {scores.shape}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores contain NaN or inf; drop unfinished cells before aggregating")
    return scores


def aggregate_mean(scores: np.ndarray) -> np.ndarray:
    """Mean over tasks of the per-task mean over runs."""
    scores = _check(scores)
    return scores.mean(axis=-2).mean(axis=-1)


def aggregate_median(scores: np.ndarray) -> np.ndarray:
    """Median over tasks of the per-task mean over runs."""
    scores = _check(scores)
    return np.median(scores.mean(axis=-2), axis=-1)


def aggregate_iqm(scores: np.ndarray) -> np.ndarray:
    """Interquartile mean: 25% trimmed mean of all run x task scores pooled."""
    scores = _check(scores)
    flat = scores.reshape(*scores.shape[:-2], -1)
    return scipy.stats.trim_mean(flat, proportiontocut=0.25, axis=-1)


def aggregate_optimality_gap(scores: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """How far scores fall short of ``gamma`` (scores above it count as ``gamma``)."""
    scores = _check(scores)
    return gamma - np.minimum(scores, gamma).mean(axis=(-2, -1))


AGGREGATE_NAMES = ("median", "iqm", "mean", "optimality_gap")


def aggregate_metrics(scores: np.ndarray) -> np.ndarray:
    """[median, IQM, mean, optimality gap] along the last axis (rliable's usual order)."""
    return np.stack([aggregate_median(scores), aggregate_iqm(scores), aggregate_mean(scores),
                     aggregate_optimality_gap(scores)], axis=-1)


def _u_fraction(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mann-Whitney U of x over y divided by n_x*n_y, i.e. P(X > Y) + P(X = Y)/2; batched over leading axes."""
    gt = (x[..., :, None] > y[..., None, :]).mean(axis=(-2, -1))
    eq = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return gt + 0.5 * eq


def probability_of_improvement(scores_x: np.ndarray, scores_y: np.ndarray) -> np.ndarray:
    """P(X > Y) per task (ties count half), averaged over tasks; runs of X and Y may differ in number."""
    scores_x, scores_y = _check(scores_x), _check(scores_y)
    if scores_x.shape[-1] != scores_y.shape[-1]:
        raise ValueError(f"X has {scores_x.shape[-1]} tasks and Y has {scores_y.shape[-1]}; they must match")
    per_task = [_u_fraction(scores_x[..., t], scores_y[..., t]) for t in range(scores_x.shape[-1])]
    return np.mean(np.stack(per_task, axis=-1), axis=-1)


def score_distribution(scores: np.ndarray, taus: Sequence[float]) -> np.ndarray:
    """Performance profile: fraction of all runs x tasks scoring above each tau."""
    scores = _check(scores)
    taus = np.asarray(taus, dtype=float)
    return np.stack([(scores > t).mean(axis=(-2, -1)) for t in taus], axis=-1)


def average_score_distribution(scores: np.ndarray, taus: Sequence[float]) -> np.ndarray:
    """Profile of the per-task mean scores: fraction of tasks whose mean is above each tau."""
    scores = _check(scores)
    means = scores.mean(axis=-2)
    return np.stack([(means > t).mean(axis=-1) for t in np.asarray(taus, dtype=float)], axis=-1)


def _resample(scores: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps, runs, tasks): runs drawn with replacement independently within each task (the strata)."""
    runs, tasks = scores.shape
    idx = rng.integers(0, runs, size=(reps, runs, tasks))
    return scores[idx, np.arange(tasks)[None, None, :]]


def _percentile_interval(stats: np.ndarray, confidence: float) -> np.ndarray:
    alpha = 100.0 * (1.0 - confidence) / 2.0
    return np.percentile(stats, [alpha, 100.0 - alpha], axis=0)


def _chunks(reps: int, size: int):
    done = 0
    while done < reps:
        n = min(size, reps - done)
        yield n
        done += n


def stratified_bootstrap_ci(scores: np.ndarray, func: Callable[[np.ndarray], np.ndarray], reps: int = 50_000,
                            confidence: float = 0.95, seed: int | None = 0,
                            chunk: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """Point estimate and percentile CI of ``func`` under the stratified bootstrap over runs.

    ``func`` maps ``(..., runs, tasks)`` to ``(...,)`` or ``(..., k)``. Returns
    ``(point, interval)`` with ``interval[0]`` the lower and ``interval[1]``
    the upper bounds.
    """
    scores = _check(scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must be (runs, tasks), got shape {scores.shape}")
    if reps < 1:
        raise ValueError(f"reps={reps} must be >= 1")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence} must be in (0, 1)")
    rng = np.random.default_rng(seed)
    point = np.asarray(func(scores))
    chunk = max(1, min(chunk, 4_000_000 // scores.size))  # bound the resample stack to ~32 MB
    stats = np.concatenate([np.asarray(func(_resample(scores, n, rng))).reshape(n, *point.shape)
                            for n in _chunks(reps, chunk)])
    return point, _percentile_interval(stats, confidence)


@dataclass(frozen=True)
class IntervalEstimate:
    point: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float]:
        return {"point": float(self.point), "low": float(self.low), "high": float(self.high)}


def interval_estimates(score_dict: Mapping[str, np.ndarray], reps: int = 50_000, confidence: float = 0.95,
                       seed: int | None = 0) -> dict[str, dict[str, IntervalEstimate]]:
    """{method: {median|iqm|mean|optimality_gap: IntervalEstimate}} for each runs x tasks matrix."""
    out: dict[str, dict[str, IntervalEstimate]] = {}
    for i, (name, scores) in enumerate(score_dict.items()):
        point, ci = stratified_bootstrap_ci(scores, aggregate_metrics, reps, confidence,
                                            None if seed is None else seed + i)
        out[name] = {m: IntervalEstimate(point[k], ci[0, k], ci[1, k]) for k, m in enumerate(AGGREGATE_NAMES)}
    return out


def poi_interval(scores_x: np.ndarray, scores_y: np.ndarray, reps: int = 2_000, confidence: float = 0.95,
                 seed: int | None = 0, chunk: int = 2_000) -> IntervalEstimate:
    """Probability of improvement of X over Y with a CI from independent stratified resampling of X and Y."""
    scores_x, scores_y = _check(scores_x), _check(scores_y)
    rng = np.random.default_rng(seed)
    point = float(probability_of_improvement(scores_x, scores_y))
    chunk = max(1, min(chunk, 4_000_000 // (scores_x.shape[0] * scores_y.shape[0])))
    stats = np.concatenate([probability_of_improvement(_resample(scores_x, n, rng), _resample(scores_y, n, rng))
                            for n in _chunks(reps, chunk)])
    low, high = _percentile_interval(stats, confidence)
    return IntervalEstimate(point, float(low), float(high))


def performance_profile(scores: np.ndarray, taus: Sequence[float], reps: int = 2_000, confidence: float = 0.95,
                        seed: int | None = 0, use_score_distribution: bool = True
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Profile over ``taus`` and its CI band ``(2, len(taus))`` under the stratified bootstrap."""
    fn = score_distribution if use_score_distribution else average_score_distribution
    return stratified_bootstrap_ci(scores, lambda s: fn(s, taus), reps, confidence, seed, chunk=2_000)


def t_interval(values, confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of a Student-t interval over a few seeds' values (non-finite values dropped).

    For small per-seed summaries (an LM study's 3 seeds) where a bootstrap over 3 values would be
    degenerate; the half-width is nan for one value, both are nan for none.
    """
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if len(x) == 0:
        return float("nan"), float("nan")
    if len(x) == 1:
        return float(x[0]), float("nan")
    q = float(scipy.stats.t.ppf(0.5 + confidence / 2, len(x) - 1))
    return float(x.mean()), q * float(x.std(ddof=1)) / float(np.sqrt(len(x)))


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a success rate from ``n`` episodes of one run.

    Used where there is one seed and the bootstrap over seeds has nothing to
    resample; unlike a percentile bootstrap over episodes it stays informative
    at 0/n and n/n (0 of 20 gives [0, 0.16], not [0, 0]).
    """
    if n == 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} is invalid: must be in [0, n={n}]")
    z = float(scipy.stats.norm.ppf(0.5 + confidence / 2))
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, float(centre - half)), min(1.0, float(centre + half)))
