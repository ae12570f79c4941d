"""The engine against transformers: same greedy tokens, same log-probs, under reuse and eviction."""

import asyncio
import threading

import pytest
import torch

from echo_rl.core.async_execution import AsyncExecutionEngine, ContextLengthError, ExecutionConfig
from echo_rl.engine.errors import AdmissionTimeout
from echo_rl.lm.session import EpisodeSession
from .helpers import hf_greedy, run, tiny_model

KINDS = ["llama-mha", "llama-gqa", "qwen2-gqa", "qwen3-gqa"]


def prompts(n, lo, hi, seed=0, vocab=101):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_matches_generate_concurrently(kind):
    model = tiny_model(kind)
    ps = prompts(6, 3, 40, seed=1)
    want = [hf_greedy(model, p, 12) for p in ps]

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(max_batch_tokens=32), model) as eng:
            return await asyncio.gather(*[eng.generate(p, max_new_tokens=12, stop_token_ids=()) for p in ps])

    got = run(main())
    assert [r.token_ids for r in got] == want
    assert all(r.finish_reason == "length" for r in got)


def _episodes(model, n_eps, turns, cfg, obs_len=(5, 15), act=6, seed=0):
    """Multi-turn episodes on the engine; returns (per-turn results, per-turn full prompts, engine)."""
    g = torch.Generator().manual_seed(seed)
    system = torch.randint(1, 101, (10,), generator=g).tolist()
    obs = [[torch.randint(1, 101, (int(torch.randint(*obs_len, (1,), generator=g)),), generator=g).tolist()
            for _ in range(turns)] for _ in range(n_eps)]
    log = []

    async def episode(eng, e):
        s = EpisodeSession(eng, e)
        s.append(system, "template")
        for t in range(turns):
            s.append(obs[e][t])
            prompt = list(s.token_ids)
            r = await s.generate(max_new_tokens=act, stop_token_ids=())
            log.append((prompt, r))

    async def main():
        async with AsyncExecutionEngine(cfg, model) as eng:
            await asyncio.gather(*[episode(eng, e) for e in range(n_eps)])
            eng.cache.check_invariants()
            return eng

    eng = run(main())
    return log, eng


@pytest.mark.parametrize("kind", ["llama-gqa", "qwen2-gqa"])
def test_multi_turn_reuse_matches_generate(kind):
    model = tiny_model(kind)
    log, eng = _episodes(model, n_eps=3, turns=4, cfg=ExecutionConfig(max_batch_tokens=24))
    for prompt, r in log:
        assert r.token_ids == hf_greedy(model, prompt, len(r.token_ids))
    snap = eng.snapshot()
    assert snap["kv_reuse_rate"] > 0.5
    assert max(r.cached_length for _, r in log) > 30
    assert snap["cache_pinned_tokens"] == 0


def test_tight_budget_bounds_all_kv_and_stays_exact():
    """The budget holds the cache *and* the working KV: requests wait for room, the cache yields."""
    model = tiny_model("llama-gqa")
    per_token = 2 * 2 * 2 * 16 * 4  # K+V, layers, kv heads, head_dim, fp32
    budget = 260 * per_token  # about two in-flight requests of ~100 positions and a small cache
    cfg = ExecutionConfig(max_batch_tokens=16, kv_memory_budget_mb=budget / 2**20)
    log, eng = _episodes(model, n_eps=4, turns=4, cfg=cfg, seed=3)
    for prompt, r in log:
        assert r.token_ids == hf_greedy(model, prompt, len(r.token_ids))
    snap = eng.snapshot()
    assert eng.kv.bytes_per_token == per_token
    assert 0 < snap["kv_peak_mb"] * 2**20 <= budget
    assert snap["memory_waits"] > 0  # four episodes did not all fit at once
    assert eng.cache.evicted_tokens > 0
    assert snap["kv_reuse_rate"] > 0  # the cache still served prefixes inside the budget
    assert snap["kv_working_mb"] == 0 and snap["kv_memory_mb"] * 2**20 <= budget


