"""Which web origins may call the server: one rule, used by the Guard (a request from any other origin
is refused) and by CORS (the allowed ones get CORS headers and answered preflights), so the two never
disagree.

An origin is compared normalised: scheme and host in lower case, no trailing slash, no default port
(`HTTPS://Chat.Example:443/` is `https://chat.example`). A pattern may hold one `*`: `scheme://*` (any
origin of that scheme, e.g. `chrome-extension://*`), `http://localhost:*` (any port, or none),
`https://*.example.org` (any subdomain); `*` alone allows every origin. `LOCAL_APPS` is Ollama's
default list (its envconfig's AllowedOrigins): this machine's pages on any port and the schemes desktop
app shells use.
"""

from __future__ import annotations

import re

DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}
LOCAL_APPS = (*(f"{scheme}://{host}{port}" for host in ("localhost", "127.0.0.1", "0.0.0.0")
                for scheme in ("http", "https") for port in ("", ":*")),
              "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")


def normalise(origin: str) -> str:
    """'HTTP://LocalHost:80/' -> 'http://localhost'; what is not scheme://host[:port] is only trimmed."""
    origin = origin.strip()
    scheme, sep, rest = origin.partition("://")
    if not sep:
        return origin.lower() if origin.lower() == "null" else origin.rstrip("/")
    scheme, rest = scheme.lower(), rest.lower().rstrip("/")
    host, colon, port = rest.rpartition(":")
    if colon and port == DEFAULT_PORTS.get(scheme) and not host.endswith("["):
        rest = host
    return f"{scheme}://{rest}"


def is_pattern_or_origin(text: str) -> bool:
    """What --cors-origin takes: `*`, or scheme://host[:port] with at most one `*`."""
    if text == "*":
        return True
    scheme, sep, rest = text.rstrip("/").partition("://")
    return bool(scheme and sep and rest and "/" not in rest and text.count("*") <= 1)


def _regex(pattern: str) -> re.Pattern:
    pattern = normalise(pattern)
    if pattern.endswith(":*"):  # any port, or none
        return re.compile(re.escape(pattern[:-2]) + r"(:\d{1,5})?")
    head, _, tail = pattern.partition("*")
    return re.compile(re.escape(head) + r"[^/\s]*" + re.escape(tail))


class OriginPolicy:
    def __init__(self, patterns: tuple[str, ...] = (), *, local_apps: bool = False):
        patterns = tuple(patterns) + (LOCAL_APPS if local_apps else ())
        self.any = "*" in patterns
        self.exact = {normalise(p) for p in patterns if "*" not in p}
        self.wild = [_regex(p) for p in patterns if "*" in p and p != "*"]

    def __bool__(self) -> bool:
        """True when some origin is allowed (CORS is on)."""
        return self.any or bool(self.exact or self.wild)

    def allows(self, origin: str) -> bool:
        if self.any:
            return True
        origin = normalise(origin)
        return origin in self.exact or any(w.fullmatch(origin) for w in self.wild)
