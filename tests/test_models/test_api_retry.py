"""APIBackbone retries only what a retry can fix: never a 4xx, a 5xx at most MAX_5XX_RETRIES times."""

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

from echo_rl.models import load_backbone  # noqa: E402
from echo_rl.models.api import MAX_5XX_RETRIES, retry_after  # noqa: E402
from echo_rl.serve import ModelServer, create_app  # noqa: E402

MSGS = [{"role": "user", "content": "hi"}]
OK = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
      "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
      "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def _app(statuses, headers=None):
    """Answers each request with the next status of ``statuses`` (then 200); counts the requests."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app, calls = FastAPI(), {"n": 0}

    @app.post("/v1/chat/completions")
    async def chat():
        calls["n"] += 1
        if calls["n"] <= len(statuses):
            return JSONResponse({"error": {"message": "nope", "type": "x"}}, status_code=statuses[calls["n"] - 1],
                                headers={"retry-after-ms": "1", **(headers or {})})
        return OK

    return app, calls


def _backbone(srv, retries=5):
    b = load_backbone(f"{srv.url}#m", max_retries=retries)
    slept = []
    b._sleep = slept.append  # no real waiting; the delays are checked instead
    return b, slept


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_deterministic_4xx_is_sent_once(status):
    import openai

    app, calls = _app([status] * 10)
    with ModelServer(app) as srv:
        b, slept = _backbone(srv)
        with pytest.raises(openai.APIStatusError) as info:
            b.chat(MSGS, max_tokens=1)
    assert info.value.status_code == status and calls["n"] == 1 and slept == []


def test_5xx_retries_are_capped():
    import openai

    app, calls = _app([500] * 10)
    with ModelServer(app) as srv:
        b, slept = _backbone(srv, retries=5)
        with pytest.raises(openai.InternalServerError):
            b.chat(MSGS, max_tokens=1)
    assert calls["n"] == 1 + MAX_5XX_RETRIES and slept == [0.001] * MAX_5XX_RETRIES  # Retry-After honoured


def test_5xx_then_success_and_429_use_the_full_budget():
    app, calls = _app([503, 429, 429, 429, 502])
    with ModelServer(app) as srv:
        b, slept = _backbone(srv, retries=5)
        assert b.chat(MSGS, max_tokens=1).text == "ok"
    assert calls["n"] == 6 and len(slept) == 5


def test_should_retry_false_stops_at_once():
    import openai

    app, calls = _app([503] * 3, headers={"x-should-retry": "false"})
    with ModelServer(app) as srv:
        b, _ = _backbone(srv)
        with pytest.raises(openai.InternalServerError):
            b.chat(MSGS, max_tokens=1)
    assert calls["n"] == 1


def test_connection_errors_retry_with_backoff():
    import openai

    b = load_backbone("http://127.0.0.1:9/v1#m", max_retries=3, timeout=2)  # port 9: nothing listens
    slept = []
    b._sleep = slept.append
    with pytest.raises(openai.APIConnectionError):
        b.chat(MSGS, max_tokens=1)
    assert len(slept) == 3 and all(0.3 <= d <= 8.0 for d in slept) and slept[0] < slept[2]


def test_retry_after_parsing():
    assert retry_after({"retry-after-ms": "250"}) == 0.25
    assert retry_after({"retry-after": "2"}) == 2.0
    assert retry_after({"retry-after": "3600"}) is None  # too long: use our own backoff
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None


def test_echo_rl_serve_bad_request_is_not_resent(tiny):
    """The issue's case: a malformed request to `echo-rl serve` must fail once with the server's reason."""
    import openai

    with ModelServer(create_app(tiny, model_name="tiny")) as srv:
        b = load_backbone(f"{srv.url}#tiny", max_retries=5)
        b._sleep = lambda d: pytest.fail(f"retried a deterministic failure (slept {d})")
        with pytest.raises(openai.BadRequestError, match="seed"):
            b.chat(MSGS, max_tokens=1, seed=2**70)
        assert b.chat(MSGS, max_tokens=2, temperature=1e-300).usage.completion_tokens >= 1
