"""One request's engine events -> what the client reads: the text pieces in order (stop strings
applied), the finish reason, usage and speculation metrics. The wire formats (OpenAI's chat and
completions in server/openai_api.py, Ollama's in server/ollama.py) are thin subclasses.

A streamed reply is sent through `TimedStreamingResponse`: a client that stops reading for
`write_timeout` seconds cancels its generation (counted in /metrics), so nobody holds the engine for a
whole max_tokens without reading it. "Stops reading" is measured by what the client's TCP acknowledges
(server/http.py), not by a blocked send: on loopback a send blocks only after megabytes are buffered,
which a whole long reply can fit in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from eaglechat.chat.reasoning import ReasoningStream
from eaglechat.engine.protocol import Finished, StopReason, TextDelta
from eaglechat.server.errors import ApiError, engine_error
from eaglechat.server.metrics import RequestTally, eaglechat_metrics
from eaglechat.server.request import ChatRequest
from eaglechat.server.stops import StopScanner
from eaglechat.server.worker import DONE, Job

log = logging.getLogger("eaglechat.server")

KEEPALIVE_S = 2.0  # an SSE comment while a request waits in the queue (keeps proxies from timing out)
# the engine's StopReason -> the OpenAI finish_reason (a reply cut by the context or memory ran out of room)
FINISH_REASONS = {StopReason.STOP: "stop", StopReason.LENGTH: "length", StopReason.CONTEXT: "length",
                  StopReason.OOM: "length"}


class TimedStreamingResponse(StreamingResponse):
    """A StreamingResponse that notices a client that stopped reading: written bytes left unacknowledged
    by the client's TCP for `write_timeout` seconds (where the HTTP protocol reports it,
    `extensions["eaglechat.reader_progress"]`), or any one send blocked that long. Then `on_timeout()`
    runs once (it cancels the generation); a blocked send also ends the response unfinished."""

    def __init__(self, content, *, write_timeout: float, on_timeout, **kwargs):
        super().__init__(content, **kwargs)
        self.write_timeout, self.on_timeout = write_timeout, on_timeout
        self.progress = None
        self.timed_out = False

    async def __call__(self, scope, receive, send) -> None:
        self.progress = scope.get("extensions", {}).get("eaglechat.reader_progress")
        await super().__call__(scope, receive, send)

    def time_out(self) -> None:
        if not self.timed_out:
            self.timed_out = True
            self.on_timeout()

    async def watch_reader(self) -> None:
        """Returns (after `time_out`) once unacknowledged bytes have waited write_timeout seconds."""
        poll = min(1.0, self.write_timeout / 4)
        last, since = None, time.monotonic()
        while True:
            await asyncio.sleep(poll)
            acked, pending = self.progress()
            now = time.monotonic()
            if pending == 0 or acked != last:  # all read, or reading: the clock starts again
                last, since = acked, now
            elif now - since >= self.write_timeout:
                self.time_out()
                return

    async def stream_response(self, send) -> None:
        async def timed(message) -> None:
            try:
                await asyncio.wait_for(send(message), self.write_timeout)
            except asyncio.TimeoutError:
                self.time_out()
                raise
        watcher = asyncio.create_task(self.watch_reader()) if self.progress is not None else None
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await super().stream_response(timed)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await watcher


class Reply:
    """The format-independent part: events -> text pieces, finish reason, usage."""

    prefix = "chatcmpl"
    param = "messages"  # what an engine's complaint about the input names

    def __init__(self, core, job: Job, chat: ChatRequest):
        self.core, self.job, self.chat = core, job, chat
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.scanner = StopScanner(chat.stops)
        self.tally = RequestTally(tree_total=core.engine.info.tree.total_tokens)
        self.finished: Finished | None = None
        self.observed = False  # counted in the server metrics (once per request)
        self.buffered: list = []  # the first engine event, read before the response started
        self.pending_ids: list[int] = []  # token ids (and drafted flags) not yet sent with their text
        self.pending_drafted: list[bool] = []
        # with return_token_ids and no stop strings, each engine step is one chunk carrying its ids,
        # drafted flags, per-token texts and step stats (what a RemoteEngine needs to be exact)
        self.per_step = chat.return_token_ids and not chat.stops
        # a reasoning model's <think> block kept apart from the answer (not with return_token_ids: the text
        # sent there is what the ids spell, which a RemoteEngine splits itself)
        self.splitter = (ReasoningStream(chat.reasoning_opened) if chat.split_reasoning and not chat.return_token_ids
                         else None)
        self.reasoning = ""  # the whole reasoning so far

    def observe(self, reason: str, *args) -> None:
        if not self.observed:
            self.observed = True
            self.core.metrics.observe(reason, *args)

    @contextlib.asynccontextmanager
    async def cancelled_on_disconnect(self, request: Request):
        """While the response has not started, nothing else listens: watch for the client leaving."""
        async def watch():
            while (await request.receive())["type"] != "http.disconnect":
                pass
            self.job.cancel.set()

        watcher = asyncio.create_task(watch())
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    def failed(self, reason: str, error: ApiError) -> ApiError:
        """`error` ends this request: counted as finished with `reason`, not as a refusal."""
        self.observe(reason)
        error.counted = True
        return error

    async def started(self, request: Request) -> None:
        """Wait for the engine's first event, so an error before any output (a prompt beyond the
        context) is an HTTP error, not an event inside a 200 stream."""
        async with self.cancelled_on_disconnect(request):
            item = await self.job.events.get()
        if isinstance(item, BaseException):
            raise self.failed("error", engine_error(item, self.param))
        if item is DONE:
            raise self.failed("cancelled", ApiError(499, "client closed the request", code="cancelled"))
        self.buffered.append(item)

    def take_ids(self) -> dict:
        """With return_token_ids: the ids that arrived since the last chunk, for the chunk's choice."""
        if not self.chat.return_token_ids:
            return {}
        out = {"token_ids": self.pending_ids, "drafted": self.pending_drafted}
        self.pending_ids, self.pending_drafted = [], []
        return out

    def split(self, text: str, end: bool = False) -> tuple[str, str]:
        """Released text -> (reasoning, answer); `end`: the reply is over, nothing more is held."""
        if self.splitter is None:
            return "", text
        reasoning, answer = self.splitter.feed(text)
        if end:
            more = self.splitter.flush()
            reasoning, answer = reasoning + more[0], answer + more[1]
        self.reasoning += reasoning
        return reasoning, answer

    async def pieces(self):
        """(answer text, extra choice fields, reasoning text) to send, in order; None while the engine is
        quiet (time for a keep-alive). Raises ApiError when the engine fails."""
        while True:
            if self.buffered:
                item = self.buffered.pop(0)
            else:
                try:
                    item = await asyncio.wait_for(self.job.events.get(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield None
                    continue
            if item is DONE:
                break
            if isinstance(item, BaseException):
                raise self.failed("error", engine_error(item, self.param))
            if isinstance(item, Finished):
                self.finished = item
            if not isinstance(item, TextDelta):
                continue  # PrefillProgress: nothing to send
            self.tally.add(item.step)
            if self.per_step:
                step = None if item.step is None else item.step.to_dict()
                yield item.text, {"token_ids": item.token_ids, "drafted": item.drafted,
                                  "eaglechat": {"step": step, "token_texts": item.token_texts}}, ""
                continue
            self.pending_ids += item.token_ids
            self.pending_drafted += item.drafted
            text = self.scanner.feed(item.text)
            if self.scanner.stopped:
                self.job.cancel.set()  # a stop string ended the reply: the engine stops after this step
            reasoning, text = self.split(text) if text else ("", "")
            for piece in self.apart(reasoning, text):
                yield piece
        for piece in self.apart(*self.split(self.scanner.flush(), end=True)):
            yield piece

    def apart(self, reasoning: str, text: str) -> list[tuple]:
        """The pieces to send for a step's reasoning and answer: one piece each, the reasoning first (a
        client that reads a chunk as either thinking or answer, as litellm's Ollama stream does, loses
        neither)."""
        out = [("", {}, reasoning)] if reasoning else []
        if text:
            out.append((text, self.take_ids(), ""))
        return out

    async def text(self, request: Request) -> str:
        """The whole reply (a non-streamed response); ApiError when the engine failed or the client left."""
        async with self.cancelled_on_disconnect(request):
            parts = [piece[0] async for piece in self.pieces() if piece]
        if self.finished is None or (self.finished.stop_reason == StopReason.CANCELLED and not self.scanner.stopped):
            raise self.failed("cancelled", ApiError(499, "client closed the request", code="cancelled"))
        return "".join(parts)

    def finish_reason(self) -> str:
        if self.scanner.stopped:
            return "stop"
        return FINISH_REASONS.get(self.finished.stop_reason if self.finished else "", "stop")

    def counts(self) -> tuple[int, int]:
        """(prompt tokens, completion tokens)"""
        stats = self.finished.stats if self.finished else None
        if stats is None:
            return 0, 0
        return stats.prompt_tokens or stats.prefill_tokens + stats.reused_tokens, len(self.finished.token_ids)

    def usage_and_metrics(self) -> tuple[dict, dict]:
        stats = self.finished.stats if self.finished else None
        if stats is None:
            return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, {}
        prompt, completion = self.counts()
        spec = self.tally.speculative_decoding(stats)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        if stats.reused_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": stats.reused_tokens}
        self.observe(self.finish_reason(), prompt, completion, spec)
        return usage, {"speculative_decoding": spec, "eaglechat": eaglechat_metrics(stats)}

    def end(self) -> None:
        """The response is over (sent, failed or abandoned): the engine must not decode for nobody."""
        self.observe("cancelled")  # no-op when the request was already counted
        self.job.cancel.set()

    def write_timed_out(self) -> None:
        log.warning("a client stopped reading its stream for %.0f s: its generation is cancelled",
                    self.core.config.write_timeout)
        self.core.metrics.write_timeouts += 1
        self.end()

    def streaming_response(self, body, media_type: str) -> TimedStreamingResponse:
        return TimedStreamingResponse(body, media_type=media_type, write_timeout=self.core.config.write_timeout,
                                      on_timeout=self.write_timed_out,
                                      headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def respond(self, request: Request):
        """The HTTP response: whole, or streamed once the engine's first event is in (an error before
        that raises ApiError, which the face's handler renders)."""
        if not self.chat.stream:
            return JSONResponse(self.whole(await self.text(request)))
        await self.started(request)
        return self.streaming_response(self.stream(), self.media_type)

    # -- a wire format -------------------------------------------------------------------------------
    media_type = "application/json"

    def whole(self, text: str) -> dict:
        """The whole reply as one JSON object."""
        raise NotImplementedError

    def stream(self):
        """The streamed reply: an async iterator of str (it calls `end()` when it stops)."""
        raise NotImplementedError
