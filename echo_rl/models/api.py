"""API backbones: hosted providers and any OpenAI-compatible server, through the official ``openai`` SDK.

Why the one SDK rather than LiteLLM or one SDK per provider: every backbone the
product names is served behind an OpenAI-compatible chat endpoint (OpenAI
itself; Anthropic's and Google's documented OpenAI-compatibility endpoints;
DeepSeek's API; Llama-4 and Qwen on Together AI or Alibaba DashScope; vLLM,
SGLang, Ollama and ``echo-rl serve`` locally). The ``openai`` package is
already a dependency, is maintained by the API's owner, and brings what this
layer needs: timeouts, typed errors and streaming. Retries are ours
(:meth:`APIBackbone._call`), not the SDK's: the SDK retries every 5xx up to
``max_retries`` times, so a request the server fails deterministically (a
500 it will answer again) was sent six times; here a 4xx other than
408/409/429 is never retried, a 5xx at most :data:`MAX_5XX_RETRIES` times,
and ``x-should-retry: false`` (which ``echo-rl serve`` sends on its 500s)
stops at once. LiteLLM would add a large, fast-moving dependency tree to
translate between formats we do not need to translate. The price is the
compatibility layers' limits (Anthropic's ignores ``logprobs`` and ``seed`` and
caps temperature at 1); they are documented in docs/backbones.md.
"""

from __future__ import annotations

import email.utils
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from echo_rl.config import ConfigError, register_name_rule
from echo_rl.models.backbone import (Backbone, Completion, Message, SamplingParams, TokenLogprob, Usage,
                                     check_messages)
from echo_rl.models.pricing import PriceTable
from echo_rl.utils.optional import require


@dataclass(frozen=True)
class Provider:
    base_url: str | None  # None: the SDK default (api.openai.com)
    key_env: tuple[str, ...]  # environment variables tried in order
    key_required: bool = True


PROVIDERS: dict[str, Provider] = {
    "openai": Provider(None, ("OPENAI_API_KEY",)),
    "anthropic": Provider("https://api.anthropic.com/v1/", ("ANTHROPIC_API_KEY",)),
    "gemini": Provider("https://generativelanguage.googleapis.com/v1beta/openai/", ("GEMINI_API_KEY", "GOOGLE_API_KEY")),
    "deepseek": Provider("https://api.deepseek.com/v1", ("DEEPSEEK_API_KEY",)),
    "together": Provider("https://api.together.xyz/v1", ("TOGETHER_API_KEY",)),
    "dashscope": Provider("https://dashscope-intl.aliyuncs.com/compatible-mode/v1", ("DASHSCOPE_API_KEY",)),
    "openrouter": Provider("https://openrouter.ai/api/v1", ("OPENROUTER_API_KEY",)),
}

# The product's backbone names -> (provider, model id). Override with "provider/model".
ALIASES: dict[str, tuple[str, str]] = {
    "gpt-4o": ("openai", "gpt-4o"),
    "claude-3.5-sonnet": ("anthropic", "claude-3-5-sonnet-20241022"),
    "gemini-1.5-pro": ("gemini", "gemini-1.5-pro"),
    "llama-4": ("together", "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8"),
    "qwen": ("together", "Qwen/Qwen2.5-72B-Instruct-Turbo"),
    "deepseek-r1": ("deepseek", "deepseek-reasoner"),
}


RETRY_STATUSES = (408, 409, 429)  # transient by definition: timeout, conflict, rate limit
MAX_5XX_RETRIES = 2  # a 5xx may be deterministic (the server fails this request every time): retry it little
BACKOFF_INITIAL, BACKOFF_MAX, RETRY_AFTER_MAX = 0.5, 8.0, 60.0  # seconds (the SDK's schedule)


def retry_after(headers: Any) -> float | None:
    """The server's ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP date), if in (0, 60] seconds."""
    try:
        if headers.get("retry-after-ms") is not None:
            delay = float(headers["retry-after-ms"]) / 1000
        elif headers.get("retry-after") is not None:
            value = headers["retry-after"]
            try:
                delay = float(value)
            except ValueError:
                when = email.utils.parsedate_to_datetime(value)
                delay = when.timestamp() - time.time()
        else:
            return None
    except (TypeError, ValueError, OverflowError):
        return None
    return delay if 0 < delay <= RETRY_AFTER_MAX else None


