"""Ollama's native API over the same worker, for clients that speak only it (oterm, Enchanted, Open
WebUI's Ollama connection, Continue's ollama provider, the `ollama` Python library).

Routes as Ollama's docs/api.md: GET / (a liveness probe), GET /api/version, GET /api/tags, POST /api/show, GET /api/ps,
POST /api/chat and POST /api/generate (NDJSON streaming by default, `"stream": false` for one object;
`raw` continues the prompt as text, `suffix` fills in the middle where the model has FIM tokens; an
empty prompt answers `done_reason: "load"` as Ollama does), POST /api/embed and POST /api/embeddings
(the base model's embeddings). Errors are `{"error": "..."}`. `think` (server/thinking.py) switches a
reasoning model's thinking; its reasoning comes in `message.thinking` (chat) or `thinking` (generate).

`options` map onto the engine's parameters: temperature, top_p, top_k, min_p, seed (-1: random),
num_predict (-1/-2 or beyond the context: up to the context), stop (up to 32), repeat_penalty over
repeat_last_n (64 when not sent, as Ollama; -1 the whole context, 0 off; prompt tokens count, as in
llama.cpp). Options that only tune resources (num_ctx, num_thread, num_gpu, ...) are accepted and change
nothing; options that would change the output are honoured or refused with a 400: presence and
frequency penalties must be 0 here (Ollama applies them over the last repeat_last_n tokens, prompt
included; /v1 has OpenAI's definition), mirostat 0, tfs_z and typical_p 1, and an option this list does
not know is refused rather than ignored. Defaults are this server's (greedy), not Ollama's
(temperature 0.8). Any model name is answered by the served model (`--strict-model`: 404 for others).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from eaglechat.engine.protocol import Speculate
from eaglechat.server.core import ServerCore
from eaglechat.server.errors import ApiError, bad, unsupported
from eaglechat.server.reply import Reply
from eaglechat.server.request import ChatRequest, chat_messages, check_model, embedding_inputs, sampling, stop_list
from eaglechat.server.thinking import ollama_think

SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed"}
RESOURCES = {"num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "numa", "use_mmap", "use_mlock",
             "num_thread", "num_keep", "vocab_only", "logits_all", "embedding_only", "f16_kv",
             # Ollama ignores penalize_newline since 0.4; mirostat's knobs do nothing while mirostat is 0
             "penalize_newline", "mirostat_tau", "mirostat_eta"}
NEUTRAL = {"mirostat": 0, "tfs_z": 1, "typical_p": 1}
WINDOWED = ("presence_penalty", "frequency_penalty")  # llama.cpp's: over the last repeat_last_n tokens
OLLAMA_REPEAT_LAST_N = 64  # Ollama's default window for repeat_penalty


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def ollama_params(body: dict, *, max_tokens_limit: int, default_max_tokens: int, default_speculate: Speculate = Speculate.ON,
                  model_defaults: dict | None = None):
    """Ollama's `options` -> (GenerationParams, stop strings); ApiError naming 'options.X'."""
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise bad("options", "'options' must be an object")
    mapped: dict = {}
    for name, value in options.items():
        if value is None or name in RESOURCES:
            continue
        if name in NEUTRAL:
            if value != NEUTRAL[name] or isinstance(value, bool):
                raise unsupported(f"options.{name}", f"it would change the output; send {NEUTRAL[name]} or leave it out")
        elif name in WINDOWED:
            if value != 0 or isinstance(value, bool):
                raise unsupported(f"options.{name}", "Ollama applies it over the last repeat_last_n tokens, the prompt "
                                  "included, which this server does not; send 0 here, or use /v1, where "
                                  f"{name} is OpenAI's (over the generated tokens)")
        elif name in SAMPLING:
            mapped[SAMPLING[name]] = value
        elif name not in ("num_predict", "stop", "repeat_penalty", "repeat_last_n"):
            raise unsupported(f"options.{name}", "an option this server does not know (it is refused rather than ignored)")
    if mapped.get("seed") is not None and isinstance(mapped["seed"], int) and mapped["seed"] < 0:
        mapped.pop("seed")  # Ollama: a negative seed means a random one
    if options.get("repeat_penalty") is not None:
        mapped["repetition_penalty"] = options["repeat_penalty"]
        window = options.get("repeat_last_n")
        mapped["repeat_last_n"] = OLLAMA_REPEAT_LAST_N if window is None else window
    predict = options.get("num_predict")
    if predict is not None:
        if isinstance(predict, bool) or not isinstance(predict, int) or predict == 0 or predict < -2:
            raise bad("options.num_predict", "'num_predict' must be a positive integer, or -1 / -2 (up to the context)")
        mapped["max_tokens"] = max_tokens_limit if predict < 0 else min(predict, max_tokens_limit)
    mapped["speculate"] = body.get("speculate")  # eaglechat's own: true, false, "auto"; absent: the engine's default
    try:
        params = sampling(mapped, max_tokens_limit=max_tokens_limit, default_max_tokens=default_max_tokens,
                          default_speculate=default_speculate, model_defaults=model_defaults)
    except ApiError as exc:
        ollama_name = {"repetition_penalty": "repeat_penalty", "max_tokens": "num_predict"}.get(exc.param, exc.param)
        exc.message = exc.message.replace(f"'{exc.param}'", f"'{ollama_name}'")
        exc.param = f"options.{ollama_name}" if exc.param and exc.param != "speculate" else exc.param
        raise
    stop = options.get("stop")
    if isinstance(stop, list):
        stop = [s for s in stop if s != ""]  # Ollama's clients send empty strings: they stop nothing
    return params, stop_list(stop, "options.stop")