def test_request_larger_than_the_budget_fails_alone():
    model = tiny_model("llama-gqa")
    per_token = 2 * 2 * 2 * 16 * 4
    cfg = ExecutionConfig(kv_memory_budget_mb=100 * per_token / 2**20)
    small, big = prompts(2, 20, 21, seed=5)

    async def main():
        async with AsyncExecutionEngine(cfg, model) as eng:
            res = await asyncio.gather(eng.generate(small, max_new_tokens=8, stop_token_ids=()),
                                       eng.generate(big * 4, max_new_tokens=30, stop_token_ids=()),
                                       return_exceptions=True)
            return res, eng.snapshot()

    (ok, err), snap = run(main())
    assert ok.token_ids == hf_greedy(model, small, 8)
    assert "needs 0.054 MiB of working KV (80 inputs + max_new_tokens 30" in str(err)
    assert "kv_memory_budget_mb" in str(err)
    assert snap["kv_peak_mb"] * 2**20 <= 100 * per_token


def test_no_cache_still_exact():
    model = tiny_model("qwen3-gqa")
    log, eng = _episodes(model, n_eps=2, turns=3, cfg=ExecutionConfig(max_cache_size=0))
    for prompt, r in log:
        assert r.cached_length == 0
        assert r.token_ids == hf_greedy(model, prompt, len(r.token_ids))


@pytest.mark.parametrize("kind", ["llama-gqa", "qwen3-gqa"])
def test_sampled_logprobs_match_teacher_forcing(kind):
    model = tiny_model(kind)
    ps = prompts(4, 5, 30, seed=7)
    temp = 0.7

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(max_batch_tokens=20), model) as eng:
            first = await asyncio.gather(*[eng.generate(p, max_new_tokens=10, temperature=temp, top_k=30,
                                                        top_p=0.9, seed=i, stop_token_ids=())
                                           for i, p in enumerate(ps)])
            # second turn reuses the first one's cache
            again = [p + r.token_ids + [5, 6, 7] for p, r in zip(ps, first)]
            second = await asyncio.gather(*[eng.generate(p, max_new_tokens=10, temperature=temp, seed=9,
                                                         stop_token_ids=()) for p in again])
            return list(zip(ps, first)) + list(zip(again, second))

    for prompt, r in run(main()):
        full = torch.tensor([prompt + r.token_ids])
        with torch.no_grad():
            logits = model(full).logits[0, len(prompt) - 1: -1].float()
        ref = torch.log_softmax(logits / temp, -1).gather(1, torch.tensor(r.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=1e-4), (r.logprobs, ref)


def test_seeded_sampling_is_reproducible():
    model = tiny_model("llama-gqa")

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            a = await eng.generate([1, 2, 3], max_new_tokens=8, temperature=1.0, seed=5, stop_token_ids=())
            b = await eng.generate([1, 2, 3], max_new_tokens=8, temperature=1.0, seed=5, stop_token_ids=())
            return a, b

    a, b = run(main())
    assert a.token_ids == b.token_ids  # (the second run reuses the cache: log-probs agree to float eps)
    assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_plan_injection_matches_inputs_embeds_and_keeps_history_cached():
    model = tiny_model("llama-gqa")
    prompt = prompts(1, 20, 21, seed=4)[0]
    plan = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)) * 0.5
    want = hf_greedy(model, prompt, 8, plan=plan)

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(max_batch_tokens=8), model) as eng:
            warm = await eng.generate(prompt[:15], max_new_tokens=2, stop_token_ids=())
            r = await eng.generate(prompt, max_new_tokens=8, plan_embeddings=plan, stop_token_ids=())
            again = await eng.generate(prompt, max_new_tokens=8, plan_embeddings=plan, stop_token_ids=())
            return warm, r, again

    warm, r, again = run(main())
    assert r.token_ids == want
    assert r.prompt_length == 23
    assert warm.token_ids[0] != prompt[15]
    assert r.cached_length == 15  # the warm-up's prompt (its KV was computed while decoding)
    assert again.cached_length == 20  # the whole prompt: only the plan rows are recomputed
    assert again.token_ids == want


