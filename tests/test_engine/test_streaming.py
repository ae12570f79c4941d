"""The engine's per-token hook: tokens arrive while the request runs, and abort() frees its slot at once."""

import asyncio

import pytest

from echo_rl.config import ExecutionConfig
from echo_rl.engine.engine import AsyncExecutionEngine
from echo_rl.engine.request import GenerationResult

from .helpers import hf_greedy, run, tiny_model

PROMPT = [5, 17, 33, 2, 41, 8, 9]


def test_stream_yields_tokens_before_the_request_ends_and_matches_generate():
    model = tiny_model("llama-gqa")

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            seen, running_at_first = [], None
            async for item in eng.stream(PROMPT, max_new_tokens=12, stop_token_ids=()):
                if isinstance(item, GenerationResult):
                    return seen, running_at_first, item
                if running_at_first is None:  # the first token, while the request is still decoding
                    running_at_first = eng.snapshot()["running"]
                seen.append(item)

    seen, running_at_first, result = run(main())
    assert running_at_first == 1
    assert [t for t, _ in seen] == result.token_ids == hf_greedy(model, PROMPT, 12)
    assert [lp for _, lp in seen] == result.logprobs


def test_closing_a_stream_early_frees_the_slot_within_a_step():
    model = tiny_model("llama-gqa")

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            stream = eng.stream(PROMPT, max_new_tokens=200, stop_token_ids=())
            await stream.__anext__()
            await stream.__anext__()
            await stream.aclose()
            for _ in range(100):  # the worker drops it at its next step
                if eng.snapshot()["running"] == 0:
                    break
                await asyncio.sleep(0.01)
            return eng.snapshot()

    snap = run(main())
    assert snap["running"] == 0 and snap["requests_cancelled"] == 1
    assert snap["cache_pinned_tokens"] == 0


def test_abort_by_request_id_from_another_thread():
    model = tiny_model("llama-gqa")

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            got = []
            first = asyncio.Event()

            def on_token(tok, lp):
                got.append(tok)
                first.set()

            task = asyncio.create_task(eng.generate(PROMPT, max_new_tokens=200, stop_token_ids=(),
                                                    on_token=on_token, request_id="r1"))
            await first.wait()
            aborted = await asyncio.to_thread(eng.abort, "r1")
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                if eng.snapshot()["running"] == 0:
                    break
                await asyncio.sleep(0.01)
            return aborted, got, eng.snapshot(), eng.abort("r1")

    aborted, got, snap, again = run(main())
    assert aborted and not again
    assert 1 <= len(got) < 200
    assert snap["running"] == 0 and snap["requests_cancelled"] == 1


def test_a_failing_hook_fails_its_request_alone():
    model = tiny_model("llama-gqa")

    def bad(tok, lp):
        raise KeyError("boom")

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            bad_req = eng.generate(PROMPT, max_new_tokens=20, stop_token_ids=(), on_token=bad)
            good = eng.generate(PROMPT[:5], max_new_tokens=20, stop_token_ids=())
            return await asyncio.gather(bad_req, good, return_exceptions=True)

    bad_res, good_res = run(main())
    assert "on_token raised KeyError" in str(bad_res)
    assert len(good_res.token_ids) == 20


def test_duplicate_request_id_is_refused():
    model = tiny_model("llama-gqa")

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            t = asyncio.create_task(eng.generate(PROMPT, max_new_tokens=50, stop_token_ids=(), request_id="x"))
            await asyncio.sleep(0)
            with pytest.raises(ValueError, match="request_id='x' is already in flight"):
                await eng.generate(PROMPT, max_new_tokens=5, request_id="x")
            await t

    run(main())
