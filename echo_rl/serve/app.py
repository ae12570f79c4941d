"""An OpenAI-compatible HTTP API over a local backbone (FastAPI).

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` and
``POST /v1/completions``, streaming (server-sent events) and not, with
log-probs and usage. Every error is a JSON body in the OpenAI shape
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status for bad
input, and the server keeps serving. Generation runs on one shared execution
engine (``engine_host``): concurrent requests decode in one packed forward per
token and share its radix prefix cache. Replies are built as the engine
decodes (``stream_text``): a stream sends each piece of text as soon as it is
final, holding back only what could still become a stop string, and a stop
string ends the request in the engine. A client that disconnects (a stream
closed, or a non-streaming request whose connection drops) has its request
aborted, freeing its engine slot at the next step. Reported log-probs are the
model's (temperature 1, as vLLM reports them), from teacher-forced forwards.

(No ``from __future__ import annotations`` here: FastAPI must resolve the
route signatures' names, which are imported inside :func:`create_app`.)
"""

import asyncio
import json
import time
import uuid
from contextlib import aclosing, asynccontextmanager
from typing import Any, AsyncIterator

from echo_rl.config import ConfigError
from echo_rl.models.chat_template import TemplateLimitError
from echo_rl.models.backbone import Completion, SamplingParams, TextDelta, TokenLogprob, Usage
from echo_rl.models.local import ContextLengthError, LocalBackbone
from echo_rl.serve.engine_host import EngineHost, Generated
from echo_rl.serve.errors import APIError, ClientGone
from echo_rl.serve.stream_text import StreamText
from echo_rl.serve.tool_api import ToolRequestError, ToolStream, tool_call_deltas, tool_prompt
from echo_rl.utils.optional import require

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_JSON_DEPTH = 32  # the deepest valid body is 5 levels; deeper input is refused before validation


