"""The four demos run on CPU with a tiny budget, print what they measured and write a real PNG."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=EXAMPLES.parent)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc


def assert_png(path: Path, min_size: tuple[int, int] = (400, 200)) -> None:
    """A PNG by signature and header, of a plausible figure size, and decodable."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= min_size[0] and height >= min_size[1], (width, height)
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width) and pixels.std() > 0.01  # not a blank canvas


def number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in output:\n{text}"
    return float(m.group(1))


def test_latent_planning_demo(tmp_path):
    out = tmp_path / "lp.png"
    proc = run_example("latent_planning_demo.py", "--episodes", "6", "--heldout", "3", "--steps", "30",
                       "--out", str(out))
    text = proc.stdout
    acc = number(r"held-out action accuracy: with plan ([\d.]+)", text)
    assert 0.0 <= acc <= 1.0
    assert number(r"final CE ([\d.]+)", text) < 1.9  # below ln(7) = 1.95: it learned something in 30 steps
    assert re.search(r"plan surprise right after a subgoal switch \(pickup/toggle\): [\d.]+ vs elsewhere [\d.]+", text)
    assert_png(out)


def test_prioritized_replay_demo_prioritized_replay_finds_the_needle(tmp_path):
    out = tmp_path / "pr.png"
    proc = run_example("prioritized_replay_demo.py", "--states", "6", "--episodes", "300", "--seeds", "2",
                       "--max-updates", "4000", "--out", str(out))
    text = proc.stdout
    uniform = number(r"uniform\s*:.*share of samples at the last state ([\d.]+)", text)
    prioritized = number(r"prioritized:.*share of samples at the last state ([\d.]+)", text)
    assert prioritized > uniform  # PER spends more of its draws on the rare rewarding transition
    assert re.search(r"prioritized: updates to MSE<0.001: median \d+ \(solved 2/2\)", text), text
    assert_png(out)


def test_async_execution_demo_reuse_keeps_tokens_and_saves_compute(tmp_path):
    out = tmp_path / "ae.png"
    proc = run_example("async_execution_demo.py", "--episodes", "2", "--max-turns", "3", "--max-new-tokens", "2",
                       "--out", str(out))
    text = proc.stdout
    assert "identical tokens with and without reuse: True" in text
    assert number(r"radix cache: .*KV reuse rate ([\d.]+)", text) > 0.3
    assert number(r"no reuse\s*: .*KV reuse rate ([\d.]+)", text) == 0.0
    cached = number(r"radix cache: .*computed (\d+) tokens", text)
    full = number(r"no reuse\s*: .*computed (\d+) tokens", text)
    assert cached < full
    assert_png(out)


def test_bandwidth_efficient_demo_accounts_eta_bw(tmp_path):
    out = tmp_path / "bw.png"
    proc = run_example("bandwidth_efficient_demo.py", "--episodes", "2", "--max-turns", "3", "--max-new-tokens", "2",
                       "--out", str(out))
    text = proc.stdout
    assert number(r"radix cache: .*bandwidth saved ([\d.]+)%", text) > 10
    assert number(r"no reuse\s*: .*bandwidth saved ([\d.]+)%", text) == 0.0
    assert number(r"tracker delta: ([+-][\d.]+)\)", text) == 0.0  # tracker total == sum of b(t) - b(t')
    assert re.search(r"eta_bw gain from prefix reuse: [\d.]+x", text)
    assert_png(out)


@pytest.mark.parametrize("script", ["latent_planning_demo.py", "prioritized_replay_demo.py",
                                    "async_execution_demo.py", "bandwidth_efficient_demo.py"])
def test_demos_refuse_a_bad_budget_with_exit_2(script):
    flag = "--steps" if script.startswith("latent") else "--seeds" if script.startswith("prior") else "--episodes"
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), flag, "0"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert f"{flag}=0 is invalid: must be >= 1" in proc.stderr