def test_64_concurrent_requests_complete():
    model = tiny_model("qwen2-gqa")
    ps = prompts(64, 2, 30, seed=11)

    async def main():
        cfg = ExecutionConfig(max_concurrent_rollouts=64, max_batch_tokens=256)
        async with AsyncExecutionEngine(cfg, model) as eng:
            out = await asyncio.gather(*[eng.generate(p, max_new_tokens=5, stop_token_ids=()) for p in ps])
            return out, eng.snapshot()

    out, snap = run(main())
    assert len(out) == 64 and all(len(r.token_ids) == 5 for r in out)
    for i in (0, 17, 63):
        assert out[i].token_ids == hf_greedy(model, ps[i], 5)
    assert snap["requests_finished"] == 64
    assert snap["sequences_per_step"] > 16  # they really ran together


def test_cancel_frees_pins_and_others_finish():
    model = tiny_model("llama-gqa")
    a, b = prompts(2, 30, 31, seed=5)

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(max_batch_tokens=4), model) as eng:
            await asyncio.gather(eng.generate(a, max_new_tokens=1, stop_token_ids=()),
                                 eng.generate(b, max_new_tokens=1, stop_token_ids=()))
            ta = asyncio.create_task(eng.generate(a, max_new_tokens=200, stop_token_ids=()))
            tb = asyncio.create_task(eng.generate(b, max_new_tokens=60, stop_token_ids=()))
            while eng.snapshot()["cache_pinned_tokens"] < 58:
                await asyncio.sleep(0.001)
            both = eng.snapshot()["cache_pinned_tokens"]
            ta.cancel()
            while eng.snapshot()["cache_pinned_tokens"] == both:
                await asyncio.sleep(0.001)
            after_cancel = eng.snapshot()["cache_pinned_tokens"]
            still_running = not tb.done()
            rb = await tb
            with pytest.raises(asyncio.CancelledError):
                await ta
            return both, after_cancel, still_running, rb, eng.snapshot()

    both, after_cancel, still_running, rb, snap = run(main())
    assert both == 58 and after_cancel == 29 and still_running
    assert len(rb.token_ids) == 60
    assert snap["cache_pinned_tokens"] == 0 and snap["requests_cancelled"] == 1


def test_over_context_fails_clearly_while_others_finish():
    model = tiny_model("llama-gqa", max_pos=64)
    ps = prompts(3, 5, 20, seed=2)

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            return await asyncio.gather(
                eng.generate(ps[0], max_new_tokens=8, stop_token_ids=()),
                eng.generate(list(range(1, 60)), max_new_tokens=8, stop_token_ids=()),
                eng.generate(ps[1], max_new_tokens=8, stop_token_ids=()),
                return_exceptions=True)

    out = run(main())
    assert isinstance(out[1], ContextLengthError)
    assert "67 positions" in str(out[1]) and "context length is 64" in str(out[1])
    assert out[0].token_ids == hf_greedy(model, ps[0], 8)
    assert out[2].token_ids == hf_greedy(model, ps[1], 8)


def test_stop_token_ends_request():
    model = tiny_model("llama-gqa")
    p = prompts(1, 10, 11, seed=8)[0]
    free = hf_greedy(model, p, 10)

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            return await eng.generate(p, max_new_tokens=10, stop_token_ids=[free[3]])

    r = run(main())
    stop_at = free.index(free[3])
    assert r.token_ids == free[: stop_at + 1] and r.finish_reason == "stop"


def test_weight_update_never_serves_stale_kv():
    model = tiny_model("llama-gqa", seed=0)
    new = tiny_model("llama-gqa", seed=1)
    p = prompts(1, 30, 31, seed=6)[0]

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            await eng.generate(p, max_new_tokens=4, stop_token_ids=())
            warm = await eng.generate(p, max_new_tokens=4, stop_token_ids=())
            v = await eng.update_weights(new.state_dict())
            after = await eng.generate(p, max_new_tokens=4, stop_token_ids=())
            eng.cache.check_invariants()
            return warm, v, after, eng

    warm, v, after, eng = run(main())
    assert warm.cached_length == 29 and v == 1
    assert after.cached_length == 0 and after.policy_versions == [1] * 4
    assert after.token_ids == hf_greedy(new, p, 4)


