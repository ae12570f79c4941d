"""The trainer's loopback server: ``echo-rl serve``'s app with a recorder, rollout paths, a key and a reward route.

A program is handed ``OPENAI_BASE_URL=http://127.0.0.1:PORT/rollout/<id>/v1`` and ``OPENAI_API_KEY``, so
the official ``openai`` client (which reads both) names its episode without a code change; a client shared
by several episodes may send the ``x-echo-rl-rollout: <id>`` header to ``/v1`` instead. The reward is
``POST /rollout/<id>/v1/echo_rl/reward`` with ``{"reward": float, "task": str}``
(:func:`echo_rl.external.report`).
"""

# (no `from __future__ import annotations`: FastAPI must resolve the reward route's `Request`)

import hmac
import json
import re
from typing import Any

from echo_rl.external.recorder import Recorder
from echo_rl.serve.app import create_app, parse_json
from echo_rl.serve.errors import APIError

ROLLOUT_HEADER = b"x-echo-rl-rollout"
_PATH = re.compile(r"^/rollout/([A-Za-z0-9_-]{1,64})(/v1/.*)$")


class RolloutRouter:
    """ASGI wrapper: checks the key, and turns ``/rollout/<id>/v1/...`` into ``/v1/...`` plus the header."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.key = app, key
        self.state = app.state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        on_path = scope["path"].startswith("/rollout/")  # the path names the rollout: a header cannot override it
        headers = [(k, v) for k, v in scope["headers"] if k != ROLLOUT_HEADER or not on_path]
        auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        if scope["path"] != "/health" and not hmac.compare_digest(auth, f"Bearer {self.key}"):
            return await _send_error(send, 401, "missing or wrong API key: use the OPENAI_API_KEY this trainer set")
        m = _PATH.match(scope["path"])
        if m:
            headers.append((ROLLOUT_HEADER, m.group(1).encode()))
            scope = {**scope, "path": m.group(2), "raw_path": m.group(2).encode(), "headers": headers}
        elif scope["path"].startswith("/rollout/"):
            return await _send_error(send, 404, "rollout paths are /rollout/<id>/v1/..., id of 1-64 characters "
                                     "[A-Za-z0-9_-]")
        await self.app(scope, receive, send)


async def _send_error(send: Any, status: int, message: str) -> None:
    body = json.dumps(APIError(status, message).body()).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def trainer_app(backbone: Any, recorder: Recorder, key: str, *, model_name: str = "policy",
                max_concurrent: int = 64) -> RolloutRouter:
    """The serve app recording into ``recorder``, behind the key and the rollout paths."""
    from fastapi import Request  # the serve extra, loaded with the app

    app = create_app(backbone, model_name=model_name, max_concurrent=max_concurrent, recorder=recorder)

    @app.post("/v1/echo_rl/reward")
    async def reward(request: Request) -> dict:
        raw = await request.body()
        if len(raw) > 4096:
            raise APIError(413, f"reward body is {len(raw)} bytes; the limit is 4096")
        data = parse_json(raw)
        if not isinstance(data, dict) or "reward" not in data:
            raise APIError(400, 'reward body must be a JSON object {"reward": number, "task": string}')
        recorder.report(request.headers.get(ROLLOUT_HEADER.decode()), data["reward"], data.get("task"))
        return {"ok": True}

    return RolloutRouter(app, key)
