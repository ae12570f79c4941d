"""Side-by-side timing: rliable vs echo_rl.utils.statistics on one score matrix (not a test).

    python tests/test_evaluation/bench_statistics_vs_rliable.py [--reps 10000]
"""

import argparse
import time

import numpy as np
from rliable import library
from rliable import metrics as rm

from echo_rl.utils import statistics as st


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10_000)
    args = parser.parse_args()
    scores = np.random.default_rng(0).uniform(size=(5, 10))  # 5 seeds x 10 tasks

    def four(s):
        return np.array([rm.aggregate_median(s), rm.aggregate_iqm(s), rm.aggregate_mean(s),
                         rm.aggregate_optimality_gap(s)])

    np.random.seed(0)
    t = time.perf_counter()
    _, ci_r = library.get_interval_estimates({"a": scores}, four, reps=args.reps)
    t_rly = time.perf_counter() - t
    t = time.perf_counter()
    ours = st.interval_estimates({"a": scores}, reps=args.reps)["a"]
    t_ours = time.perf_counter() - t
    gap = max(max(abs(ours[n].low - ci_r["a"][0, k]), abs(ours[n].high - ci_r["a"][1, k]))
              for k, n in enumerate(st.AGGREGATE_NAMES))
    print(f"4 aggregates with 95% CIs, 5x10 scores, {args.reps} resamples: rliable {t_rly:.2f}s, "
          f"echo_rl {t_ours:.3f}s, ratio {t_rly / t_ours:.0f}x; largest CI endpoint difference {gap:.4f}")


if __name__ == "__main__":
    main()
