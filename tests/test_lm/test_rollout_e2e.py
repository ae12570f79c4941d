"""Engine rollouts on MiniGrid-as-text into trajectories, a learner step, new weights back to the engine."""

import asyncio

import pytest
import torch

transformers = pytest.importorskip("transformers")

from echo_rl.algorithms.token_logprobs import sequence_logprobs  # noqa: E402
from echo_rl.config import ExecutionConfig, LMConfig  # noqa: E402
from echo_rl.engine.engine import AsyncExecutionEngine  # noqa: E402
from echo_rl.environments.minigrid import ACTION_WORDS, MiniGridEnvironment  # noqa: E402
from echo_rl.lm.batch import collate  # noqa: E402
from echo_rl.lm.chat_delta import ChatRenderer  # noqa: E402
from echo_rl.lm.learner import LMLearner  # noqa: E402
from echo_rl.lm.rollout import CandidateScorer, LMRolloutWorker  # noqa: E402
from echo_rl.lm.sft import expert_trajectory  # noqa: E402
from echo_rl.types import ACTION  # noqa: E402


def _model(vocab, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                                   eos_token_id=None, bos_token_id=None, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture
def setup(chatml_tokenizer):
    renderer = ChatRenderer(chatml_tokenizer)
    learner_model = _model(len(chatml_tokenizer))
    engine_model = _model(len(chatml_tokenizer))
    engine_model.load_state_dict(learner_model.state_dict())
    return renderer, learner_model, engine_model


def _env():
    return MiniGridEnvironment(task_type="empty", max_steps=3)


def test_generate_mode_rollouts_train_and_sync(setup):
    renderer, learner_model, engine_model = setup
    cfg = LMConfig(max_turns=3, max_new_tokens=6, temperature=1.0)

    async def run():
        async with AsyncExecutionEngine(ExecutionConfig(), engine_model) as engine:
            worker = LMRolloutWorker(engine, renderer, cfg)
            trajs = [await worker.episode(_env(), seed=s, group_id=0, episode_id=s) for s in range(3)]
            learner = LMLearner(learner_model, pad_id=0, config=LMConfig(learning_rate=1e-3), lam=0.05)
            # behaviour log-probs (engine, at the rollout temperature) = the learner's teacher-forced ones
            batch = collate(trajs, 0)
            with torch.no_grad():
                lp = sequence_logprobs(learner_model(input_ids=batch.input_ids,
                                                     attention_mask=batch.attention_mask).logits, batch.input_ids)
            acts = batch.roles == ACTION
            assert torch.allclose(lp[acts], batch.behavior_logprobs[acts], atol=1e-4)
            metrics = learner.update(trajs)
            version = await engine.update_weights(learner.state_dict_for_engine(), version=learner.version)
            after = await worker.episode(_env(), seed=9, group_id=1, episode_id=9)
            return trajs, metrics, version, after, engine.snapshot()

    trajs, metrics, version, after, snap = asyncio.run(run())
    for t in trajs:
        assert 1 <= t.num_turns <= 3 and len(t.rewards) == t.num_turns
        assert t.env_output_count > 0 and t.policy_version == 0 and "env_s" in t.timings
    # an untrained model mostly writes non-actions, which the env answers with warnings
    assert metrics["tokens_env_output"] + metrics["tokens_warning"] == sum(t.env_output_count for t in trajs)
    assert metrics["policy_version"] == 1.0
    assert version == 1 and after.policy_version == 1 and after.info["policy_versions"] == [1]
    assert snap["policy_version"] == 1.0


def test_choose_mode_picks_admissible_actions_with_their_logprobs(setup):
    renderer, learner_model, engine_model = setup
    cfg = LMConfig(action_mode="choose", max_turns=2, temperature=0.0)

    async def run():
        async with AsyncExecutionEngine(ExecutionConfig(), engine_model) as engine:
            worker = LMRolloutWorker(engine, renderer, cfg, scorer=CandidateScorer(learner_model))
            return await worker.episode(_env(), seed=0)

    traj = asyncio.run(run())
    env = _env()
    assert all(a in env.reset(seed=0)[1]["admissible_actions"] for a in traj.info["actions"])
    # greedy choice = the admissible action with the highest teacher-forced log-likelihood
    a, b = traj.turn_spans()[0]
    batch = collate([traj], 0)
    with torch.no_grad():
        lp = sequence_logprobs(learner_model(input_ids=batch.input_ids).logits, batch.input_ids)
    assert torch.allclose(lp[0, a:b], torch.tensor(traj.behavior_logprobs[a:b]), atol=1e-4)
    with pytest.raises(ValueError, match="needs a scorer"):
        LMRolloutWorker(None, renderer, cfg)


def test_expert_sft_raises_action_likelihood(setup):
    renderer, learner_model, _ = setup
    demos = [expert_trajectory(_env(), renderer, seed=s, episode_id=s, max_turns=2) for s in range(2)]
    assert all(d.info["source"] == "expert" for d in demos)
    assert all(a in ACTION_WORDS for d in demos for a in d.info["actions"])
    assert all(d.role_counts()["env_output"] > 0 for d in demos)
    learner = LMLearner(learner_model, pad_id=0, config=LMConfig(learning_rate=1e-2))
    first = learner.sft_update(demos)["sft_action_ce"]
    for _ in range(6):
        last = learner.sft_update(demos)["sft_action_ce"]
    assert last < 0.7 * first
