"""Serve an EchoRL text task as an OpenEnv environment server (``echo-rl serve-env TASK``).

The server is the ``openenv`` package's own (``openenv.core.create_fastapi_app``):
the WebSocket session API ``/ws`` (``reset`` / ``step`` / ``state``, one
environment per session) and the HTTP routes ``/reset``, ``/step``, ``/state``,
``/schema``, ``/metadata``, ``/health``, so OpenEnv's clients and the trainers
built on them (TRL, ART, ...) use EchoRL's tasks unchanged. What this module adds:

- the models: the action is ``{"text": REPLY}`` (the task parses it as it parses
  any reply: a MiniGrid action word, a ``<bash>`` tool call); the observation
  carries ``text``, its role ``segments`` (``env_output`` / ``warning`` as in RFC 010,
  the characters ECHO's masks need), ``won``, ``truncated``, ``admissible_actions``,
  ``step`` and ``task_id``; ``/metadata`` gives the task's reply instruction;
- a guard in front of the app, because a served environment takes input from
  whoever connects: only the routes above answer (no MCP, no docs, no task API),
  request bodies and WebSocket messages are capped in bytes, the action text in
  characters, sessions in number (the rest get OpenEnv's capacity error) and in
  idle time (reaped), HTTP calls in flight (503 beyond), and the bind is loopback
  unless ``--host`` says otherwise. Clients choose nothing but the seed and the
  task index of an episode; the task's own options are the operator's.

HTTP ``/reset`` and ``/step`` are OpenEnv's stateless ones (a fresh environment
per call): an episode needs the ``/ws`` session.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from echo_rl.config import ConfigError
from echo_rl.environments.openenv_task import import_openenv
from echo_rl.environments.registry import make_env, task_format, task_spec

HTTP_ROUTES = frozenset({("GET", "/health"), ("GET", "/metadata"), ("GET", "/schema"), ("GET", "/state"),
                         ("POST", "/reset"), ("POST", "/step")})
WS_ROUTES = frozenset({"/ws"})
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def build_app(task: str, env_config: dict | None = None, *, max_sessions: int = 8, session_timeout: float = 600.0,
              max_request_bytes: int = 1 << 16, max_action_chars: int = 8192, max_http_inflight: int = 4) -> Any:
    """The OpenEnv ASGI app serving ``task`` (built with ``env_config``), behind the guard."""
    for name, value, low in (("max_sessions", max_sessions, 1), ("max_request_bytes", max_request_bytes, 1024),
                             ("max_action_chars", max_action_chars, 1), ("max_http_inflight", max_http_inflight, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name}={value!r} is invalid: must be an integer >= {low}")
    if not isinstance(session_timeout, (int, float)) or session_timeout <= 0:
        raise ConfigError(f"session_timeout={session_timeout!r} is invalid: must be > 0 seconds")
    env_config = dict(env_config or {})
    spec = task_spec(task)  # an unknown task: one line naming the allowed ones
    probe = make_env(task, **env_config)  # a bad env_config fails now, not in the first client's session
    fmt = task_format(task, probe)
    probe.close()
    core = import_openenv()
    action_cls, observation_cls, state_cls = _models(core, max_action_chars)
    description = f"EchoRL text task {task!r}: {spec.description}. Reply format: {fmt.instruction}"

    class ServedTextEnv(core.Environment):
        """One session's EchoRL environment (built on the first reset, so /state and /metadata stay cheap)."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._env: Any = None
            self._episode_id: str | None = None
            self._last: dict = {"step": 0, "task_id": "", "won": False, "done": True}

        def reset(self, seed: int | None = None, episode_id: str | None = None,
                  task_index: int | None = None) -> Any:
            if self._env is None:
                self._env = make_env(task, **env_config)
            options = {} if task_index is None else {"task_index": task_index}
            obs, info = self._env.reset(seed=seed, options=options)
            self._episode_id = str(episode_id)[:255] if episode_id is not None else str(uuid.uuid4())
            return self._observation(obs, 0.0, False, False, info)

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
            if self._env is None or self._last["done"]:
                text = "No episode is running: send reset first."
                return observation_cls(text=text, segments=[{"role": "warning", "text": text}], done=True,
                                       reward=0.0)
            obs, reward, terminated, truncated, info = self._env.step(action.text)
            return self._observation(obs, reward, terminated, truncated, info)

        def _observation(self, obs: str, reward: float, terminated: bool, truncated: bool, info: dict) -> Any:
            done = bool(terminated or truncated)
            self._last = {"step": int(info.get("step", 0)), "task_id": str(info.get("task_id", "")),
                          "won": bool(info.get("won", False)), "done": done}
            acts = info.get("admissible_actions")
            return observation_cls(
                text=obs, segments=[{"role": s.role, "text": s.text} for s in info.get("segments", ())],
                admissible_actions=list(acts) if acts is not None else None, won=self._last["won"],
                truncated=bool(truncated), step=self._last["step"], task_id=self._last["task_id"], done=done,
                reward=float(reward))

        @property
        def state(self) -> Any:
            return state_cls(episode_id=self._episode_id, step_count=self._last["step"], task=task,
                             task_id=self._last["task_id"], won=self._last["won"], done=self._last["done"])

        def get_metadata(self) -> Any:
            return core.env_server.types.EnvironmentMetadata(name=f"echo-rl-{task}", description=description,
                                                             version="1")

        def close(self) -> None:
            env, self._env = self._env, None
            self._last["done"] = True
            if env is not None:
                env.close()

    ServedTextEnv.__name__ = ServedTextEnv.__qualname__ = f"EchoRL_{task.replace('-', '_')}"
    config = core.ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=float(session_timeout))
    app = core.create_fastapi_app(ServedTextEnv, action_cls, observation_cls, concurrency_config=config,
                                  env_name=task, state_cls=state_cls, mode="simulation")
    return RequestGuard(app, max_request_bytes=max_request_bytes, max_http_inflight=max_http_inflight)