def test_bad_requests_get_one_line_errors():
    model = tiny_model("llama-gqa")

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            errs = []
            for kw in [dict(prompt_ids=[]), dict(prompt_ids=[500]), dict(prompt_ids=[1], max_new_tokens=0),
                       dict(prompt_ids=[1], temperature=-1.0), dict(prompt_ids=[1], top_p=0.0),
                       dict(prompt_ids=[1], plan_embeddings=torch.zeros(2, 3))]:
                with pytest.raises(ValueError) as ei:
                    await eng.generate(**kw)
                errs.append(str(ei.value))
            return errs

    errs = run(main())
    assert all("\n" not in e for e in errs)
    assert "token 500" in errs[1] and "max_new_tokens=0" in errs[2] and "plan_embeddings shape" in errs[5]


def test_engine_must_be_started():
    from echo_rl.core.async_execution import EngineClosedError

    eng = AsyncExecutionEngine(ExecutionConfig(), tiny_model("llama-gqa"))
    with pytest.raises(EngineClosedError):
        run(eng.generate([1, 2], max_new_tokens=2))


def test_unsupported_model_is_refused():
    cfg = transformers_cfg = pytest.importorskip("transformers").GPT2Config(n_layer=1, n_embd=32, n_head=2,
                                                                             vocab_size=50)
    model = pytest.importorskip("transformers").GPT2LMHeadModel(transformers_cfg)
    with pytest.raises(NotImplementedError, match="model_type='gpt2'"):
        AsyncExecutionEngine(ExecutionConfig(), model)
    del cfg


def test_episode_sessions_build_a_trajectory_and_feed_eta_bw():
    """The episode form of submit_rollout lives with the generator (training), on its trajectory accumulator."""
    from echo_rl.lm.session import EpisodeSessions
    from echo_rl.types import role_names

    model = tiny_model("llama-gqa")

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            sessions = EpisodeSessions(eng)
            s = sessions.episode("ep", [1, 2, 3, 4])
            r1 = await sessions.submit_rollout("ep", [5, 6, 7], max_new_tokens=3, stop_token_ids=())
            s.record_reward(0.0)
            r2 = await sessions.submit_rollout("ep", [8, 9], max_new_tokens=2, stop_token_ids=())
            s.record_reward(1.0, done=True)
            with pytest.raises(ValueError, match="already has its reward"):
                s.record_reward(1.0)
            return sessions, s, r1, r2, sessions.end_episode("ep"), eng.snapshot()

    sessions, s, r1, r2, ended, snap = run(main())
    assert ended is s
    assert role_names(s.roles) == (["template"] * 4 + ["env_output"] * 3 + ["action"] * 3 + ["env_output"] * 2
                                       + ["action"] * 2)
    assert s.token_ids[7:10] == r1.token_ids and s.token_ids[12:] == r2.token_ids
    assert s.logprobs[7:10] == r1.logprobs and s.logprobs[:7] == [0.0] * 7
    assert s.token_versions[7:10] == [0] * 3 and s.token_versions[:7] == [None] * 7
    assert r2.cached_length == 9  # everything up to the last action token of turn 1
    traj = s.trajectory()
    assert traj.token_ids == s.token_ids and traj.prompt_length == 7 and traj.rewards == [0.0, 1.0]
    assert traj.env_output_count == 2 and traj.num_turns == 2
    b1 = 7 * 8 / 2  # turn 1: nothing cached
    b2 = 12 * 13 / 2 - 9 * 10 / 2
    assert sessions.bandwidth.snapshot()["eta_bw"] == pytest.approx(1.0 / (b1 + b2))
    assert not any(k.startswith("bw_") for k in snap)  # the engine holds no RL accounting
    with pytest.raises(KeyError, match="no open session"):
        sessions.end_episode("ep")


