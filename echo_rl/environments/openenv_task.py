"""The ``openenv`` task: any OpenEnv environment server, given its URL, as an EchoRL text task.

OpenEnv (PyPI ``openenv``) environments are HTTP / WebSocket servers with
``reset``, ``step`` and ``state``; an episode is one WebSocket session (the
server's stateless HTTP ``/step`` cannot carry an episode). This task talks to
such a server with the ``openenv`` package's own client (``GenericEnvClient``),
so any server built from its server code is a task EchoRL trains on:

- the reply text becomes the action: one field of the server's action model
  (``action_field``, found from its ``/schema`` when it has a single text field),
  or, with ``action_json``, the whole action as a JSON object;
- the observation becomes ``env_output`` text (one field, or ``key: value``
  lines); where the server sends role segments (``segments``: a list of
  ``{"role", "text"}`` with the env_output / warning roles of RFC 010's
  trajectory masks, as ``echo-rl serve-env`` does) they are kept as they are;
- an action the server refuses (a validation or execution error) is a
  ``warning`` segment and the episode goes on, as for every EchoRL task;
- ``reward`` (None: 0) and ``done`` map to the step's reward and termination;
  ``won``: the observation's own ``won`` where it has one, else ``done`` with
  ``reward >= win_reward``.

Each episode opens its own session (``reset``) and closes it when it ends, so a
server that allows one session at a time serves one episode after another. An
unreachable URL or a server that fails mid-episode raises one line naming the URL.
"""

from __future__ import annotations

import json
import math
import urllib.request
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from echo_rl.config import ConfigBase, ConfigError, spec
from echo_rl.environments import registry
from echo_rl.environments.base import (ROLES, Segment, StepOutcome, TextEnvironment, env_output, make_config,
                                       max_steps_spec, warning)

OPENENV_EXTRA = "pip install 'echo-rl[openenv]'"
SCHEMES = ("http", "https", "ws", "wss")
MAX_MESSAGE_MB = 16.0  # a server's reply over this closes the session (observations are cut to 1M characters anyway)
_SKIP_FIELDS = ("metadata", "done", "reward")  # OpenEnv's own Observation fields, not the environment's text


def import_openenv() -> Any:
    """``openenv.core``, or an ImportError naming the pip install."""
    try:
        import openenv.core as core
    except ImportError as exc:
        raise ImportError(f"OpenEnv support needs the openenv package: {OPENENV_EXTRA} ({exc})") from None
    return core


@dataclass
class OpenEnvConfig(ConfigBase):
    """Where the OpenEnv server is and how reply text and observations map onto its action / observation."""

    url: str = spec("", help="the OpenEnv server's base URL (http://, https://, ws:// or wss://)")
    action_field: str | None = spec(None, help="the action field the reply text fills (None: the one text field "
                                    "of the server's action schema)")
    action_json: bool = spec(False, help="the reply is the whole action as a JSON object (multi-field actions)")
    observation_field: str | None = spec(None, help="the observation field shown as text (None: role segments "
                                         "where sent, else the only field, else 'key: value' lines)")
    reset_kwargs: dict = spec(default_factory=dict, help="extra keyword arguments of every reset (e.g. split)")
    num_seeds: int = spec(1_000_000, help="episodes reset the server with seed = a task index in [0, num_seeds)",
                          min=1)
    win_reward: float = spec(1.0, help="won: the episode ended (done) with a step reward >= this (unless the "
                             "observation says won itself)")
    max_steps: int = max_steps_spec(32)
    connect_timeout: float = spec(10.0, help="seconds to open a session", gt=0)
    message_timeout: float = spec(60.0, help="seconds to wait for a reset / step reply", gt=0)

    def validate(self) -> None:
        super().validate()
        parts = urlsplit(self.url) if isinstance(self.url, str) else None
        if parts is None or parts.scheme not in SCHEMES or not parts.hostname:
            self._fail("url", self.url, f"must be an OpenEnv server's base URL ({', '.join(SCHEMES)}://HOST[:PORT])")
        if self.action_json and self.action_field is not None:
            self._fail("action_field", self.action_field, "must be None with action_json=True (the reply is the "
                       "whole action)")
        if "seed" in self.reset_kwargs:
            self._fail("reset_kwargs", self.reset_kwargs, "must not set seed (episodes draw it from num_seeds)")

    @property
    def http_url(self) -> str:
        parts = urlsplit(self.url.rstrip("/"))
        scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        return parts._replace(scheme=scheme).geturl()


