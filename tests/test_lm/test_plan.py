"""Latent plans for LM policies: the soft prefix reaches the model's inputs at the right positions in the
engine rollout and the learner forward (their log-probs agree), the plan KL matches torch.distributions,
and the planner trains jointly with the policy."""

import asyncio

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from echo_rl.algorithms.token_logprobs import sequence_logprobs  # noqa: E402
from echo_rl.config import ExecutionConfig, LMConfig, PlanningConfig  # noqa: E402
from echo_rl.engine.engine import AsyncExecutionEngine  # noqa: E402
from echo_rl.environments.minigrid import MiniGridEnvironment  # noqa: E402
from echo_rl.planning import PlanDistribution  # noqa: E402
from echo_rl.lm.batch import collate  # noqa: E402
from echo_rl.lm.chat_delta import ChatRenderer  # noqa: E402
from echo_rl.lm.learner import LMLearner  # noqa: E402
from echo_rl.lm.plan import (EpisodePlan, LMPlanner, observation_spans, plan_kl,  # noqa: E402
                                      planned_forward, turn_embeddings)
from echo_rl.lm.rollout import CandidateScorer, LMRolloutWorker  # noqa: E402
from echo_rl.types import ACTION  # noqa: E402


def _model(vocab, arch="qwen2"):
    torch.manual_seed(0)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=None, pad_token_id=0)
    cls = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[arch]
    return cls[1](cls[0](**common)).eval()


def _planner(hidden, alpha=1.0):
    torch.manual_seed(1)
    p = LMPlanner(hidden, PlanningConfig(embedding_dim=8, state_window_size=3, soft_prefix_alpha=alpha), num_tokens=2,
                  encoder_hidden=16)
    torch.nn.init.normal_(p.to_prefix.weight, std=0.5)  # a plan strong enough to change every action
    return p


def _rollouts(tokenizer, model, planner, mode, seeds=(0, 1, 2)):
    import copy

    renderer = ChatRenderer(tokenizer)
    engine_model, engine_planner = copy.deepcopy(model), copy.deepcopy(planner)
    cfg = LMConfig(action_mode=mode, max_turns=3, max_new_tokens=5, temperature=1.0)

    async def run():
        async with AsyncExecutionEngine(ExecutionConfig(), engine_model) as engine:
            scorer = CandidateScorer(engine_model)
            plan = (lambda rng: EpisodePlan(engine_planner, engine_model.get_input_embeddings(), rng))
            worker = LMRolloutWorker(engine, renderer, cfg, scorer=scorer, plan=plan)
            return list(await asyncio.gather(*[worker.episode(MiniGridEnvironment(task_type="empty", max_steps=3),
                                                              seed=s, episode_id=s) for s in seeds]))
    return asyncio.run(run())


@pytest.mark.parametrize("mode, arch", [("generate", "qwen2"), ("generate", "llama"), ("choose", "qwen2")])
def test_engine_and_learner_logprobs_agree_with_the_plan_on(chatml_tokenizer, mode, arch):
    model = _model(len(chatml_tokenizer), arch)
    planner = _planner(32)
    trajs = _rollouts(chatml_tokenizer, model, planner, mode)
    assert all(len(t.info["plan_eps"]) == t.num_turns >= 1 for t in trajs)
    batch = collate(trajs, 0)
    acts = batch.roles == ACTION
    with torch.no_grad():
        logits, dists = planned_forward(model, planner, trajs, [t.info["plan_eps"] for t in trajs],
                                        batch.input_ids.shape[1])
        lp = sequence_logprobs(logits, batch.input_ids)
        plain = sequence_logprobs(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
                                  batch.input_ids)
    assert torch.allclose(lp[acts], batch.behavior_logprobs[acts], atol=1e-4)
    # the plan really is in the inputs: without it the same actions have other log-probs
    assert (plain[acts] - batch.behavior_logprobs[acts]).abs().max() > 1e-2
    # observation tokens are predicted from the plain stream, as every later engine turn saw it
    obs = batch.attention_mask.bool() & ~acts
    obs[:, 0] = False
    assert torch.allclose(lp[obs], plain[obs], atol=1e-5)
    assert [d.mean.shape[0] for d in dists] == [t.num_turns for t in trajs]


