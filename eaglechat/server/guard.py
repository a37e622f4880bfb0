"""What a web page in the user's browser can and cannot do to a server on this machine.

* DNS rebinding (a page's own host name re-pointed at 127.0.0.1) is refused by the Host header: only
  loopback names, IP literals (a page whose address *is* the literal is served by that address, so
  no rebinding is involved), the bound host and `--allow-host` names pass (`*` turns the check off).
* A cross-origin request a browser sends without asking first (a "simple" request: a form or
  text/plain POST) could start a generation; every POST must say `Content-Type: application/json`,
  which a browser only sends cross-origin after a CORS preflight.
* CORS: only origins the user names (`--cors-origin`) get CORS headers; a request from any other
  origin is refused before it reaches a route (so even a GET reveals nothing).

Refusals are 403/415 in the shape of the face the Guard stands in front of (each face of the app has
its own Guard, given that face's `render`: OpenAI's `{"error": {...}}`, Ollama's `{"error": "..."}`).
"""

from __future__ import annotations

import ipaddress
from typing import Callable

from starlette.datastructures import Headers
from starlette.responses import Response

from eaglechat.server.errors import ApiError

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def host_name(header: str) -> str:
    """'Example.org:8000' -> 'example.org'; '[::1]:8000' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Guard:
    """ASGI middleware in front of the whole app (CORS headers come from starlette's CORSMiddleware inside it)."""

    def __init__(self, app, *, render: Callable[[ApiError], Response], allow_hosts: tuple[str, ...] = (),
                 cors_origins: tuple[str, ...] = ()):
        self.app, self.render = app, render
        self.any_host = "*" in allow_hosts
        self.hosts = {host_name(h) for h in allow_hosts if h != "*"}
        self.origins = {o.rstrip("/") for o in cors_origins}
        self.any_origin = "*" in self.origins

    def host_allowed(self, name: str) -> bool:
        return (self.any_host or name in self.hosts or name in LOOPBACK_NAMES or name.endswith(".localhost")
                or is_ip(name))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        host = headers.get("host")
        if host is not None and not self.host_allowed(host_name(host)):
            shown = host_name(host).encode("ascii", "backslashreplace").decode()
            return await self.refuse(scope, receive, send, 403, "host_not_allowed",
                                     f"the Host '{shown}' is not allowed (a DNS-rebinding guard); start the server "
                                     f"with --allow-host {shown} to reach it by that name")
        origin = headers.get("origin")
        if origin is not None and not (self.any_origin or origin.rstrip("/") in self.origins):
            shown = origin.encode("ascii", "backslashreplace").decode()
            return await self.refuse(scope, receive, send, 403, "origin_not_allowed",
                                     f"requests from the web origin '{shown}' are not allowed; start the server "
                                     f"with --cors-origin {shown} to let that page use it")
        if scope["method"] == "POST":
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind != "application/json":
                return await self.refuse(scope, receive, send, 415, "unsupported_media_type",
                                         "send the body as JSON with 'Content-Type: application/json' (a browser "
                                         "can send other types from any web page, so they are refused)")
        return await self.app(scope, receive, send)

    async def refuse(self, scope, receive, send, status: int, code: str, message: str) -> None:
        await self.render(ApiError(status, message, code=code))(scope, receive, send)
