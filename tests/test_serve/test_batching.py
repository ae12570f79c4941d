"""`echo-rl serve` on the execution engine: concurrent requests batch and each still gets its own answer.

Run as a script to time 1 request against 8 concurrent ones (the docs/benchmarks.md numbers):
``nice .venv/bin/python tests/test_serve/test_batching.py [--backbone tiny] [--max-tokens 64] [--reps 3]
[--threads N]``.
"""

import concurrent.futures
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from echo_rl.serve import ModelServer, create_app  # noqa: E402

CHAT = "/v1/chat/completions"
PROMPTS = ["go to cabinet 1", "open drawer 2", "take the apple from the table", "look",
           "put the mug in the coffee machine", "examine shelf 3", "go to the sink and clean the plate", "inventory"]


def body(prompt: str, max_tokens: int, **extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "system", "content": "You are in a room."},
                                          {"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, **extra}


def post_all(base: str, bodies: list[dict]) -> tuple[list[dict], float]:
    """Send ``bodies`` at once (one thread each); the replies in order and the wall time."""
    def one(b: dict) -> dict:
        with httpx.Client(base_url=base, timeout=300) as http:
            r = http.post(CHAT, json=b)
            assert r.status_code == 200, r.text[:300]
            return r.json()

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        out = list(pool.map(one, bodies))
    return out, time.perf_counter() - t0


@pytest.fixture(scope="module")
def server(tiny):
    app = create_app(tiny, model_name="tiny")
    with ModelServer(app) as srv:
        yield srv, app


def text(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def test_greedy_equals_the_local_backbone(server, tiny):
    srv, _ = server
    base = f"http://{srv.host}:{srv.port}"
    for prompt in PROMPTS[:2]:
        b = body(prompt, 16)
        (got,), _ = post_all(base, [b])
        want = tiny.chat(b["messages"], max_tokens=16, temperature=0)
        assert text(got) == want.text
        assert got["usage"]["completion_tokens"] == want.usage.completion_tokens
        assert got["choices"][0]["finish_reason"] == want.finish_reason


def test_stop_strings_cut_as_the_local_backbone_does(server, tiny):
    srv, _ = server
    base = f"http://{srv.host}:{srv.port}"
    b = body(PROMPTS[0], 24)
    full = tiny.chat(b["messages"], max_tokens=24, temperature=0).text
    assert len(full) >= 6, full  # the tiny model says something to cut
    stop = full[3:5]
    (got,), _ = post_all(base, [dict(b, stop=[stop, "\u2603never"])])
    want = tiny.chat(b["messages"], max_tokens=24, temperature=0, stop=(stop, "\u2603never"))
    assert text(got) == want.text and stop not in text(got)
    assert got["choices"][0]["finish_reason"] == want.finish_reason == "stop"
    assert got["usage"]["completion_tokens"] == want.usage.completion_tokens


def test_eight_concurrent_requests_batch_and_match_their_solo_results(server):
    srv, app = server
    base = f"http://{srv.host}:{srv.port}"
    bodies = [body(p, 24) for p in PROMPTS]
    solo = [post_all(base, [b])[0][0] for b in bodies]
    steps_before = app.state.engine_host.snapshot()
    together, _ = post_all(base, bodies)
    assert [text(r) for r in together] == [text(r) for r in solo]
    assert [r["usage"] for r in together] == [r["usage"] for r in solo]
    snap = app.state.engine_host.snapshot()
    assert snap["running"] == 0 and snap["waiting"] == 0
    # the shared system prompt came from the radix cache rather than being recomputed
    assert snap.get("cache_tokens", 0) > 0 and steps_before.get("cache_tokens", 0) > 0


def test_seeded_sampling_in_a_batch_is_reproducible(server):
    srv, _ = server
    base = f"http://{srv.host}:{srv.port}"
    bodies = [body(p, 12, temperature=1.0, seed=11) for p in PROMPTS[:4]]
    a, _ = post_all(base, bodies)
    b, _ = post_all(base, bodies)
    assert [text(r) for r in a] == [text(r) for r in b]


def test_close_stops_the_engine_and_a_new_request_restarts_it(tiny):
    app = create_app(tiny, model_name="tiny")
    with ModelServer(app) as srv:
        base = f"http://{srv.host}:{srv.port}"
        (first,), _ = post_all(base, [body("look", 4)])
        app.state.engine_host.close()
        (again,), _ = post_all(base, [body("look", 4)])
        assert text(again) == text(first)
    assert app.state.engine_host._thread is None  # ModelServer.stop closed it


#: prompts a real instruct model answers at length, so every reply runs to ``max_tokens`` (a reply that stops
#: early at EOS would make 8 requests look cheaper or dearer than they are)
LONG_PROMPTS = [f"Write a long, detailed paragraph about {t}." for t in
                ("the ocean", "mountains", "the history of bread", "railways", "honey bees", "the moon",
                 "winter in a forest", "how clocks work")]


def measure(backbone: str = "tiny", max_tokens: int = 64, reps: int = 3, long: bool = False) -> dict:
    """Wall time of one request vs 8 concurrent ones (best of ``reps``), greedy, distinct prompts."""
    from echo_rl.models import load_backbone

    bb = load_backbone(backbone, device="cpu")
    with ModelServer(create_app(bb, model_name="tiny")) as srv:
        base = f"http://{srv.host}:{srv.port}"
        bodies = [body(p, max_tokens) for p in (LONG_PROMPTS if long else PROMPTS)]
        post_all(base, bodies)  # warm-up (and the prefix cache, as a running server would have it)
        one, one_replies = float("inf"), None
        for _ in range(reps):
            replies, t = post_all(base, bodies[:1])
            if t < one:
                one_replies, one = replies, t
        eight_replies, eight = None, float("inf")
        for _ in range(reps):
            replies, t = post_all(base, bodies)
            if t < eight:
                eight_replies, eight = replies, t
    tokens = sum(r["usage"]["completion_tokens"] for r in eight_replies)
    return {"one_s": one, "eight_s": eight, "ratio": eight / one,
            "one_completion_tokens": one_replies[0]["usage"]["completion_tokens"], "eight_completion_tokens": tokens}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backbone", default="tiny")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--long", action="store_true", help="prompts a real model answers at length (every reply "
                                                        "runs to --max-tokens)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    print(measure(a.backbone, a.max_tokens, a.reps, a.long))
