"""True token streaming and abandoned requests in `echo-rl serve`, against the real server on loopback.

No timing asserts: a stream is shown to be incremental by what the engine reports while the first events
arrive (the request still running, none finished), and an abandoned request by the engine dropping it
(cancelled, not finished) after far fewer steps than it asked for.
"""

import json
import socket
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from echo_rl.serve import ModelServer, create_app  # noqa: E402
from echo_rl.serve.stream_text import StreamText  # noqa: E402

CHAT = "/v1/chat/completions"
LONG = 3000  # tokens asked for; the tiny model's greedy reply never ends before it


def body(**extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "temperature": 0, **extra}


@pytest.fixture(scope="module")
def server(tiny):
    with ModelServer(create_app(tiny, model_name="tiny")) as srv:
        yield srv


def snap(srv) -> dict:
    return srv.app.state.engine_host.snapshot()


def wait_for(cond, what: str, tries: int = 3000) -> None:
    for _ in range(tries):
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


def settled(srv) -> dict:
    """The engine's counters once nothing runs (a request ended by a stop string or a client leaves at the
    engine's next step, after its reply)."""
    wait_for(lambda: snap(srv)["running"] == 0, "the engine to be idle")
    return snap(srv)


def sse(lines):
    """The data of each server-sent event, as it arrives."""
    return (line[len("data: "):] for line in lines if line.startswith("data: "))


def test_events_arrive_while_the_engine_is_still_decoding(server):
    before = settled(server)
    seen = []
    with httpx.Client(base_url=f"http://{server.host}:{server.port}", timeout=300) as http:
        with http.stream("POST", CHAT, json=body(max_tokens=LONG, stream=True)) as r:
            assert r.status_code == 200
            for i, data in enumerate(sse(r.iter_lines())):
                s = snap(server)
                seen.append((json.loads(data)["choices"][0]["delta"], s["running"],
                             s["requests_finished"] - before["requests_finished"]))
                if i == 3:
                    break  # the role chunk and three pieces of text, each while the request still ran
    assert [x[1:] for x in seen] == [(1.0, 0.0)] * 4
    assert seen[0][0]["role"] == "assistant" and all(x[0].get("content") for x in seen[1:])


def test_the_streamed_text_is_the_non_streamed_reply(server):
    with httpx.Client(base_url=f"http://{server.host}:{server.port}", timeout=300) as http:
        with http.stream("POST", CHAT, json=body(max_tokens=120, temperature=1.0, seed=7, stream=True)) as r:
            events = list(sse(r.iter_lines()))
        full = http.post(CHAT, json=body(max_tokens=120, temperature=1.0, seed=7)).json()
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert len(chunks) > 20 and events[-1] == "[DONE]"
    assert text == full["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]


def test_a_stop_string_ends_the_stream_and_the_request(server):
    with httpx.Client(base_url=f"http://{server.host}:{server.port}", timeout=300) as http:
        ref = http.post(CHAT, json=body(max_tokens=40, temperature=1.0, seed=3)).json()
        text = ref["choices"][0]["message"]["content"]
        stop = text[10:13]
        assert len(stop) == 3
        want = http.post(CHAT, json=body(max_tokens=40, temperature=1.0, seed=3, stop=[stop])).json()
        before = settled(server)["requests_cancelled"]
        with http.stream("POST", CHAT, json=body(max_tokens=LONG, temperature=1.0, seed=3, stop=[stop],
                                                 stream=True)) as r:
            chunks = [json.loads(e) for e in list(sse(r.iter_lines()))[:-1]]
    got = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert got == want["choices"][0]["message"]["content"] == text[:text.index(stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    wait_for(lambda: snap(server)["running"] == 0, "the stopped request to leave the engine")
    assert snap(server)["requests_cancelled"] == before + 1  # ended at the stop string, not run to LONG


def test_a_streaming_client_that_disconnects_frees_its_slot(server):
    before = settled(server)
    with httpx.Client(base_url=f"http://{server.host}:{server.port}", timeout=300) as http:
        with http.stream("POST", CHAT, json=body(max_tokens=LONG, stream=True)) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
            assert snap(server)["running"] == 1
            steps_at_close = snap(server)["steps"]
    # leaving the block closed the connection mid-stream
    wait_for(lambda: snap(server)["running"] == 0, "the abandoned stream to leave the engine")
    after = snap(server)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["requests_finished"] == before["requests_finished"]
    assert after["steps"] - steps_at_close < LONG // 10, (steps_at_close, after["steps"])


def test_a_non_streaming_client_that_disconnects_frees_its_slot(server):
    before = settled(server)
    raw = json.dumps(body(max_tokens=LONG)).encode()
    s = socket.create_connection((server.host, server.port), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
    wait_for(lambda: snap(server)["running"] == 1, "the request to start decoding")
    steps_at_close = snap(server)["steps"]
    s.close()
    wait_for(lambda: snap(server)["running"] == 0, "the abandoned request to leave the engine")
    after = snap(server)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["requests_finished"] == before["requests_finished"]
    assert after["steps"] - steps_at_close < LONG // 10, (steps_at_close, after["steps"])
    with httpx.Client(base_url=f"http://{server.host}:{server.port}", timeout=300) as http:
        assert http.post(CHAT, json=body(max_tokens=3)).status_code == 200  # the server is fine


class Pieces:
    """A tokenizer whose token i decodes to bytes PIECES[i] (bytes split across tokens decode to U+FFFD)."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids):
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


def test_a_stop_string_split_across_tokens_is_never_sent():
    tok = Pieces([b"xx ST", b"O", b"P yy", b"ST", b"AR"])
    st = StreamText(tok, ["STOP"])
    assert [st.push(0), st.push(1)] == ["xx ", ""]  # "ST", "STO" may become the stop string: held back
    assert st.push(2) == "" and st.stopped and st.used == 3
    assert st.text[:st.sent] == "xx " and st.kept == [0]
    st = StreamText(tok, ["STOP"])
    assert [st.push(3), st.push(4), st.finish()] == ["", "STAR", ""]  # "ST" released once it cannot be one
    st = StreamText(tok, ["STOP"])
    assert [st.push(3), st.finish()] == ["", "ST"]  # the end releases what was held


def test_a_character_split_across_tokens_waits_for_its_last_byte():
    snow = "\u2603".encode()
    st = StreamText(Pieces([b"a", snow[:1], snow[1:2], snow[2:]]))
    assert [st.push(0), st.push(1), st.push(2), st.push(3)] == ["a", "", "", "\u2603"]
