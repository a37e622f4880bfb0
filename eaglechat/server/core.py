"""What both faces share: the engine behind its worker, the server's limits and metrics, the API key,
reading a request body, and admitting a checked request to the queue. The faces (server/openai_api.py,
server/ollama.py) parse their own formats and render their own replies over this."""

from __future__ import annotations

import asyncio
import hmac
import logging
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse

from eaglechat.chat.reasoning import OPEN
from eaglechat.engine.protocol import Engine, GenerationParams, Speculate
from eaglechat.server.errors import ApiError, engine_error
from eaglechat.server.metrics import ServerMetrics
from eaglechat.server.request import ChatRequest, parse_json
from eaglechat.server.thinking import Thinking
from eaglechat.server.worker import DONE, Job, Worker

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
    strict_model: bool = False  # a request naming another model: 404 (else the served model answers)


class ServerCore:
    def __init__(self, engine: Engine, config: ServerConfig):
        self.engine, self.config = engine, config
        self.metrics = ServerMetrics(config.model)
        self.worker = Worker(engine, max_queue=config.max_queue, on_change=self._queue_changed)
        self.thinking = Thinking.of(engine)  # what the model's chat template can do about reasoning

    def _queue_changed(self, running: int, waiting: int) -> None:
        self.metrics.running, self.metrics.waiting = running, waiting

    def check_key(self, request: Request) -> None:
        if self.config.api_key is None:
            return
        # a header arrives as bytes, which starlette decodes as Latin-1: encoding it back gives the bytes the
        # client sent, compared with the key's UTF-8 bytes (a non-ASCII key sent as UTF-8 then matches)
        given = request.headers.get("authorization", "").encode("latin-1")
        scheme, _, token = given.partition(b" ")
        # constant time: the comparison does not reveal how much of a guess was right
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.config.api_key.encode()):
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
        """The API key checked, then the body read within the limits and parsed as a JSON object."""
        self.check_key(request)
        return parse_json(await self.read_body(request))

    def limits(self) -> tuple[int, int]:
        """(the most new tokens a request may ask for, the default when it asks for none)"""
        limit = max(1, self.engine.info.max_context - 1)  # at least one prompt token
        return limit, min(self.config.default_max_tokens, limit)

    @property
    def default_speculate(self) -> Speculate:
        """What a request without `speculate` gets: the engine's default (a loaded head: "auto", the
        engine measuring plain and EAGLE steps while decoding; no head: false)."""
        return Speculate.of(self.engine.info.speculate_by_default)

    @property
    def model_sampling(self) -> dict:
        """The served model's own sampling defaults, for the fields a request leaves out."""
        return dict(self.engine.info.sampling)

    @property
    def max_prompt_tokens(self) -> int:
        return self.config.max_prompt_tokens or 16 * self.engine.info.max_context

    async def count_tokens(self, messages: list[dict]) -> int | None:
        count = getattr(self.engine, "count_tokens", None)
        if count is None:
            return None
        try:
            return await asyncio.to_thread(count, messages)
        except Exception as exc:  # noqa: BLE001 - a template's complaint is the request's error
            raise engine_error(exc) from None

    async def prompt_tokens(self, chat: ChatRequest) -> int | None:
        """The prompt's length; for a reply to split, the prompt rendered as the engine will render it
        (the request's thinking switch passed), and whether it ends inside an opened <think> block."""
        encode, tokenizer = getattr(self.engine, "encode", None), getattr(self.engine, "tokenizer", None)
        if not chat.split_reasoning or encode is None or tokenizer is None:
            return await self.count_tokens(chat.messages)
        try:
            ids = await asyncio.to_thread(encode, chat.messages, chat.params.thinking)
        except Exception as exc:  # noqa: BLE001 - a template's complaint is the request's error
            raise engine_error(exc) from None
        chat.reasoning_opened = tokenizer.decode(ids[-16:]).rstrip().endswith(OPEN)
        return len(ids)

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
        tokens = await self.prompt_tokens(chat) if chat.messages else None
        if tokens is not None and tokens > self.max_prompt_tokens:
            raise ApiError(400, f"the conversation is {tokens} tokens; this server takes at most "
                           f"{self.max_prompt_tokens} per request", param="messages", code="context_length_exceeded")
        job = Job(chat.messages, chat.params, asyncio.get_running_loop(), prompt=chat.prompt, suffix=chat.suffix)
        self.worker.submit(job)
        return job

    async def embed(self, inputs: list, *, truncate: bool = True, param: str = "input") -> tuple[list[list[float]], int]:
        """Embeddings through the worker (one engine, in arrival order) -> (vectors, tokens read)."""
        if not hasattr(self.engine, "embed"):
            raise ApiError(501, "this engine cannot compute embeddings", param=param, code="not_implemented")
        job = Job([], GenerationParams(), asyncio.get_running_loop(), embed=inputs, truncate=truncate)
        self.worker.submit(job)
        result = await job.events.get()
        if result is DONE:
            raise ApiError(503, "the server is shutting down", type="server_error", code="unavailable")
        if isinstance(result, BaseException):
            raise engine_error(result, param)
        return result

    # -- probes, the same on both faces ---------------------------------------------------------------
    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": self.config.model, "waiting": self.worker.waiting})

    async def prometheus(self, request: Request) -> PlainTextResponse:
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")
