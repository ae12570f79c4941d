"""The real pretrained model (smollm2-135m, fetched by `make test`): its checkpoint, a known answer, the engine.

Skipped only on a developer machine without the model; under CI=true an
absent model fails, so CI always exercises real weights.
"""

import asyncio
import json
import os

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from echo_rl.models import fetch as F  # noqa: E402

NAME = "smollm2-135m"
PARIS = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
CHATS = [
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "system", "content": "You are a household robot. Reply with one action."},
     {"role": "user", "content": "You see a cabinet 1 and a fridge 1. Your task is to: put a cool apple in "
                                 "the cabinet. What do you do first?"}],
    [{"role": "user", "content": "List three prime numbers and explain why each one is prime."}],
]


@pytest.fixture(scope="module")
def smollm2_path():
    if not F.is_fetched(NAME):
        msg = f"{NAME} is not fetched in {F.model_dir()}: run `echo-rl models fetch {NAME}` (make test does)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return F.resolve_model(NAME)


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    from echo_rl.models import load_backbone

    torch.set_num_threads(min(2, torch.get_num_threads()))
    return load_backbone(NAME, device="cpu")


def test_checkpoint_is_plain_and_verified(smollm2_path):
    cfg = json.loads((smollm2_path / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["vocab_size"] == 49152 and cfg["tie_word_embeddings"]
    assert "quantization_config" not in cfg  # loads without gguf
    manifest = json.loads((smollm2_path / F.MANIFEST).read_text())
    assert round(manifest["parameters"] / 1e6, 1) == 134.5
    assert manifest["wheel_sha256"] == F.MODELS[NAME].wheel_sha256
    assert F.check_copy(smollm2_path, F.MODELS[NAME], full=True) is None


def test_greedy_chat_knows_paris(smollm2):
    reply = smollm2.chat(PARIS, max_tokens=32, temperature=0)
    assert "Paris" in reply.text and reply.finish_reason == "stop", reply.text
    assert smollm2.name == NAME and smollm2.path == F.model_dir() / NAME


def test_engine_greedy_equals_transformers_generate(smollm2):
    """Chunked prefill (32-token batches) and batched decode give generate's tokens exactly."""
    from echo_rl.core.async_execution import AsyncExecutionEngine, ExecutionConfig

    model, tok = smollm2.model, smollm2.tokenizer
    prompts = [smollm2.chat_prompt_ids(m) for m in CHATS]
    assert all(len(p) > 32 for p in prompts)
    eos = model.generation_config.eos_token_id
    want = []
    with torch.no_grad():
        for p in prompts:
            out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=32, do_sample=False, eos_token_id=eos, pad_token_id=eos)
            want.append(out[0, len(p):].tolist())

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(max_batch_tokens=32), model) as eng:
            return await asyncio.gather(*[eng.generate(p, max_new_tokens=32, stop_token_ids=[eos]) for p in prompts])

    got = asyncio.run(main())
    assert [r.token_ids for r in got] == want, [tok.decode(r.token_ids) for r in got]
    assert sum(len(w) for w in want) > 64  # the prompts ask for long replies: real decoding, not one EOS


def test_training_and_benchmark_resolve_the_name(smollm2_path):
    from echo_rl.config import TrainingConfig
    from echo_rl.evaluation.backbones import check_backbone_name
    from echo_rl.lm.loop import load_policy

    model, tok = load_policy(NAME, 0)
    assert model.config.model_type == "llama" and tok.chat_template
    assert TrainingConfig(env_name="minigrid", backbone=NAME).text_task
    check_backbone_name(NAME)


def test_served_under_its_name(smollm2):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from echo_rl.serve import ModelServer, create_app

    with ModelServer(create_app(smollm2)) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
        assert [m["id"] for m in http.get("/models").json()["data"]] == [NAME]
        r = http.post("/chat/completions", json={"model": NAME, "messages": PARIS, "max_tokens": 16,
                                                 "temperature": 0})
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"], r.text
