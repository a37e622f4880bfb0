"""`create_app(engine)`: the OpenAI-compatible HTTP API (and Ollama's, server/ollama.py) over any
object implementing the Engine protocol.

OpenAI routes: GET /v1/models, GET /v1/models/{id}, POST /v1/chat/completions and POST /v1/completions
(stream false and true; `suffix` fills in the middle where the model has FIM tokens), POST /tokenize
(vLLM's). Also GET /health, GET /metrics (Prometheus text). Streaming follows the OpenAI API:
`text/event-stream` of chunks with one id, a chunk with `finish_reason` ends the choice,
`stream_options.include_usage` adds a chunk with `choices: []`, `usage` and `metrics`, then
`data: [DONE]`. Errors are `{"error": {"message", "type", "param", "code"}}`, never a 500 for a
request's own mistake. Requests are checked (size, messages, prompt tokens) before they queue for
the engine; server/guard.py keeps web pages out.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from eaglechat.engine.protocol import Engine
from eaglechat.server.guard import Guard
from eaglechat.server.metrics import ServerMetrics
from eaglechat.server.reply import ChatReply, CompletionReply, engine_error, error_response
from eaglechat.server.schema import (
    ApiError,
    ChatRequest,
    chat_messages,
    parse_chat_request,
    parse_completion_request,
    parse_json,
)
from eaglechat.server.worker import Job, Worker

log = logging.getLogger("eaglechat.server")


@dataclass
class ServerConfig:
    model: str
    api_key: str | None = None
    max_queue: int = 16
    max_body_bytes: int = 1 << 20
    default_max_tokens: int = 1024
    aliases: tuple[str, ...] = ()
    max_messages: int = 1024  # per request
    max_prompt_tokens: int = 0  # per request, the chat template applied (0: 16 x the context window)
    read_timeout: float = 30.0  # seconds for a request body to arrive
    write_timeout: float = 60.0  # seconds a streaming client may leave a chunk unread


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

        async def receive_all() -> None:
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > limit:
                    raise too_big

        try:
            await asyncio.wait_for(receive_all(), self.config.read_timeout)
        except asyncio.TimeoutError:
            log.warning("a client sent %d bytes of its request body in %.0f s and no more: dropped", len(body),
                        self.config.read_timeout)
            raise ApiError(408, f"the request body did not arrive within {self.config.read_timeout:g} s",
                           code="request_timeout") from None
        except ClientDisconnect:
            log.warning("a client disconnected while sending its request (%d bytes received)", len(body))
            raise ApiError(499, "client closed the request", code="cancelled") from None
        return bytes(body)

    async def read_json(self, request: Request) -> dict:
        self.check_key(request)
        return parse_json(await self.read_body(request))

    def limits(self) -> tuple[int, int]:
        """(the most new tokens a request may ask for, the default when it asks for none)"""
        limit = max(1, self.engine.info.max_context - 1)  # at least one prompt token
        return limit, min(self.config.default_max_tokens, limit)

    @property
    def default_speculate(self) -> bool | str:
        """What a request without `speculate` gets: the engine's default (a loaded head: "auto", the
        engine measuring plain and EAGLE steps while decoding; no head: false)."""
        return self.engine.info.speculate_by_default

    @property
    def max_prompt_tokens(self) -> int:
        return self.config.max_prompt_tokens or 16 * self.engine.info.max_context

    async def admit(self, chat: ChatRequest) -> Job:
        """Checks that need the request's size, then the queue: nothing here waits for the engine."""
        if len(chat.messages) > self.config.max_messages:
            raise ApiError(400, f"the request has {len(chat.messages)} messages; this server takes at most "
                           f"{self.config.max_messages} per request", param="messages", code="too_many_messages")
        if chat.prompt is not None and not hasattr(self.engine, "complete"):
            raise ApiError(501, "this engine cannot continue raw text (only chat messages)", param="prompt",
                           code="not_implemented")
        if chat.suffix and not getattr(self.engine, "can_fill_in_middle", False):
            from eaglechat.engine.fim import NAMES

            raise ApiError(400, f"this model has no fill-in-the-middle tokens ({NAMES}): 'suffix' cannot be used",
                           param="suffix", code="unsupported_parameter")
        count = getattr(self.engine, "count_tokens", None)
        if chat.messages and count is not None:
            try:
                tokens = await asyncio.to_thread(count, chat.messages)
            except Exception as exc:  # noqa: BLE001 - a template's complaint is the request's error
                raise engine_error(exc) from None
            if tokens > self.max_prompt_tokens:
                raise ApiError(400, f"the conversation is {tokens} tokens; this server takes at most "
                               f"{self.max_prompt_tokens} per request", param="messages",
                               code="context_length_exceeded")
        job = Job(chat.messages, chat.params, asyncio.get_running_loop(), prompt=chat.prompt, suffix=chat.suffix)
        self.worker.submit(job)
        return job

    def card(self, name: str) -> dict:
        info = self.engine.info
        return {
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "eaglechat",
            "max_model_len": info.max_context,
            "eaglechat": {"head": info.head, "device": info.device, "dtype": info.dtype, "quant": info.quant,
                          "tree": {"total_tokens": info.tree.total_tokens, "depth": info.tree.depth,
                                   "top_k": info.tree.top_k, "kind": info.tree.kind},
                          "speculate_by_default": info.speculate_by_default},
        }

    def serves(self, name: str) -> bool:
        return name == self.config.model or name in self.config.aliases

    # -- endpoints ---------------------------------------------------------------------------------
    async def models(self, request: Request) -> JSONResponse:
        self.check_key(request)
        return JSONResponse({"object": "list", "data": [self.card(self.config.model)]})

    async def model(self, request: Request) -> JSONResponse:
        self.check_key(request)
        name = request.path_params["id"]
        if not self.serves(name):
            raise ApiError(404, f"the model '{name}' does not exist; this server serves '{self.config.model}'",
                           param="model", code="model_not_found")
        return JSONResponse(self.card(name))

    async def tokenize(self, request: Request) -> JSONResponse:
        """vLLM's /tokenize for chat messages: {"count", "max_model_len", "tokens"} (the chat template applied)."""
        try:
            body = await self.read_json(request)
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
            body = await self.read_json(request)
            limit, default = self.limits()
            chat = parse_chat_request(body, model=self.config.model, aliases=self.config.aliases,
                                      max_tokens_limit=limit, default_max_tokens=default,
                                      default_speculate=self.default_speculate)
            job = await self.admit(chat)
        except ApiError as exc:
            self.metrics.reject(exc.status)
            return error_response(exc)
        return await ChatReply(self, job, chat).respond(request)

    async def completions(self, request: Request):
        try:
            body = await self.read_json(request)
            chat = parse_completion_request(body, model=self.config.model, aliases=self.config.aliases,
                                            max_tokens_limit=self.limits()[0], default_speculate=self.default_speculate)
            job = await self.admit(chat)
        except ApiError as exc:
            self.metrics.reject(exc.status)
            return error_response(exc)
        return await CompletionReply(self, job, chat).respond(request)


