"""The same engine API on vLLM (GPU): our admission order and accounting; vLLM's kernels.

vLLM already does continuous batching and prefix caching (hashed full blocks,
``enable_prefix_caching``), so this backend does not step tokens itself. It
keeps what is ours: the same ``generate`` / ``submit_rollout`` checks and
results (so training's episode sessions run on either backend), bandwidth-aware admission of at most
``max_concurrent_rollouts`` requests (b_eff estimated from a token-only radix
tree of what was sent, since vLLM cannot be asked before a request runs), the
metrics of ``engine.metrics`` with reuse measured by vLLM's
``RequestOutput.num_cached_tokens``, and policy-version bumps that reset
vLLM's prefix cache so stale KV is never served.

Not exercised in this repository's CI (no GPU, no vLLM): the tests drive it
with a stand-in client. Soft-prefix plans are refused (vLLM's prompt-embeds
input disables prefix caching for those requests).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, Callable, Sequence

import torch

from echo_rl.config import ExecutionConfig
from echo_rl.engine.errors import AdmissionTimeout
from echo_rl.engine.request import ContextLengthError, EngineClosedError, EngineFrontend, GenerationResult, int_list
from echo_rl.engine.sampling import SamplingParams
from echo_rl.engine.metrics import EngineMetrics
from echo_rl.engine.radix_cache import KVCacheManager
from echo_rl.engine.scheduler import RequestScheduler
from echo_rl.utils.optional import require


def _vllm_sampling_params(**kw):
    vllm = require("vllm", "vllm")
    return vllm.SamplingParams(**kw)


class VLLMExecutionEngine(EngineFrontend):
    """``generate`` / ``submit_rollout(state_sequence=...)`` on a vLLM ``AsyncLLMEngine``.

    Pass ``model`` (a local path or hub id vLLM can load) and vLLM engine
    arguments, or an already built ``llm`` client. ``max_context`` defaults to
    ``config.max_context_length``.
    """

    def __init__(self, config: ExecutionConfig | None = None, model: str | None = None, *, llm: Any = None,
                 max_context: int | None = None, sampling_params_factory: Callable | None = None,
                 **engine_kwargs):
        self.config = config or ExecutionConfig()
        cfg = self.config
        if llm is None:
            if not model:
                raise ValueError("model is required (a path or id vLLM can load) when no llm client is given")
            vllm = require("vllm", "vllm")
            args = vllm.AsyncEngineArgs(model=model, enable_prefix_caching=True,
                                        max_num_seqs=cfg.max_concurrent_rollouts, **engine_kwargs)
            llm = vllm.AsyncLLMEngine.from_engine_args(args)
        self.llm = llm
        self._sp = sampling_params_factory or _vllm_sampling_params
        self.max_context = max_context or cfg.max_context_length
        if not self.max_context:
            raise ValueError("max_context is required: pass it or set ExecutionConfig.max_context_length")
        self.shadow = KVCacheManager(1, 1, 0, cfg.max_cache_size)  # token ids only: what vLLM may hold
        self.scheduler = RequestScheduler("bandwidth" if cfg.enable_bandwidth_scheduling else "fifo",
                                          cfg.bandwidth_scale, cfg.bandwidth_weight, cfg.queue_weight,
                                          cfg.schedule_epsilon)
        self.metrics = EngineMetrics(cfg.max_concurrent_rollouts)
        self.policy_version = 0
        self._ids = itertools.count()
        self._waiting: list = []
        self._running = 0
        self._started = False

    async def start(self) -> "VLLMExecutionEngine":
        self._started = True
        return self

    async def stop(self) -> None:
        self._started = False
        for _, fut, _ in self._waiting:
            if not fut.done():
                fut.set_exception(EngineClosedError("engine stopped before the request was admitted"))
        self._waiting = []

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.stop()

    async def _admit(self, prompt: list[int], reward: float) -> float:
        """Wait for a slot; the highest-priority waiting request gets each free one."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiting.append((prompt, fut, (reward, time.perf_counter())))
        self._dispatch()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.config.timeout)
        except asyncio.CancelledError:
            self._waiting = [w for w in self._waiting if w[1] is not fut]
            if fut.done() and not fut.cancelled():
                self._release()
            raise
        except asyncio.TimeoutError:
            self._waiting = [w for w in self._waiting if w[1] is not fut]
            if fut.done() and not fut.cancelled():  # admitted at the last moment: give the slot back
                self._release()
            self.metrics.requests_failed += 1
            raise AdmissionTimeout(f"request waited {self.config.timeout}s for admission "
                                   f"(ExecutionConfig.timeout={self.config.timeout})") from None

    def _dispatch(self) -> None:
        free = self.config.max_concurrent_rollouts - self._running
        if free <= 0 or not self._waiting:
            return
        order = self.scheduler.order(self._waiting, totals=lambda w: len(w[0]),
                                     cached=lambda w: self.shadow.match_length(w[0], len(w[0]) - 1),
                                     rewards=lambda w: w[2][0])
        for w in order[:free]:
            self._waiting.remove(w)
            self._running += 1
            w[1].set_result(time.perf_counter() - w[2][1])

    def _release(self) -> None:
        self._running -= 1
        self._dispatch()

    async def generate(self, prompt_ids: Sequence[int], *, max_new_tokens: int = 16, temperature: float = 0.0,
                       top_p: float = 1.0, top_k: int = 0, stop_token_ids: Sequence[int] | None = None,
                       seed: int | None = None, plan_embeddings: torch.Tensor | None = None,
                       reward_estimate: float = 1.0) -> GenerationResult:
        """As :meth:`AsyncExecutionEngine.generate`; log-probs are what vLLM reports."""
        if not self._started:
            raise EngineClosedError("engine is not running: call `await engine.start()` or use `async with engine`")
        if plan_embeddings is not None:
            raise NotImplementedError("plan_embeddings are not supported on the vLLM backend "
                                      "(use the local AsyncExecutionEngine for latent-plan soft prefixes)")
        prompt = int_list(prompt_ids, "prompt_ids")
        if not prompt:
            raise ValueError("prompt_ids is empty: need at least one token")
        # the local engine's checks, so a bad request fails here, alone, on either backend
        SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                       stop_token_ids=() if stop_token_ids is None else tuple(int_list(stop_token_ids,
                                                                                        "stop_token_ids")),
                       seed=seed)
        if len(prompt) + max_new_tokens > self.max_context:
            raise ContextLengthError(
                f"request needs {len(prompt) + max_new_tokens} positions (prompt {len(prompt)} + max_new_tokens "
                f"{max_new_tokens}) but the context length is {self.max_context}")
        kw = dict(max_tokens=max_new_tokens, temperature=float(temperature), top_p=float(top_p),
                  top_k=top_k if top_k > 0 else -1, seed=seed, logprobs=0, detokenize=False)
        if stop_token_ids is not None:
            kw["stop_token_ids"] = [int(t) for t in stop_token_ids]
            kw["ignore_eos"] = True  # the list given is the whole stop set
        params = self._sp(**kw)
        arrival = time.perf_counter()
        queue_time = await self._admit(prompt, float(reward_estimate))
        rid, final, version = f"echo-{next(self._ids)}", None, self.policy_version
        try:
            async for out in self.llm.generate({"prompt_token_ids": prompt}, params, rid):
                final = out
        except asyncio.CancelledError:
            await self.llm.abort(rid)
            self.metrics.requests_cancelled += 1
            raise
        finally:
            self._release()
        comp = final.outputs[0]
        tokens = list(comp.token_ids)
        logprobs = [float(d[t].logprob) for d, t in zip(comp.logprobs or [], tokens)]
        cached = int(getattr(final, "num_cached_tokens", 0) or 0)
        self.shadow.insert(prompt + tokens[:-1], torch.empty(len(prompt) + len(tokens) - 1, 2, 1, 1, 0))
        self.metrics.record_admit(queue_time)
        self.metrics.record_finish(len(prompt), cached, len(tokens), self.scheduler.b_eff(len(prompt), cached))
        reason = "stop" if getattr(comp, "finish_reason", "length") == "stop" else "length"
        return GenerationResult(token_ids=tokens, logprobs=logprobs, finish_reason=reason, prompt_length=len(prompt),
                                cached_length=cached, queue_time=queue_time, latency=time.perf_counter() - arrival,
                                policy_versions=[version] * len(tokens))

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a worker thread: vLLM's weights live in its own workers, so work that
        reads a local model (candidate scoring) races nothing here."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def update_weights(self, state_dict: dict | None = None, version: int | None = None, *,
                             modules: dict[str, dict] | None = None) -> int:
        """Bump the policy version and reset vLLM's prefix cache (stale KV is never served).

        Loading weights into vLLM depends on its version and parallel layout
        (e.g. ``collective_rpc`` to each worker's ``model.load_weights``); do that
        first, then call this with ``state_dict=None``.
        """
        if state_dict is not None or modules:
            raise NotImplementedError("the vLLM backend does not load state_dicts itself: sync weights with your "
                                      "vLLM version's weight-update path, then call update_weights(version=...)")
        new_version = self.policy_version + 1 if version is None else int(version)
        if new_version <= self.policy_version:
            raise ValueError(f"version={version!r} is invalid: must be > current {self.policy_version}")
        await self.llm.reset_prefix_cache()
        self.shadow.set_version(new_version)
        self.policy_version = new_version
        return new_version

    def snapshot(self) -> dict[str, float]:
        out = self.metrics.snapshot()
        out.update({"running": float(self._running), "waiting": float(len(self._waiting)),
                    "policy_version": float(self.policy_version)})
        return out