class OpenEnvTask(TextEnvironment):
    """A text task whose episodes run on a remote OpenEnv server, one WebSocket session per episode."""

    def __init__(self, config: OpenEnvConfig | dict | None = None, render_mode: str | None = None,
                 **overrides: Any):
        config = make_config(OpenEnvConfig, config, overrides)
        super().__init__(config, render_mode)
        import_openenv()
        self._field = None if config.action_json else (config.action_field or self._discover_action_field())
        self._client: Any = None
        self._obs: dict = {}
        self._holder: list = [None]  # the open session's client; closed at episode end, close() or collection
        weakref.finalize(self, _close_client, self._holder)

    # -- the server -------------------------------------------------------------
    def _fail_line(self, what: str, exc: BaseException) -> str:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return f"openenv task: {what} the OpenEnv server at {self.config.url}: {reason}"

    def _discover_action_field(self) -> str:
        """The one text field of the server's action model (``GET /schema``)."""
        try:
            with urllib.request.urlopen(self.config.http_url + "/schema", timeout=self.config.connect_timeout) as r:
                schema = json.loads(r.read(1 << 22))
        except (OSError, ValueError) as exc:  # unreachable, not HTTP, or not JSON
            raise ConfigError(self._fail_line("cannot read /schema from", exc) + " (is it running? or set "
                              "env_config.action_field)") from None
        props = (schema.get("action") or {}).get("properties") or {} if isinstance(schema, dict) else {}
        names = [k for k in props if k not in _SKIP_FIELDS]
        text = [k for k in names if isinstance(props[k], dict) and props[k].get("type") == "string"]
        if len(text) == 1:
            return text[0]
        raise ConfigError(f"openenv task: the action of the OpenEnv server at {self.config.url} has "
                          f"{len(text)} text fields among {names}: set env_config.action_field to one of them, or "
                          "action_json=true to reply with the whole action as JSON")

    def _connect(self) -> Any:
        self._disconnect()
        core = import_openenv()
        client = core.GenericEnvClient(base_url=self.config.url, connect_timeout_s=self.config.connect_timeout,
                                       message_timeout_s=self.config.message_timeout,
                                       max_message_size_mb=MAX_MESSAGE_MB).sync()
        self._holder[0] = client
        try:
            client.connect()
        except Exception as exc:  # refused, bad host, not a WebSocket server
            self._disconnect()
            raise ConfigError(self._fail_line("cannot open a session on", exc)) from None
        self._client = client
        return client

    def _disconnect(self) -> None:
        self._client = None
        _close_client(self._holder)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A reset / step on the server; a refused request returns its one-line message as a str."""
        try:
            return fn(*args, **kwargs)
        except RuntimeError as exc:
            if str(exc).startswith("Server error:"):
                return " ".join(str(exc).split())
            self._disconnect()
            raise RuntimeError(self._fail_line(f"{what} failed on", exc)) from None
        except Exception as exc:  # the connection dropped, timed out, or the reply was not JSON
            self._disconnect()
            raise RuntimeError(self._fail_line(f"{what} failed on", exc)) from None

    # -- hooks ----------------------------------------------------------------
    def _num_tasks(self) -> int:
        return self.config.num_seeds

    def _task_id(self) -> str:
        task_id = self._obs.get("task_id")
        return task_id if isinstance(task_id, str) and task_id else str(self._task_index)

    def _admissible_actions(self) -> list[str] | None:
        acts = self._obs.get("admissible_actions")
        if isinstance(acts, list) and all(isinstance(a, str) for a in acts):
            return list(acts)
        return None

    def _reset_task(self, index: int, options: dict) -> list[Segment]:
        client = self._connect()
        result = self._call("reset", client.reset, seed=index, **self.config.reset_kwargs)
        if isinstance(result, str):
            self._disconnect()
            raise ConfigError(self._fail_line("reset was refused by", RuntimeError(result)))
        self._obs = result.observation if isinstance(result.observation, dict) else {}
        return self._segments(self._obs)

    def _step(self, action: str) -> StepOutcome:
        if self._client is None:
            return StepOutcome(warning("The episode is over; call reset()."))
        payload = self._payload(action)
        if isinstance(payload, str):
            return StepOutcome(warning(payload))
        result = self._call("step", self._client.step, payload)
        if isinstance(result, str):
            return StepOutcome(warning(f"The environment refused the action: {result}"))
        self._obs = result.observation if isinstance(result.observation, dict) else {}
        reward = float(result.reward) if isinstance(result.reward, (int, float)) else 0.0
        reward = reward if math.isfinite(reward) else 0.0  # a NaN from the server must not reach the loss
        done = bool(result.done)
        truncated = done and self._obs.get("truncated") is True  # a served EchoRL task says which end it was
        won = self._obs.get("won")
        won = bool(won) if isinstance(won, bool) else done and reward >= self.config.win_reward
        return StepOutcome(self._segments(self._obs), reward=reward, terminated=done and not truncated, won=won,
                           truncated=truncated)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        out = super().step(action)
        if self._done:
            self._disconnect()  # the episode's session ends with it: single-session servers serve the next one
        return out

    def close(self) -> None:
        self._disconnect()
        super().close()

    # -- text <-> OpenEnv -----------------------------------------------------
    def _payload(self, action: str) -> dict | str:
        """The action dict the reply text makes, or a warning for a reply that is not one."""
        if self._field is not None:
            return {self._field: action}
        try:
            value = json.loads(action)
        except ValueError as exc:
            return f"Reply with the action as one JSON object; it did not parse: {exc}."
        if not isinstance(value, dict):
            return f"Reply with the action as one JSON object, not a JSON {type(value).__name__}."
        return value

    def _segments(self, obs: dict) -> list[Segment]:
        field_name = self.config.observation_field
        if field_name is not None:
            value = obs.get(field_name, "")
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            return env_output(text or "(empty observation)")
        segs = obs.get("segments")
        if isinstance(segs, list) and segs and all(
                isinstance(s, dict) and s.get("role") in ROLES and isinstance(s.get("text"), str) for s in segs):
            return [Segment(s["role"], s["text"]) for s in segs]
        fields = {k: v for k, v in obs.items() if k not in _SKIP_FIELDS}
        if len(fields) == 1 and isinstance(next(iter(fields.values())), str):
            text = next(iter(fields.values()))
        else:
            text = "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v, sort_keys=True)}"
                             for k, v in fields.items())
        return env_output(text or "(empty observation)")


def _close_client(holder: list) -> None:
    client, holder[0] = holder[0], None
    if client is not None:
        try:
            client.close()
        except Exception:  # noqa: S110 - best effort: the server reaps a dropped session itself
            pass


registry.register_text_env(  # held out by seed: the server's episodes are drawn by seed
    "openenv", lambda **kw: OpenEnvTask(kw),
    description="any OpenEnv environment server (env_config: url=...), over its WebSocket session API",
    data="a running OpenEnv server (env_config.url); needs pip install 'echo-rl[openenv]'")

__all__ = ["OpenEnvConfig", "OpenEnvTask", "import_openenv"]
