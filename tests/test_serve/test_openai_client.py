"""The official openai client against `echo-rl serve` on loopback."""

import threading

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from echo_rl.serve import ModelServer, create_app  # noqa: E402

MSGS = [{"role": "system", "content": "You are in a room."}, {"role": "user", "content": "go to cabinet 1"}]


@pytest.fixture(scope="module")
def server(tiny):
    with ModelServer(create_app(tiny, model_name="tiny")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="EMPTY", max_retries=0, timeout=60)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_matches_the_backbone(client, tiny):
    resp = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=12, temperature=0)
    local = tiny.chat(MSGS, max_tokens=12, temperature=0)
    assert resp.choices[0].message.content == local.text
    assert resp.choices[0].message.role == "assistant"
    assert resp.usage.prompt_tokens == local.usage.prompt_tokens == len(tiny.chat_prompt_ids(MSGS))
    assert resp.usage.completion_tokens == local.usage.completion_tokens
    assert resp.choices[0].finish_reason in ("stop", "length")


def test_streaming_reassembles_to_the_same_text(client):
    full = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=16, temperature=0)
    stream = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    parts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(parts) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens


def test_chat_logprobs(client):
    resp = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8, temperature=0, logprobs=True,
                                          top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) >= 1
    assert "".join(t.token for t in content).startswith(resp.choices[0].message.content)
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # greedy: the sampled token is the most likely one
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-5)


def test_streamed_logprobs_match_the_full_reply(client):
    full = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=10, temperature=0, logprobs=True,
                                          top_logprobs=2)
    stream = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=10, temperature=0, stream=True,
                                            logprobs=True, top_logprobs=2)
    streamed = [t for chunk in stream for c in chunk.choices if c.logprobs and c.logprobs.content
                for t in c.logprobs.content]
    reply = full.choices[0].logprobs.content
    assert [t.token for t in streamed] == [t.token for t in reply]
    # scored over the history one piece at a time vs all at once: other shapes, the same values up to float rounding
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in reply], abs=1e-5)
    assert all(len(t.top_logprobs) == 2 for t in streamed)


def test_seeded_sampling_is_reproducible(client):
    a = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=10, temperature=1.0, seed=7)
    b = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=10, temperature=1.0, seed=7)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_completions_echo_scores_the_prompt(client, tiny):
    prompt = "go to cabinet 1 and open drawer 2"
    resp = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    lp = resp.choices[0].logprobs
    ids = tiny.encode(prompt)
    assert resp.choices[0].text == prompt and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(tiny.prompt_logprobs(ids), abs=1e-4)
    gen = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0)
    assert gen.usage.prompt_tokens == len(ids) and 1 <= gen.usage.completion_tokens <= 5


def test_errors_are_openai_errors(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-4o", messages=MSGS)
    assert exc.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=10**9)
    assert exc.value.body["code"] == "context_length_exceeded"


def test_concurrent_requests(client):
    want = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=12, temperature=0)
    got, errors = [], []

    def one():
        try:
            r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=12, temperature=0)
            got.append(r.choices[0].message.content)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and got == [want.choices[0].message.content] * 4


def test_serve_cli_rejects_api_backbones(monkeypatch, capsys):
    from echo_rl.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert main(["serve", "--backbone", "gpt-4o"]) == 2
    err = capsys.readouterr().err.strip()
    assert "serve needs a local checkpoint" in err and len(err.splitlines()) == 1
    monkeypatch.delenv("OPENAI_API_KEY")  # refused by what the name is, before any key or endpoint is needed
    for name in ("gpt-4o", "http://127.0.0.1:1/v1"):
        assert main(["serve", "--backbone", name]) == 2
        assert "serve needs a local checkpoint" in capsys.readouterr().err
    assert main(["serve", "--backbone", "tiny", "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err
    assert main(["serve", "--backbone", "tiny", "--torch-threads", "-1"]) == 2
    assert "--torch-threads" in capsys.readouterr().err
