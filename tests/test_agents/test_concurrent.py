"""Concurrent evaluation: episodes overlap, results keep job order, a local model decodes through the engine."""

import asyncio
from types import SimpleNamespace

import pytest

from echo_rl.prompting.base import EpisodeResult
from echo_rl.prompting.engine_backbone import EngineBackbone, engine_backed
from echo_rl.prompting.react import ReActAgent
from echo_rl.prompting.runner import EpisodeJob, run_episodes
from echo_rl.config import ConfigError
from echo_rl.models import ScriptedBackbone
from echo_rl.models.backbone import Backbone, Completion, Usage
from corridor_env import CorridorEnv


class _AsyncBackbone(Backbone):
    """Answers with the corridor's expert move after a yield; counts how many calls overlap."""

    name = "async-test"

    def __init__(self, fail_seed=None):
        super().__init__()
        self.in_flight = self.most = 0
        self.fail_seed = fail_seed

    def chat(self, messages, **sampling):  # pragma: no cover - the agents use achat
        raise AssertionError("achat expected")

    async def achat(self, messages, **sampling):
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0)  # let the other episodes run: they must not wait for this one
        self.in_flight -= 1
        text = messages[-1]["content"]
        if self.fail_seed is not None and f"seed {self.fail_seed}" in messages[1]["content"]:
            raise RuntimeError("API down")
        env = _ENVS[messages[1]["content"]]
        return Completion(env.expert_action(), "stop", Usage(len(text), 1, 0.0, 1), self.name)


_ENVS = {}


class _TaggedCorridor(CorridorEnv):
    """Tags the first observation with the seed so the test backbone finds the env (and the seed) it serves."""

    def reset(self, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        obs = f"{obs} (seed {seed})"
        _ENVS[obs] = self
        return obs, info


def _run(backbone, jobs, concurrency):
    made = []

    def make_env():
        made.append(_TaggedCorridor())
        return made[-1]

    results = asyncio.run(run_episodes(jobs, make_env, lambda env: ReActAgent(backbone, mode="act", few_shot=None),
                                       concurrency=concurrency))
    return results, made


def test_episodes_overlap_and_keep_job_order():
    bb = _AsyncBackbone()
    jobs = [EpisodeJob(i, 100 + i) for i in range(5)]
    results, made = _run(bb, jobs, concurrency=3)
    assert bb.most == 3  # three episodes were waiting on the backbone at once
    assert len(made) == 3  # one environment per worker
    assert [r.seed for r in results] == [100, 101, 102, 103, 104]
    assert all(isinstance(r, EpisodeResult) and r.success and r.usage.requests == r.turns for r in results)


def test_a_failing_episode_fails_alone():
    results, _ = _run(_AsyncBackbone(fail_seed=102), [EpisodeJob(i, 100 + i) for i in range(4)], concurrency=2)
    assert [r.success for r in results] == [True, True, False, True]
    assert results[2].error == "RuntimeError: API down"


def test_bad_concurrency_is_a_config_error():
    with pytest.raises(ConfigError, match="concurrency=0 is invalid"):
        asyncio.run(run_episodes([EpisodeJob(0, 0)], CorridorEnv, lambda env: None, concurrency=0))


def test_engine_backbone_matches_transformers_generate(tiny):
    eb = engine_backed(tiny)
    assert isinstance(eb, EngineBackbone) and engine_backed(ScriptedBackbone(["x"])).name == "scripted"
    try:
        msgs = [{"role": "system", "content": "Reply with one action."}, {"role": "user", "content": "go on"}]
        want = tiny.chat(msgs, max_tokens=12, temperature=0.0)
        got = eb.chat(msgs, max_tokens=12, temperature=0.0)
        assert got.text == want.text and got.token_ids == want.token_ids  # greedy: the same tokens
        assert got.usage.prompt_tokens == want.usage.prompt_tokens and got.usage.completion_tokens == 12
        newline = eb.stop_token_ids(("\n",))
        assert set(tiny.eos_ids) <= set(newline) and len(newline) > len(tiny.eos_ids)
        assert all("\n" in tiny.tokenizer.decode([t]) for t in set(newline) - set(tiny.eos_ids))

        async def many():
            return await asyncio.gather(*[eb.achat(msgs, max_tokens=12, temperature=1.0, seed=s, stop=("\n",))
                                          for s in range(4)])

        replies = asyncio.run(many())
        assert all("\n" not in r.text for r in replies)
        assert eb.usage.requests == 5 and eb.snapshot()["requests_finished"] == 5
    finally:
        eb.host.close()  # the session's tiny backbone stays usable for other tests


def test_engine_backed_where_the_engine_runs_the_architecture(tiny, monkeypatch):
    """Elsewhere the local backbone stays as is (transformers' generate decodes it); scoring is teacher-forced."""
    monkeypatch.setattr(tiny.model.config, "model_type", "gpt2")
    assert engine_backed(tiny) is tiny
    monkeypatch.undo()
    eb = engine_backed(tiny)
    try:
        msgs = [{"role": "user", "content": "go on"}]
        assert eb.score(msgs, ["a", "b c"]) == tiny.score(msgs, ["a", "b c"])
    finally:
        eb.host.close()


def test_the_lm_agents_judge_decodes_on_the_engine(tiny, monkeypatch):
    from echo_rl.lm import loop

    monkeypatch.setattr(loop, "load_backbone", lambda name: tiny)
    agent = loop.LMAgent.__new__(loop.LMAgent)
    lm = SimpleNamespace(judge_backbone="tiny", judge_rubric="", judge_mode="generate")
    agent.config = SimpleNamespace(lm_config=lm)
    agent.judge = judge = agent._make_judge()
    try:
        assert isinstance(judge.backbone, EngineBackbone) and judge.backbone.local is tiny
        assert judge.judge("put the apple away", [{"role": "assistant", "content": "done"}]).score >= 0
        agent.generator = SimpleNamespace(running=False)
        assert agent.close() is None and judge.backbone.host._loop is None  # the judge's engine thread stopped
    finally:
        judge.backbone.host.close()