def refuse_unsupported(body: dict) -> None:
    if body.get("format") not in (None, ""):
        raise unsupported("format", "structured output is not supported")
    if body.get("tools"):
        raise unsupported("tools", "tool calls are not supported")
    if body.get("logprobs"):
        raise unsupported("logprobs", "log probabilities are not returned")
    if body.get("images"):
        raise unsupported("images", "text only")
    if body.get("template"):
        raise unsupported("template", "the model's own chat template is used")
    if body.get("context"):
        raise unsupported("context", "send the conversation as /api/chat messages instead")
    stream = body.get("stream", True)
    if stream is not None and not isinstance(stream, bool):
        raise bad("stream", "'stream' must be true or false")


class OllamaReply(Reply):
    """NDJSON lines (or one object): each piece in `message.content` (chat) or `response` (generate);
    the last line has `done: true`, `done_reason` and Ollama's counts and durations (ns)."""

    media_type = "application/x-ndjson"

    def __init__(self, core, job, chat, *, field: str, started: float):
        super().__init__(core, job, chat)
        self.field, self.started_at = field, started
        self.param = "prompt" if field == "response" else "messages"

    def line(self, piece: str, thinking: str = "", **final) -> dict:
        # a reasoning model's thinking in `message.thinking` (chat) or `thinking` (generate), as Ollama sends it
        extra = {"thinking": thinking} if thinking else {}
        if self.field == "message":
            content = {"message": {"role": "assistant", "content": piece, **extra}}
        else:
            content = {"response": piece, **extra}
        return {"model": self.chat.model, "created_at": now_iso(), **content, "done": bool(final), **final}

    def final(self) -> dict:
        prompt, completion = self.counts()
        usage = self.usage_and_metrics()  # counts the request in the server metrics
        stats = self.finished.stats if self.finished else None
        prefill = stats.prefill_s if stats else 0.0
        decode = (stats.elapsed_s - stats.prefill_s) if stats else 0.0
        return {"done_reason": self.finish_reason(), "total_duration": int((time.perf_counter() - self.started_at) * 1e9),
                "load_duration": 0, "prompt_eval_count": prompt, "prompt_eval_duration": int(prefill * 1e9),
                "eval_count": completion, "eval_duration": int(max(0.0, decode) * 1e9),
                "metrics": usage[1]}

    def whole(self, text: str) -> dict:
        return self.line(text, self.reasoning, **self.final())

    async def stream(self):
        try:
            try:
                async for piece in self.pieces():
                    if piece is not None:
                        yield json.dumps(self.line(piece[0], piece[2]), ensure_ascii=False) + "\n"
            except ApiError as exc:
                yield json.dumps({"error": exc.message}) + "\n"
                return
            yield json.dumps(self.line("", **self.final()), ensure_ascii=False) + "\n"
        finally:
            self.end()


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)


