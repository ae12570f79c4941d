"""The learner's chunked LM head (log-probs from hidden states, only where a loss reads them) computes the
same losses, metrics and gradients as the full-logits path on the tiny model."""

import copy

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import echo_rl.lm.learner as learner_mod  # noqa: E402
from echo_rl.algorithms.token_logprobs import hidden_logprobs, sequence_logprobs  # noqa: E402
from echo_rl.config import LMConfig, PlanningConfig  # noqa: E402
from echo_rl.lm.chat_delta import ChatRenderer  # noqa: E402
from echo_rl.lm.learner import LMLearner  # noqa: E402
from echo_rl.lm.plan import LMPlanner  # noqa: E402

from echo_rl.lm.trajectory import TrajectoryBuilder  # noqa: E402


def _traj(r, k, version, **info):
    b = TrajectoryBuilder(r, [("env_output", "You see a key 1.")], group_id=1, episode_id=k, policy_version=version)
    for turn in range(2):
        ids = r.encode("take key 1")[: k + 1 + turn]
        b.add_action(ids, [-0.25 * (k + 1)] * len(ids))
        b.add_observation([("warning", "Nothing happens."), ("env_output", " You see a door 1.")], float(k == turn))
    return b.finish(**info)


def _tiny_model(tokenizer, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=512, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg)


def test_hidden_logprobs_equal_the_full_log_softmax_with_gradients():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(2, 7, 8, requires_grad=True)
    ids = torch.randint(0, 50, (2, 7))
    needed = torch.rand(2, 7) > 0.4
    for T in (1.0, 0.7):
        full = sequence_logprobs(head(hidden), ids, T) * needed
        (chunked,) = hidden_logprobs(hidden, head, ids, needed, (T,), chunk_tokens=3)
        torch.testing.assert_close(chunked, full)
        g_full = torch.autograd.grad(full.sum(), [hidden, head.weight])
        g_chunk = torch.autograd.grad(chunked.sum(), [hidden, head.weight])
        for a, b in zip(g_full, g_chunk):
            torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="chunk_tokens"):
        hidden_logprobs(hidden, head, ids, needed, (1.0,), chunk_tokens=0)


def _pair(tokenizer, monkeypatch, **cfg):
    """The same learner twice: chunked head, and the full-logits path."""
    model = _tiny_model(tokenizer)
    planner = None
    if cfg.pop("plan", False):
        torch.manual_seed(1)
        planner = LMPlanner(model.config.hidden_size, PlanningConfig(), 2)
    lam = cfg.pop("lam")
    a = LMLearner(model, 0, LMConfig(learning_rate=1e-5, learner_chunk_tokens=5, **cfg), lam=lam, planner=planner,
                  ref_model=copy.deepcopy(model) if cfg.get("kl_coef") else None)
    b = copy.deepcopy(a)
    return a, b


def _run(learner, monkeypatch, chunked, fn):
    with monkeypatch.context() as m:
        if not chunked:
            m.setattr(learner_mod, "chunked_head", lambda model: False)
        assert learner_mod.chunked_head(learner.model) is chunked
        out = fn(learner)
    return out, {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("cfg", [dict(lam=0.05), dict(lam=0.3, temperature=0.7, kl_coef=0.1),
                                 dict(objective="ppo-rlhf", lam=0.05, temperature=0.8),
                                 dict(lam=0.05, plan=True)])
def test_chunked_update_equals_full_logits(chatml_tokenizer, monkeypatch, cfg):
    r = ChatRenderer(chatml_tokenizer)
    a, b = _pair(chatml_tokenizer, monkeypatch, **cfg)
    rng = np.random.default_rng(0)
    trajs = [_traj(r, k, 0, **({"plan_eps": rng.normal(size=(2, a.planner.latent_dim)).astype(np.float32)}
                               if a.planner is not None else {})) for k in range(3)]
    ma, ga = _run(a, monkeypatch, True, lambda ln: ln.update(trajs))
    mb, gb = _run(b, monkeypatch, False, lambda ln: ln.update(trajs))
    assert ma.keys() == mb.keys()
    for k in ma:
        np.testing.assert_allclose(ma[k], mb[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert ga.keys() == gb.keys() and ga
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-6, msg=n)
    assert ma["grad_norm"] > 0


def test_chunked_sft_and_held_out_ce_equal_full_logits(chatml_tokenizer, monkeypatch):
    r = ChatRenderer(chatml_tokenizer)
    trajs = [_traj(r, k, 0) for k in range(3)]
    a, b = _pair(chatml_tokenizer, monkeypatch, lam=0.05)
    ca, _ = _run(a, monkeypatch, True, lambda ln: ln.held_out_env_ce(trajs))
    cb, _ = _run(b, monkeypatch, False, lambda ln: ln.held_out_env_ce(trajs))
    assert ca == pytest.approx(cb, rel=1e-6) and ca > 0
    ma, ga = _run(a, monkeypatch, True, lambda ln: ln.sft_update(trajs, env_lambda=0.5))
    mb, gb = _run(b, monkeypatch, False, lambda ln: ln.sft_update(trajs, env_lambda=0.5))
    for k in ma:
        np.testing.assert_allclose(ma[k], mb[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("cfg", [dict(lam=0.05, temperature=0.7, kl_coef=0.1), dict(lam=0.05, plan=True)])
def test_micro_batched_update_has_the_full_batch_loss_and_gradient(chatml_tokenizer, monkeypatch, cfg):
    """learner_token_budget=1: every trajectory is its own micro-batch; loss, metrics and gradients stay the same."""
    r = ChatRenderer(chatml_tokenizer)
    a, b = _pair(chatml_tokenizer, monkeypatch, **cfg)
    b.config.learner_token_budget = 1
    rng = np.random.default_rng(0)
    trajs = [_traj(r, k, 0, **({"plan_eps": rng.normal(size=(2, a.planner.latent_dim)).astype(np.float32)}
                               if a.planner is not None else {})) for k in range(3)]
    assert len(b._groups(trajs)) == 3 and len(a._groups(trajs)) == 1
    for step in (lambda ln: ln.update(trajs), lambda ln: ln.sft_update(trajs, env_lambda=0.5)):
        ma, ga = _run(a, monkeypatch, True, step)
        mb, gb = _run(b, monkeypatch, True, step)
        for k in ma:
            np.testing.assert_allclose(ma[k], mb[k], rtol=1e-5, atol=1e-6, err_msg=k)
        for n in ga:
            torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-6, msg=n)
        if a.planner is not None:
            for pa, pb in zip(a.planner.parameters(), b.planner.parameters()):
                torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-6)
    assert a.held_out_env_ce(trajs) == pytest.approx(b.held_out_env_ce(trajs), rel=1e-6)
