"""Hundreds of malformed requests get 4xx OpenAI-shaped JSON errors; the server keeps serving."""

import json
import random

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from echo_rl.serve import ModelServer, create_app  # noqa: E402

VALID = {"model": "tiny", "messages": [{"role": "user", "content": "look"}], "max_tokens": 4, "temperature": 0}
JUNK = [None, True, -1, 0, 1.5, 10**12, -10**12, "x", "", [], {}, [1, "a"], {"a": 1}, float("nan")]
FIELD_BAD = {  # values every one of which is invalid for the field
    "model": [None, 1, True, [], {}, "", "gpt-4o", "tiny2"],
    "messages": [None, "hi", [], [1], [{}], [{"role": "user"}], [{"role": "robot", "content": "x"}],
                 [{"role": "user", "content": 5}], [{"role": "user", "content": [{"type": "image", "url": "x"}]}]],
    "max_tokens": ["10", 0, -5, 1.5, True, 10**9, [], {}],
    "temperature": ["hot", -0.1, 2.5, [], {}, True],
    "top_p": [0, -1, 1.5, "x", []],
    "tools": [5, "x", {}, [1], [{}], [{"type": "function"}], [{"type": "function", "function": {"name": "a b"}}],
              [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
              [{"type": "function", "function": {"name": "f",
                                                  "parameters": {"properties": {"n": {"type": "integer"}}}}}],
              [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": {}, "b": {}}}}}]],
    "tool_choice": ["always", 1, [], {"type": "function"}, "auto", "required",
                    {"type": "function", "function": {"name": "f"}}],  # with no tools: a 400
    "n": [0, 9, "2", 1.5],
    "stop": [5, [1], {"a": "b"}, True],
    "stream": ["yes", 1, []],
    "logprobs": ["true", 2, []],
    "top_logprobs": [-1, 21, "3", 2.5],
    "seed": ["1", 1.5, []],
}


INT64_MAX = 2**63 - 1
CHAT = "/v1/chat/completions"


def _raw(body: dict, field: str, literal: str) -> bytes:
    """``body`` as JSON with ``field`` set to a raw JSON literal (NaN, 1e-300, a 30-digit integer, ...)."""
    text = json.dumps({**body, field: "@@"})
    return text.replace('"@@"', literal).encode()


def _nested(rng: random.Random) -> bytes:
    depth = rng.choice([33, 100, 1000, 100_000])
    inner = rng.choice(["[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth])
    where = rng.choice(["top", "messages", "extra", "content"])
    if where == "top":
        return inner.encode()
    if where == "content":
        return json.dumps({**VALID, "messages": [{"role": "user", "content": "@@"}]}).replace('"@@"', inner).encode()
    return _raw(VALID, where, inner)


def structural(rng: random.Random) -> tuple[str, bytes]:
    """Deep nesting, wrong container types, huge arrays."""
    choice = rng.randrange(6)
    if choice == 0:
        return CHAT, _nested(rng)
    if choice == 1:  # huge arrays of the wrong thing
        field, value = rng.choice([("messages", [1] * 20_000), ("messages", [[]] * 5_000),
                                   ("stop", ["x"] * 10_000), ("messages", [{"role": "user"}] * 3_000)])
        return CHAT, json.dumps(dict(VALID, **{field: value})).encode()
    if choice == 2:  # a huge valid-looking conversation: longer than the context
        msgs = [{"role": "user", "content": "go to cabinet 1 and look around"}] * rng.choice([600, 2000])
        return CHAT, json.dumps(dict(VALID, messages=msgs)).encode()
    if choice == 3:
        return "/v1/completions", json.dumps({"model": "tiny", "prompt": ["a"] * rng.choice([2, 10_000]),
                                              "max_tokens": 2}).encode()
    if choice == 4:  # wrong container types in nested places
        bad = rng.choice([{"role": "user", "content": {"text": "x"}}, {"role": ["user"], "content": "x"},
                          {"role": "user", "content": [{"type": "text", "text": 5}]},
                          {"role": "user", "content": [{"type": "text"}]}, "user: hi", None])
        return CHAT, json.dumps(dict(VALID, messages=[bad])).encode()
    body = dict(VALID, stream_options=rng.choice([1, "x", [], {"include_usage": "yes"}]), stream=True)
    return CHAT, json.dumps(body).encode()


def encoding(rng: random.Random) -> tuple[str, bytes]:
    """Lone surrogates (as JSON escapes), invalid UTF-8 bytes, raw NUL and control bytes."""
    choice = rng.randrange(5)
    surrogate = rng.choice(["\\ud800", "\\udfff", "a\\ud83d", "\\udc00b"])
    if choice == 0:
        where = rng.choice(["content", "model", "stop", "role", "key"])
        text = json.dumps({**VALID, "messages": [{"role": "user", "content": "@@"}], "stop": "@s", "extra": 1})
        if where == "content":
            text = text.replace('"@@"', f'"{surrogate}"')
        elif where == "model":
            text = text.replace('"tiny"', f'"{surrogate}"')
        elif where == "stop":
            text = text.replace('"@s"', f'"{surrogate}"')
        elif where == "role":
            text = text.replace('"user"', f'"{surrogate}"')
        else:
            text = text.replace('"extra"', f'"{surrogate}"')
        return CHAT, text.replace('"@@"', '"x"').replace('"@s"', '"x"').encode()
    if choice == 1:
        return "/v1/completions", json.dumps({"model": "tiny", "prompt": "@@", "max_tokens": 2}).replace(
            '"@@"', f'"go {surrogate}"').encode()
    if choice == 2:  # invalid UTF-8 inside a string
        junk = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])
        return CHAT, json.dumps(VALID).encode().replace(b"look", b"lo" + junk + b"ok")
    if choice == 3:  # raw NUL / control bytes inside a JSON string (strict JSON forbids them)
        ctrl = rng.choice([b"\x00", b"\x01", b"\x1f", b"\n"])
        return CHAT, json.dumps(VALID).encode().replace(b"look", b"lo" + ctrl + b"ok")
    return CHAT, rng.choice([b"\x00" * 10, b"\xef\xbb\xbf\xef\xbb\xbf{}", "\u2028".encode() * 3, b"\xfe\xff\x00{"])


def numeric(rng: random.Random) -> tuple[str, bytes]:
    """NaN/Infinity literals, 1e308, 1e-300 where an integer is needed, integers beyond int64."""
    field = rng.choice(["temperature", "top_p", "max_tokens", "n", "seed", "top_logprobs",
                        "max_completion_tokens"])
    literal = rng.choice(["NaN", "Infinity", "-Infinity", "1e308", "-1e308", "1e309", "1e-300", "-1e-300",
                          str(INT64_MAX + 1), str(-(2**63) - 1), str(2**70), "1" * 30, "-" + "9" * 25, "1" * 5000])
    if field in ("temperature", "top_p") and literal in ("1e-300",):
        literal = "-1e-300" if field == "temperature" else "1e308"  # 1e-300 is valid here (greedy)
    return CHAT, _raw(VALID, field, literal)


def malformed(rng: random.Random) -> tuple[str, str, bytes, dict]:
    """(method, path, body, headers) of one request that must be rejected."""
    kind = rng.randrange(10)
    if kind >= 7:
        path, body = (structural, encoding, numeric)[kind - 7](rng)
        return "POST", path, body, {"content-type": "application/json"}
    headers = {"content-type": "application/json"}
    if kind == 0:  # broken JSON text
        text = json.dumps(VALID)
        cut = rng.randrange(1, len(text) - 1)
        body = rng.choice([text[:cut], text[:cut] + "}}", text.replace(":", "=", 1), "{'model': 'tiny'}", "",
                           "\x00\xff", "nul", "[" * 50])
        return "POST", "/v1/chat/completions", body.encode("utf-8", "surrogatepass"), headers
    if kind == 1:  # JSON that is not an object
        return "POST", rng.choice(["/v1/chat/completions", "/v1/completions"]), json.dumps(
            rng.choice([[VALID], 1, "s", None, True])).encode(), headers
    if kind == 2:  # one field wrong
        field = rng.choice(sorted(FIELD_BAD))
        body = dict(VALID, **{field: rng.choice(FIELD_BAD[field])})
        return "POST", "/v1/chat/completions", json.dumps(body).encode(), headers
    if kind == 3:  # required field missing
        body = dict(VALID)
        del body[rng.choice(["model", "messages"])]
        return "POST", "/v1/chat/completions", json.dumps(body).encode(), headers
    if kind == 4:  # completions endpoint with bad values
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        field, value = rng.choice([("prompt", 5), ("prompt", ["a", "b"]), ("prompt", ""), ("max_tokens", -1),
                                   ("max_tokens", 0), ("logprobs", 6), ("logprobs", "1"), ("echo", "no"),
                                   ("model", "other"), ("stream", True), ("max_tokens", 10**8)])
        body[field] = value
        return "POST", "/v1/completions", json.dumps(body).encode(), headers
    if kind == 5:  # random junk in random fields
        body = dict(VALID)
        for _ in range(rng.randrange(1, 4)):
            field = rng.choice(sorted(FIELD_BAD))
            body[field] = rng.choice(FIELD_BAD[field])
        return "POST", "/v1/chat/completions", json.dumps(body).encode(), headers
    # wrong method or unknown route
    return rng.choice([("GET", "/v1/chat/completions"), ("POST", "/v1/models"), ("POST", "/v1/nothing"),
                       ("GET", "/v2/models"), ("DELETE", "/v1/completions")]) + (b"", headers)


# Extreme values that are valid: each is served (200), never a 500 nor a dropped stream.
EDGE_VALID = [{"temperature": 1e-300}, {"temperature": 5e-324}, {"temperature": 1.0, "top_p": 1e-300},
              {"temperature": 2.0, "top_p": 5e-324}, {"temperature": 0.7, "seed": INT64_MAX},
              {"temperature": 0.7, "seed": -(2**63)}, {"temperature": 0.7, "seed": INT64_MAX, "n": 3},
              {"messages": [{"role": "user", "content": "a\u0000b \U0001F600 \u2028"}]},
              {"stop": ["\u0000", "\U0001F600"]}, {"top_logprobs": 20, "logprobs": True}]


def test_fuzz_then_valid(tiny):
    rng = random.Random(1234)
    kinds = {}
    with ModelServer(create_app(tiny, model_name="tiny")) as srv, \
            httpx.Client(base_url=f"http://{srv.host}:{srv.port}", timeout=60) as http:
        for i in range(400):
            method, path, body, headers = malformed(rng)
            r = http.request(method, path, content=body, headers=headers)
            assert 400 <= r.status_code < 500, (i, method, path, body[:200], r.status_code, r.text[:300])
            err = r.json()["error"]
            assert isinstance(err["message"], str) and err["message"] and "type" in err, r.text
            assert len(err["message"]) < 600, err["message"][:200]  # one line, not a dump of the input
            kinds[r.status_code] = kinds.get(r.status_code, 0) + 1
        r = http.post("/v1/chat/completions", json=VALID)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["role"] == "assistant"
    assert sum(kinds.values()) == 400 and kinds.get(400, 0) > 300


@pytest.mark.parametrize("stream", [False, True])
def test_extreme_but_valid_values_are_served(tiny, stream):
    """Before: temperature/top_p 1e-300 gave a 500 (NaN probabilities), or a 200 stream that was cut off."""
    with ModelServer(create_app(tiny, model_name="tiny")) as srv, \
            httpx.Client(base_url=f"http://{srv.host}:{srv.port}", timeout=60) as http:
        greedy = http.post(CHAT, json=dict(VALID, max_tokens=3)).json()["choices"][0]["message"]["content"]
        for extra in EDGE_VALID:
            if stream and extra.get("n", 1) > 1:
                continue
            body = {**VALID, "max_tokens": 3, "stream": stream, **extra}
            r = http.post(CHAT, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
            assert r.status_code == 200, (extra, r.text[:300])
            if stream:
                events = [e[len("data: "):] for e in r.text.split("\n\n") if e]
                assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), (extra, r.text[-300:])
            elif "temperature" in extra and extra["temperature"] < 1e-5 or extra.get("top_p", 1) < 1e-100:
                # a vanishing temperature or top_p is the greedy choice
                assert r.json()["choices"][0]["message"]["content"] == greedy, extra


def test_stream_failure_after_200_is_an_error_event(tiny, monkeypatch):
    """A fault mid-stream ends the stream with an OpenAI-shaped error event and [DONE], not a dropped connection."""
    from echo_rl.serve.stream_text import StreamText

    real = StreamText.push
    sent = []

    def failing(self, token):
        if sent:  # a piece already went out after the 200
            raise RuntimeError("device lost")
        part = real(self, token)
        if part:
            sent.append(part)
        return part

    monkeypatch.setattr(StreamText, "push", failing)
    with ModelServer(create_app(tiny, model_name="tiny")) as srv, \
            httpx.Client(base_url=f"http://{srv.host}:{srv.port}", timeout=60) as http:
        body = dict(VALID, max_tokens=8, stream=True)
        body["messages"] = [{"role": "user", "content": "go to cabinet 1"}]
        r = http.post(CHAT, json=body)
        assert r.status_code == 200
        events = [e[len("data: "):] for e in r.text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert "device lost" in err["message"] and err["type"] == "server_error"
        monkeypatch.setattr(StreamText, "push", real)
        assert http.post(CHAT, json=VALID).status_code == 200


def test_openai_sdk_gets_a_400_for_a_seed_beyond_int64(tiny):
    openai = pytest.importorskip("openai")
    with ModelServer(create_app(tiny, model_name="tiny")) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="EMPTY", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="seed"):
            client.chat.completions.create(model="tiny", messages=VALID["messages"], seed=2**70, max_tokens=2)
