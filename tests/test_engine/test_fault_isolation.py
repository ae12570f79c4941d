"""One request that cannot be served fails alone, promptly and clearly; the others finish as if alone."""

import asyncio
import math
import time

import pytest
import torch

import echo_rl.engine.engine as engine_mod
from echo_rl.core.async_execution import AsyncExecutionEngine, ExecutionConfig
from echo_rl.engine.request import RequestFailedError
from .helpers import run, tiny_model

N_NEW = 10
PROMPTS = [[(7 * i + 3 * j) % 97 + 1 for j in range(5 + 3 * i)] for i in range(7)]
BAD = 3  # the index of the bad request among the 7


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama-gqa")


@pytest.fixture(scope="module")
def alone(model):
    """Each good request run by itself on a fresh engine: the reference outputs."""
    async def one(p):
        async with AsyncExecutionEngine(ExecutionConfig(max_batch_tokens=32), model) as eng:
            return await eng.generate(p, max_new_tokens=N_NEW, stop_token_ids=())

    return [run(one(p)) for p in PROMPTS]


def _concurrent(model, bad_kwargs, setup=None, cfg=None):
    """Run the 7 requests together (request BAD with ``bad_kwargs``); returns (results, bad's wait in s)."""
    async def main():
        async with AsyncExecutionEngine(cfg or ExecutionConfig(max_batch_tokens=32), model) as eng:
            if setup is not None:
                setup(eng)

            async def timed(i):
                t = time.perf_counter()
                kwargs = dict(max_new_tokens=N_NEW, stop_token_ids=())
                kwargs.update(bad_kwargs if i == BAD else {})
                try:
                    return await asyncio.wait_for(eng.generate(PROMPTS[i], **kwargs), 30)
                except Exception as exc:  # noqa: BLE001 - the test inspects it
                    return exc, time.perf_counter() - t

            out = await asyncio.gather(*[timed(i) for i in range(len(PROMPTS))])
            # the engine still serves after the fault
            again = await eng.generate(PROMPTS[0], max_new_tokens=N_NEW, stop_token_ids=())
            assert not eng._running and not eng._waiting
            assert eng.cache.pinned_tokens() == 0
            eng.cache.check_invariants()
            return out, again

    return run(main())


def _check_others(out, alone):
    for i, (got, want) in enumerate(zip(out, alone)):
        if i == BAD:
            continue
        assert not isinstance(got, tuple), f"request {i} failed: {got[0]!r}"
        assert got.token_ids == want.token_ids, i
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4), i


INVALID = [
    ({"seed": 2**70, "temperature": 0.7}, "seed"),
    ({"seed": 1.5, "temperature": 0.7}, "seed"),
    ({"seed": "1"}, "seed"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"temperature": -1e-300}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0.0, "temperature": 1.0}, "top_p"),
    ({"top_p": float("nan"), "temperature": 1.0}, "top_p"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"max_new_tokens": 10**9}, "context length"),
    ({"stop_token_ids": [1.5]}, "stop_token_ids"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids"),
    ({"top_k": -1}, "top_k"),
    ({"reward_estimate": float("nan")}, "reward_estimate"),
]


@pytest.mark.parametrize("bad, field", [INVALID[0], INVALID[3], INVALID[12]])
def test_invalid_request_fails_alone_at_submission(model, alone, bad, field):
    """Before: seed=2**70 failed the 5 requests in flight and its own caller hung forever."""
    (out, again) = _concurrent(model, bad)
    err, waited = out[BAD]
    assert isinstance(err, ValueError) and field in str(err), err
    assert waited < 1.0
    _check_others(out, alone)
    assert again.token_ids == alone[0].token_ids


def test_every_invalid_parameter_is_a_clear_value_error(model):
    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            for bad, field in INVALID:
                with pytest.raises(ValueError, match=field):
                    await eng.generate([1, 2, 3], **bad)
            return await eng.generate([1, 2, 3], max_new_tokens=2, stop_token_ids=())

    assert len(run(main()).token_ids) == 2


@pytest.mark.parametrize("bad", [{"temperature": 1e-300}, {"temperature": 5e-324},
                                 {"temperature": 1.0, "top_p": 1e-300}, {"temperature": 0.9, "top_p": 5e-324}])
