"""Tiny checkpoints: built offline from config, loaded through the same local path as real checkpoints."""

import json

import pytest

from echo_rl.config import ConfigError
from echo_rl.models import load_backbone
from echo_rl.models.local import ContextLengthError, LocalBackbone
from echo_rl.models.tiny import CHAT_TEMPLATE, build_tiny

MSGS = [{"role": "user", "content": "Your task is to: put some spraybottle on toilet."}]


def test_tiny_is_a_standard_checkpoint(tiny_path):
    names = {p.name for p in tiny_path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    cfg = json.loads((tiny_path / "config.json").read_text())
    assert cfg["model_type"] == "qwen2"
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_path), local_files_only=True)
    text = tok.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\n" + MSGS[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok("héllo → wörld 世界")["input_ids"]) == "héllo → wörld 世界"  # byte-level: any text


def test_load_backbone_tiny_uses_the_local_path(tiny_path, monkeypatch):
    monkeypatch.setenv("ECHO_RL_CACHE_DIR", str(tiny_path.parent.parent))
    a = load_backbone("tiny", device="cpu")
    b = load_backbone(str(tiny_path), device="cpu")
    assert isinstance(a, LocalBackbone) and isinstance(b, LocalBackbone) and a.path == tiny_path
    assert a.chat(MSGS, max_tokens=5, temperature=0).text == b.chat(MSGS, max_tokens=5, temperature=0).text


def test_build_is_deterministic_and_llama_variant(tmp_path):
    corpus = ["go to cabinet 1. take apple 1 from countertop 1. " * 20]
    p1 = build_tiny(tmp_path / "a", "tiny-llama", seed=3, corpus=corpus)
    p2 = build_tiny(tmp_path / "b", "tiny-llama", seed=3, corpus=corpus)
    assert (p1 / "tokenizer.json").read_text() == (p2 / "tokenizer.json").read_text()
    assert (p1 / "model.safetensors").read_bytes() == (p2 / "model.safetensors").read_bytes()
    assert json.loads((p1 / "config.json").read_text())["model_type"] == "llama"
    b = LocalBackbone(p1, device="cpu")
    assert b.chat(MSGS, max_tokens=3, temperature=0).usage.completion_tokens <= 3
    with pytest.raises(ConfigError, match="allowed: tiny, tiny-llama, small"):
        build_tiny(tmp_path / "c", "huge")


def test_a_build_leaves_the_callers_torch_rng_alone(tmp_path):
    """A run that builds the tiny cache must draw the same numbers as one that finds it built."""
    import torch

    corpus = ["open the door. pick up the key. " * 20]
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    build_tiny(tmp_path / "a", "tiny", seed=0, corpus=corpus)
    assert torch.equal(torch.rand(4), expected)


def test_sampling_stop_strings_and_accounting(tiny):
    greedy = tiny.chat(MSGS, max_tokens=20, temperature=0, logprobs=True)
    assert greedy.token_ids and len(greedy.logprobs) == len(greedy.token_ids)
    assert greedy.usage.prompt_tokens == len(tiny.chat_prompt_ids(MSGS))
    # a stop string taken from the greedy output cuts the text right before it
    if len(greedy.text) > 4:
        stop = greedy.text[2:4]
        cut = tiny.chat(MSGS, max_tokens=20, temperature=0, stop=[stop])
        assert cut.text == greedy.text[: greedy.text.index(stop)] and cut.finish_reason == "stop"
    a = tiny.chat(MSGS, max_tokens=8, temperature=1.0, seed=5).text
    assert a == tiny.chat(MSGS, max_tokens=8, temperature=1.0, seed=5).text
    streamed = list(tiny.stream_chat(MSGS, max_tokens=12, temperature=0))
    assert "".join(s for s in streamed if isinstance(s, str)) == streamed[-1].text


def test_score_ranks_by_log_likelihood(tiny):
    conts = ["go to cabinet 1", "open drawer 2"]
    scores = tiny.score(MSGS, conts)
    prompt = tiny.chat_prompt_ids(MSGS)
    for cont, s in zip(conts, scores):
        ids = tiny.encode(cont)
        assert s == pytest.approx(sum(tiny.prompt_logprobs(prompt + ids)[len(prompt) - 1:]), abs=1e-4)
        assert s < 0


def test_bad_inputs(tiny, tmp_path):
    with pytest.raises(ContextLengthError, match="context"):
        tiny.chat([{"role": "user", "content": "go " * 5000}], max_tokens=2)
    with pytest.raises(ConfigError, match="max_tokens"):
        tiny.chat(MSGS, max_tokens=0)
    with pytest.raises(ConfigError, match="temperature"):
        tiny.chat(MSGS, temperature=3)
    with pytest.raises(ConfigError, match="messages\\[0\\]"):
        tiny.chat([{"role": "robot", "content": "x"}])
    with pytest.raises(ConfigError, match="not a checkpoint directory"):
        LocalBackbone(tmp_path)
    with pytest.raises(ConfigError, match="unknown backbone"):
        load_backbone("no/such/place-xyz")
    with pytest.raises(ConfigError, match="device"):
        load_backbone("tiny", device="tpu")


def test_decoding_is_transformers_generate_with_the_models_own_logprobs(tiny, monkeypatch):
    """No decode loop of our own: one ``generate`` call per reply; the log-probs are the model's (temperature 1)."""
    import torch

    calls = []
    real = tiny.model.generate
    monkeypatch.setattr(tiny.model, "generate", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    got = tiny.chat(MSGS, max_tokens=6, temperature=0.7, seed=11, logprobs=True, top_logprobs=3)
    assert len(calls) == 1 and calls[0]["generation_config"].top_k == 0  # none of the checkpoint's defaults
    prompt = tiny.chat_prompt_ids(MSGS)
    with torch.no_grad():
        logits = tiny.model(torch.tensor([prompt + got.token_ids])).logits[0, len(prompt) - 1:-1]
    want = torch.log_softmax(logits.float(), -1)[torch.arange(len(got.token_ids)), got.token_ids]
    assert [t.logprob for t in got.logprobs] == pytest.approx(want.tolist(), abs=1e-4)
    assert len(got.logprobs[0].top) == 3 and got.logprobs[0].top[0][1] >= got.logprobs[0].logprob - 1e-6


def test_a_seed_repeats_and_leaves_the_callers_rng_alone(tiny):
    import torch

    torch.manual_seed(2)
    expected = torch.rand(3)
    torch.manual_seed(2)
    a = tiny.chat(MSGS, max_tokens=8, temperature=1.0, seed=9).token_ids
    assert torch.equal(torch.rand(3), expected)
    assert a == tiny.chat(MSGS, max_tokens=8, temperature=1.0, seed=9).token_ids


def test_a_stop_string_is_matched_in_the_reply_only(tiny):
    """The prompt ends in a newline: a reply whose first token is a newline has not yet said "\\n\\n"."""
    greedy = tiny.chat(MSGS, max_tokens=6, temperature=0)
    first = tiny.tokenizer.decode(greedy.token_ids[:1])
    cut = tiny.chat(MSGS, max_tokens=6, temperature=0, stop=[first + first])
    assert greedy.text.startswith(first + first) is (cut.finish_reason == "stop")
    assert cut.text == greedy.text.split(first + first)[0]
