"""What a web page in the user's browser can and cannot do to a server on this machine.

* DNS rebinding (a page's own host name re-pointed at 127.0.0.1) is refused by the Host header: only
  loopback names, IP literals (a page whose address *is* the literal is served by that address, so
  no rebinding is involved), the bound host and `--allow-host` names pass (`*` turns the check off).
* A cross-origin request a browser sends without asking first (a "simple" request: a form or
  text/plain POST) could start a generation; every POST must say `Content-Type: application/json`,
  which a browser only sends cross-origin after a CORS preflight. Ollama's face also takes a POST with
  no Content-Type at all (Ollama parses any body, and litellm's and aider's Ollama clients send none)
  when no browser sent it: no `Origin`, and no `Sec-Fetch-Site` naming another site. (A page's fetch of
  a typeless Blob sends no Content-Type, but always an Origin.)
* CORS: only origins the user allows (`--cors-origin`, `--cors-local-apps`; server/origins.py) get CORS
  headers; a request from any other origin is refused before it reaches a route (so even a GET reveals
  nothing). Both use the same OriginPolicy.

Refusals are 403/415 in the shape of the face the Guard stands in front of (each face of the app has
its own Guard, given that face's `render`: OpenAI's `{"error": {...}}`, Ollama's `{"error": "..."}`).
"""

from __future__ import annotations

import ipaddress
from typing import Callable

from starlette.datastructures import Headers
from starlette.responses import Response

from eaglechat.server.errors import ApiError
from eaglechat.server.origins import OriginPolicy

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

    def __init__(self, app, *, render: Callable[[ApiError], Response], origins: OriginPolicy,
                 allow_hosts: tuple[str, ...] = (), bare_bodies: bool = False):
        self.app, self.render, self.origins = app, render, origins
        self.any_host = "*" in allow_hosts
        self.hosts = {host_name(h) for h in allow_hosts if h != "*"}
        self.bare_bodies = bare_bodies  # a POST without Content-Type, from no browser, is JSON (Ollama's face)

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
        if origin is not None and not self.origins.allows(origin):
            shown = origin.encode("ascii", "backslashreplace").decode()
            return await self.refuse(scope, receive, send, 403, "origin_not_allowed",
                                     f"requests from the web origin '{shown}' are not allowed; start the server "
                                     f"with --cors-origin {shown} to let that page use it")
        if scope["method"] == "POST":
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind != "application/json" and not (self.bare_bodies and self.from_no_browser(headers)):
                return await self.refuse(scope, receive, send, 415, "unsupported_media_type",
                                         "send the body as JSON with 'Content-Type: application/json' (a browser "
                                         "can send other types from any web page, so they are refused)")
        return await self.app(scope, receive, send)

    @staticmethod
    def from_no_browser(headers: Headers) -> bool:
        """No Content-Type, no Origin, no cross-site fetch metadata: no web page sent it."""
        site = headers.get("sec-fetch-site")
        return "content-type" not in headers and "origin" not in headers and site in (None, "none", "same-origin")

    async def refuse(self, scope, receive, send, status: int, code: str, message: str) -> None:
        await self.render(ApiError(status, message, code=code))(scope, receive, send)
