"""The vLLM backend's own logic (admission, accounting; training's sessions on it) with a stand-in client.

vLLM itself needs a GPU and is not installed here; the stand-in answers the
calls the backend makes (``generate`` / ``abort`` / ``reset_prefix_cache``) the way
vLLM's AsyncLLMEngine does, reporting ``num_cached_tokens`` from a real prefix match.
"""

import asyncio
import importlib.util
from types import SimpleNamespace

import pytest

from echo_rl.config import ExecutionConfig
from echo_rl.engine.request import ContextLengthError
from echo_rl.engine.vllm_backend import VLLMExecutionEngine
from echo_rl.kernels.sequence import prefix_match
from echo_rl.lm.session import EpisodeSessions
from echo_rl.types import ACTION


class FakeLLM:
    def __init__(self, delay=0.0):
        self.seen, self.aborted, self.resets, self.delay, self.order = [], [], 0, delay, []

    async def generate(self, prompt, params, request_id):
        ids = prompt["prompt_token_ids"]
        self.order.append(tuple(ids))
        cached = max([prefix_match(ids, s) for s in self.seen] + [0])
        cached = min(cached, len(ids) - 1)
        await asyncio.sleep(self.delay)
        toks = [(sum(ids) + i) % 50 for i in range(params["max_tokens"])]
        self.seen.append(list(ids) + toks)
        lps = [{t: SimpleNamespace(logprob=-0.5)} for t in toks]
        yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=toks, logprobs=lps, finish_reason="length")],
                              num_cached_tokens=cached)

    async def abort(self, rid):
        self.aborted.append(rid)

    async def reset_prefix_cache(self):
        self.resets += 1
        self.seen = []


def engine(llm, **cfg):
    return VLLMExecutionEngine(ExecutionConfig(**cfg), llm=llm, max_context=100, sampling_params_factory=dict)


def test_sessions_and_reuse_accounting():
    llm = FakeLLM()

    async def main():
        async with engine(llm) as eng:
            sessions = EpisodeSessions(eng)
            sessions.episode("e", [1, 2, 3])
            r1 = await sessions.submit_rollout("e", [4, 5], max_new_tokens=3)
            r2 = await sessions.submit_rollout("e", [6], max_new_tokens=3)
            return eng, sessions, r1, r2

    eng, sessions, r1, r2 = asyncio.run(main())
    assert r1.cached_length == 0 and r2.cached_length == 8
    assert sessions.episode("e").roles[-3:] == [ACTION] * 3
    snap = eng.snapshot()
    assert snap["kv_reuse_rate"] == pytest.approx(8 / (5 + 9))
    assert snap["running"] == 0


def test_admission_limit_and_bandwidth_order():
    llm = FakeLLM(delay=0.01)

    async def main():
        async with engine(llm, max_concurrent_rollouts=1, queue_weight=0.0) as eng:
            await eng.generate(list(range(1, 30)), max_new_tokens=2)
            llm.order.clear()
            blocker = asyncio.create_task(eng.generate([7, 7, 7], max_new_tokens=2))
            await asyncio.sleep(0)
            cold = eng.generate(list(range(60, 90)), max_new_tokens=2)
            warm = eng.generate(list(range(1, 31)), max_new_tokens=2)
            await asyncio.gather(blocker, cold, warm)

    asyncio.run(main())
    assert [len(o) for o in llm.order] == [3, 30, 30]
    assert llm.order[1][0] == 1  # the mostly cached request was admitted first


def test_cancel_aborts_and_frees_the_slot():
    llm = FakeLLM(delay=10.0)

    async def main():
        async with engine(llm, max_concurrent_rollouts=1) as eng:
            t = asyncio.create_task(eng.generate([1, 2], max_new_tokens=2))
            await asyncio.sleep(0.01)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            return eng.snapshot()

    snap = asyncio.run(main())
    assert llm.aborted == ["echo-0"] and snap["running"] == 0 and snap["requests_cancelled"] == 1


def test_cancel_while_waiting_for_admission_keeps_slots_right():
    llm = FakeLLM(delay=0.05)

    async def main():
        async with engine(llm, max_concurrent_rollouts=1) as eng:
            first = asyncio.create_task(eng.generate([1, 2], max_new_tokens=2))
            queued = asyncio.create_task(eng.generate([3, 4], max_new_tokens=2))
            await asyncio.sleep(0.01)
            queued.cancel()
            await first
            last = await eng.generate([5, 6], max_new_tokens=2)  # would hang if the slot leaked
            return last, eng.snapshot()

    last, snap = asyncio.run(main())
    assert len(last.token_ids) == 2 and snap["running"] == 0 and snap["waiting"] == 0


def test_errors_and_version_reset():
    llm = FakeLLM()

    async def main():
        async with engine(llm) as eng:
            with pytest.raises(ContextLengthError, match="context length is 100"):
                await eng.generate(list(range(95)), max_new_tokens=10)
            with pytest.raises(NotImplementedError, match="plan_embeddings"):
                await eng.generate([1], plan_embeddings=[[0.0]])
            with pytest.raises(NotImplementedError, match="state_dict"):
                await eng.update_weights({"w": 1})
            with pytest.raises(NotImplementedError, match="state_dict"):
                await eng.update_weights(None, modules={"planner": {}})
            assert await eng.call(lambda a, b=0: a + b, 2, b=3) == 5  # the engine API the LM rollouts use
            await eng.generate([1, 2, 3], max_new_tokens=2)
            v = await eng.update_weights()
            r = await eng.generate([1, 2, 3], max_new_tokens=2)
            return v, r

    v, r = asyncio.run(main())
    assert v == 1 and llm.resets == 1 and r.cached_length == 0 and r.policy_versions == [1, 1]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_missing_vllm_names_the_extra():
    with pytest.raises(ImportError, match=r"pip install 'echo-rl\[vllm\]'"):
        VLLMExecutionEngine(ExecutionConfig(max_context_length=64), "some/model")
