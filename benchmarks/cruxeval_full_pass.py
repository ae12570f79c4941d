"""CRUXEval: check all 800 reference answers (and 800 deliberately wrong ones) on the sandbox pool.

    nice -n 10 .venv/bin/python benchmarks/cruxeval_full_pass.py --workers 2
"""

from __future__ import annotations

import argparse
import time

from echo_rl.environments.cruxeval import load_samples, reference_answer, score_answers
from echo_rl.environments.sandbox import SandboxPool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    samples = load_samples()
    with SandboxPool(args.workers) as pool:
        pool.run("pass")  # worker start-up is not part of the pass
        for task in ("output", "input"):
            t0 = time.perf_counter()
            ok = score_answers(samples, [reference_answer(s, task, pool) for s in samples], task, pool)
            dt = time.perf_counter() - t0
            wrong = [f"({s['output']}, 'wrong')" if task == "output" else f"f({s['input']}, 'extra argument')"
                     for s in samples]
            bad = score_answers(samples, wrong, task, pool)
            print(f"{task}: references {sum(r.passed for r in ok)}/{len(ok)} pass in {dt:.1f} s "
                  f"({len(ok) / dt:.0f} checks/s); wrong answers passing: {sum(r.passed for r in bad)}/{len(bad)}")


if __name__ == "__main__":
    main()
