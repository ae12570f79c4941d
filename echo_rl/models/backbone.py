"""The backbone protocol: one interface over API models, local checkpoints and tiny models.

Agents, the server and the evaluation runner only see :class:`Backbone`, so a
prompting baseline runs unchanged on GPT-4o, on a served checkpoint, or on a
tiny model built from config. Every call returns a :class:`Completion` with
its own :class:`Usage`; the backbone also keeps the running total so an
evaluation can read tokens and cost without threading them through.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from echo_rl.config import ConfigError

Message = dict[str, Any]  # {"role": "system"|"user"|"assistant", "content": str}

MAX_TOP_LOGPROBS = 20  # the OpenAI API's bound


class CapabilityError(ConfigError):
    """The backbone cannot do what was asked (e.g. score text through a chat-only API)."""


@dataclass
class Usage:
    """Token and cost accounting; ``cost`` is None when the model has no known price."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = 0.0
    requests: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: "Usage") -> "Usage":
        cost = None if self.cost is None or other.cost is None else self.cost + other.cost
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens,
                     cost, self.requests + other.requests)

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens, "cost": self.cost, "requests": self.requests}


@dataclass
class TokenLogprob:
    """One sampled token with its log-probability and the most likely alternatives."""

    token: str
    logprob: float
    token_id: int | None = None
    top: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class Completion:
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    usage: Usage
    model: str = ""
    token_ids: list[int] | None = None  # sampled ids, exactly as sampled (local backbones)
    prompt_token_ids: list[int] | None = None
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI's tool_calls entries (backbones with supports_tools)


class TextDelta(str):
    """A streamed piece of text; ``tokens`` are the sampled tokens it completes (local backbones)."""

    tokens: list[TokenLogprob]

    def __new__(cls, text: str, tokens: list[TokenLogprob] | None = None) -> "TextDelta":
        obj = super().__new__(cls, text)
        obj.tokens = list(tokens or [])
        return obj


@dataclass
class SamplingParams:
    """Decoding options shared by every backbone; validated so bad values fail before a request."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop or ())
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens={self.max_tokens!r} is invalid: must be an integer >= 1")
        if not 0.0 <= float(self.temperature) <= 2.0:
            raise ConfigError(f"temperature={self.temperature!r} is invalid: must be in [0, 2]")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise ConfigError(f"top_p={self.top_p!r} is invalid: must be in (0, 1]")
        if not 0 <= int(self.top_logprobs) <= MAX_TOP_LOGPROBS:
            raise ConfigError(f"top_logprobs={self.top_logprobs!r} is invalid: must be in [0, {MAX_TOP_LOGPROBS}]")
        if any(not isinstance(s, str) or not s for s in self.stop) or len(self.stop) > 4:
            raise ConfigError(f"stop={self.stop!r} is invalid: up to 4 non-empty strings")


def check_messages(messages: Sequence[Message], tools: bool = False) -> list[Message]:
    """Validate a chat message list (roles and string content) and return it as plain dicts.

    ``tools``: OpenAI's tool-call turns are allowed too (an assistant message's ``tool_calls``, ``tool``
    messages with their ``tool_call_id``), for backbones that pass them on as they are.
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ConfigError("messages must be a non-empty list of {role, content} dicts")
    roles = ("system", "user", "assistant", "developer") + (("tool",) if tools else ())
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in roles:
            raise ConfigError(f"messages[{i}] is invalid: needs role in {', '.join(roles)}")
        if not isinstance(m.get("content"), str):
            raise ConfigError(f"messages[{i}].content must be a string")
        role = "system" if m["role"] == "developer" else m["role"]
        msg = {"role": role, "content": m["content"]}
        if tools and role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise ConfigError(f"messages[{i}].tool_call_id must be a string (the call this tool result answers)")
            msg["tool_call_id"] = m["tool_call_id"]
        if tools and role == "assistant" and m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list) or not all(isinstance(c, dict) for c in m["tool_calls"]):
                raise ConfigError(f"messages[{i}].tool_calls must be a list of OpenAI tool_calls entries")
            msg["tool_calls"] = m["tool_calls"]
        out.append(msg)
    return out


class Backbone(ABC):
    """A language model an agent can query; thread-safe accounting of usage."""

    name: str = "backbone"
    supports_tools: bool = False  # chat(..., tools=[schema...]) returns Completion.tool_calls (OpenAI's format)

    def __init__(self) -> None:
        self._usage = Usage()
        self._usage_lock = threading.Lock()

    # -- the protocol ------------------------------------------------------
    @abstractmethod
    def chat(self, messages: Sequence[Message], **sampling: Any) -> Completion:
        """Reply to a chat; ``sampling`` are :class:`SamplingParams` fields."""

    def complete(self, prompt: str, **sampling: Any) -> Completion:
        """Continue raw text (no chat template)."""
        raise CapabilityError(f"backbone {self.name!r} has no raw text completion; use chat()")

    def score(self, messages: Sequence[Message], continuations: Sequence[str]) -> list[float]:
        """Log-likelihood of each continuation as the assistant's reply to ``messages``."""
        raise CapabilityError(
            f"backbone {self.name!r} cannot score given continuations (it returns no log-probs for given "
            "text); use a local or tiny backbone")

    def stream_chat(self, messages: Sequence[Message], **sampling: Any) -> Iterator[str | Completion]:
        """Yield text deltas, then the final :class:`Completion`. Default: one delta."""
        done = self.chat(messages, **sampling)
        if done.text:
            yield done.text
        yield done

    def close(self) -> None:
        """Release clients or memory; the backbone is unusable afterwards."""

    # -- accounting ----------------------------------------------------------
    @property
    def usage(self) -> Usage:
        with self._usage_lock:
            return Usage(**{k: getattr(self._usage, k) for k in ("prompt_tokens", "completion_tokens",
                                                                  "cost", "requests")})

    def reset_usage(self) -> None:
        with self._usage_lock:
            self._usage = Usage()

    def _record(self, usage: Usage) -> None:
        with self._usage_lock:
            self._usage = self._usage + usage

    def __enter__(self) -> "Backbone":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
