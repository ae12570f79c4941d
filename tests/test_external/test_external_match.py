"""benchmarks/external_match.py's table: per-block training returns and pooled held-out success of both arms."""

import json
import sys
from pathlib import Path

from tests.script_loader import load_script


def _rows(path: Path, rows: list[dict]) -> None:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_table_sets_both_arms_side_by_side(tmp_path, monkeypatch, capsys):
    # in-process: evaluation rows before and after, one return per update; external: returns, then heldout.json
    _rows(tmp_path / "in", [{"eval/success_rate": 0.25, "eval/episodes": 8.0, "step": 0},
                            *({"episode/return": r} for r in (0.0, 0.5, 0.5, 1.0)),
                            {"eval/success_rate": 0.75, "eval/episodes": 8.0, "step": 9}])
    _rows(tmp_path / "ext", [{"episode/return": r, "update": i} for i, r in enumerate((0.0, 0.0, 1.0, 1.0, 1.0))])
    (tmp_path / "ext" / "export" / "transformers").mkdir(parents=True)
    (tmp_path / "ext" / "export" / "transformers" / "heldout.json").write_text(
        json.dumps({"success_rate": 0.5, "episodes": 8}))
    monkeypatch.setattr(sys, "argv", ["external_match.py", "table", "--inprocess", str(tmp_path / "in"),
                                      "--external", str(tmp_path / "ext"), "--block", "2",
                                      "--plot", str(tmp_path / "curves.png")])
    load_script("benchmarks/external_match.py", "external_match_under_test").main()
    out = capsys.readouterr().out
    assert "| in-process | 0.25 ± nan (0.25) | 0.75 ± nan (0.75) |" in out  # the shorter run sets the blocks
    assert "| external | 0.00 ± nan (0.00) | 1.00 ± nan (1.00) |" in out
    assert "in-process held-out after training: 6/8 = 0.75" in out  # its last evaluation row
    assert "external held-out after training: 4/8 = 0.50" in out  # the export's heldout.json
    assert (tmp_path / "curves.png").stat().st_size > 0