def create_app(backbone: LocalBackbone, *, model_name: str | None = None, default_max_tokens: int = 256,
               max_concurrent: int = 64, recorder: Any = None) -> Any:
    """Build the FastAPI app serving ``backbone`` under ``model_name``; with a ``recorder``
    (:class:`echo_rl.external.recorder.Recorder`) every chat turn is recorded into its rollout's episode.

    The app owns one engine (``app.state.engine_host``), started by the first
    request and stopped at shutdown (the lifespan, or :class:`ModelServer.stop`).
    """
    fastapi = require("fastapi", "serve")
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from pydantic import ValidationError
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from echo_rl.serve.schemas import ChatCompletionRequest, CompletionRequest  # pydantic: loaded on first use

    if not isinstance(backbone, LocalBackbone):
        raise ConfigError(f"echo-rl serve needs a local backbone (checkpoint path or tiny), got {backbone!r}")

    name = model_name or backbone.name
    created = int(time.time())
    host = EngineHost(backbone, max_concurrent=max_concurrent)

    @asynccontextmanager
    async def lifespan(_: Any) -> Any:
        yield
        await run_in_threadpool(host.close)

    app = fastapi.FastAPI(title="echo-rl serve", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.engine_host = host

    async def events(prompt_ids: list[int], params: SamplingParams, stream: bool,
                     keep: tuple[str, ...] = (), turn: Any = None) -> AsyncIterator[TextDelta | Completion]:
        """One completion as the engine decodes it: text pieces as they become final, then the Completion.

        A stop string ends the request in the engine. Log-probs, when asked, are scored per piece when
        ``stream`` (one forward over the history each) and once at the end otherwise. Closing this
        iterator early aborts the request. ``keep``: stop strings kept in the text (tool calls' closing tags).
        ``turn``: a recorded turn, given the sampled ids (up to the stop, EOS included) and the engine's log-probs.
        """
        text = StreamText(backbone.tokenizer, params.stop, keep)
        sampled, finish, scored, lps, eos, sink = 0, "length", 0, [], [], []

        async def piece(part: str) -> TextDelta:
            nonlocal scored
            toks: list[TokenLogprob] = []
            if stream and params.logprobs:
                upto = len(text.kept) if text.stopped else len(text.ids)
                toks = await run_in_threadpool(_score, backbone, list(prompt_ids) + text.ids[:scored],
                                               text.ids[scored:upto], params.top_logprobs)
                scored = upto
            lps.extend(toks)
            return TextDelta(part, toks)

        async with aclosing(host.stream(prompt_ids, max_tokens=params.max_tokens, temperature=params.temperature,
                                        top_p=params.top_p, seed=params.seed,
                                        **({"logprobs": sink} if turn else {}))) as tokens:
            async for item in tokens:
                if isinstance(item, Generated):
                    finish = item.finish_reason
                    break
                sampled += 1
                if item in host.stop_ids:  # EOS: it ends the request and carries no text
                    eos.append(item)
                    continue
                part = text.push(item)
                if part or (text.stopped and stream and params.logprobs):
                    yield await piece(part)
                if text.stopped:
                    break  # leaving the stream aborts the request: no token past the stop string is computed
        if not text.stopped:
            part = text.finish()
            if part or (stream and params.logprobs and scored < len(text.ids)):
                yield await piece(part)
        kept = text.kept
        if params.logprobs and not stream:
            lps = await run_in_threadpool(_score, backbone, prompt_ids, kept, params.top_logprobs)
        if turn is not None:
            turn.done(text.ids[:text.used] if text.stopped else text.ids + eos, sink, text.text[:text.sent],
                      host.engine.policy_version)
        usage = Usage(len(prompt_ids), text.used if text.stopped else sampled, 0.0, 1)
        backbone._record(usage)
        yield Completion(text.text[:text.sent], "stop" if text.stopped else finish, usage, name, token_ids=kept,
                         prompt_token_ids=list(prompt_ids), logprobs=lps if params.logprobs else None)

    async def run_one(prompt_ids: list[int], params: SamplingParams, keep: tuple[str, ...] = (),
                      turn: Any = None) -> Completion:
        """One completion through the shared engine, with serve's stop strings, usage and log-probs."""
        async with aclosing(events(prompt_ids, params, stream=False, keep=keep, turn=turn)) as items:
            async for item in items:
                if isinstance(item, Completion):
                    return item
        raise RuntimeError("the completion ended without a result")  # unreachable: events() ends with one

    async def unless_gone(request: Request, coro: Any) -> Any:
        """Await ``coro`` while the client is connected; if it disconnects, cancel it (aborting its requests).

        The body has been read, so the next ASGI message is ``http.disconnect``: the server delivers it the
        moment the connection drops, and the request is aborted before the engine's next step.
        """
        task = asyncio.ensure_future(coro)
        watch = asyncio.ensure_future(request.receive())
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            if not watch.cancelled() and watch.exception() is None and watch.result().get("type") == "http.disconnect":
                raise ClientGone()
            return await task  # another message (none is expected): keep waiting for the reply
        finally:
            for t in (task, watch):
                if not t.done():
                    t.cancel()
            await asyncio.gather(task, watch, return_exceptions=True)

    def with_seed(params: SamplingParams, i: int) -> SamplingParams:
        return params if params.seed is None else SamplingParams(**{**params.__dict__, "seed": params.seed + i})

    class AsciiJSONResponse(JSONResponse):
        """ASCII JSON: an error message quoting client text (a lone surrogate, say) can always be encoded."""

        def render(self, content: Any) -> bytes:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()

    def error_response(err: APIError, headers: dict | None = None) -> JSONResponse:
        return AsciiJSONResponse(err.body(), status_code=err.status, headers=headers)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(ClientGone)
    async def _client_gone(_: Request, exc: ClientGone) -> JSONResponse:  # nobody reads it; nginx's 499
        return error_response(APIError(499, "the client closed the request", code="client_closed_request"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(APIError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_from_validation(exc.errors()))

    @app.exception_handler(ConfigError)
    async def _config_error(_: Request, exc: ConfigError) -> JSONResponse:  # the backbone refused the input
        return error_response(APIError(400, str(exc)))

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        # a bug of this server, not a transient fault: tell SDK clients (openai, APIBackbone) not to retry
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error"),
                              headers={"x-should-retry": "false"})

    async def parse(request: Request, schema: type) -> Any:
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            raise APIError(413, f"request body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES}")
        data = parse_json(raw)
        if not isinstance(data, dict):
            raise APIError(400, f"request body must be a JSON object, got {type(data).__name__}")
        check_strings(data)
        try:
            req = schema.model_validate(data)
        except ValidationError as exc:
            raise _from_validation(exc.errors()) from None
        if req.model != name:
            raise APIError(404, f"The model {req.model!r} does not exist; this server serves {name!r}",
                           param="model", code="model_not_found")
        return req

    def sampling(req: Any, max_tokens: int, prompt_len: int, logprobs: bool, top: int) -> SamplingParams:
        room = backbone.max_context - prompt_len
        if room < 1 or max_tokens > room:
            raise APIError(400, f"This model's maximum context length is {backbone.max_context} tokens; the "
                           f"prompt has {prompt_len} and max_tokens asks for {max_tokens}",
                           param="max_tokens", code="context_length_exceeded")
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
                                  top_p=1.0 if req.top_p is None else req.top_p, stop=req.stops(), seed=req.seed,
                                  logprobs=logprobs, top_logprobs=top)
        except ConfigError as exc:
            raise APIError(400, str(exc), param=str(exc).split("=", 1)[0]) from None

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "echo-rl",
                                            "max_model_len": backbone.max_context}]}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        req = await parse(request, ChatCompletionRequest)
        try:
            plan, messages, render = tool_prompt(req, backbone)
            turn = recorder.open(request.headers.get("x-echo-rl-rollout"), req, plan, messages) if recorder else None
            prompt_ids = await run_in_threadpool(turn.prompt if turn else render, messages)
        except ToolRequestError as exc:
            raise APIError(400, str(exc), param=exc.param) from None
        except TemplateLimitError as exc:  # the model's template is at fault, not the request
            raise APIError(500, str(exc), type="server_error", code="chat_template_limit") from None
        except ConfigError as exc:
            raise APIError(400, str(exc), param="messages") from None
        max_tokens = req.max_completion_tokens or req.max_tokens or min(default_max_tokens,
                                                                         max(1, backbone.max_context - len(prompt_ids)))
        params = sampling(req, max_tokens, len(prompt_ids), req.logprobs, req.top_logprobs or 0)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:
            if req.n != 1:
                raise APIError(400, "n must be 1 when stream is true", param="n")
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            gen = events(prompt_ids, params, stream=True, keep=plan.keep_stops, turn=turn)
            # the first piece is awaited before the 200 goes out, so a request that fails at once gets a status
            try:
                first = await unless_gone(request, gen.__anext__())
            except BaseException:
                await gen.aclose()
                raise
            return StreamingResponse(_chat_stream(rid, gen, first, params, include_usage,
                                                  ToolStream(plan) if plan.mode != "none" else None),
                                     media_type="text/event-stream")
        choices, usage = [], {"prompt_tokens": len(prompt_ids), "completion_tokens": 0}
        dones = await unless_gone(request, asyncio.gather(*(run_one(prompt_ids, with_seed(params, i), plan.keep_stops,
                                                                   turn) for i in range(req.n))))
        for i, done in enumerate(dones):
            usage["completion_tokens"] += done.usage.completion_tokens
            content, calls = plan.read(plan.prefill + done.text)
            message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            choices.append({"index": i, "message": message,
                            "logprobs": _chat_logprobs(done.logprobs) if req.logprobs else None,
                            "finish_reason": "tool_calls" if calls else done.finish_reason})
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": name,
                "choices": choices, "usage": usage}

    async def _chat_stream(rid: str, gen: AsyncIterator, first: Any, params: SamplingParams,
                           include_usage: bool, tools: Any = None) -> AsyncIterator[str]:
        """The SSE body, sent as the engine decodes. A failure after the 200 is sent as an ``error`` event, then
        the stream ends cleanly. A client that disconnects cancels this (Starlette listens for it), and closing
        ``gen`` aborts the request in the engine. With ``tools`` (a ToolStream), text from a call's opening tag
        on is held, and the call goes out as ``delta.tool_calls`` once it is complete (OpenAI's shape: index,
        id and name, then the arguments)."""
        def chunk(delta: dict, finish: str | None = None, **extra: Any) -> str:
            body = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": name,
                    "choices": [{"index": 0, "delta": delta, "logprobs": extra.pop("logprobs", None),
                                 "finish_reason": finish}], **extra}
            return f"data: {json.dumps(body)}\n\n"

        async def items() -> AsyncIterator:
            yield first
            async for item in gen:
                yield item

        yield chunk({"role": "assistant", "content": ""})
        held: list = []  # log-probs of text held back (a tool call), sent with the next chunk
        try:
            async for item in items():
                if isinstance(item, Completion):
                    finish = item.finish_reason
                    if tools is not None:
                        rest, calls = tools.finish()
                        lp = _chat_logprobs(held) if params.logprobs else None
                        if rest or (held and not calls):
                            yield chunk({"content": rest}, logprobs=lp)
                        for k, delta in enumerate(tool_call_deltas(calls or [])):
                            yield chunk(delta, logprobs=lp if k == 0 and not rest else None)
                        finish = "tool_calls" if calls else finish
                    yield chunk({}, finish)
                    if include_usage:
                        u = item.usage
                        body = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                                "model": name, "choices": [],
                                "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                                          "total_tokens": u.total_tokens}}
                        yield f"data: {json.dumps(body)}\n\n"
                else:
                    held.extend(getattr(item, "tokens", []))
                    part = str(item) if tools is None else tools.push(str(item))
                    if part or tools is None:
                        lp = _chat_logprobs(held) if params.logprobs else None
                        held = []
                        yield chunk({"content": part}, logprobs=lp)
        except Exception as exc:  # noqa: BLE001 - the headers are sent: report in-band, as OpenAI streams do
            status, kind = (400, "invalid_request_error") if isinstance(exc, ConfigError) else (500, "server_error")
            err = APIError(status, f"{'internal error: ' if status == 500 else ''}{type(exc).__name__}: {exc}",
                           type=kind)
            yield f"data: {json.dumps(err.body())}\n\n"
        finally:
            await gen.aclose()
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        req = await parse(request, CompletionRequest)
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        if len(prompts) != 1:
            raise APIError(400, "prompt must be one string (batches of prompts are not supported)", param="prompt")
        if req.stream:
            raise APIError(400, "stream is not supported on /v1/completions; use /v1/chat/completions",
                           param="stream")
        prompt_ids = backbone.encode(prompts[0])
        if not prompt_ids:
            raise APIError(400, "prompt is empty", param="prompt")
        max_tokens = 16 if req.max_tokens is None else req.max_tokens
        if max_tokens == 0 and not req.echo:
            raise APIError(400, "max_tokens=0 is only allowed with echo=true (scoring the prompt)",
                           param="max_tokens")
        top = req.logprobs or 0
        params = sampling(req, max(1, max_tokens), len(prompt_ids), req.logprobs is not None, top)
        prompt_lp: list[TokenLogprob] = []
        if req.echo and req.logprobs is not None:
            lps = await run_in_threadpool(backbone.prompt_logprobs, prompt_ids)
            prompt_lp = [TokenLogprob(backbone.tokenizer.decode([t]), lp, t) for t, lp in
                         zip(prompt_ids, [None, *lps])]  # the first token has no log-prob
        choices, completion_tokens = [], 0
        if max_tokens == 0:
            dones = [Completion("", "length", Usage(len(prompt_ids), 0), name, [], prompt_ids, [])] * req.n
        else:
            dones = await unless_gone(request, asyncio.gather(*(run_one(prompt_ids, with_seed(params, i))
                                                               for i in range(req.n))))
        for i, done in enumerate(dones):
            completion_tokens += done.usage.completion_tokens
            text = (prompts[0] if req.echo else "") + done.text
            lp = None
            if req.logprobs is not None:
                lp = _completion_logprobs(prompt_lp + (done.logprobs or []), prompts[0] if req.echo else "")
            choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": done.finish_reason})
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": name, "choices": choices,
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens,
                          "total_tokens": len(prompt_ids) + completion_tokens}}

    @app.exception_handler(ContextLengthError)
    async def _context(_: Request, exc: ContextLengthError) -> JSONResponse:
        return error_response(APIError(400, str(exc), code="context_length_exceeded"))

    return app


