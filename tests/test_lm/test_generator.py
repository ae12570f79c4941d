"""The generator ↔ trainer boundary: rollouts through the engine, η_bw from engine results, one versioned sync."""

import asyncio
import copy
import threading

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from echo_rl.config import BandwidthConfig, ExecutionConfig, LMConfig, PlanningConfig  # noqa: E402
from echo_rl.environments.minigrid import MiniGridEnvironment  # noqa: E402
from echo_rl.training.bandwidth import BandwidthEfficiencyTracker  # noqa: E402
from echo_rl.lm.chat_delta import ChatRenderer  # noqa: E402
from echo_rl.lm.generator import LMGenerator, WeightUpdate  # noqa: E402
from echo_rl.lm.plan import LMPlanner  # noqa: E402
from echo_rl.lm.rollout import CandidateScorer  # noqa: E402


def _model(vocab):
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                                   bos_token_id=None, pad_token_id=0)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def _planner():
    torch.manual_seed(1)
    return LMPlanner(32, PlanningConfig(embedding_dim=8, state_window_size=3), num_tokens=2, encoder_hidden=16)


def _generator(chatml_tokenizer, mode="generate"):
    tracker = BandwidthEfficiencyTracker(BandwidthConfig())
    gen = LMGenerator(ExecutionConfig(), ChatRenderer(chatml_tokenizer),
                      LMConfig(action_mode=mode, max_turns=2, max_new_tokens=4, temperature=1.0), None,
                      lambda held_out: MiniGridEnvironment(task_type="empty", max_steps=3), tracker)
    return gen, tracker


def test_rollouts_feed_the_trainers_eta_bw_and_one_sync_moves_model_and_planner(chatml_tokenizer):
    model, planner = _model(len(chatml_tokenizer)), _planner()
    gen, tracker = _generator(chatml_tokenizer)
    new_planner = {k: v + 0.5 for k, v in planner.state_dict().items()}
    new_model = {k: v * 0.5 for k, v in model.state_dict().items()}

    async def run():
        await gen.start(copy.deepcopy(model), copy.deepcopy(planner), version=0)
        try:
            before = await gen.rollouts(np.random.default_rng(0), num_actors=2, group_size=2, batch_size=2,
                                        budget=100, update=1, held_out_seed_base=1000)
            with pytest.raises(ValueError, match="must be > current 0"):
                await gen.sync(WeightUpdate(0, new_model, new_planner))
            version = await gen.sync(WeightUpdate(1, new_model, new_planner))
            after = await gen.rollouts(np.random.default_rng(1), num_actors=2, group_size=2, batch_size=1,
                                       budget=100, update=2, held_out_seed_base=1000)
            return before, version, after, gen.snapshot()
        finally:
            await gen.stop()

    before, version, after, snap = asyncio.run(run())
    assert before.steps >= 2 and all(t.policy_version == 0 and "plan_eps" in t.info for t in before.trajectories)
    # η_bw is the trainer's: every turn and every episode end reached its tracker, the engine reports none
    bw = tracker.snapshot()
    assert bw.episodes == len(before.trajectories) + len(after.trajectories)
    assert bw.steps == before.steps + after.steps and np.isfinite(bw.eta_bw)
    assert not any(k.startswith("bw_") for k in snap)
    # one versioned sync: the engine's model and its planner both changed, under version 1
    assert version == 1 and snap["policy_version"] == 1.0
    for k, v in gen.engine_planner.state_dict().items():
        torch.testing.assert_close(v, new_planner[k])
    for k, v in gen.engine_model.state_dict().items():
        torch.testing.assert_close(v, new_model[k])
    assert all(t.info["policy_versions"] == [1] for t in after.trajectories)


def test_choose_mode_scores_and_plans_on_the_engines_thread(chatml_tokenizer, monkeypatch):
    """Candidate scoring and the latent plan read the engine's weights: they run on its worker thread."""
    model, planner = _model(len(chatml_tokenizer)), _planner()
    gen, _ = _generator(chatml_tokenizer, mode="choose")
    threads = set()
    score = CandidateScorer.score

    def spy(self, *a, **kw):
        threads.add(threading.current_thread().name)
        return score(self, *a, **kw)

    monkeypatch.setattr(CandidateScorer, "score", spy)

    async def run():
        await gen.start(copy.deepcopy(model), copy.deepcopy(planner), version=2)
        try:
            return await gen.evaluation_episodes([0, 1], concurrency=2)
        finally:
            await gen.stop()

    trajs = asyncio.run(run())
    assert all(t.policy_version == 2 and t.num_turns >= 1 for t in trajs)
    assert threads and all(name.startswith("echo-engine") for name in threads)
