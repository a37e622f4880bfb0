"""One engine, many clients: a single worker thread decodes requests one at a time, in arrival order.

Why one at a time: the engine holds one KV cache and keeps the prefix of the last conversation, so
interleaving requests would only thrash it (batching is what vLLM and SGLang are for). Requests wait
in a bounded queue; beyond it `submit` refuses with 429 and a Retry-After estimated from recent
request times. Each request carries the protocol's cancel Event: a client that goes away sets it,
and the worker skips a cancelled request that has not started or stops the running one after its
current step. Events cross from the worker thread to the event loop with call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time
from dataclasses import dataclass, field

from eaglechat.engine.protocol import Engine, GenerationParams
from eaglechat.server.errors import ApiError

log = logging.getLogger("eaglechat.server")

DONE = object()  # the last item of every job's event queue


@dataclass
class Job:
    messages: list[dict]
    params: GenerationParams
    loop: asyncio.AbstractEventLoop
    prompt: str | None = None  # raw text to continue (engine.complete) instead of messages
    suffix: str | None = None
    embed: list | None = None  # texts (or token-id lists) to embed instead (engine.embed): one result event
    truncate: bool = True  # embed: an input beyond the context is cut, not refused
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)

    def push(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server shutting down): nobody is listening
            self.cancel.set()


class Worker:
    def __init__(self, engine: Engine, *, max_queue: int = 16, on_change=None):
        self.engine = engine
        self.max_queue = max_queue
        self.on_change = on_change or (lambda running, waiting: None)
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._running: Job | None = None
        self._closed = False
        self._durations: collections.deque[float] = collections.deque(maxlen=16)
        self._thread = threading.Thread(target=self._loop, name="eaglechat-engine", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def retry_after(self) -> int:
        """Seconds until a queue slot is likely free: the recent mean request time (at least 1 s)."""
        mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
        return max(1, math.ceil(mean))

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise ApiError(503, "the server is shutting down", type="server_error", code="unavailable",
                               headers={"Retry-After": "5"})
            if len(self._queue) >= self.max_queue:
                raise ApiError(429, f"the server is busy ({len(self._queue)} requests waiting); retry later",
                               type="rate_limit_error", code="queue_full",
                               headers={"Retry-After": str(self.retry_after())})
            self._queue.append(job)
            self._cond.notify()
        self._changed()

    def close(self, timeout: float = 5.0) -> None:
        """Refuse new requests, cancel the waiting and the running ones, wait for the thread."""
        with self._cond:
            self._closed = True
            for job in [*self._queue, *([self._running] if self._running else [])]:
                job.cancel.set()
            self._cond.notify_all()
        self._thread.join(timeout)

    def _changed(self) -> None:
        self.on_change(1 if self._running else 0, len(self._queue))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                job = self._running = self._queue.popleft()
            self._changed()
            start = time.perf_counter()
            try:
                self._run(job)
            finally:
                self._durations.append(time.perf_counter() - start)
                with self._cond:
                    self._running = None
                self._changed()

    def _run(self, job: Job) -> None:
        job.started.set()
        if job.cancel.is_set():  # the client left while queued
            job.push(DONE)
            return
        events = None
        try:
            if job.embed is not None:
                job.push(self.engine.embed(job.embed, truncate=job.truncate))
            elif job.prompt is not None:
                events = self.engine.complete(job.prompt, job.params, job.cancel, suffix=job.suffix)
            else:
                events = self.engine.generate(job.messages, job.params, job.cancel)
            for event in events or ():
                job.push(event)
        except Exception as exc:  # noqa: BLE001 - reported to this client; the server keeps serving
            if not isinstance(exc, ApiError):
                log.warning("request failed: %s", exc, exc_info=not _is_user_error(exc))
            job.push(exc)
        finally:
            if events is not None and hasattr(events, "close"):
                events.close()  # releases the engine's lock even when the loop above broke early
            job.push(DONE)


def _is_user_error(exc: BaseException) -> bool:
    from eaglechat.errors import EaglechatError

    return isinstance(exc, EaglechatError)