def test_prefix_rows_sit_right_before_each_action(chatml_tokenizer):
    """The learner's extra block for an action is [context][plan rows][action tokens] at consecutive positions:
    recomputing one action by hand from inputs_embeds gives the same log-probs."""
    model = _model(len(chatml_tokenizer))
    planner = _planner(32)
    traj = _rollouts(chatml_tokenizer, model, planner, "generate", seeds=(4,))[0]
    spans = traj.turn_spans()
    embed = model.get_input_embeddings()
    ids = torch.tensor(traj.token_ids)
    with torch.no_grad():
        emb = turn_embeddings(embed, ids, observation_spans(spans))
        _, prefix = planner(emb, torch.tensor(np.asarray(traj.info["plan_eps"], np.float32)))
        k = len(spans) - 1
        a, b = spans[k]
        x = torch.cat([embed(ids[:a]), prefix[k], embed(ids[a:b - 1])])[None]
        by_hand = torch.log_softmax(model(inputs_embeds=x).logits[0, a + 1:], -1)
        want = by_hand[torch.arange(b - a), ids[a:b]]
        logits, _ = planned_forward(model, planner, [traj], [traj.info["plan_eps"]], len(traj))
        got = sequence_logprobs(logits, ids[None])[0, a:b]
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(got, torch.tensor(traj.behavior_logprobs[a:b]), atol=1e-4)


def test_plan_kl_matches_torch_distributions():
    torch.manual_seed(0)
    d1 = PlanDistribution(torch.randn(4, 6), torch.randn(4, 6).clamp(-2, 1))
    d2 = PlanDistribution(torch.randn(2, 6), torch.randn(2, 6).clamp(-2, 1))
    D = torch.distributions

    def ref(d):
        n = D.Independent(D.Normal(d.mean, d.log_std.exp()), 1)
        cur = D.Independent(D.Normal(d.mean[1:], d.log_std[1:].exp()), 1)
        prev = D.Independent(D.Normal(d.mean[:-1], d.log_std[:-1].exp()), 1)
        assert n.batch_shape[0] == d.mean.shape[0]
        return D.kl_divergence(cur, prev)

    want = torch.cat([ref(d1), ref(d2)]).mean()
    assert torch.allclose(plan_kl([d1, d2]), want, atol=1e-6)
    single = PlanDistribution(torch.zeros(1, 6, requires_grad=True), torch.zeros(1, 6))
    z = plan_kl([single])
    assert float(z.detach()) == 0.0 and z.requires_grad  # one-turn episodes: a graph-connected zero


def test_windows_mask_turns_before_the_episode():
    p = _planner(4)
    emb = torch.arange(8, dtype=torch.float32).view(2, 4) + 1
    states, mask = p.windows(emb)
    assert states.shape == (2, 3, 4) and mask.tolist() == [[0, 0, 1], [0, 1, 1]]
    assert torch.equal(states[1, 1:], emb) and torch.equal(states[0, 2], emb[0])


def test_planner_trains_jointly_with_the_policy(chatml_tokenizer):
    model = _model(len(chatml_tokenizer))
    planner = _planner(32, alpha=0.5)
    trajs = _rollouts(chatml_tokenizer, model, planner, "generate", seeds=(0, 1, 2, 3))
    for i, t in enumerate(trajs):  # one group with distinct rewards -> non-zero advantages
        t.rewards[-1] = float(i)
    learner = LMLearner(model, 0, LMConfig(learning_rate=1e-3), lam=0.05, planner=planner)
    before = {k: v.clone() for k, v in planner.state_dict().items()}
    m = learner.update(trajs)
    assert m["plan_kl"] >= 0 and m["plan_std"] > 0
    assert any(not torch.equal(before[k], v) for k, v in planner.state_dict().items())
    with pytest.raises(ValueError, match="has no info\\['plan_eps'\\]"):
        stripped = [type(t)(t.token_ids, t.roles, t.behavior_logprobs, t.rewards, t.prompt_length,
                            t.env_output_count, policy_version=learner.version) for t in trajs]
        learner.update(stripped)
