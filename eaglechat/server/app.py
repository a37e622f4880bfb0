"""`create_app(engine)`: the HTTP API over any object implementing the Engine protocol, as two faces
over one core (server/core.py: the worker, limits, key, metrics):

* OpenAI's under /v1 (server/openai_api.py) plus vLLM's /tokenize, and GET /health and GET /metrics
  (Prometheus text): errors `{"error": {"message", "type", "param", "code"}}`;
* Ollama's under /api (server/ollama.py) plus GET / (the probe Ollama answers): errors `{"error": "..."}`.

Each face is its own Starlette app with its own exception handlers (an `ApiError` raised anywhere in a
request, a 404 or 405 of its router) and its own Guard (server/guard.py keeps web pages out) and CORS,
so a face's errors always come in its shape. A request is checked (size, messages, prompt tokens)
before it queues for the engine; a request's own mistake is a 4xx, never a 500.
"""

from __future__ import annotations

import contextlib
from typing import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from eaglechat.engine.protocol import Engine
from eaglechat.server import ollama, openai_api
from eaglechat.server.core import ServerConfig, ServerCore
from eaglechat.server.errors import ApiError
from eaglechat.server.guard import Guard
from eaglechat.server.origins import OriginPolicy

HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


class Cors(CORSMiddleware):
    """starlette's CORS with eaglechat's origin rule (the Guard's: normalised, patterns) and Private
    Network Access preflights answered for the allowed origins (a public page's request to this
    machine asks first with `Access-Control-Request-Private-Network: true`)."""

    def __init__(self, app, *, origins: OriginPolicy):
        # the origin is trusted: SDKs add their own headers
        super().__init__(app, allow_origins=["*"] if origins.any else [], allow_methods=["GET", "POST"],
                         allow_headers=["*"], allow_private_network=True, max_age=600)
        self.origins = origins
        if origins.any:  # answer with the origin itself, not "*" (one rule for the Guard and CORS)
            self.allow_all_origins, self.preflight_explicit_allow_origin = False, True
            self.simple_headers.pop("Access-Control-Allow-Origin", None)
            self.preflight_headers.pop("Access-Control-Allow-Origin", None)

    def is_allowed_origin(self, origin: str) -> bool:
        return self.origins.allows(origin)


def face(core: ServerCore, routes: list[Route], render: Callable[[ApiError], Response], *,
         allow_hosts: tuple[str, ...], origins: OriginPolicy, bare_bodies: bool = False) -> Starlette:
    """One face: its routes behind its Guard (and CORS), every error rendered by `render`."""

    async def api_error(request: Request, exc: ApiError) -> Response:
        if not exc.counted:  # a reply's own end is already counted as finished
            core.metrics.reject(exc.status)
        return render(exc)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return render(ApiError(exc.status_code, message, code=HTTP_CODES.get(exc.status_code)))

    middleware = [Middleware(Guard, render=render, origins=origins, allow_hosts=allow_hosts, bare_bodies=bare_bodies)]
    if origins:
        middleware.append(Middleware(Cors, origins=origins))
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={ApiError: api_error, HTTPException: http_error})


def create_app(engine: Engine, *, model: str | None = None, api_key: str | None = None, max_queue: int = 16,
               max_body_bytes: int = 1 << 20, default_max_tokens: int = 1024, aliases: tuple[str, ...] = (),
               allow_hosts: tuple[str, ...] = (), cors_origins: tuple[str, ...] = (), cors_local_apps: bool = False,
               **limits) -> Starlette:
    """The ASGI app serving `engine`; `app.state.server` is the ServerCore (config, metrics, worker).
    `cors_origins`: origins or patterns (server/origins.py); `cors_local_apps`: Ollama's default set too.
    `limits`: the other ServerConfig fields (max_messages, max_prompt_tokens, read_timeout, write_timeout,
    strict_model)."""
    config = ServerConfig(model=model or engine.info.model, api_key=api_key or None, max_queue=max_queue,
                          max_body_bytes=max_body_bytes, default_max_tokens=default_max_tokens, aliases=aliases,
                          **limits)
    core = ServerCore(engine, config)
    oa, ol = openai_api.OpenAiApi(core), ollama.OllamaApi(core)
    guarded = {"allow_hosts": allow_hosts, "origins": OriginPolicy(cors_origins, local_apps=cors_local_apps)}
    rest = [  # the probes and vLLM's /tokenize, with OpenAI's error shape (and every unknown path)
        Route("/", ol.root, methods=["GET"]),
        Route("/tokenize", oa.tokenize, methods=["POST"]),
        Route("/health", core.health, methods=["GET"]),
        Route("/metrics", core.prometheus, methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        core.worker.close()

    app = Starlette(routes=[
        Mount("/v1", face(core, oa.routes(), openai_api.error_response, **guarded)),
        Mount("/api", face(core, ol.routes(), ollama.error_response, bare_bodies=True, **guarded)),
        Mount("", face(core, rest, openai_api.error_response, **guarded)),
    ], lifespan=lifespan)
    app.state.server = core
    return app
