"""The ECHO term: hand-computed CE, lambda = 0 is GRPO exactly, zero-advantage groups still learn the world."""

import pytest
import torch

from echo_rl.algorithms.echo_loss import LambdaSchedule, echo_loss, env_ce_loss
from echo_rl.algorithms.grpo import grpo_loss, group_advantages
from echo_rl.algorithms.token_logprobs import action_mask, response_mask, sequence_logprobs
from echo_rl.types import ACTION as A, ENV_OUTPUT as E, TEMPLATE as T, WARNING as W

# two trajectories, prompt of 2 tokens, then action / template / warning / env tokens
ROLES = torch.tensor([[T, E, A, A, T, W, E, E, T, A],
                      [T, E, A, T, E, E, E, T, A, T]])
PROMPT = torch.tensor([2, 2])
COUNT = torch.tensor([3, 3])  # |O|: warning + env body after the prompt
V = 11


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(V, 8), torch.nn.Linear(8, V))


def _ids(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, ROLES.shape, generator=g)


def test_env_ce_by_hand():
    lp = torch.tensor([[0.0, -9, -9, -9, -9, -3.0, -1.0, -2.0, -9, -9]])
    m = (torch.tensor([[T, E, A, A, T, W, E, E, T, A]]) == E).float()
    m[0, 1] = 0  # the prompt's env tokens are not targets
    assert env_ce_loss(lp, m, torch.tensor([3])).item() == pytest.approx(3.0 / 3.001)
    assert env_ce_loss(lp, m, torch.tensor([3]), normalization="token_mean").item() == pytest.approx(3.0 / 2.001)
    two = torch.cat([lp, lp * 2]), torch.cat([m, m])
    # per-sequence: mean over rows of (CE_i / |O_i|); token-mean: all CE over all selected tokens
    assert env_ce_loss(*two, torch.tensor([3, 4])).item() == pytest.approx((3 / 3.001 + 6 / 4.001) / 2)
    assert env_ce_loss(*two, torch.tensor([3, 4]), normalization="token_mean").item() == pytest.approx(9 / 4.001)
    with pytest.raises(ValueError, match="ce_normalization='x' is invalid"):
        env_ce_loss(lp, m, torch.tensor([3]), normalization="x")


def _echo(model, ids, adv, lam, **kw):
    logits = model[1](model[0](ids))
    blp = sequence_logprobs(logits, ids).detach() - 0.05 * (ROLES == A).float()
    return echo_loss(logits, ids, ROLES, PROMPT, blp, adv, COUNT, lam=lam, **kw), logits, blp


def test_echo_term_matches_hand_computation_on_model_logits():
    model, ids = _model(), _ids()
    terms, logits, _ = _echo(model, ids, torch.tensor([1.0, -1.0]), lam=0.05)
    lp = torch.log_softmax(logits.float(), -1)
    per_row = []
    for i in range(2):
        s = sum(-lp[i, t - 1, ids[i, t]] for t in range(2, 10) if ROLES[i, t] == E)
        per_row.append(s / (COUNT[i] + 1e-3))
    expected = sum(per_row) / 2
    assert terms.env_ce.item() == pytest.approx(expected.item(), rel=1e-5)
    assert terms.loss.item() == pytest.approx(terms.pg_loss.item() + 0.05 * expected.item(), rel=1e-5)
    assert terms.metrics["tokens_env_output"] == 5 and terms.metrics["tokens_warning"] == 1
    assert terms.metrics["tokens_ce_target"] == 5 and terms.metrics["tokens_action"] == 5


def test_warnings_only_on_request_and_counted_in_O():
    model, ids = _model(), _ids()
    a, _, _ = _echo(model, ids, torch.zeros(2), lam=1.0)
    b, _, _ = _echo(model, ids, torch.zeros(2), lam=1.0, ce_target="warning_plus_env")
    c, _, _ = _echo(model, ids, torch.zeros(2), lam=1.0, ce_target="warning_only")
    assert b.env_ce.item() == pytest.approx(a.env_ce.item() + c.env_ce.item(), rel=1e-5)  # same |O| denominator
    assert c.metrics["tokens_ce_target"] == 1


