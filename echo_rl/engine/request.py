"""What one request to an engine backend is: its checked inputs, its life in the engine, its result, its errors.

Both backends (the local :class:`~echo_rl.engine.engine.AsyncExecutionEngine`
and :class:`~echo_rl.engine.vllm_backend.VLLMExecutionEngine`) take the same
``generate`` arguments, refuse bad ones with the same one-line errors before
anything is queued, and return the same :class:`GenerationResult`. The
engine keeps no episode state: a multi-turn history is the caller's
(:class:`~echo_rl.lm.session.EpisodeSession` on the training side).
"""

from __future__ import annotations

import asyncio
import math
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Sequence

import torch

from echo_rl.engine.errors import ContextLengthError

if TYPE_CHECKING:
    from echo_rl.engine.model_runner import SequenceKV
    from echo_rl.engine.radix_cache import PrefixMatch


class EngineClosedError(RuntimeError):
    """The engine is not running (call ``start()`` or use ``async with``)."""


class RequestFailedError(RuntimeError):
    """This request failed inside the engine; the others kept running."""


def int_list(values: Sequence[int], name: str) -> list[int]:
    """``values`` as Python ints; floats, bools and strings are a ValueError naming ``name``."""
    out = []
    for t in values:
        try:
            if isinstance(t, bool):
                raise TypeError
            out.append(operator.index(t))  # ints, numpy ints, integer 0-d tensors
        except TypeError:
            raise ValueError(f"{name} contains {t!r}: must be integers") from None
    return out


def check_prompt(prompt_ids: Sequence[int], vocab_size: int | None = None) -> list[int]:
    """The prompt as ints, every id inside the vocabulary (when its size is known)."""
    prompt = int_list(prompt_ids, "prompt_ids")
    if vocab_size is not None:
        bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt_ids contains token {bad}: allowed 0..{vocab_size - 1}")
    return prompt


def check_plan(plan_embeddings: Any, hidden_size: int) -> torch.Tensor:
    """Soft-prefix rows ``[P >= 1, hidden_size]``, finite floats."""
    plan = torch.as_tensor(plan_embeddings)
    if plan.ndim != 2 or plan.shape[0] < 1 or plan.shape[1] != hidden_size:
        raise ValueError(f"plan_embeddings shape {tuple(plan.shape)} is invalid: need "
                         f"[P>=1, hidden_size={hidden_size}]")
    if not plan.is_floating_point() or not bool(torch.isfinite(plan).all()):
        raise ValueError("plan_embeddings is invalid: must be a finite floating-point tensor")
    return plan


def check_reward_estimate(reward_estimate: Any) -> float:
    if not isinstance(reward_estimate, (int, float)) or not math.isfinite(reward_estimate):
        raise ValueError(f"reward_estimate={reward_estimate!r} is invalid: must be a finite number")
    return float(reward_estimate)


def check_context(inputs: int, max_new_tokens: int, max_context: int) -> None:
    need = inputs + max_new_tokens
    if need > max_context:
        raise ContextLengthError(f"request needs {need} positions (prompt {inputs} + max_new_tokens "
                                 f"{max_new_tokens}) but the context length is {max_context}")


@dataclass
class GenerationResult:
    """What one request produced. ``logprobs[i]`` is log p(token_ids[i]) at the request's temperature."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token) or "length" (max_new_tokens)
    prompt_length: int  # prompt tokens + soft-prefix rows
    cached_length: int  # of them, served from the radix cache
    queue_time: float
    latency: float
    policy_versions: list[int]  # the weights version that produced each token


class EngineFrontend:
    """The product's ``submit_rollout`` form over any backend's ``generate`` (the backend seam)."""

    async def generate(self, prompt_ids: Sequence[int], **kwargs: Any) -> GenerationResult:
        raise NotImplementedError

    async def submit_rollout(self, *episode: Any, state_sequence: Sequence[int] | None = None,
                             priority: float | None = None, **generate_kwargs: Any) -> GenerationResult:
        """``submit_rollout(state_sequence=ids, priority=r)``: act on one window of token ids.

        ``priority`` is r in the bandwidth-aware admission priority r / (b_eff + q + eps)
        (``generate``'s ``reward_estimate``). The engine keeps no episodes: a multi-turn history
        accumulates in :class:`echo_rl.lm.session.EpisodeSessions`, whose
        ``submit_rollout(episode_id, new_token_ids)`` is the episode form.
        """
        if episode:
            raise TypeError("submit_rollout takes either state_sequence= (one window, here) or (episode_id, "
                            "new_token_ids) on echo_rl.lm.session.EpisodeSessions(engine), not both")
        if state_sequence is None:
            raise TypeError("submit_rollout needs state_sequence= (the token window to act on)")
        if priority is not None:
            generate_kwargs["reward_estimate"] = priority
        return await self.generate(state_sequence, **generate_kwargs)

    async def stream(self, prompt_ids: Sequence[int], **generate_kwargs: Any) -> AsyncIterator[Any]:
        """``generate`` as an async iterator: ``(token, logprob)`` pairs as they are decoded, then the
        :class:`GenerationResult` (or the request's error). Leaving the loop early (``break``, an exception,
        ``aclose()``, a cancelled task) aborts the request, so its engine slot is freed at the next step.
        Needs a backend whose ``generate`` takes ``on_token``."""
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(self.generate(prompt_ids, on_token=lambda t, lp: queue.put_nowait((t, lp)),
                                                   **generate_kwargs))
        task.add_done_callback(lambda _: queue.put_nowait(None))  # after every token: they were put first
        try:
            while (item := await queue.get()) is not None:
                yield item
            yield task.result()
        finally:
            if not task.done():
                task.cancel()


@dataclass(eq=False)
class Request:
    """One queued request of the local engine (checked inputs and the future its caller awaits)."""

    rid: int
    prompt: list[int]
    params: Any  # SamplingParams
    plan: torch.Tensor | None
    reward: float
    arrival: float
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    cancelled: bool = False
    on_token: Any = None  # Callable[[int, float], None]: called on ``loop`` with each decoded token

    @property
    def num_inputs(self) -> int:
        return len(self.prompt) + (0 if self.plan is None else int(self.plan.shape[0]))


def deliver_tokens(emitted: list[tuple[Request, int, float]]) -> None:
    """Hand one step's tokens to their requests' ``on_token`` hooks, on the loop; a failing hook fails its
    request alone (the worker drops it at the next step)."""
    for req, tok, lp in emitted:
        if req.cancelled or req.future.done():
            continue
        try:
            req.on_token(tok, lp)
        except Exception as exc:  # noqa: BLE001 - the caller's hook, not the engine
            req.cancelled = True
            req.future.set_exception(RequestFailedError(f"request {req.rid}: on_token raised {exc!r}"))


@dataclass(eq=False)
class Running:
    """An admitted request: its working KV, its pinned cached prefix and what it has sampled so far."""

    req: Request
    kv: SequenceKV
    match: PrefixMatch
    admitted: float
    b_eff: float
    generator: torch.Generator | None
    start_version: int
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    @property
    def prefilled(self) -> bool:
        return self.kv.length >= self.req.num_inputs
