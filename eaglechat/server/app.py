"""`create_app(engine)`: the OpenAI-compatible HTTP API over any object implementing the Engine protocol.

Endpoints: GET /v1/models, POST /v1/chat/completions (stream false and true), GET /health,
GET /metrics (Prometheus text). Streaming follows the OpenAI API: `text/event-stream` of
`chat.completion.chunk` events with one id; the first delta carries the role, a chunk with
`finish_reason` ends the choice, `stream_options.include_usage` adds a chunk with `choices: []`,
`usage` and `metrics`, then `data: [DONE]`. Errors are `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import time
import uuid
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from eaglechat.engine.protocol import Engine, Finished, TextDelta
from eaglechat.server.metrics import RequestTally, ServerMetrics, eaglechat_metrics
from eaglechat.server.schema import ApiError, ChatRequest, chat_messages, parse_chat_request, parse_json
from eaglechat.server.stops import StopScanner
from eaglechat.server.worker import DONE, Job, Worker

KEEPALIVE_S = 2.0  # an SSE comment while a request waits in the queue (keeps proxies from timing out)
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length", "oom": "length"}


@dataclass
class ServerConfig:
    model: str
    api_key: str | None = None
    max_queue: int = 16
    max_body_bytes: int = 1 << 20
    default_max_tokens: int = 1024
    aliases: tuple[str, ...] = ()


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def engine_error(exc: BaseException) -> ApiError:
    """An exception from the engine -> the client's error (a user's mistake is a 4xx, not a 500)."""
    from eaglechat.errors import ContextTooLong, EaglechatError, OutOfMemory, UsageError

    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextTooLong):
        return ApiError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, UsageError):
        return ApiError(400, str(exc), param="messages", code="invalid_value")
    if isinstance(exc, OutOfMemory):
        return ApiError(503, str(exc), type="server_error", code="out_of_memory", headers={"Retry-After": "5"})
    if isinstance(exc, EaglechatError):
        return ApiError(500, str(exc), type="server_error", code="engine_error")
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error", code="internal_error")


class ChatServer:
    def __init__(self, engine: Engine, config: ServerConfig):
        self.engine, self.config = engine, config
        self.metrics = ServerMetrics(config.model)
        self.worker = Worker(engine, max_queue=config.max_queue, on_change=self._queue_changed)

    def _queue_changed(self, running: int, waiting: int) -> None:
        self.metrics.running, self.metrics.waiting = running, waiting

    # -- plumbing ----------------------------------------------------------------------------------
    def check_key(self, request: Request) -> None:
        if self.config.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        # constant time: the comparison does not reveal how much of a guess was right
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.config.api_key.encode()):
            raise ApiError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                           type="authentication_error", code="invalid_api_key")

    async def read_body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        too_big = ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
        if declared and declared.isdigit() and int(declared) > limit:
            raise too_big
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_big
        return bytes(body)

    def limits(self) -> tuple[int, int]:
        """(the most new tokens a request may ask for, the default when it asks for none)"""
        limit = max(1, self.engine.info.max_context - 1)  # at least one prompt token
        return limit, min(self.config.default_max_tokens, limit)

    # -- endpoints ---------------------------------------------------------------------------------
    async def models(self, request: Request) -> JSONResponse:
        self.check_key(request)
        info = self.engine.info
        card = {
            "id": self.config.model, "object": "model", "created": int(time.time()), "owned_by": "eaglechat",
            "max_model_len": info.max_context,
            "eaglechat": {"head": info.head, "device": info.device, "dtype": info.dtype, "quant": info.quant,
                          "tree": {"total_tokens": info.tree.total_tokens, "depth": info.tree.depth,
                                   "top_k": info.tree.top_k, "kind": info.tree.kind},
                          "speculate_by_default": info.speculate_by_default},
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def tokenize(self, request: Request) -> JSONResponse:
        """vLLM's /tokenize for chat messages: {"count", "max_model_len", "tokens"} (the chat template applied)."""
        try:
            self.check_key(request)
            body = parse_json(await self.read_body(request))
            count = getattr(self.engine, "count_tokens", None)
            if count is None:
                raise ApiError(501, "this engine cannot count tokens", code="not_implemented")
            messages = chat_messages(body)
            encode = getattr(self.engine, "encode", None)
            tokens = await asyncio.to_thread(encode or count, messages)
        except ApiError as exc:
            return error_response(exc)
        except Exception as exc:  # noqa: BLE001 - the tokenizer's complaint, as the client's error
            return error_response(engine_error(exc))
        ids = tokens if isinstance(tokens, list) else []
        return JSONResponse({"count": len(ids) if ids else int(tokens), "max_model_len": self.engine.info.max_context,
                             "tokens": ids})

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": self.config.model, "waiting": self.worker.waiting})

    async def prometheus(self, request: Request) -> PlainTextResponse:
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def chat_completions(self, request: Request):
        try:
            self.check_key(request)
            body = parse_json(await self.read_body(request))
            limit, default = self.limits()
            chat = parse_chat_request(body, model=self.config.model, aliases=self.config.aliases,
                                      max_tokens_limit=limit, default_max_tokens=default)
            job = Job(chat.messages, chat.params, asyncio.get_running_loop())
            self.worker.submit(job)
        except ApiError as exc:
            self.metrics.reject(exc.status)
            return error_response(exc)
        reply = Reply(self, job, chat)
        if not chat.stream:
            return await reply.whole(request)
        error = await reply.started(request)
        if error is not None:
            return error_response(error)
        return StreamingResponse(reply.sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class Reply:
    """One request's events -> the OpenAI response, streamed or whole."""

    def __init__(self, server: ChatServer, job: Job, chat: ChatRequest):
        self.server, self.job, self.chat = server, job, chat
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.scanner = StopScanner(chat.stops)
        self.tally = RequestTally(tree_total=server.engine.info.tree.total_tokens)
        self.finished: Finished | None = None
        self.observed = False  # counted in the server metrics (once per request)
        self.buffered: list = []  # the first engine event, read before the response started
        self.pending_ids: list[int] = []  # token ids (and drafted flags) not yet sent with their text
        self.pending_drafted: list[bool] = []
        # with return_token_ids and no stop strings, each engine step is one chunk carrying its ids,
        # drafted flags, per-token texts and step stats (what a RemoteEngine needs to be exact)
        self.per_step = chat.return_token_ids and not chat.stops

    def observe(self, reason: str, *args) -> None:
        if not self.observed:
            self.observed = True
            self.server.metrics.observe(reason, *args)

    @contextlib.asynccontextmanager
    async def cancelled_on_disconnect(self, request: Request):
        """While the response has not started, nothing else listens: watch for the client leaving."""
        async def watch():
            while (await request.receive())["type"] != "http.disconnect":
                pass
            self.job.cancel.set()

        watcher = asyncio.create_task(watch())
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def started(self, request: Request) -> ApiError | None:
        """Wait for the engine's first event, so an error before any output (a prompt beyond the
        context) is an HTTP error, not an event inside a 200 stream."""
        async with self.cancelled_on_disconnect(request):
            item = await self.job.events.get()
        if isinstance(item, BaseException):
            self.observe("error")
            return engine_error(item)
        if item is DONE:
            self.observe("cancelled")
            return ApiError(499, "client closed the request", code="cancelled")
        self.buffered.append(item)
        return None

    def take_ids(self) -> dict:
        """With return_token_ids: the ids that arrived since the last chunk, for the chunk's choice."""
        if not self.chat.return_token_ids:
            return {}
        out = {"token_ids": self.pending_ids, "drafted": self.pending_drafted}
        self.pending_ids, self.pending_drafted = [], []
        return out

    async def pieces(self):
        """(text, extra choice fields) to send, in order; None while the engine is quiet (time for a
        keep-alive). Raises ApiError when the engine fails."""
        while True:
            if self.buffered:
                item = self.buffered.pop(0)
            else:
                try:
                    item = await asyncio.wait_for(self.job.events.get(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield None
                    continue
            if item is DONE:
                break
            if isinstance(item, BaseException):
                self.observe("error")
                raise engine_error(item)
            if isinstance(item, Finished):
                self.finished = item
            if not isinstance(item, TextDelta):
                continue  # PrefillProgress: nothing to send
            self.tally.add(item.step)
            if self.per_step:
                step = None if item.step is None else dataclasses.asdict(item.step)
                yield item.text, {"token_ids": item.token_ids, "drafted": item.drafted,
                                  "eaglechat": {"step": step, "token_texts": item.token_texts}}
                continue
            self.pending_ids += item.token_ids
            self.pending_drafted += item.drafted
            text = self.scanner.feed(item.text)
            if self.scanner.stopped:
                self.job.cancel.set()  # a stop string ended the reply: the engine stops after this step
            if text:
                yield text, self.take_ids()
        tail = self.scanner.flush()
        if tail:
            yield tail, self.take_ids()

    def finish_reason(self) -> str:
        if self.scanner.stopped:
            return "stop"
        return FINISH_REASONS.get(self.finished.stop_reason if self.finished else "", "stop")

    def usage_and_metrics(self) -> tuple[dict, dict]:
        stats = self.finished.stats if self.finished else None
        if stats is None:
            return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, {}
        prompt = stats.prompt_tokens or stats.prefill_tokens + stats.reused_tokens
        completion = len(self.finished.token_ids)
        spec = self.tally.speculative_decoding(stats)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        if stats.reused_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": stats.reused_tokens}
        self.observe(self.finish_reason(), prompt, completion, spec)
        return usage, {"speculative_decoding": spec, "eaglechat": eaglechat_metrics(stats)}

    def chunk(self, delta: dict | None, finish_reason: str | None = None, extra_choice: dict | None = None,
              **extra) -> str:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                             "finish_reason": finish_reason, **(extra_choice or {})}]
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.chat.model, "choices": choices, **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    async def sse(self):
        try:
            yield self.chunk({"role": "assistant", "content": ""})
            try:
                async for piece in self.pieces():
                    yield ": keep-alive\n\n" if piece is None else self.chunk({"content": piece[0]}, None, piece[1])
            except ApiError as exc:  # mid-stream: the status line is sent, so the error goes in an event
                yield f"data: {json.dumps(exc.body())}\n\n"
                yield "data: [DONE]\n\n"
                return
            usage, metrics = self.usage_and_metrics()
            yield self.chunk({}, self.finish_reason(), self.take_ids())
            if self.chat.include_usage:
                yield self.chunk(None, usage=usage, metrics=metrics)
            yield "data: [DONE]\n\n"
        finally:
            # the client went away (the response task is cancelled) or we are done: either way the
            # engine must not keep decoding for nobody
            self.observe("cancelled")  # no-op when the request was already counted
            self.job.cancel.set()

    async def whole(self, request: Request) -> JSONResponse:
        async with self.cancelled_on_disconnect(request):
            try:
                parts = [piece[0] async for piece in self.pieces() if piece]
            except ApiError as exc:
                return error_response(exc)
        if self.finished is None or (self.finished.stop_reason == "cancelled" and not self.scanner.stopped):
            self.observe("cancelled")
            return error_response(ApiError(499, "client closed the request", code="cancelled"))
        usage, metrics = self.usage_and_metrics()
        ids = {"token_ids": self.finished.token_ids} if self.chat.return_token_ids else {}
        return JSONResponse({
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.chat.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(parts)},
                         "logprobs": None, "finish_reason": self.finish_reason(), **ids}],
            "usage": usage, "metrics": metrics,
        })


def create_app(engine: Engine, *, model: str | None = None, api_key: str | None = None, max_queue: int = 16,
               max_body_bytes: int = 1 << 20, default_max_tokens: int = 1024, aliases: tuple[str, ...] = ()) -> Starlette:
    """The ASGI app serving `engine`; `app.state.server` is the ChatServer (metrics, worker)."""
    config = ServerConfig(model=model or engine.info.model, api_key=api_key or None, max_queue=max_queue,
                          max_body_bytes=max_body_bytes, default_max_tokens=default_max_tokens, aliases=aliases)
    server = ChatServer(engine, config)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.worker.close()

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code))

    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        server.metrics.reject(exc.status)
        return error_response(exc)

    routes = [
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/tokenize", server.tokenize, methods=["POST"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.prometheus, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, ApiError: api_error})
    app.state.server = server
    return app
