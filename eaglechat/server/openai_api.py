"""The OpenAI face: GET /v1/models, GET /v1/models/{id}, POST /v1/chat/completions and POST
/v1/completions (stream false and true; `suffix` fills in the middle where the model has FIM tokens),
and vLLM's POST /tokenize. Streaming follows the OpenAI API: `text/event-stream` of chunks with one id,
a chunk with `finish_reason` ends the choice, `stream_options.include_usage` adds a chunk with
`choices: []`, `usage` and `metrics`, then `data: [DONE]`. A reasoning model's thinking (`reasoning_effort`,
`chat_template_kwargs.enable_thinking`: server/thinking.py) comes in `reasoning_content` and `reasoning`. Errors are `{"error": {"message", "type",
"param", "code"}}` (`error_response`, registered as this face's exception handler in server/app.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from eaglechat.engine.protocol import Speculate
from eaglechat.server.core import ServerCore
from eaglechat.server.errors import ApiError, bad, engine_error, unsupported
from eaglechat.server.openai_schema import parse_chat_request, parse_completion_request
from eaglechat.server.reply import Reply
from eaglechat.server.request import chat_messages, check_model, embedding_inputs


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


class SseReply(Reply):
    """An OpenAI reply: one JSON object, or server-sent events ending in `data: [DONE]`."""

    media_type = "text/event-stream"
    chunk_object = ""

    def chunk(self, piece: str | None, finish_reason: str | None = None, extra_choice: dict | None = None,
              reasoning: str = "") -> str:
        raise NotImplementedError

    def first_chunk(self) -> str | None:
        return None

    async def stream(self):
        try:
            first = self.first_chunk()
            if first:
                yield first
            try:
                async for piece in self.pieces():
                    yield ": keep-alive\n\n" if piece is None else self.chunk(piece[0], None, piece[1], piece[2])
            except ApiError as exc:  # mid-stream: the status line is sent, so the error goes in an event
                yield f"data: {json.dumps(exc.body())}\n\n"
                yield "data: [DONE]\n\n"
                return
            usage, metrics = self.usage_and_metrics()
            yield self.chunk(None, self.finish_reason(), self.take_ids())
            if self.chat.include_usage:
                yield self.event({"choices": [], "usage": usage, "metrics": metrics})
            yield "data: [DONE]\n\n"
        finally:
            self.end()

    def event(self, fields: dict) -> str:
        body = {"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.chat.model, **fields}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


class ChatReply(SseReply):
    """`chat.completion` / `chat.completion.chunk`: the first delta carries the role, a chunk with
    `finish_reason` ends the choice, `stream_options.include_usage` adds a chunk with `choices: []`."""

    chunk_object = "chat.completion.chunk"

    def first_chunk(self) -> str:
        return self.event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                        "finish_reason": None}]})

    def chunk(self, piece, finish_reason=None, extra_choice=None, reasoning="") -> str:
        # a reasoning model's thinking: vLLM's and DeepSeek's `reasoning_content`, and `reasoning` (vLLM's
        # newer name, OpenRouter's), never inside `content`
        delta = {"reasoning_content": reasoning, "reasoning": reasoning} if reasoning else {}
        if piece or (piece is not None and not reasoning):
            delta["content"] = piece
        return self.event({"choices": [{"index": 0, "delta": delta, "logprobs": None,
                                        "finish_reason": finish_reason, **(extra_choice or {})}]})

    def whole(self, text: str) -> dict:
        usage, metrics = self.usage_and_metrics()
        ids = {"token_ids": self.finished.token_ids} if self.chat.return_token_ids else {}
        message = {"role": "assistant", "content": text}
        if self.splitter is not None:
            message["reasoning_content"] = message["reasoning"] = self.reasoning or None
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.chat.model,
                "choices": [{"index": 0, "message": message,
                             "logprobs": None, "finish_reason": self.finish_reason(), **ids}],
                "usage": usage, "metrics": metrics}


class CompletionReply(SseReply):
    """`text_completion`, streamed or whole, as the OpenAI completions API (and vLLM) send it."""

    prefix = "cmpl"
    param = "prompt"
    chunk_object = "text_completion"

    def chunk(self, piece, finish_reason=None, extra_choice=None, reasoning="") -> str:
        return self.event({"choices": [{"index": 0, "text": piece or "", "logprobs": None,
                                        "finish_reason": finish_reason}]})

    def whole(self, text: str) -> dict:
        usage, metrics = self.usage_and_metrics()
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.chat.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason()}],
                "usage": usage, "metrics": metrics}


class OpenAiApi:
    def __init__(self, core: ServerCore):
        self.core = core

    def card(self, name: str) -> dict:
        info, thinking = self.core.engine.info, self.core.thinking
        return {
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "eaglechat",
            "max_model_len": info.max_context,
            "eaglechat": {"head": info.head, "device": info.device, "dtype": info.dtype, "quant": info.quant,
                          "tree": info.tree.to_dict(),
                          "speculate_by_default": Speculate.of(info.speculate_by_default).wire,
                          "sampling": self.core.model_sampling,
                          # what the template can do about reasoning, so a RemoteEngine offers the same switch
                          "thinking": {"switch": thinking.switch, "effort": thinking.effort,
                                       "reasoning": thinking.splits, "opens": thinking.opens}},
        }

    def serves(self, name: str) -> bool:
        return name == self.core.config.model or name in self.core.config.aliases

    async def models(self, request: Request) -> JSONResponse:
        self.core.check_key(request)
        return JSONResponse({"object": "list", "data": [self.card(self.core.config.model)]})

    async def model(self, request: Request) -> JSONResponse:
        self.core.check_key(request)
        name = request.path_params["id"]
        if not self.serves(name):
            raise ApiError(404, f"the model '{name}' does not exist; this server serves '{self.core.config.model}'",
                           param="model", code="model_not_found")
        return JSONResponse(self.card(name))

    async def tokenize(self, request: Request) -> JSONResponse:
        """vLLM's /tokenize for chat messages: {"count", "max_model_len", "tokens"} (the chat template applied)."""
        body = await self.core.read_json(request)
        engine = self.core.engine
        count = getattr(engine, "count_tokens", None)
        if count is None:
            raise ApiError(501, "this engine cannot count tokens", code="not_implemented")
        messages = chat_messages(body)
        try:
            tokens = await asyncio.to_thread(getattr(engine, "encode", None) or count, messages)
        except Exception as exc:  # noqa: BLE001 - the tokenizer's complaint, as the client's error
            raise engine_error(exc) from None
        ids = tokens if isinstance(tokens, list) else []
        return JSONResponse({"count": len(ids) if ids else int(tokens), "max_model_len": engine.info.max_context,
                             "tokens": ids})

    async def chat_completions(self, request: Request):
        body = await self.core.read_json(request)
        limit, default = self.core.limits()
        config = self.core.config
        chat = parse_chat_request(body, model=config.model, aliases=config.aliases, max_tokens_limit=limit,
                                  default_max_tokens=default, default_speculate=self.core.default_speculate,
                                  strict_model=config.strict_model, model_defaults=self.core.model_sampling,
                                  thinking=self.core.thinking)
        job = await self.core.admit(chat)
        return await ChatReply(self.core, job, chat).respond(request)

    async def completions(self, request: Request):
        body = await self.core.read_json(request)
        config = self.core.config
        chat = parse_completion_request(body, model=config.model, aliases=config.aliases,
                                        max_tokens_limit=self.core.limits()[0],
                                        default_speculate=self.core.default_speculate,
                                        strict_model=config.strict_model, model_defaults=self.core.model_sampling)
        job = await self.core.admit(chat)
        return await CompletionReply(self.core, job, chat).respond(request)

    async def embeddings(self, request: Request) -> JSONResponse:
        """OpenAI's embeddings from the served base model (ServerCore.embed): `float` lists or `base64`
        (little-endian float32, what the openai client asks for by default)."""
        body = await self.core.read_json(request)
        config = self.core.config
        check_model(body.get("model"), config.model, config.aliases, strict=config.strict_model)
        inputs = embedding_inputs(body.get("input"))
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise bad("encoding_format", "'encoding_format' must be \"float\" or \"base64\"")
        vectors, tokens = await self.core.embed(inputs)
        if body.get("dimensions") not in (None, len(vectors[0])):
            raise unsupported("dimensions", f"this model's embeddings have {len(vectors[0])} dimensions")

        def encode(v: list[float]):
            return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if encoding == "base64" else v

        return JSONResponse({"object": "list", "model": config.model,
                             "data": [{"object": "embedding", "index": i, "embedding": encode(v)}
                                      for i, v in enumerate(vectors)],
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def routes(self) -> list[Route]:
        """Under /v1."""
        return [
            Route("/models", self.models, methods=["GET"]),
            Route("/models/{id:path}", self.model, methods=["GET"]),
            Route("/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/completions", self.completions, methods=["POST"]),
            Route("/embeddings", self.embeddings, methods=["POST"]),
        ]
