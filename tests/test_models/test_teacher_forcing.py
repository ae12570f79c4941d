"""One teacher-forced scorer: the rollout's candidate scorer, the local backbone and the server read the same rows."""

import pytest
import torch

from echo_rl.lm.rollout import CandidateScorer
from echo_rl.models import teacher_forcing
from echo_rl.models.teacher_forcing import continuation_logprobs, token_logprobs

MSGS = [{"role": "user", "content": "Your task is to: put some spraybottle on toilet."}]


def _manual(model, ids: list[int], start: int) -> list[float]:
    """log p(ids[k] | ids[:k]) for k >= start, from one plain forward with no mask."""
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    return [float(logp[k - 1, ids[k]]) for k in range(start, len(ids))]


def test_batched_candidates_score_as_each_alone(tiny):
    context = tiny.chat_prompt_ids(MSGS)
    conts = [tiny.encode(t) for t in ("go to toilet 1", "take spraybottle 2 from cabinet 1", "look")]
    logp = continuation_logprobs(tiny.model, context, conts)
    assert logp.shape[:2] == (3, max(map(len, conts))) and logp.dtype == torch.float32
    for got, c in zip(token_logprobs(logp, conts), conts):
        assert got == pytest.approx(_manual(tiny.model, context + c, len(context)), abs=1e-5)


def test_a_prefix_of_token_embeddings_scores_as_those_tokens(tiny):
    """The latent-plan prefix sits between context and continuation, as the engine places it."""
    context, middle = tiny.chat_prompt_ids(MSGS), tiny.encode(" plan")
    conts = [tiny.encode("go to toilet 1"), tiny.encode("look")]
    with torch.inference_mode():
        prefix = tiny.model.get_input_embeddings()(torch.tensor(middle))
    with_prefix = token_logprobs(continuation_logprobs(tiny.model, context, conts, prefix), conts)
    as_tokens = token_logprobs(continuation_logprobs(tiny.model, context + middle, conts), conts)
    for a, b in zip(with_prefix, as_tokens):
        assert a == pytest.approx(b, abs=1e-5)


def test_nothing_to_score_is_one_clear_error(tiny):
    with pytest.raises(ValueError, match="at least one context token"):
        continuation_logprobs(tiny.model, [], [[1, 2]])
    with pytest.raises(ValueError, match="at least one non-empty continuation"):
        continuation_logprobs(tiny.model, [1], [[], []])


def test_every_caller_reads_the_one_scorer(tiny, monkeypatch):
    """The candidate scorer, the backbone's echo scoring and score(), and the server's log-probs agree bit for
    bit, and each goes through teacher_forcing.continuation_logprobs."""
    from echo_rl.lm import rollout
    from echo_rl.serve.app import _score

    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return continuation_logprobs(*args, **kwargs)

    monkeypatch.setattr(teacher_forcing, "continuation_logprobs", spy)
    monkeypatch.setattr(rollout, "continuation_logprobs", spy)
    prompt, cont = tiny.chat_prompt_ids(MSGS), tiny.encode("go to toilet 1")
    candidate = CandidateScorer(tiny.model).score(prompt, [cont])[0]
    echo = tiny.prompt_logprobs(prompt + cont)[len(prompt) - 1:]
    served = [t.logprob for t in _score(tiny, prompt, cont, top=2)]
    total = tiny.score(MSGS, ["go to toilet 1"])[0]
    assert candidate == echo == served and total == float(sum(echo))
    assert len(calls) == 4