def test_lambda_zero_is_grpo_exactly():
    ids, adv = _ids(), torch.tensor([0.7, -0.7])
    m1, m2 = _model(), _model()
    t1, logits1, blp = _echo(m1, ids, adv, lam=0.0)
    t1.loss.backward()
    logits2 = m2[1](m2[0](ids))
    resp = response_mask(PROMPT, ids.shape[1])
    t2 = grpo_loss(sequence_logprobs(logits2, ids), blp, adv, action_mask(ROLES, resp))
    t2.loss.backward()
    assert torch.equal(t1.loss, t2.loss)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1.grad, p2.grad)


def test_zero_advantage_group_still_trains_the_world_model():
    ids = _ids()
    adv = group_advantages(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]))  # all equal -> 0
    assert (adv == 0).all()
    grads = {}
    for lam in (0.0, 0.05):
        m = _model()
        t, _, _ = _echo(m, ids, adv, lam=lam)
        t.loss.backward()
        grads[lam] = torch.cat([p.grad.flatten() for p in m.parameters()])
    assert grads[0.0].abs().max() == 0
    assert grads[0.05].abs().max() > 1e-4


def test_ce_at_temperature_one_whatever_the_pg_temperature():
    model, ids = _model(), _ids()
    a, _, _ = _echo(model, ids, torch.ones(2), lam=0.05)
    b, _, _ = _echo(model, ids, torch.ones(2), lam=0.05, pg_temperature=0.7)
    assert a.env_ce.item() == pytest.approx(b.env_ce.item(), rel=1e-6)
    assert a.pg_loss.item() != pytest.approx(b.pg_loss.item(), rel=1e-6)


def test_lambda_schedules():
    assert LambdaSchedule(0.05)(10_000) == 0.05
    lin = LambdaSchedule(0.05, "linear_decay", steps=100, end=0.01)
    assert lin(0) == 0.05 and lin(50) == pytest.approx(0.03) and lin(500) == pytest.approx(0.01)
    step = LambdaSchedule(0.08, "step_decay", steps=10, factor=0.5)
    assert [step(s) for s in (0, 9, 10, 25)] == [0.08, 0.08, 0.04, 0.02]
    with pytest.raises(ValueError, match="kind='cosine' is invalid"):
        LambdaSchedule(0.05, "cosine")
    with pytest.raises(ValueError, match="lam=-1 is invalid"):
        _echo(_model(), _ids(), torch.zeros(2), lam=-1)


def test_importance_weights_reach_the_ce_term():
    lp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -3.0, -3.0]])
    m = torch.tensor([[0.0, 1, 1], [0.0, 1, 1]])
    got = env_ce_loss(lp, m, torch.tensor([2, 2]), weights=torch.tensor([2.0, 0.0]))
    assert got.item() == pytest.approx((2 * 3 / 2.001 + 0) / 2)


def test_per_row_env_ce_for_replay_priorities():
    ids = _ids()
    logits = _model()(ids)
    terms = echo_loss(logits, ids, ROLES, PROMPT, torch.zeros(ROLES.shape), torch.zeros(2), COUNT, lam=0.05)
    lp = sequence_logprobs(logits, ids)
    # row 0: env tokens at 6, 7; row 1: at 4, 5, 6 — token means of -log p, not divided by |O|
    want = [-(lp[0, 6] + lp[0, 7]) / 2, -(lp[1, 4] + lp[1, 5] + lp[1, 6]) / 3]
    assert terms.row_env_ce.tolist() == pytest.approx([float(w.detach()) for w in want], rel=1e-6)
    assert not terms.row_env_ce.requires_grad
