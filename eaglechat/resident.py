"""The resident engine: a local `eaglechat serve` that `run` and the chat use instead of loading a model.

Loading costs seconds (Python, torch and transformers imports, the weights); a server that already
holds the model answers in a fraction of one. While `eaglechat serve` runs, it leaves a small record in
the data folder (paths.resident_dir(), one JSON file per server: URL, pid, the names it answers to and
the load options it was started with) and removes it when it stops. `run MODEL` looks there first
(without importing torch) and attaches when a server:
- answers to MODEL (its served name, an alias, or the same local folder),
- was loaded with the same options this run asks for (--head, --quant, --device, --dtype,
  --max-context, --compile and the tree flags, as given: the same request gives the same engine, so a
  greedy reply is the one a local run would give, token for token),
- holds a draft head when this run speculates, and
- answers GET /v1/models as an eaglechat server serving that model (a stale record, a dead pid or a
  port now used by something else is skipped; a dead pid's record is removed).
Options a request carries (sampling, seed, --max-new-tokens, --speculate, --system) pass through.
`--no-resident` loads locally whatever is running. A server that requires an API key is used only with
the key (--api-key or $EAGLECHAT_API_KEY).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eaglechat.fit.choose import LoadRequest

RECORD_VERSION = 1
PROBE_TIMEOUT_S = 2.0  # a resident engine answers GET /v1/models at once, even while decoding


def load_options(request: LoadRequest) -> dict:
    """What a load was asked for, as the record keeps it (defaults included): equal dicts mean the same
    engine. The tree flags as given; `speculate`: whether the draft head is loaded."""
    return {
        "head": str(Path(request.head).expanduser().resolve()) if request.head else None,
        "quant": request.quant, "device": request.device or "auto", "dtype": request.dtype,
        "max_context": request.max_context, "compile": request.compile, "tree": request.tree_flags(),
        "speculate": request.speculate,
    }


def names_for(model: str) -> list[str]:
    """The names a model argument stands for: itself, and a local folder's absolute path."""
    names = [model]
    path = Path(model).expanduser()
    if path.is_dir():
        names.append(str(path.resolve()))
    return names


def loopback_url(host: str, port: int) -> str:
    """Where this machine reaches a server bound to `host`: a wildcard bind through loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"


class Advertised:
    """`with Advertised(...)`: the record of a running server, written atomically when the model is
    loaded, removed when the server stops."""

    def __init__(self, *, url: str, served: str, names: list[str], request: LoadRequest, api_key_required: bool):
        from eaglechat import __version__, paths

        self.path = paths.resident_dir() / f"{os.getpid()}.json"
        self.record = {"version": RECORD_VERSION, "eaglechat": __version__, "pid": os.getpid(), "url": url,
                       "served": served, "names": sorted(set(names)), "options": load_options(request),
                       "api_key_required": api_key_required, "started": time.time()}

    def __enter__(self):
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self.record, indent=1))
            os.replace(tmp, self.path)
        except OSError:  # a read-only data folder: the server still serves, it just is not found by `run`
            self.path = None
        return self

    def __exit__(self, *exc):
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        return False


@dataclass
class Resident:
    url: str
    served: str
    pid: int
    api_key: str | None

    def describe(self) -> str:
        return f"the resident engine at {self.url.removesuffix('/v1')} (eaglechat serve, pid {self.pid})"


def records() -> list[tuple[Path, dict]]:
    from eaglechat import paths

    try:
        folder = paths.resident_dir()
        files = sorted(folder.glob("*.json"))
    except Exception:  # noqa: BLE001 - an unusable data folder: no resident engine, the local load says why
        return []
    out = []
    for path in files:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("version") == RECORD_VERSION:
            out.append((path, record))
    return out


def pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's (cannot be ours: the folder is private)
        return True
    return True


def find(model: str, request: LoadRequest, api_key: str | None = None) -> Resident | None:
    """A running eaglechat server that serves `model` loaded as `request` asks, checked by a request; None
    when there is none (nothing is loaded or started here)."""
    options = load_options(request)
    wanted = set(names_for(model))
    for path, record in records():
        if not pid_alive(record.get("pid")):
            path.unlink(missing_ok=True)  # the server died without removing it
            continue
        if not wanted & set(record.get("names") or ()) or not compatible(record.get("options") or {}, options):
            continue
        if record.get("api_key_required") and not api_key:
            continue
        url, served = str(record.get("url", "")), str(record.get("served", ""))
        if answers(url, served, api_key if record.get("api_key_required") else None):
            return Resident(url=url, served=served, pid=record["pid"],
                            api_key=api_key if record.get("api_key_required") else None)
    return None


def compatible(resident: dict, wanted: dict) -> bool:
    """The resident was loaded as this run asks; a run that decodes plainly can use one that has a head
    (a request says speculate: false)."""
    same = {k: v for k, v in resident.items() if k != "speculate"} == {k: v for k, v in wanted.items() if k != "speculate"}
    return same and (resident.get("speculate", False) or not wanted.get("speculate", False))


def answers(url: str, served: str, api_key: str | None) -> bool:
    """GET /v1/models names an eaglechat server serving `served`."""
    import httpx

    # UTF-8 bytes: httpx encodes a str header as ASCII (a non-ASCII key was a UnicodeEncodeError)
    headers = {"Authorization": f"Bearer {api_key}".encode("utf-8", "surrogateescape")} if api_key else {}
    try:
        response = httpx.get(f"{url}/models", headers=headers, timeout=PROBE_TIMEOUT_S)
        cards = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return False
    return any(isinstance(c, dict) and c.get("id") == served and c.get("owned_by") == "eaglechat"
               for c in cards or ())


# ------------------------------------------------------------------------------------- keep-alive


def duration(text: str) -> float:
    """An argparse type: 90, 90s, 30m, 2h -> seconds (> 0)."""
    import argparse
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text.lower())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration such as 300, 90s, 30m or 2h, got {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


class IdleWatch:
    """ASGI wrapper that knows how long the server has had no request in flight (a stream counts until
    its last chunk is sent)."""

    def __init__(self, app):
        self.app, self.active, self.last = app, 0, time.monotonic()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # lifespan
            return await self.app(scope, receive, send)
        self.active += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.active -= 1
            self.last = time.monotonic()

    def idle_s(self) -> float:
        return 0.0 if self.active else time.monotonic() - self.last


def stop_when_idle(server, watch: IdleWatch, keep_alive_s: float, say) -> None:
    """A daemon thread that asks the uvicorn `server` to stop once `watch` has been idle `keep_alive_s`."""
    import threading

    def watch_loop():
        while not server.should_exit:
            time.sleep(min(1.0, keep_alive_s / 4))
            if watch.idle_s() >= keep_alive_s:
                say(f"eaglechat: no request for {fmt_duration(keep_alive_s)} (--keep-alive), stopping")
                server.should_exit = True

    threading.Thread(target=watch_loop, name="keep-alive", daemon=True).start()


def fmt_duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
