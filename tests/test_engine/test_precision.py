"""The engine in bfloat16: KV kept in the weights' dtype, logits and greedy tokens follow transformers' bf16."""

import asyncio

import torch

from echo_rl.core.async_execution import AsyncExecutionEngine, ExecutionConfig
from echo_rl.engine.model_runner import PackedModelRunner, Segment
from .helpers import hf_greedy, run, tiny_model


def _bf16(kind="llama-gqa"):
    return tiny_model(kind).to(torch.bfloat16)


def test_bf16_runner_logits_follow_the_model_and_kv_is_bf16():
    model = _bf16()
    runner = PackedModelRunner(model)
    assert runner.dtype == torch.bfloat16 and runner.attn_upcast
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(1, 101, (n,), generator=g).tolist() for n in (23, 9)]
    kvs = [runner.new_kv(40) for _ in seqs]
    assert all(kv.buf.dtype == torch.bfloat16 for kv in kvs)
    with torch.inference_mode():
        # chunked prefill (two chunks for the long one), then two packed decode steps
        runner.forward([Segment(kvs[0], seqs[0][:16]), Segment(kvs[1], seqs[1])])
        runner.forward([Segment(kvs[0], seqs[0][16:])])
        for step in range(2):
            got = runner.forward([Segment(kv, [5 + step], need_logits=True) for kv in kvs])
            for s in seqs:
                s.append(5 + step)
            want = torch.stack([model(torch.tensor([s])).logits[0, -1].float() for s in seqs])
            scale = want.abs().max()
            # bf16 rounding differs between the packed kernels and transformers' SDPA; far below a logit gap
            assert (got - want).abs().max() < 0.03 * scale, ((got - want).abs().max(), scale)


def test_bf16_engine_greedy_matches_bf16_generate():
    model = _bf16("qwen2-gqa")
    g = torch.Generator().manual_seed(1)
    ps = [torch.randint(1, 101, (int(n),), generator=g).tolist() for n in (7, 31, 18, 3)]
    want = [hf_greedy(model, p, 10) for p in ps]

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(max_batch_tokens=32), model) as eng:
            return await asyncio.gather(*[eng.generate(p, max_new_tokens=10, stop_token_ids=()) for p in ps])

    got = [r.token_ids for r in run(main())]
    same = sum(a == b for x, y in zip(got, want) for a, b in zip(x, y)) / sum(map(len, want))
    assert same >= 0.95, (got, want)  # widened logits: bf16 near-ties are rare on this toy model
