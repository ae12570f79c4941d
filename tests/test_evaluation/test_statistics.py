"""Estimators: known answers, batching, and agreement with rliable on the same score matrices."""

import numpy as np
import pytest

from echo_rl.utils import statistics as st


def test_known_answers():
    scores = np.array([[0.0, 1.0], [0.5, 0.5], [1.0, 0.2], [0.25, 0.75]])
    assert st.aggregate_mean(scores) == pytest.approx(np.mean([0.4375, 0.6125]))
    assert st.aggregate_median(scores) == pytest.approx(np.median([0.4375, 0.6125]))
    # IQM pools the 8 values, drops the 2 lowest and 2 highest: mean of [0.25, 0.5, 0.5, 0.75]
    assert st.aggregate_iqm(scores) == pytest.approx(0.5)
    assert st.aggregate_optimality_gap(scores) == pytest.approx(1 - scores.mean())
    assert st.aggregate_optimality_gap(scores, gamma=0.5) == pytest.approx(0.5 - np.minimum(scores, 0.5).mean())


def test_probability_of_improvement_counts_ties_half():
    x = np.array([[1.0], [0.0]])
    y = np.array([[0.0], [0.0], [1.0]])
    # pairs: (1,0) (1,0) (1,1)=.5 (0,0)=.5 (0,0)=.5 (0,1)=0  -> 3.5 / 6
    assert st.probability_of_improvement(x, y) == pytest.approx(3.5 / 6)
    assert st.probability_of_improvement(x, x) == pytest.approx(0.5)


def test_estimators_are_batched_over_leading_axes():
    rng = np.random.default_rng(0)
    stack = rng.uniform(size=(7, 5, 3))
    for fn in (st.aggregate_mean, st.aggregate_median, st.aggregate_iqm, st.aggregate_optimality_gap):
        np.testing.assert_allclose(fn(stack), [fn(m) for m in stack], rtol=0, atol=1e-12)
    taus = np.linspace(0, 1, 11)
    np.testing.assert_allclose(st.score_distribution(stack, taus), [st.score_distribution(m, taus) for m in stack])


def test_bootstrap_interval_contains_point_and_is_deterministic():
    rng = np.random.default_rng(1)
    scores = rng.uniform(size=(10, 4))
    p1, ci1 = st.stratified_bootstrap_ci(scores, st.aggregate_metrics, reps=2000, seed=3)
    p2, ci2 = st.stratified_bootstrap_ci(scores, st.aggregate_metrics, reps=2000, seed=3)
    np.testing.assert_array_equal(ci1, ci2)
    assert np.all(ci1[0] <= p1) and np.all(p1 <= ci1[1])
    assert np.all(ci1[1] - ci1[0] > 0)
    # constant scores: no uncertainty
    _, ci = st.stratified_bootstrap_ci(np.ones((5, 2)), st.aggregate_mean, reps=500)
    assert ci[0] == ci[1] == 1.0


def test_resampling_stays_within_each_task():
    # each column holds values only it can produce; a resample must never mix columns
    scores = np.array([[0.0, 10.0], [1.0, 11.0], [2.0, 12.0]])
    res = st._resample(scores, 200, np.random.default_rng(0))
    assert set(np.unique(res[:, :, 0])) <= {0.0, 1.0, 2.0}
    assert set(np.unique(res[:, :, 1])) <= {10.0, 11.0, 12.0}


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="NaN"):
        st.aggregate_mean(np.array([[np.nan]]))
    with pytest.raises(ValueError, match="runs, tasks"):
        st.aggregate_iqm(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="tasks"):
        st.probability_of_improvement(np.ones((2, 2)), np.ones((2, 3)))


# ---------------------------------------------------------------------------
# rliable cross-check (pip install rliable; needs pandas < 3)
# ---------------------------------------------------------------------------

def _rliable():
    try:
        from rliable import library, metrics
    except ImportError as exc:  # rliable is in the eval extra
        pytest.skip(f"rliable not installed ({exc}); pip install rliable to run the cross-check")
    return library, metrics


MATRICES = [
    np.random.default_rng(s).uniform(size=shape) for s, shape in enumerate([(3, 2), (5, 5), (10, 3), (7, 1)])
] + [np.random.default_rng(9).integers(0, 2, size=(6, 4)).astype(float),  # many ties, like Success@1 of 0/1
     np.round(np.random.default_rng(10).uniform(size=(5, 3)) * 10) / 10]