def _score(backbone: LocalBackbone, prompt_ids: list[int], ids: list[int], top: int) -> list[TokenLogprob]:
    """log p(ids[i] | prompt, ids[:i]) at temperature 1 (the backbone's teacher-forced rows), with the ``top``
    likeliest alternatives."""
    if not ids:
        return []
    logp = backbone.logprob_rows(prompt_ids, [ids])[0].cpu()
    decode = backbone.tokenizer.decode
    out = []
    for row, tok in zip(logp, ids):
        alts = []
        if top:
            vals, idx = row.topk(top)
            alts = [(decode([int(i)]), float(v)) for v, i in zip(vals, idx)]
        out.append(TokenLogprob(decode([tok]), float(row[tok]), tok, alts))
    return out


def parse_json(raw: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN/Infinity, no integers past 4300 digits, nesting at most MAX_JSON_DEPTH."""
    def no_constant(name: str) -> Any:
        raise APIError(400, f"request body is not valid JSON: {name} is not a JSON number", code="invalid_json")

    depth = _max_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise APIError(400, f"request body nests {depth} levels deep; the limit is {MAX_JSON_DEPTH}",
                       code="invalid_json")
    try:
        return json.loads(raw, parse_constant=no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer literal longer than Python converts
        raise APIError(400, f"request body is not valid JSON: {str(exc).split(';')[0]}",
                       code="invalid_json") from None


def _max_depth(raw: bytes) -> int:
    """Bracket depth of a JSON text, skipping strings (a cheap bound before the recursive parser runs)."""
    depth = best = 0
    in_str = escaped = False
    for b in raw:
        if in_str:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):
            depth += 1
            if depth > best:
                best = depth
                if best > MAX_JSON_DEPTH:
                    return best
        elif b in (0x5D, 0x7D):
            depth -= 1
    return best


def check_strings(data: Any, path: str = "") -> None:
    """Refuse text that is not valid Unicode (a lone surrogate such as \\ud800): it cannot be tokenized."""
    stack = [(data, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                bad = value[exc.start]
                raise APIError(400, f"{where or 'body'}: contains a lone surrogate U+{ord(bad):04X}; text must be "
                               "valid Unicode", param=where or None, code="invalid_unicode") from None
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, where))
                stack.append((v, f"{where}.{k}" if where else str(k)))
        elif isinstance(value, list):
            stack.extend((v, f"{where}.{i}") for i, v in enumerate(value))


def _from_validation(errors: list) -> APIError:
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    return APIError(400, f"{param or 'body'}: {first.get('msg', 'invalid value')}", param=param)


def _chat_logprobs(tokens: list[TokenLogprob] | None) -> dict:
    def entry(tok: str, lp: float) -> dict:
        return {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8"))}

    return {"content": [{**entry(t.token, t.logprob), "top_logprobs": [entry(a, b) for a, b in t.top]}
                        for t in tokens or []]}


def _completion_logprobs(tokens: list[TokenLogprob], prefix: str) -> dict:
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t.token)
    return {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [dict(t.top) if t.top else None for t in tokens], "text_offset": offsets}