def test_call_runs_between_steps_and_weights_sync_attached_modules_under_one_version():
    model = tiny_model("llama-gqa")
    ps = prompts(4, 5, 12, seed=21)
    want = [hf_greedy(model, p, 8) for p in ps]
    planner = torch.nn.Linear(3, 3)
    new_state = {k: v + 1.0 for k, v in planner.state_dict().items()}
    seen, engines = [], []

    def probe(tag):  # runs on the engine's thread with the step lock held: no step is in flight
        eng = engines[0]
        assert eng._state_lock.locked() and threading.current_thread().name.startswith("echo-engine")
        seen.append((tag, eng.policy_version, float(planner.bias[0].detach())))
        return tag

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(max_batch_tokens=16), model) as e:
            engines.append(e)
            assert e.attach("planner", planner) is planner
            with pytest.raises(ValueError, match="already attached"):
                e.attach("planner", planner)
            gens = [asyncio.ensure_future(e.generate(p, max_new_tokens=8, stop_token_ids=())) for p in ps]
            calls = [await e.call(probe, i) for i in range(3)]
            got = await asyncio.gather(*gens)
            with pytest.raises(ValueError, match=r"\['value_head'\] are not attached"):
                await e.update_weights(None, modules={"value_head": {}})
            assert e.policy_version == 0
            version = await e.update_weights(None, version=3, modules={"planner": new_state})
            await e.call(probe, "after")
            return calls, got, version

    calls, got, version = run(main())
    assert calls == [0, 1, 2] and [r.token_ids for r in got] == want  # greedy outputs unchanged
    assert version == 3 and seen[-1] == ("after", 3, pytest.approx(float(new_state["bias"][0])))


def test_bandwidth_admission_prefers_the_cached_request():
    model = tiny_model("llama-gqa")
    warm_prompt = prompts(1, 30, 31, seed=12)[0]
    cold_prompt = prompts(1, 30, 31, seed=13)[0]

    async def order_of(policy_on):
        cfg = ExecutionConfig(max_concurrent_rollouts=1, enable_bandwidth_scheduling=policy_on, queue_weight=0.0)
        async with AsyncExecutionEngine(cfg, model) as eng:
            await eng.generate(warm_prompt, max_new_tokens=1, stop_token_ids=())
            blocker = asyncio.create_task(eng.generate([3] * 5, max_new_tokens=20, stop_token_ids=()))
            while eng.snapshot()["running"] < 1:
                await asyncio.sleep(0.001)
            done = []

            async def one(name, p):
                await eng.generate(p, max_new_tokens=2, stop_token_ids=())
                done.append(name)

            await asyncio.gather(one("cold", cold_prompt), one("warm", warm_prompt), blocker)
            return done

    assert run(order_of(True)) == ["warm", "cold"]
    assert run(order_of(False)) == ["cold", "warm"]


def test_weight_update_mid_flight_tags_tokens_and_skips_caching():
    model = tiny_model("llama-gqa", seed=0)
    new = tiny_model("llama-gqa", seed=1)

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as eng:
            t = asyncio.create_task(eng.generate(list(range(1, 20)), max_new_tokens=60, stop_token_ids=()))
            while eng.snapshot()["steps"] < 3:  # prefill done, a few tokens out
                await asyncio.sleep(0.001)
            await eng.update_weights(new.state_dict())
            r = await t
            return r, eng.cache.cached_tokens

    r, cached = run(main())
    assert r.policy_versions[0] == 0 and r.policy_versions[-1] == 1
    assert r.policy_versions == sorted(r.policy_versions)
    assert cached == 0  # KV spanning two weight versions is not given to the cache


def test_admission_timeout_fails_clearly():
    model = tiny_model("llama-gqa")

    async def main():
        cfg = ExecutionConfig(max_concurrent_rollouts=1, timeout=0.05, max_batch_tokens=2)
        async with AsyncExecutionEngine(cfg, model) as eng:
            return await asyncio.gather(eng.generate([1] * 10, max_new_tokens=150, stop_token_ids=()),
                                        eng.generate([2, 3], max_new_tokens=2, stop_token_ids=()),
                                        return_exceptions=True)

    first, second = run(main())
    assert len(first.token_ids) == 150
    assert isinstance(second, AdmissionTimeout) and "ExecutionConfig.timeout=0.05" in str(second)


