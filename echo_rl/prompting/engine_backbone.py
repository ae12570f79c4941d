"""A local checkpoint served through the execution engine, as a :class:`Backbone` agents can share.

Evaluation runs many episodes at once; with a plain :class:`LocalBackbone`
each reply would run its own decode loop, one request after another. Here
every ``chat`` / ``achat`` becomes one request to the shared
:class:`~echo_rl.engine.engine.AsyncExecutionEngine` (through the same
:class:`~echo_rl.serve.engine_host.EngineHost` ``echo-rl serve`` uses), so
concurrent episodes decode together, one packed forward per token, and the
radix cache serves each episode's earlier turns and the prompt all episodes
share. Stop strings become stop tokens (every vocabulary token whose text
contains one), so a one-line reply ends at its newline instead of running to
``max_tokens``; the text is then cut at the first stop string, as an API does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Sequence

from echo_rl.models.backbone import Backbone, Completion, Message, SamplingParams, Usage
from echo_rl.models.local import ContextLengthError, LocalBackbone
from echo_rl.serve.engine_host import EngineHost


class EngineBackbone(Backbone):
    """``local``'s model and tokenizer behind the engine; usage counts every sampled token."""

    def __init__(self, local: LocalBackbone, *, max_concurrent: int = 64) -> None:
        super().__init__()

        if not isinstance(local, LocalBackbone):
            raise TypeError(f"EngineBackbone needs a LocalBackbone, got {type(local).__name__}")
        self.local = local
        self.name = local.name
        self.max_context = local.max_context
        self.host = EngineHost(local, max_concurrent=max_concurrent)
        self._stop_tokens: dict[tuple[str, ...], tuple[int, ...]] = {}
        self._lock = threading.Lock()

    # -- stop strings -> stop tokens ---------------------------------------------
    def stop_token_ids(self, stop: Sequence[str]) -> tuple[int, ...]:
        """EOS plus every token whose text contains a stop string (computed once per stop set)."""
        key = tuple(sorted(set(stop)))
        with self._lock:
            if key not in self._stop_tokens:
                ids = set(self.local.eos_ids)
                if key:
                    tok = self.local.tokenizer
                    texts = tok.convert_ids_to_tokens(list(range(len(tok))))
                    for i, piece in enumerate(texts):
                        if piece is None:
                            continue
                        text = tok.convert_tokens_to_string([piece])
                        if any(s in text for s in key):
                            ids.add(i)
                self._stop_tokens[key] = tuple(sorted(ids))
            return self._stop_tokens[key]

    # -- requests ----------------------------------------------------------------------
    def _submit(self, messages: Sequence[Message], sampling: dict[str, Any]
                ) -> tuple[concurrent.futures.Future, list[int], SamplingParams]:
        params = SamplingParams(**sampling)
        prompt = self.local.chat_prompt_ids(messages)
        room = self.max_context - len(prompt)
        if room < 1:
            raise ContextLengthError(f"prompt has {len(prompt)} tokens; the model's context is "
                                     f"{self.max_context} tokens")
        loop = self.host._ensure_started()
        coro = self.host.engine.generate(prompt, max_new_tokens=min(params.max_tokens, room),
                                         temperature=params.temperature, top_p=params.top_p,
                                         stop_token_ids=self.stop_token_ids(params.stop), seed=params.seed)
        return asyncio.run_coroutine_threadsafe(coro, loop), prompt, params

    def _finish(self, result: Any, prompt: list[int], params: SamplingParams) -> Completion:
        ids = [t for t in result.token_ids if t not in self.local.eos_ids]
        text = self.local.tokenizer.decode(ids, skip_special_tokens=True)
        finish = "stop" if result.finish_reason == "stop" else "length"
        hits = [i for i in (text.find(s) for s in params.stop) if i >= 0]
        if hits:
            text, finish = text[:min(hits)], "stop"
        usage = Usage(len(prompt), len(result.token_ids), 0.0, 1)
        self._record(usage)
        return Completion(text, finish, usage, self.name, token_ids=list(result.token_ids),
                          prompt_token_ids=prompt)

    def chat(self, messages: Sequence[Message], **sampling: Any) -> Completion:
        future, prompt, params = self._submit(messages, sampling)
        return self._finish(future.result(), prompt, params)

    async def achat(self, messages: Sequence[Message], **sampling: Any) -> Completion:
        """As :meth:`chat`, awaited on any event loop (the engine runs on its own)."""
        future, prompt, params = self._submit(messages, sampling)
        return self._finish(await asyncio.wrap_future(future), prompt, params)

    def score(self, messages: Sequence[Message], continuations: Sequence[str]) -> list[float]:
        """Teacher-forced log-likelihoods (no decoding): the local backbone's, on the same weights."""
        return self.local.score(messages, continuations)

    def snapshot(self) -> dict[str, float]:
        """The engine's counters (prefix-cache hit rate, tokens per second, ...)."""
        return self.host.snapshot()

    def close(self) -> None:
        self.host.close()
        self.local.close()


def engine_backed(backbone: Backbone, max_concurrent: int = 64) -> Backbone:
    """A local checkpoint behind the engine, where the engine runs its architecture; any other backbone unchanged
    (API calls run concurrently as is; a local architecture the engine cannot run exactly decodes with
    transformers' ``generate``, through :class:`LocalBackbone`)."""
    if not isinstance(backbone, LocalBackbone):
        return backbone
    from echo_rl.engine.model_runner import check_supported  # torch: loaded on first use

    try:
        check_supported(backbone.model)
    except NotImplementedError:
        return backbone
    return EngineBackbone(backbone, max_concurrent=max_concurrent)