class RateLimiter:
    """Token bucket: at most ``per_minute`` acquisitions per rolling minute, bursts up to ``burst``."""

    def __init__(self, per_minute: float, burst: int | None = None, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if per_minute <= 0:
            raise ConfigError(f"requests_per_minute={per_minute!r} is invalid: must be > 0")
        self.rate = per_minute / 60.0
        self.capacity = float(burst if burst is not None else max(1, int(per_minute // 60) or 1))
        self._tokens = self.capacity
        self._clock, self._sleep = clock, sleep
        self._last = clock()
        self._lock = threading.Lock()

    def acquire(self) -> float:
        """Block until a request may go; return the seconds waited."""
        waited = 0.0
        while True:
            with self._lock:
                now = self._clock()
                self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return waited
                delay = (1.0 - self._tokens) / self.rate
            self._sleep(delay)
            waited += delay


def resolve_api_name(name: str) -> tuple[str, str] | None:
    """``gpt-4o`` / ``anthropic/claude-3-5-haiku-20241022`` -> (provider, model), else None."""
    if name in ALIASES:
        return ALIASES[name]
    if "/" in name:
        provider, model = name.split("/", 1)
        if provider in PROVIDERS and model:
            return provider, model
    return None


def is_api_backbone(name: str) -> bool:
    """An API model (an alias, provider/model, or an endpoint URL): it has no weights to train."""
    return resolve_api_name(name) is not None or name.startswith(("http://", "https://"))


register_name_rule("api_backbone", is_api_backbone)  # TrainingConfig refuses to train these


def find_api_key(provider: str, key_env: str | None = None) -> str:
    """The key from the provider's environment variable, or a one-line ConfigError naming it."""
    names = (key_env,) if key_env else PROVIDERS[provider].key_env
    for env in names:
        if os.environ.get(env):
            return os.environ[env]
    raise ConfigError(f"backbone provider {provider!r} needs an API key: set the environment variable "
                      f"{' or '.join(names)} (no request was sent)")


class APIBackbone(Backbone):
    """A chat model behind an OpenAI-compatible HTTP API.

    The constructor sends nothing; a missing key fails here, before any
    request. ``timeout`` goes to the SDK; ``max_retries`` bounds our retries
    of transient failures (see :meth:`_call`; a 4xx is never retried);
    ``requests_per_minute`` throttles on our side so a sweep stays under the
    provider's limit. ``chat(..., tools=[...])`` uses OpenAI's tool calls (``supports_tools``).
    """

    supports_tools = True

    def __init__(self, model: str, *, provider: str = "openai", base_url: str | None = None,
                 api_key: str | None = None, api_key_env: str | None = None, timeout: float = 60.0,
                 max_retries: int = 5, requests_per_minute: float | None = None,
                 prices: PriceTable | dict | None = None, name: str | None = None) -> None:
        super().__init__()
        if provider not in PROVIDERS and provider != "openai-compatible":
            raise ConfigError(f"unknown API provider {provider!r}; allowed: {', '.join(PROVIDERS)}, openai-compatible")
        if timeout <= 0:
            raise ConfigError(f"timeout={timeout!r} is invalid: must be > 0 seconds")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries={max_retries!r} is invalid: must be an integer >= 0")
        if provider == "openai-compatible":
            # local servers (vLLM, SGLang, Ollama, echo-rl serve) usually need no key
            api_key = api_key or (os.environ.get(api_key_env) if api_key_env else None) or \
                os.environ.get("OPENAI_API_KEY") or "EMPTY"
            if not base_url:
                raise ConfigError("an openai-compatible backbone needs base_url, e.g. http://127.0.0.1:8000/v1")
        else:
            api_key = api_key or find_api_key(provider, api_key_env)
            base_url = base_url or PROVIDERS[provider].base_url
        openai = require("openai", "api")
        self.provider, self.model, self.base_url = provider, model, base_url
        self.name = name or (model if provider in ("openai", "openai-compatible") else f"{provider}/{model}")
        self.prices = prices if isinstance(prices, PriceTable) else PriceTable(prices)
        self.local_server = provider == "openai-compatible"
        self._limiter = RateLimiter(requests_per_minute) if requests_per_minute else None
        self.max_retries = max_retries
        self._openai = openai
        self._sleep: Callable[[float], None] = time.sleep
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0)

    # -- helpers -------------------------------------------------------------
    def _model_id(self) -> str:
        if self.model:
            return self.model
        # an openai-compatible URL without a model name: use the server's first model (first call only)
        models = self._call(self._client.models.list).data
        if not models:
            raise ConfigError(f"the server at {self.base_url} lists no models")
        self.model = models[0].id
        return self.model

    def _usage_of(self, usage: Any) -> Usage:
        pt = int(getattr(usage, "prompt_tokens", 0) or 0) if usage is not None else 0
        ct = int(getattr(usage, "completion_tokens", 0) or 0) if usage is not None else 0
        cost = 0.0 if self.local_server and self.model not in self.prices else self.prices.cost(self.model, pt, ct)
        return Usage(pt, ct, cost, 1)

    def _request_args(self, p: SamplingParams) -> dict[str, Any]:
        # OpenAI's own API deprecates max_tokens (reasoning models reject it); compatibility layers expect max_tokens
        limit = "max_completion_tokens" if self.provider == "openai" else "max_tokens"
        args: dict[str, Any] = {"model": self._model_id(), limit: p.max_tokens, "temperature": p.temperature}
        if p.top_p != 1.0:
            args["top_p"] = p.top_p
        if p.stop:
            args["stop"] = list(p.stop)
        if p.seed is not None:
            args["seed"] = p.seed
        return args

    def _throttle(self) -> None:
        if self._limiter is not None:
            self._limiter.acquire()

    def _call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """``fn(**kwargs)`` (one SDK request), retried only where a retry can help.

        Connection errors, timeouts and 408/409/429: up to ``max_retries``
        times; 5xx: at most ``MAX_5XX_RETRIES`` of those; any other 4xx, or a
        response saying ``x-should-retry: false``: never. The wait is the
        server's ``Retry-After`` when given, else exponential backoff with jitter.
        """
        openai = self._openai
        attempts = fives = 0
        while True:
            self._throttle()
            try:
                return fn(**kwargs)
            except openai.APIStatusError as exc:
                headers = exc.response.headers
                hint = (headers.get("x-should-retry") or "").lower()
                status = exc.status_code
                if attempts >= self.max_retries or hint == "false":
                    raise
                if status >= 500 and hint != "true":
                    if fives >= MAX_5XX_RETRIES:
                        raise
                    fives += 1
                elif status not in RETRY_STATUSES and hint != "true":
                    raise  # a bad request stays bad: never resent
                delay = retry_after(headers)
            except openai.APIConnectionError:  # includes APITimeoutError
                if attempts >= self.max_retries:
                    raise
                delay = None
            attempts += 1
            if delay is None:
                delay = min(BACKOFF_INITIAL * 2 ** (attempts - 1), BACKOFF_MAX) * (1 - 0.25 * random.random())
            self._sleep(delay)

    # -- protocol --------------------------------------------------------------
    def chat(self, messages: Sequence[Message], *, tools: Sequence[dict] | None = None,
             **sampling: Any) -> Completion:
        """``tools``: OpenAI ``tools=[...]`` entries (``Tool.schema()``); the reply's calls come back in
        ``Completion.tool_calls``, and ``messages`` may then hold tool-call turns."""
        p = SamplingParams(**sampling)
        args = self._request_args(p)
        if p.logprobs:
            args["logprobs"] = True
            if p.top_logprobs:
                args["top_logprobs"] = p.top_logprobs
        if tools:
            args["tools"] = list(tools)
        resp = self._call(self._client.chat.completions.create, messages=check_messages(messages, tools=True),
                          **args)
        choice = resp.choices[0]
        logprobs = None
        content = getattr(getattr(choice, "logprobs", None), "content", None)
        if content:
            logprobs = [TokenLogprob(t.token, t.logprob, None, [(a.token, a.logprob) for a in (t.top_logprobs or [])])
                        for t in content]
        usage = self._usage_of(resp.usage)
        self._record(usage)
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                "arguments": c.function.arguments}}
                 for c in (getattr(choice.message, "tool_calls", None) or []) if getattr(c, "function", None)]
        return Completion(choice.message.content or "", choice.finish_reason or "stop", usage, resp.model,
                          logprobs=logprobs, tool_calls=calls or None)

    def complete(self, prompt: str, **sampling: Any) -> Completion:
        p = SamplingParams(**sampling)
        args = self._request_args(p)
        args["max_tokens"] = args.pop("max_completion_tokens", p.max_tokens)
        if p.logprobs:
            args["logprobs"] = max(1, p.top_logprobs)
        resp = self._call(self._client.completions.create, prompt=prompt, **args)
        choice = resp.choices[0]
        logprobs = None
        lp = getattr(choice, "logprobs", None)
        if lp is not None and lp.tokens:
            tops = lp.top_logprobs or [None] * len(lp.tokens)
            logprobs = [TokenLogprob(t, float(v), None, sorted((top or {}).items(), key=lambda kv: -kv[1]))
                        for t, v, top in zip(lp.tokens, lp.token_logprobs, tops)]
        usage = self._usage_of(resp.usage)
        self._record(usage)
        return Completion(choice.text or "", choice.finish_reason or "stop", usage, resp.model, logprobs=logprobs)

    def stream_chat(self, messages: Sequence[Message], **sampling: Any) -> Iterator[str | Completion]:
        p = SamplingParams(**sampling)
        args = self._request_args(p)
        stream = self._call(self._client.chat.completions.create, messages=check_messages(messages), stream=True,
                            stream_options={"include_usage": True}, **args)
        parts: list[str] = []
        finish, usage_obj, model = "stop", None, self.model
        for chunk in stream:
            model = chunk.model or model
            if getattr(chunk, "usage", None) is not None:
                usage_obj = chunk.usage
            for choice in chunk.choices or []:
                if choice.delta and choice.delta.content:
                    parts.append(choice.delta.content)
                    yield choice.delta.content
                if choice.finish_reason:
                    finish = choice.finish_reason
        usage = self._usage_of(usage_obj)
        self._record(usage)
        yield Completion("".join(parts), finish, usage, model)

    def close(self) -> None:
        self._client.close()