@pytest.mark.parametrize("retries", [0, 10_000])
def test_rl_worker_waits_out_admission_timeouts(monkeypatch, retries):
    """An RL episode is not dropped for a slow admission (that would bias a batch toward the admitted ones): the
    request is retried with its seed, and the sample equals the one it gets with nothing ahead of it."""
    from echo_rl.lm import session

    monkeypatch.setattr(session, "ADMISSION_RETRIES", retries)
    model = tiny_model("llama-gqa")
    sample = dict(max_new_tokens=6, temperature=1.0, seed=11, stop_token_ids=())

    async def main(cfg):
        async with AsyncExecutionEngine(cfg, model) as eng:
            alone = await eng.generate([2, 3], **sample)
            blocker = eng.generate([1] * 10, max_new_tokens=150, stop_token_ids=())
            _, behind = await asyncio.gather(blocker, session.generate_admitted(eng, [2, 3], **sample),
                                             return_exceptions=True)
            return alone, behind, eng.snapshot()["requests_failed"]

    alone, behind, waits = run(main(ExecutionConfig(max_concurrent_rollouts=1, timeout=0.05, max_batch_tokens=2)))
    if retries == 0:
        assert isinstance(behind, AdmissionTimeout)
    else:
        assert waits >= 1 and behind.token_ids == alone.token_ids


def test_stop_fails_in_flight_requests_and_releases_pins():
    from echo_rl.core.async_execution import EngineClosedError

    model = tiny_model("llama-gqa")
    p = prompts(1, 20, 21, seed=9)[0]

    async def main():
        eng = await AsyncExecutionEngine(ExecutionConfig(max_batch_tokens=2), model).start()
        await eng.generate(p, max_new_tokens=1, stop_token_ids=())
        t = asyncio.create_task(eng.generate(p, max_new_tokens=200, stop_token_ids=()))
        while eng.snapshot()["cache_pinned_tokens"] == 0:
            await asyncio.sleep(0.001)
        await eng.stop()
        with pytest.raises(EngineClosedError):
            await t
        eng.cache.check_invariants()
        return eng.snapshot()["cache_pinned_tokens"]

    assert run(main()) == 0


def test_max_batch_tokens_caps_every_step_even_with_many_decoders():
    model = tiny_model("llama-gqa")
    ps = prompts(8, 2, 6, seed=21)

    async def main():
        cfg = ExecutionConfig(max_concurrent_rollouts=8, max_batch_tokens=3)
        async with AsyncExecutionEngine(cfg, model) as eng:
            widths = []
            orig = eng.runner.forward

            def spy(segments):
                widths.append(sum(s.num_inputs for s in segments))
                return orig(segments)

            eng.runner.forward = spy
            out = await asyncio.gather(*[eng.generate(p, max_new_tokens=4, stop_token_ids=()) for p in ps])
            return out, widths

    out, widths = run(main())
    assert max(widths) <= 3
    assert [r.token_ids for r in out] == [hf_greedy(model, p, 4) for p in ps]


def test_grpo_group_prompt_is_computed_once():
    model = tiny_model("qwen2-gqa")
    prompt = prompts(1, 60, 61, seed=31)[0]
    want = hf_greedy(model, prompt, 3)

    async def main():
        async with AsyncExecutionEngine(ExecutionConfig(max_batch_tokens=64), model) as eng:
            out = await asyncio.gather(*[eng.generate(prompt, max_new_tokens=3, stop_token_ids=())
                                         for _ in range(8)])
            return out, eng.snapshot()

    out, snap = run(main())
    assert all(r.token_ids == want for r in out)
    assert sorted(r.cached_length for r in out) == [0] + [59] * 7
    assert snap["computed_tokens"] == 60 + 7 * 1 + 8 * 2  # one prefill, 7 last-token rows, decodes
    assert snap["shared_prefix_waits"] >= 7
