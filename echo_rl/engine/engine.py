"""AsyncExecutionEngine: many generation requests share one model, token by token.

Every engine step runs *one* packed forward over all in-flight sequences
(decode tokens plus prefill chunks, see ``model_runner``); requests join and
leave between steps. A request first takes the longest prefix of its prompt
the radix cache holds (pinned while it runs), computes the rest, and on finish
gives its history back to the cache so the next turn of the episode, or a
sibling in its GRPO group, starts from there. Waiting requests are admitted by
bandwidth-aware priority (``scheduler``) within the KV budget (``kv_budget``);
inputs are checked before queueing (``request``). The engine keeps no episode
or reward state: callers own their histories and their η_bw accounting.

Threading: the asyncio loop only enqueues requests and resolves futures; all
engine state (cache, sequences, model, attached modules) is touched by one
worker thread that runs the steps, weight updates and ``call``-ed functions,
so the event loop (and the environments on it) stays responsive while torch
computes.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import threading
import time
from typing import Any, Callable, Hashable, Sequence

import torch

from echo_rl.config import ConfigError, ExecutionConfig
from echo_rl.engine.errors import AdmissionTimeout
from echo_rl.engine.kv_budget import KVBudget
from echo_rl.engine.metrics import EngineMetrics
from echo_rl.engine.model_runner import PackedModelRunner, Segment
from echo_rl.engine.radix_cache import PrefixMatch
from echo_rl.engine.request import (  # noqa: F401 - ContextLengthError, GenerationResult, int_list re-exported
    ContextLengthError,
    EngineClosedError,
    EngineFrontend,
    GenerationResult,
    Request,
    RequestFailedError,
    Running,
    check_context,
    check_plan,
    check_prompt,
    check_reward_estimate,
    deliver_tokens,
    int_list,
)
from echo_rl.engine.sampling import SamplingParams, choose_token
from echo_rl.engine.scheduler import RequestScheduler
from echo_rl.kernels.sequence import prefix_match

# Wait for an in-flight prefill instead of recomputing a shared prefix when it is at least this long
# (vLLM's block size: shorter overlaps, e.g. a common first token, are cheaper to recompute than to wait for).
SHARE_MIN_TOKENS = 16


class AsyncExecutionEngine(EngineFrontend):
    """Serves ``await generate(...)`` / ``await submit_rollout(state_sequence=...)`` for a local Llama/Qwen model.

    ``model`` is a transformers causal LM (``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
    ``Qwen3ForCausalLM``); it is moved to ``device`` and put in eval mode. Modules the caller
    computes inputs with (a latent planner) can be :meth:`attach`-ed: :meth:`call` runs them on the
    engine's thread and :meth:`update_weights` loads them with the model, under one version.
    """

    def __init__(self, config: ExecutionConfig | None = None, model: Any = None,
                 device: str | torch.device = "cpu"):
        if model is None:
            raise ValueError("model is required: a transformers Llama/Qwen causal LM")
        self.config = config or ExecutionConfig()
        if not isinstance(self.config, ExecutionConfig):
            raise ConfigError(f"config must be an ExecutionConfig, got {type(self.config).__name__}")
        self.device = torch.device(device)
        self.runner = PackedModelRunner(model.to(self.device))
        cfg = self.config
        self.max_context = min(self.runner.max_context, cfg.max_context_length or self.runner.max_context)
        self.kv = KVBudget(self.runner, cfg.kv_memory_budget_mb, cfg.max_cache_size, self.device)
        self.cache = self.kv.cache
        self.scheduler = RequestScheduler(
            "bandwidth" if cfg.enable_bandwidth_scheduling else "fifo", cfg.bandwidth_scale,
            cfg.bandwidth_weight, cfg.queue_weight, cfg.schedule_epsilon)
        self.metrics = EngineMetrics(cfg.max_concurrent_rollouts)
        self.modules: dict[str, torch.nn.Module] = {}
        self.policy_version = 0
        gen_cfg = getattr(model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None)
        if eos is None:
            eos = getattr(model.config, "eos_token_id", None)
        self.default_stop_ids = tuple([eos] if isinstance(eos, int) else (eos or []))
        self._inbox: collections.deque[Request] = collections.deque()
        self._waiting: list[Request] = []
        self._running: list[Running] = []
        self._emitted: list[tuple[Request, int, float]] = []  # tokens of the last step, for on_token hooks
        self._keyed: dict[Hashable, Request] = {}  # requests submitted with a request_id (abort() finds them)
        self._ids = itertools.count()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._rotation = 0
        self._state_lock = threading.Lock()  # the worker holds it during a step; snapshot() waits for it

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> "AsyncExecutionEngine":
        if self._task is not None:
            return self
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="echo-engine")
        self._wake = asyncio.Event()
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    async def stop(self) -> None:
        """Finish nothing new: fail waiting and running requests, release their pins, stop the worker."""
        if self._task is None:
            return
        self._stopping = True
        self._wake.set()
        await self._task
        self._task = None
        self._executor.shutdown(wait=True)
        self._executor = None

    async def __aenter__(self) -> "AsyncExecutionEngine":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # -- public API -----------------------------------------------------------
    async def generate(self, prompt_ids: Sequence[int], *, max_new_tokens: int = 16, temperature: float = 0.0,
                       top_p: float = 1.0, top_k: int = 0, stop_token_ids: Sequence[int] | None = None,
                       seed: int | None = None, plan_embeddings: torch.Tensor | None = None,
                       reward_estimate: float = 1.0, on_token: Callable[[int, float], None] | None = None,
                       request_id: Hashable | None = None) -> GenerationResult:
        """Generate up to ``max_new_tokens`` after ``prompt_ids``.

        ``plan_embeddings`` ``[P, hidden]`` are soft-prefix rows placed after the
        prompt, right before generation (the prompt stays reusable from the
        cache; the plan and what follows it are not cached). ``stop_token_ids``
        None means the model's EOS; pass ``()`` to never stop early.
        ``reward_estimate`` is r in the scheduling priority. ``on_token(token, logprob)``
        is called on this event loop for each token as it is decoded (before the
        result is set; :meth:`stream` is the iterator form). ``request_id``: a key
        for :meth:`abort`; cancelling this coroutine aborts the request too.
        """
        if self._task is None or self._stopping:
            raise EngineClosedError("engine is not running: call `await engine.start()` or use `async with engine`")
        prompt = check_prompt(prompt_ids, self.runner.vocab_size)
        plan = None
        if plan_embeddings is not None:
            plan = check_plan(plan_embeddings, self.runner.hidden_size).detach().to(self.device, self.runner.dtype)
        if not prompt and plan is None:
            raise ValueError("prompt_ids is empty: need at least one token (or plan_embeddings)")
        stops = self.default_stop_ids if stop_token_ids is None else tuple(int_list(stop_token_ids,
                                                                                     "stop_token_ids"))
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                top_k=top_k, stop_token_ids=stops, seed=seed)
        reward = check_reward_estimate(reward_estimate)
        loop = asyncio.get_running_loop()
        req = Request(next(self._ids), prompt, params, plan, reward, time.perf_counter(), loop.create_future(), loop)
        check_context(req.num_inputs, max_new_tokens, self.max_context)
        req.on_token = on_token
        if request_id is not None:
            if request_id in self._keyed:
                raise ValueError(f"request_id={request_id!r} is already in flight")
            self._keyed[request_id] = req
        self._inbox.append(req)
        self._wake.set()
        try:
            return await asyncio.shield(req.future)
        except asyncio.CancelledError:
            req.cancelled = True  # the worker drops it and releases its pins at the next step
            self._wake.set()
            raise
        finally:
            if request_id is not None:
                self._keyed.pop(request_id, None)

    def abort(self, request_id: Hashable) -> bool:
        """Stop the request submitted with ``request_id`` (any thread): the next step drops it and frees its slot,
        and its ``generate`` raises CancelledError. False if no such request is in flight."""
        req = self._keyed.get(request_id)
        if req is None or req.future.done():
            return False
        req.cancelled = True
        req.loop.call_soon_threadsafe(req.future.cancel)  # its generate() wakes the loop on the way out
        return True

    async def update_weights(self, state_dict: dict | None = None, version: int | None = None, *,
                             modules: dict[str, dict] | None = None) -> int:
        """Load new weights between steps and bump the policy version.

        ``modules`` maps an :meth:`attach`-ed module's name to its new state dict: it is
        loaded in the same step, so the model and the modules that compute its inputs
        change version together. Cached KV of older versions is never matched again;
        in-flight sequences keep going and record the version of every token they
        produce, and a sequence that spans versions does not give its KV back to the cache.
        """
        new_version = self.policy_version + 1 if version is None else int(version)
        if new_version <= self.policy_version:
            raise ValueError(f"version={version!r} is invalid: must be > current {self.policy_version}")
        unknown = sorted(set(modules or ()) - set(self.modules))
        if unknown:
            raise ValueError(f"modules={unknown} are not attached to the engine (attached: {sorted(self.modules)})")

        def apply() -> None:
            if state_dict is not None:
                self.runner.model.load_state_dict(state_dict)
            for name, state in (modules or {}).items():
                self.modules[name].load_state_dict(state)
            self.policy_version = new_version
            self.cache.set_version(new_version)

        await self.call(apply)
        return new_version

    def attach(self, name: str, module: torch.nn.Module) -> torch.nn.Module:
        """Register a module the caller computes engine inputs with (a latent planner on the engine's
        embeddings): :meth:`update_weights` loads it with the model under one version."""
        if name in self.modules:
            raise ValueError(f"a module named {name!r} is already attached")
        self.modules[name] = module.eval()
        return module

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the engine's worker thread, between two steps.

        For work that reads the engine's model or attached modules (scoring candidate
        actions, a latent plan from the model's embeddings): it never runs during a
        decode step or a weight update, so it sees one consistent version.
        """
        def locked() -> Any:
            with self._state_lock:
                return fn(*args, **kwargs)

        if self._executor is None:
            return locked()
        return await asyncio.get_running_loop().run_in_executor(self._executor, locked)

    def snapshot(self) -> dict[str, float]:
        """Metrics (see ``engine.metrics``) plus cache state, read between two steps."""
        with self._state_lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, float]:
        return {**self.metrics.snapshot(), **self.kv.snapshot(self._running),
                "running": float(len(self._running)), "waiting": float(len(self._waiting)),
                "policy_version": float(self.policy_version)}

    # -- the loop -------------------------------------------------------------
    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._stopping:
                done = await loop.run_in_executor(self._executor, self._shutdown)
                self._resolve(done)
                return
            if not (self._inbox or self._waiting or self._running):
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                done = await loop.run_in_executor(self._executor, self._step)
            except Exception as exc:  # a broken step fails everyone in flight, loudly
                with self._state_lock:
                    done = self._fail_all(exc)
            emitted, self._emitted = self._emitted, []
            deliver_tokens(emitted)
            self._resolve(done)
            await asyncio.sleep(0)  # let finished callers submit their next turn

    @staticmethod
    def _resolve(done: list) -> None:
        for req, value in done:
            if req.future.done():
                continue
            if isinstance(value, BaseException):
                req.future.set_exception(value)
            else:
                req.future.set_result(value)

    def _fail_all(self, exc: BaseException, wrap: bool = True) -> list:
        err = RuntimeError(f"engine step failed: {exc!r}") if wrap else exc
        done = [(s.req, err) for s in self._running] + [(r, err) for r in self._waiting]
        for s in self._running:
            self.cache.release(s.match)
        self._running, self._waiting = [], []
        return done

    def _shutdown(self) -> list:
        with self._state_lock:
            self._drain_inbox()
            return self._fail_all(EngineClosedError("engine stopped before the request finished"), wrap=False)

    def _drain_inbox(self) -> None:
        while self._inbox:
            self._waiting.append(self._inbox.popleft())

    # -- one step (worker thread) ----------------------------------------------
    def _step(self) -> list:
        with self._state_lock:
            return self._step_locked()

    def _step_locked(self) -> list:
        done: list = []
        now = time.perf_counter()
        self._drain_inbox()
        keep = []
        for s in self._running:
            if s.req.cancelled:
                self.cache.release(s.match)
                self.metrics.requests_cancelled += 1
            else:
                keep.append(s)
        self._running = keep
        waiting = []
        for r in self._waiting:
            if r.cancelled:
                self.metrics.requests_cancelled += 1
            elif now - r.arrival > self.config.timeout:
                self.metrics.requests_failed += 1
                done.append((r, AdmissionTimeout(f"request waited {now - r.arrival:.1f}s for admission "
                                                 f"(ExecutionConfig.timeout={self.config.timeout})")))
            else:
                waiting.append(r)
        self._waiting = waiting
        self._admit(now, done)
        if not self._running:
            return done
        segments, seqs = self._build_batch()
        t0 = time.perf_counter()
        logits, errors = self.runner.forward_isolating(segments)  # a faulty segment fails its request alone
        for i, exc in errors.items():
            done.append((seqs[i].req, self._fail_one(seqs[i], exc)))
        rows = [(seqs[i], row) for i, row in logits.items()]
        self.metrics.record_step(len(segments), sum(s.num_inputs for s in segments), time.perf_counter() - t0)
        finished = []
        for seq, logits in rows:
            try:
                tok, lp = choose_token(logits, seq.req.params, seq.generator)
                seq.out.append(tok)
                seq.logprobs.append(lp)
                seq.versions.append(self.policy_version)
                if seq.req.on_token is not None:
                    self._emitted.append((seq.req, tok, lp))
                if len(seq.out) == 1 and seq.start_version == self.policy_version:
                    # Prefill done: share the prompt now, so requests waiting on it (and siblings) reuse it.
                    n = len(seq.req.prompt)
                    self.cache.insert(seq.req.prompt, seq.kv.rows(n))
            except Exception as exc:
                done.append((seq.req, self._fail_one(seq, exc)))
                continue
            p = seq.req.params
            if tok in p.stop_token_ids or len(seq.out) >= p.max_new_tokens:
                finished.append((seq, "stop" if tok in p.stop_token_ids else "length"))
        for seq, reason in finished:
            try:
                done.append((seq.req, self._finish(seq, reason)))
            except Exception as exc:
                done.append((seq.req, self._fail_one(seq, exc)))
        self.metrics.record_kv(self.kv.held_bytes(self._running))
        self.kv.fit_cache(self._running)  # finished sequences gave working KV back: the cache may grow into it
        return done

    def _fail_one(self, seq: Running, exc: BaseException) -> BaseException:
        """Drop one running sequence (pins released) and return the error its caller gets."""
        if seq in self._running:
            self._running.remove(seq)
            self.cache.release(seq.match)
        self.metrics.requests_failed += 1
        return RequestFailedError(f"request {seq.req.rid} failed in the engine step: {type(exc).__name__}: {exc}")

    def _admit(self, now: float, failed: list) -> None:
        """Move waiting requests into the running set; those that cannot start go to ``failed``."""
        free = self.config.max_concurrent_rollouts - len(self._running)
        if free <= 0 or not self._waiting:
            return
        limit = self._match_limit
        order = self.scheduler.order(self._waiting, totals=lambda r: r.num_inputs,
                                     cached=lambda r: self.cache.match_length(r.prompt, limit(r)),
                                     rewards=lambda r: r.reward)
        # A request sharing a long prefix with one being prefilled now waits until that prefill
        # lands in the cache (a GRPO group's prompt, a common system prompt: computed once).
        leaders = [s.req.prompt for s in self._running if not s.prefilled]
        admitted = []
        for req in order:
            if len(admitted) >= free:
                break
            n = limit(req)
            cached = self.cache.match_length(req.prompt, n)
            shared = max((prefix_match(req.prompt[:n], p) for p in leaders), default=0) if n else 0
            if shared - cached >= SHARE_MIN_TOKENS:
                self.metrics.shared_prefix_waits += 1
                continue
            admitted.append(req)
            leaders.append(req.prompt)
        chosen = set(map(id, admitted))
        self._waiting = [r for r in self._waiting if id(r) not in chosen]
        for req in admitted:
            match = None
            try:
                match = self._reserve(req, limit(req), failed)
                if match is None:
                    continue
                kv = self.runner.new_kv(req.num_inputs + req.params.max_new_tokens)
                if match.length:
                    kv.load_rows(self.cache.pool.read(match.slots))
                gen = None
                if not req.params.greedy:
                    gen = torch.Generator(device=self.device)
                    gen.manual_seed(req.params.seed if req.params.seed is not None else
                                    int(torch.randint(0, 2**62, (1,))))
            except Exception as exc:  # this request alone cannot start (e.g. its KV does not fit in memory)
                if match is not None:
                    self.cache.release(match)
                self.metrics.requests_failed += 1
                failed.append((req, RequestFailedError(f"request {req.rid} could not be admitted: "
                                                       f"{type(exc).__name__}: {exc}")))
                continue
            self.metrics.record_admit(now - req.arrival)
            self._running.append(Running(req, kv, match, now, self.scheduler.b_eff(req.num_inputs, match.length),
                                           gen, self.policy_version))
            self.metrics.record_kv(self.kv.held_bytes(self._running))
        self._waiting.sort(key=lambda r: r.rid)  # requests sent back to wait keep their arrival order

    def _reserve(self, req: Request, limit: int, failed: list) -> PrefixMatch | None:
        """The request's pinned prefix and room for its working KV (``kv_budget``); else it waits for
        running sequences to finish, or fails if it cannot fit even alone. None: not admitted now."""
        need = (req.num_inputs + req.params.max_new_tokens) * self.kv.bytes_per_token
        match = self.kv.reserve(req.prompt, limit, need, self._running)
        if match is not None:
            return match
        if not self._running and need > self.kv.budget_bytes:
            self.metrics.requests_failed += 1
            failed.append((req, RequestFailedError(
                f"request {req.rid} needs {need / 2**20:.3f} MiB of working KV ({req.num_inputs} inputs + "
                f"max_new_tokens {req.params.max_new_tokens}, {self.kv.bytes_per_token} B/token) but "
                f"ExecutionConfig.kv_memory_budget_mb={self.config.kv_memory_budget_mb:g}")))
        else:
            self.metrics.memory_waits += 1
            self._waiting.append(req)
        return None

    @staticmethod
    def _match_limit(req: Request) -> int:
        # The last input must be computed to get logits, unless a plan row follows the prompt.
        return len(req.prompt) if req.plan is not None else len(req.prompt) - 1

    def _build_batch(self) -> tuple[list[Segment], list[Running]]:
        segments, seqs = [], []
        budget = self.config.max_batch_tokens
        decoding = [s for s in self._running if s.prefilled]
        if len(decoding) > budget:  # more decoders than rows: take turns
            k = self._rotation % len(decoding)
            decoding = (decoding[k:] + decoding[:k])[:budget]
            self._rotation += budget
        for s in decoding:
            segments.append(Segment(s.kv, [s.out[-1]], need_logits=True))
            seqs.append(s)
            budget -= 1
        for s in self._running:
            if s.prefilled or budget <= 0:
                continue
            a = s.kv.length
            b = min(s.req.num_inputs, a + budget)
            n_prompt = len(s.req.prompt)
            toks = s.req.prompt[a: min(b, n_prompt)] if a < n_prompt else []
            emb = None
            if b > n_prompt:
                emb = s.req.plan[max(a, n_prompt) - n_prompt: b - n_prompt]
            segments.append(Segment(s.kv, toks, emb, need_logits=(b == s.req.num_inputs)))
            seqs.append(s)
            budget -= b - a
        return segments, seqs

    def _finish(self, seq: Running, reason: str) -> GenerationResult:
        req = seq.req
        if seq.start_version == self.policy_version:
            if req.plan is None:
                tokens = req.prompt + seq.out[:-1]  # the last token's KV was never computed
            else:
                tokens = req.prompt  # KV after the plan depends on the plan: not reusable history
            self.cache.insert(tokens, seq.kv.rows(len(tokens)))
        self.cache.release(seq.match)
        self._running.remove(seq)
        self.metrics.record_finish(req.num_inputs, seq.match.length, len(seq.out), seq.b_eff)
        now = time.perf_counter()
        return GenerationResult(token_ids=list(seq.out), logprobs=list(seq.logprobs), finish_reason=reason,
                                prompt_length=req.num_inputs, cached_length=seq.match.length,
                                queue_time=seq.admitted - req.arrival, latency=now - req.arrival,
                                policy_versions=list(seq.versions))