@pytest.mark.parametrize("scores", MATRICES)
def test_point_estimates_match_rliable(scores):
    _, rm = _rliable()
    assert abs(st.aggregate_mean(scores) - rm.aggregate_mean(scores)) <= 1e-9
    assert abs(st.aggregate_median(scores) - rm.aggregate_median(scores)) <= 1e-9
    assert abs(st.aggregate_iqm(scores) - rm.aggregate_iqm(scores)) <= 1e-9
    assert abs(st.aggregate_optimality_gap(scores) - rm.aggregate_optimality_gap(scores)) <= 1e-9
    other = np.random.default_rng(42).permutation(scores.ravel()).reshape(scores.shape)[: max(2, len(scores) - 1)]
    assert abs(st.probability_of_improvement(scores, other) - rm.probability_of_improvement(scores, other)) <= 1e-9


def test_performance_profile_matches_rliable():
    library, _ = _rliable()
    scores = MATRICES[1]
    taus = np.linspace(0, 1, 21)
    np.random.seed(0)
    prof, _ = library.create_performance_profile({"a": scores}, taus, reps=200)
    np.testing.assert_allclose(st.score_distribution(scores, taus), prof["a"], atol=1e-9)
    prof_avg, _ = library.create_performance_profile({"a": scores}, taus, use_score_distribution=False, reps=200)
    np.testing.assert_allclose(st.average_score_distribution(scores, taus), prof_avg["a"], atol=1e-9)


# Stated tolerance: the two implementations use different random streams, so interval endpoints agree up
# to Monte-Carlo error. On scores in [0, 1] with the same number of resamples: within 0.015 absolute at
# 20,000 resamples (observed <= 0.004), within 0.02 at 10,000 (the fast test).
CI_CASES = [pytest.param(MATRICES[4], 10_000, 0.02, id="binary-10k"),
            pytest.param(MATRICES[1], 20_000, 0.015, id="uniform5x5-20k", marks=pytest.mark.slow),
            pytest.param(MATRICES[2], 20_000, 0.015, id="uniform10x3-20k", marks=pytest.mark.slow)]


@pytest.mark.parametrize("scores,reps,tol", CI_CASES)
def test_bootstrap_intervals_match_rliable(scores, reps, tol):
    library, rm = _rliable()

    def func(s):
        return np.array([rm.aggregate_median(s), rm.aggregate_iqm(s), rm.aggregate_mean(s),
                         rm.aggregate_optimality_gap(s)])

    np.random.seed(123)  # rliable's StratifiedBootstrap draws from numpy's global RNG
    points, cis = library.get_interval_estimates({"a": scores}, func, reps=reps)
    ours = st.interval_estimates({"a": scores}, reps=reps, seed=7)["a"]
    for k, name in enumerate(st.AGGREGATE_NAMES):
        assert abs(ours[name].point - points["a"][k]) <= 1e-9
        assert abs(ours[name].low - cis["a"][0, k]) <= tol, name
        assert abs(ours[name].high - cis["a"][1, k]) <= tol, name


@pytest.mark.slow
def test_poi_interval_matches_rliable():
    library, rm = _rliable()
    x, y = MATRICES[1], MATRICES[1][::-1] * 0.8 + 0.1
    np.random.seed(5)
    points, cis = library.get_interval_estimates({"x,y": (x, y)}, rm.probability_of_improvement, reps=2000)
    ours = st.poi_interval(x, y, reps=2000, seed=5)
    assert abs(ours.point - points["x,y"]) <= 1e-9
    assert abs(ours.low - cis["x,y"][0]) <= 0.03 and abs(ours.high - cis["x,y"][1]) <= 0.03


def test_t_interval_by_hand():
    mean, half = st.t_interval([1.0, 2.0, 3.0])  # t_{0.975, 2} = 4.302653, s = 1
    assert mean == 2.0 and half == pytest.approx(4.302653 / np.sqrt(3), rel=1e-5)
    assert st.t_interval([1.0, 2.0, 3.0], confidence=0.9)[1] == pytest.approx(2.919986 / np.sqrt(3), rel=1e-5)
    assert np.isnan(st.t_interval([0.5, float("nan")])[1]) and np.isnan(st.t_interval([])[0])
