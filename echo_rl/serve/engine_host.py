"""The one execution engine behind ``echo-rl serve``, on an event loop of its own.

Serving through :class:`~echo_rl.engine.engine.AsyncExecutionEngine` makes
concurrent requests decode together, one packed forward per token, and share
the radix prefix cache (a common system prompt is computed once). The engine
lives on a private asyncio loop in a daemon thread, so it does not depend on
which loop the HTTP server runs (uvicorn, a test client) and a request handler
only waits on a future (or, streaming, a queue the engine's per-token hook fills).
Leaving a stream early (the client went away) cancels the request: the engine
drops it and frees its slot at its next step. Engine faults become :class:`~echo_rl.serve.errors.APIError`
here, so the server has one error type.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator

from echo_rl.config import ConfigError, ExecutionConfig
from echo_rl.serve.errors import APIError

# Requests wait for admission at most this long (the engine's 30 s default is for RL rollouts, not clients).
ADMISSION_TIMEOUT_S = 600.0


@dataclass
class Generated:
    """One engine request's output in serve's terms."""

    token_ids: list[int]  # as sampled, the final EOS included
    finish_reason: str  # "stop" (EOS) or "length"


class EngineHost:
    """Owns the engine and its loop thread; started on first use, stopped by :meth:`close`."""

    def __init__(self, backbone: Any, *, max_concurrent: int = 64) -> None:
        from echo_rl.engine.engine import AsyncExecutionEngine  # torch: loaded on first use

        cfg = ExecutionConfig(max_concurrent_rollouts=max_concurrent, timeout=ADMISSION_TIMEOUT_S,
                              max_context_length=backbone.max_context)
        try:
            self.engine = AsyncExecutionEngine(cfg, backbone.model, device=backbone.device)
        except NotImplementedError as exc:  # an architecture the packed runner cannot execute exactly
            raise ConfigError(f"echo-rl serve runs on the execution engine, which cannot run this checkpoint: "
                              f"{exc}") from None
        self.stop_ids = tuple(sorted(backbone.eos_ids))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.run_until_complete(self.engine.start())
                    ready.set()
                    loop.run_forever()

                self._thread = threading.Thread(target=run, daemon=True, name="echo-rl-serve-engine")
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float, top_p: float,
                       seed: int | None) -> Generated:
        """Submit one request to the shared engine and wait for it (a cancelled wait cancels the request)."""
        loop = self._ensure_started()
        coro = self.engine.generate(prompt_ids, max_new_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                    stop_token_ids=self.stop_ids, seed=seed)
        fut = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))
        res = await _api_errors_async(fut)
        return Generated(list(res.token_ids), res.finish_reason)

    async def stream(self, prompt_ids: list[int], *, max_tokens: int, temperature: float, top_p: float,
                     seed: int | None, logprobs: list[float] | None = None) -> AsyncIterator[int | Generated]:
        """Sampled token ids as the engine decodes them, then the :class:`Generated`; closing the iterator
        (or cancelling its consumer) aborts the request in the engine. ``logprobs``: a list the sampler's
        log-prob of each token is appended to (a recorded episode's behaviour log-probs)."""
        loop = self._ensure_started()
        here = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        end = object()

        async def pump() -> None:  # on the engine's loop
            async for item in self.engine.stream(prompt_ids, max_new_tokens=max_tokens, temperature=temperature,
                                                 top_p=top_p, stop_token_ids=self.stop_ids, seed=seed):
                here.call_soon_threadsafe(queue.put_nowait, item)

        fut = asyncio.run_coroutine_threadsafe(pump(), loop)
        def finished(_: Any) -> None:
            try:
                here.call_soon_threadsafe(queue.put_nowait, end)
            except RuntimeError:  # the consumer's loop is closed: nobody is waiting
                pass

        fut.add_done_callback(finished)
        try:
            while (item := await queue.get()) is not end:
                if isinstance(item, tuple):
                    if logprobs is not None:
                        logprobs.append(float(item[1]))
                    yield int(item[0])
                else:
                    yield Generated(list(item.token_ids), item.finish_reason)
            _api_errors(fut.result)
        finally:
            fut.cancel()  # cancels pump() on the engine's loop, which aborts the request (a no-op once done)

    def update_weights(self, state_dict: dict | None, version: int, timeout: float = 600.0) -> int:
        """Load new weights as policy ``version`` between engine steps (a trainer serving its policy)."""
        loop = self._ensure_started()
        coro = self.engine.update_weights(state_dict, version=version)
        return _api_errors(lambda: asyncio.run_coroutine_threadsafe(coro, loop).result(timeout))

    def snapshot(self) -> dict[str, float]:
        return self.engine.snapshot()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine (in-flight requests fail with a 503) and its loop thread."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.engine.stop(), loop).result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout)
        loop.close()


async def _api_errors_async(fut: Any) -> Any:
    try:
        return await fut
    except Exception as exc:  # noqa: BLE001 - mapped below, or re-raised
        raise _as_api_error(exc) from None


def _api_errors(result: Any) -> Any:
    try:
        return result()
    except Exception as exc:  # noqa: BLE001 - mapped below, or re-raised
        raise _as_api_error(exc) from None


def _as_api_error(exc: Exception) -> Exception:
    """The engine's errors as serve's one error type (anything else is returned as it is)."""
    from echo_rl.engine.request import ContextLengthError, EngineClosedError, RequestFailedError  # torch: lazily

    if isinstance(exc, ContextLengthError):
        return APIError(400, f"This model's maximum context length is exceeded: {exc}", param="max_tokens",
                        code="context_length_exceeded")
    if isinstance(exc, (EngineClosedError, TimeoutError)):
        return APIError(503, f"the engine cannot take the request now: {exc}", type="server_error")
    if isinstance(exc, RequestFailedError):
        return APIError(500, f"internal error: {exc}", type="server_error")
    if isinstance(exc, ValueError):  # the engine refused the input
        return APIError(400, str(exc))
    return exc