def _models(core: Any, max_action_chars: int) -> tuple[type, type, type]:
    from pydantic import Field

    class TextAction(core.Action):
        """The agent's reply, as the task parses it."""

        text: str = Field(..., max_length=max_action_chars, description="the reply text")

    class TextObservation(core.Observation):
        """The task's observation; ``segments`` say which characters are env_output and which warning."""

        text: str = Field("", description="the observation text (the segments' texts joined)")
        segments: list[dict[str, str]] = Field(default_factory=list, description="role segments: env_output / warning")
        admissible_actions: list[str] | None = Field(None, description="the valid replies, where the task has a list")
        won: bool = Field(False, description="the episode was won")
        truncated: bool = Field(False, description="the episode hit its step limit (done, not terminated)")
        step: int = Field(0, description="actions taken in this episode")
        task_id: str = Field("", description="which task instance this episode is")

    class TextState(core.State):
        task: str = Field("", description="the EchoRL task served")
        task_id: str = Field("", description="the current episode's task instance")
        won: bool = False
        done: bool = True

    return TextAction, TextObservation, TextState


class RequestGuard:
    """ASGI middleware: the allowed routes only, bounded bodies / WebSocket messages, bounded HTTP calls in flight."""

    def __init__(self, app: Any, *, max_request_bytes: int, max_http_inflight: int) -> None:
        self.app, self.max_bytes, self.max_inflight = app, max_request_bytes, max_http_inflight
        self.inflight = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        else:  # lifespan: OpenEnv's idle-session reaper starts and stops with it
            await self.app(scope, receive, send)

    async def _http(self, scope: dict, receive: Any, send: Any) -> None:
        if (scope["method"], scope["path"]) not in HTTP_ROUTES:
            routes = ", ".join(sorted({p for _, p in HTTP_ROUTES} | WS_ROUTES))
            return await _reply(send, 404, f"not served here: {scope['method']} {scope['path']}; routes: {routes}")
        if self.inflight >= self.max_inflight:
            return await _reply(send, 503, "busy: too many HTTP calls in flight; retry, or use the /ws session")
        body = bytearray()
        while True:  # the whole body, bounded, before the app sees any of it
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > self.max_bytes:
                return await _reply(send, 413, f"request body over {self.max_bytes} bytes")
            if not msg.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        self.inflight += 1
        try:
            await self.app(scope, replay, send)
        finally:
            self.inflight -= 1

    async def _websocket(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["path"] not in WS_ROUTES:
            await receive()  # websocket.connect
            return await send({"type": "websocket.close", "code": 1008})

        closed = False

        async def bounded() -> dict:
            nonlocal closed
            msg = await receive()
            if msg["type"] == "websocket.receive":
                size = len(msg["bytes"]) if msg.get("bytes") is not None else len((msg.get("text") or "").encode())
                if size > self.max_bytes:  # close (1009: too big) and tell the app the client is gone
                    closed = True
                    await send({"type": "websocket.close", "code": 1009,
                                "reason": f"message over {self.max_bytes} bytes"})
                    return {"type": "websocket.disconnect", "code": 1009}
            return msg

        async def sender(msg: dict) -> None:
            if not closed:  # after the guard closed the socket, the app's farewell goes nowhere
                await send(msg)

        await self.app(scope, bounded, sender)


async def _reply(send: Any, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


__all__ = ["RequestGuard", "build_app", "is_loopback"]