def test_tiny_temperature_or_top_p_is_greedy(model, alone, bad):
    """Values that overflowed to NaN (and failed the whole batch) are served: they are greedy in the limit."""
    out, _ = _concurrent(model, bad)
    _check_others(out, alone)
    got = out[BAD]
    assert got.token_ids == alone[BAD].token_ids
    assert all(math.isfinite(lp) for lp in got.logprobs)


def test_fault_in_forward_fails_only_its_request(model, alone, monkeypatch):
    """A segment whose forward raises is found by running the step's segments one by one."""
    poison = PROMPTS[BAD][0]

    def setup(eng):
        real = eng.runner.forward

        def forward(segments):
            if any(s.token_ids[:1] == [poison] and len(s.token_ids) > 1 for s in segments):
                raise RuntimeError("injected forward fault")
            return real(segments)

        eng.runner.forward = forward

    assert sum(p[0] == poison for p in PROMPTS) == 1
    out, again = _concurrent(model, {}, setup)
    err, waited = out[BAD]
    assert isinstance(err, RequestFailedError) and "injected forward fault" in str(err)
    assert waited < 10
    _check_others(out, alone)
    assert again.token_ids == alone[0].token_ids


def test_fault_in_sampling_fails_only_its_request(model, alone, monkeypatch):
    real = engine_mod.choose_token

    def choose(logits, params, gen):
        if params.top_k == 99:  # the bad request's marker
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return real(logits, params, gen)

    monkeypatch.setattr(engine_mod, "choose_token", choose)
    out, again = _concurrent(model, {"top_k": 99})
    err, waited = out[BAD]
    assert isinstance(err, RequestFailedError) and "probability tensor" in str(err)
    assert waited < 10
    _check_others(out, alone)
    assert again.token_ids == alone[0].token_ids


def test_fault_at_admission_resolves_the_request(model, alone):
    """Before: an exception while admitting lost the request (its caller hung) and failed the others."""
    def setup(eng):
        real = eng.runner.new_kv

        def new_kv(capacity):
            if capacity == len(PROMPTS[BAD]) + N_NEW + 1:
                raise MemoryError("cannot allocate the KV buffer")
            return real(capacity)

        eng.runner.new_kv = new_kv

    out, again = _concurrent(model, {"max_new_tokens": N_NEW + 1}, setup)
    err, waited = out[BAD]
    assert isinstance(err, RequestFailedError) and "MemoryError" in str(err) and "admitted" in str(err)
    assert waited < 10
    _check_others(out, alone)


def test_sampled_requests_are_unaffected_by_a_bad_neighbour(model):
    """Seeded sampling in the same batch gives the same tokens with or without a failing neighbour."""
    cfg = ExecutionConfig(max_batch_tokens=32)

    async def main(with_bad):
        async with AsyncExecutionEngine(cfg, model) as eng:
            calls = [eng.generate(p, max_new_tokens=N_NEW, stop_token_ids=(), temperature=0.8, top_p=0.9,
                                  seed=100 + i) for i, p in enumerate(PROMPTS[:3])]
            if with_bad:
                calls.append(eng.generate(PROMPTS[3], max_new_tokens=N_NEW, seed=-(2**64)))
            return await asyncio.gather(*calls, return_exceptions=True)

    clean, mixed = run(main(False)), run(main(True))
    assert isinstance(mixed[-1], ValueError) and "seed" in str(mixed[-1])
    assert [r.token_ids for r in mixed[:3]] == [r.token_ids for r in clean]


def test_non_finite_plan_embeddings_are_rejected(model):
    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            plan = torch.zeros(2, model.config.hidden_size)
            plan[0, 0] = float("nan")
            with pytest.raises(ValueError, match="plan_embeddings"):
                await eng.generate([1, 2], plan_embeddings=plan)
            with pytest.raises(ValueError, match="prompt_ids"):
                await eng.generate([1, 2.5])
            r = await eng.generate(torch.tensor([1, 2, 3]), max_new_tokens=2, stop_token_ids=())
            assert len(r.token_ids) == 2

    run(main())