class OllamaApi:
    def __init__(self, core: ServerCore):
        self.core = core

    def served(self, body: dict) -> str:
        """The model a request names ('name:latest' is the served 'name'); 404 for any other."""
        name = body.get("model", body.get("name"))
        if isinstance(name, str) and name.endswith(":latest"):
            name = name[: -len(":latest")]
        if name in (None, ""):
            raise bad("model", "'model' is required", code="missing_required_parameter")
        check_model(name, self.core.config.model, self.core.config.aliases, strict=self.core.config.strict_model)
        return self.core.config.model

    # -- what is served ----------------------------------------------------------------------------
    def details(self) -> dict:
        info, engine = self.core.engine.info, self.core.engine
        config = getattr(getattr(engine, "model", None), "config", None)
        family = getattr(config, "model_type", "") or ""
        model = getattr(engine, "model", None)
        count = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else 0
        size = f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M" if count else ""
        level = info.quant.upper() if info.quant not in ("", "none") else info.dtype.upper()
        return {"parent_model": "", "format": "safetensors", "family": family, "families": [family] if family else None,
                "parameter_size": size, "quantization_level": level}

    def entry(self) -> dict:
        name = self.core.config.model
        return {"name": name, "model": name, "size": self.core.engine.info.memory_bytes,
                # no blob store here: the digest names the served model, it hashes no file
                "digest": hashlib.sha256(name.encode()).hexdigest(), "details": self.details()}

    async def root(self, request: Request) -> PlainTextResponse:
        """Ollama answers 'Ollama is running' here; clients probe it before anything else."""
        return PlainTextResponse("eaglechat is running (OpenAI API at /v1, Ollama API at /api)")

    async def version(self, request: Request) -> JSONResponse:
        from eaglechat import __version__

        return JSONResponse({"version": __version__})

    async def tags(self, request: Request) -> JSONResponse:
        self.core.check_key(request)
        return JSONResponse({"models": [{**self.entry(), "modified_at": now_iso()}]})

    async def ps(self, request: Request) -> JSONResponse:
        self.core.check_key(request)
        info = self.core.engine.info
        far = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=3650)).isoformat()
        return JSONResponse({"models": [{**self.entry(), "expires_at": far.replace("+00:00", "Z"),
                                         "size_vram": info.memory_bytes if info.device.startswith("cuda") else 0,
                                         "context_length": info.max_context}]})

    async def show(self, request: Request) -> JSONResponse:
        self.served(await self.core.read_json(request))
        info, engine = self.core.engine.info, self.core.engine
        details = self.details()
        arch = details["family"] or "unknown"
        template = getattr(getattr(engine, "tokenizer", None), "chat_template", None) or ""
        capabilities = ["completion"] + (["insert"] if getattr(engine, "can_fill_in_middle", False) else [])
        capabilities += ["thinking"] if self.core.thinking.capable else []
        return JSONResponse({"modelfile": "", "parameters": "", "template": template if isinstance(template, str) else "",
                             "details": details, "capabilities": capabilities, "modified_at": now_iso(),
                             "model_info": {"general.architecture": arch, f"{arch}.context_length": info.max_context}})

    # -- generation --------------------------------------------------------------------------------
    async def chat(self, request: Request):
        started = time.perf_counter()
        body = await self.core.read_json(request)
        model = self.served(body)
        refuse_unsupported(body)
        for i, m in enumerate(body.get("messages") or []):
            if isinstance(m, dict) and (m.get("images") or m.get("tool_calls")):
                raise unsupported(f"messages[{i}]", "text messages only")
        messages = chat_messages(body)
        params, stops = ollama_params(body, **self.token_limits())
        params.thinking = ollama_think(body, self.core.thinking, model)
        chat = ChatRequest(model=model, messages=messages, params=params, stream=body.get("stream", True) is not False,
                           stops=stops, split_reasoning=self.core.thinking.splits)
        job = await self.core.admit(chat)
        return await OllamaReply(self.core, job, chat, field="message", started=started).respond(request)

    async def generate(self, request: Request):
        started = time.perf_counter()
        body = await self.core.read_json(request)
        model = self.served(body)
        refuse_unsupported(body)
        prompt, suffix, system = body.get("prompt"), body.get("suffix"), body.get("system")
        for name, value in (("prompt", prompt), ("suffix", suffix), ("system", system)):
            if value is not None and not isinstance(value, str):
                raise bad(name, f"'{name}' must be a string")
        params, stops = ollama_params(body, **self.token_limits())
        params.thinking = ollama_think(body, self.core.thinking, model)
        stream = body.get("stream", True) is not False
        if not prompt and not suffix:  # Ollama: an empty prompt loads the model and says so
            return JSONResponse({"model": model, "created_at": now_iso(), "response": "", "done": True,
                                 "done_reason": "load"})
        if body.get("raw") or suffix:
            chat = ChatRequest(model=model, messages=[], params=params, stream=stream, stops=stops,
                               prompt=prompt or "", suffix=suffix or None)
        else:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            chat = ChatRequest(model=model, messages=messages, params=params, stream=stream, stops=stops,
                               split_reasoning=self.core.thinking.splits)
        job = await self.core.admit(chat)
        return await OllamaReply(self.core, job, chat, field="response", started=started).respond(request)

    async def embed(self, request: Request) -> JSONResponse:
        """/api/embed: `input` a text or a list of them -> unit-length `embeddings` (ServerCore.embed)."""
        started = time.perf_counter()
        body = await self.core.read_json(request)
        model = self.served(body)
        truncate = body.get("truncate", True)
        if not isinstance(truncate, bool):
            raise bad("truncate", "'truncate' must be true or false")
        vectors, tokens = await self.core.embed(embedding_inputs(body.get("input")), truncate=truncate)
        if body.get("dimensions") not in (None, len(vectors[0])):
            raise unsupported("dimensions", f"this model's embeddings have {len(vectors[0])} dimensions")
        return JSONResponse({"model": model, "embeddings": vectors, "load_duration": 0, "prompt_eval_count": tokens,
                             "total_duration": int((time.perf_counter() - started) * 1e9)})

    async def embeddings(self, request: Request) -> JSONResponse:
        """/api/embeddings, Ollama's older form: one `prompt` -> one `embedding`."""
        body = await self.core.read_json(request)
        self.served(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad("prompt", "'prompt' must be a string")
        if not prompt:  # Ollama answers an empty prompt with an empty embedding
            return JSONResponse({"embedding": []})
        vectors, _ = await self.core.embed([prompt], param="prompt")
        return JSONResponse({"embedding": vectors[0]})

    def token_limits(self) -> dict:
        limit, default = self.core.limits()
        return {"max_tokens_limit": limit, "default_max_tokens": default, "default_speculate": self.core.default_speculate,
                "model_defaults": self.core.model_sampling}

    def routes(self) -> list[Route]:
        """Under /api."""
        return [
            Route("/version", self.version, methods=["GET"]),
            Route("/tags", self.tags, methods=["GET"]),
            Route("/ps", self.ps, methods=["GET"]),
            Route("/show", self.show, methods=["POST"]),
            Route("/chat", self.chat, methods=["POST"]),
            Route("/generate", self.generate, methods=["POST"]),
            Route("/embed", self.embed, methods=["POST"]),
            Route("/embeddings", self.embeddings, methods=["POST"]),
        ]
