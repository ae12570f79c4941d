"""docs/intrinsic_rewards.md's example runs as written; the measure CLI runs and refuses bad input."""
import re
from pathlib import Path

import pytest

from echo_rl.intrinsic.measure import main as measure

DOC = Path(__file__).resolve().parents[2] / "docs" / "intrinsic_rewards.md"


def test_doc_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "the guide has no python example"
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})
    assert "bonus mean" in capsys.readouterr().out


def test_measure_cli_runs_and_refuses_bad_input(capsys):
    assert measure(["--envs", "2", "--steps", "8", "--rollouts", "2", "--modules", "pseudo_counts,re3"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("pseudo_counts")).split()
    assert len(row) == 5 and all(0 < float(b) <= 1 for b in row[3:]), out  # compute, update, 2 rollout means
    assert measure(["--modules", "bogus"]) == 2
    assert "unknown modules ['bogus']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        measure(["--envs", "x"])
    assert exc.value.code == 2
