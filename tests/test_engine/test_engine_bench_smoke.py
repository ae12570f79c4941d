"""benchmarks/engine_bench.py must keep running; on a toy size its three methods must agree."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_bench.py"
TOY = ["--model", "random", "--episodes", "3", "--turns", "3", "--obs-len", "6", "--act-len", "3", "--system-len", "5",
       "--vocab", "64", "--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--max-pos", "128"]


def _bench(argv):
    spec = importlib.util.spec_from_file_location("engine_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    threads = torch.get_num_threads()  # the script sets its own; give the test session its count back
    try:
        return mod.main(argv)
    finally:
        torch.set_num_threads(threads)


def test_engine_bench_runs_interleaved_and_methods_agree(tmp_path):
    out = tmp_path / "r.json"
    assert _bench(TOY + ["--reps", "2", "--roofline", "--roofline-context", "16", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["action_agreement_vs_hf_a"] == 1.0 and res["action_agreement_vs_hf_b"] == 1.0
    orders = [[r["method"] for r in res["runs"] if r["rep"] == k] for k in (0, 1)]
    assert orders[0] == orders[1][::-1]  # ABC then CBA
    assert len(res["etps_ratio_vs_hf_b"]["reps"]) == 2
    eng = [r for r in res["runs"] if r["method"] == "engine"]
    assert all(0 < r["kv_reuse_rate"] < 1 and r["computed_tokens"] < res["effective_tokens"] for r in eng)
    assert all(0 < r["kv_peak_mb"] <= 1024 for r in res["runs"])
    cases = res["roofline"]["cases"]
    assert [c["batch"] for c in cases] == [1, 3] and all(c["fraction_of_limit"] > 0 for c in cases)


def test_engine_bench_refuses_bad_methods(capsys):
    with pytest.raises(SystemExit) as exc:
        _bench(TOY + ["--methods", "engine,vllm"])
    assert exc.value.code == 2
    assert "unknown 'vllm'; allowed: engine, hf_a, hf_b" in capsys.readouterr().err
