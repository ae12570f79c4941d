"""Learning threshold (slow): the demo recipe solves DoorKey-5x5 within 150k env steps on at least 4 of 5 seeds.

Float paths differ between CPUs (an AMD and an Intel box train different
trajectories from one seed), so a learning test asserts what holds for the
recipe on any machine, k of n seeds, not that a few fixed seeds are lucky on
one. The recipe's measured rate (docs/results.md) is 14 of 15 seeds on the
machine it was measured on; 4 of 5 leaves room for one seed that a different
float path sends astray.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SEEDS = (0, 1, 2, 3, 4)
REQUIRED = 4
PARALLEL = 2  # one process per core of the CI box; more only measures contention
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "minigrid_doorkey5x5.yaml"


def _train(seed: int, run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "echo_rl.cli", "train", "--config", str(CONFIG),
         "--timesteps", "149504", "--seed", str(seed), "--set", "evaluation_frequency=0",
         "--set", "save_frequency=0", "--run-dir", str(run_dir), "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_ppo_doorkey5x5_reaches_0_9_on_at_least_4_of_5_seeds(tmp_path):
    results, pending, running = {}, list(SEEDS), {}
    while pending or running:
        while pending and len(running) < PARALLEL:
            seed = pending.pop(0)
            running[seed] = _train(seed, tmp_path / f"seed{seed}")
        seed = next(iter(running))
        proc = running.pop(seed)
        _, err = proc.communicate()
        assert proc.returncode == 0, err
        summary = json.loads((tmp_path / f"seed{seed}" / "summary.json").read_text())
        assert summary["total_timesteps"] <= 150_000
        results[seed] = summary["evaluation_results"]
    solved = [s for s, r in results.items() if r["avg_reward"] >= 0.9 and r["success_rate"] >= 0.9]
    assert len(solved) >= REQUIRED, {s: (r["avg_reward"], r["success_rate"]) for s, r in results.items()}
