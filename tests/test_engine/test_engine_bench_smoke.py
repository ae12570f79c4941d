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


def test_engine_bench_bf16_runs_every_method_at_that_dtype(tmp_path):
    out32, out16 = tmp_path / "f32.json", tmp_path / "bf16.json"
    assert _bench(TOY + ["--reps", "1", "--methods", "engine,hf_b", "--json", str(out32)]) == 0
    assert _bench(TOY + ["--reps", "1", "--methods", "engine,hf_b", "--dtype", "bfloat16", "--roofline",
                         "--roofline-context", "16", "--json", str(out16)]) == 0
    r32, r16 = json.loads(out32.read_text()), json.loads(out16.read_text())
    assert r16["dtype"] == "bfloat16" and r16["kv_bytes_per_token"] * 2 == r32["kv_bytes_per_token"]
    assert r16["roofline"]["weight_bytes"] * 2 == sum(p.numel() * 4 for p in _toy_params())
    assert 0.9 <= r16["token_agreement_vs_hf_b"] <= 1.0 and "action_agreement_vs_hf_b" in r16


def _toy_params():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=32 * 11 // 4, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return list(LlamaForCausalLM(cfg).parameters())


def test_engine_bench_minigrid_workload_replays_the_text_envs_observations(tmp_path):
    """--workload minigrid: real MiniGrid-as-text observations along the expert's path, the engine equal to
    generate (fp32); needs the fetched model's tokenizer."""
    import os

    from echo_rl.models import fetch as F

    if not F.is_fetched("smollm2-135m"):
        if os.environ.get("CI"):
            pytest.fail("smollm2-135m is not fetched (make test fetches it)")
        pytest.skip("smollm2-135m is not fetched: echo-rl models fetch smollm2-135m")
    out = tmp_path / "mg.json"
    assert _bench(["--workload", "minigrid", "--episodes", "2", "--turns", "3", "--act-len", "2", "--reps", "1",
                   "--methods", "engine,hf_b", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["workload"] == "minigrid" and res["token_agreement_vs_hf_b"] == 1.0
    with pytest.raises(SystemExit, match="too few seeds"):
        _bench(["--workload", "minigrid", "--minigrid-env", "MiniGrid-Empty-5x5-v0", "--turns", "30",
                "--episodes", "1", "--methods", "engine"])


def test_engine_bench_llamacpp_needs_its_package_and_a_matching_gguf(tmp_path):
    with pytest.raises(SystemExit, match="needs llama-cpp-python|needs --gguf FILE"):
        _bench(TOY + ["--reps", "1", "--methods", "engine,llamacpp"])