def create_app(engine: Engine, *, model: str | None = None, api_key: str | None = None, max_queue: int = 16,
               max_body_bytes: int = 1 << 20, default_max_tokens: int = 1024, aliases: tuple[str, ...] = (),
               allow_hosts: tuple[str, ...] = (), cors_origins: tuple[str, ...] = (), **limits) -> Starlette:
    """The ASGI app serving `engine`; `app.state.server` is the ChatServer (metrics, worker).
    `limits`: the other ServerConfig fields (max_messages, max_prompt_tokens, read_timeout, write_timeout)."""
    from eaglechat.server.ollama import ollama_routes

    config = ServerConfig(model=model or engine.info.model, api_key=api_key or None, max_queue=max_queue,
                          max_body_bytes=max_body_bytes, default_max_tokens=default_max_tokens, aliases=aliases,
                          **limits)
    server = ChatServer(engine, config)

    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.worker.close()

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=exc.status_code)
        return error_response(ApiError(exc.status_code, message, code=code))

    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        server.metrics.reject(exc.status)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)
        return error_response(exc)

    routes = [
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{id:path}", server.model, methods=["GET"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/tokenize", server.tokenize, methods=["POST"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.prometheus, methods=["GET"]),
        *ollama_routes(server),
    ]
    middleware = [Middleware(Guard, allow_hosts=allow_hosts, cors_origins=cors_origins)]
    if cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                                     allow_headers=["*"], max_age=600))  # the origin is trusted: SDKs add their own headers
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: http_error, ApiError: api_error})
    app.state.server = server
    return app
