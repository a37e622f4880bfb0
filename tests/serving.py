"""Run an ASGI app on a real uvicorn server on 127.0.0.1 (a free port) in a thread, for the tests;
plus engines that record what the server asked of them."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import uvicorn


@contextlib.contextmanager
def serving(app, header_timeout: float = 10.0):
    """-> base URL (http://127.0.0.1:PORT); the server stops when the block ends. The HTTP protocol is
    the one `eaglechat serve` runs (a deadline on request headers)."""
    from eaglechat.server.http import timed_h11

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2,
                                           http=timed_h11(header_timeout)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class Recording:
    """Wraps an engine: keeps each call's cancel Event and start/end times (to check serialisation)."""

    def __init__(self, engine):
        self.engine = engine
        self.info = engine.info
        self.cancels: list[threading.Event] = []
        self.spans: list[tuple[float, float]] = []
        self.started = threading.Event()

    def generate(self, messages, params, cancel=None):
        self.cancels.append(cancel)
        start = time.monotonic()
        self.started.set()
        try:
            yield from self.engine.generate(messages, params, cancel)
        finally:
            self.spans.append((start, time.monotonic()))


def sse_events(lines) -> list:
    """`data:` payloads of an SSE stream (JSON decoded; "[DONE]" kept as the string)."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out
