"""benchmarks/trl_anchor.py: each side's precision is measured, and an unlike-precision ratio says so."""

import pytest
import torch

from tests.script_loader import load_script

transformers = pytest.importorskip("transformers")


def _anchor():
    return load_script("benchmarks/trl_anchor.py", "trl_anchor")


def _tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    return transformers.LlamaForCausalLM(cfg)


def test_probe_reports_the_dtype_each_phase_computed_in():
    anchor, model = _anchor(), _tiny_llama()
    ids = torch.tensor([[1, 2, 3]])
    phase = ["learning"]
    probe = anchor.DtypeProbe()
    probe.attach(model, lambda: phase[0])
    assert probe.precision() == {"rollout": "none", "learning": "none"}
    model(ids)
    phase[0] = "rollout"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # TRL's bf16=True on CPU: autocast, fp32 weights
        model(ids)
    assert probe.precision() == {"rollout": "bfloat16", "learning": "float32"}
    model(ids)  # one phase in two dtypes is reported as both, never as one
    assert probe.precision()["rollout"] == "bfloat16+float32"
    with pytest.raises(RuntimeError, match="layers.0.mlp.down_proj"):
        probe.attach(torch.nn.Linear(2, 2), "rollout")


def test_verdict_labels_like_and_unlike_precision():
    anchor = _anchor()
    bf16 = {"rollout": "bfloat16", "learning": "bfloat16"}
    echo = [{"precision": bf16, "precision_setting": "lm_config.compute_dtype=bfloat16"}]
    same = [{"precision": dict(bf16), "precision_setting": "GRPOConfig(use_cpu=True, bf16=True)", "bf16_refused": None}]
    refused = [{"precision": {"rollout": "float32", "learning": "float32"}, "bf16_refused": "ValueError: no bf16",
                "precision_setting": "GRPOConfig(use_cpu=True, bf16=False)"}]
    assert anchor.precision_verdict(echo, same).endswith("LIKE-FOR-LIKE precision")
    text = anchor.precision_verdict(echo, refused)
    assert "UNLIKE precision" in text and "not a like-for-like ratio" in text
    assert "TRL refused bf16: ValueError: no bf16" in text and '"rollout": "float32"' in text
