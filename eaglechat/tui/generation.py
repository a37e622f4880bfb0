"""One chat turn on the worker thread: drive the blocking engine iterator into a `TurnBuffer`.

The engine yields a TextDelta per verify step (EAGLE emits bursts of several tokens). Posting each
one to the UI would flood it, and batching on the worker side would hold text back whenever one
step is slow, so the worker only appends to a locked buffer and the UI drains it on a timer
(`DRAIN_HZ`), rendering whatever arrived since the last tick in one Markdown append. The worker
never raises: an engine error becomes a `TurnFailed` (the text produced before it is kept).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from eaglechat.engine.protocol import Finished, GenerationParams, PrefillProgress, TextDelta
from eaglechat.errors import EaglechatError
from eaglechat.tui.stats import TurnNumbers

DRAIN_HZ = 30.0


@dataclass
class TurnChunk:
    text: str
    runs: list[tuple[int, bool]]  # (chars, drafted) runs covering `text`
    numbers: TurnNumbers


@dataclass
class TurnDone:
    finished: Finished
    numbers: TurnNumbers


@dataclass
class TurnFailed:
    error: str
    numbers: TurnNumbers = field(default_factory=TurnNumbers)


def drafted_runs(text: str, drafted: list[bool], token_texts: list[str] | None = None) -> list[tuple[int, bool]]:
    """(chars, drafted) runs covering `text`. With the engine's per-token texts the runs are exact;
    without them (an engine that does not say) the text is split over its tokens in proportion."""
    if not text:
        return []
    if not drafted:
        return [(len(text), False)]
    runs: list[tuple[int, bool]] = []
    if token_texts and len(token_texts) == len(drafted):
        for piece, flag in zip(token_texts, drafted):
            merge_runs(runs, [(len(piece), bool(flag))])
        covered = sum(len(p) for p in token_texts)
        if covered < len(text):
            merge_runs(runs, [(len(text) - covered, False)])
        return runs
    n = len(drafted)
    prev = 0
    for i, flag in enumerate(drafted):
        end = round(len(text) * (i + 1) / n)
        if end > prev:
            merge_runs(runs, [(end - prev, bool(flag))])
        prev = end
    return runs


def merge_runs(into: list[tuple[int, bool]], more: list[tuple[int, bool]]) -> list[tuple[int, bool]]:
    for length, flag in more:
        if length <= 0:
            continue
        if into and into[-1][1] == flag:
            into[-1] = (into[-1][0] + length, flag)
        else:
            into.append((length, flag))
    return into


def describe_error(exc: BaseException) -> str:
    """One line for a notification: our own errors as they are, out-of-memory recognised."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    if isinstance(exc, MemoryError) or "OutOfMemory" in name or "out of memory" in text.lower():
        return f"Out of memory: {text or name}. Try a smaller tree budget, a shorter context or --quant 4bit."
    if isinstance(exc, EaglechatError):
        return text or name
    return f"Engine error ({name}): {text}" if text else f"Engine error ({name})"


class TurnBuffer:
    """Hand-over between the worker (add/finish) and the UI thread (take)."""

    def __init__(self, numbers: TurnNumbers) -> None:
        self._lock = threading.Lock()
        self._text: list[str] = []
        self._runs: list[tuple[int, bool]] = []
        self._numbers = numbers
        self._final: TurnDone | TurnFailed | None = None
        self._start = time.perf_counter()
        self._changed = False  # numbers changed without text (prompt reading progress)

    def add(self, delta: TextDelta) -> None:
        with self._lock:
            self._numbers.add_step(delta.step, len(delta.token_ids))
            if delta.text:
                self._text.append(delta.text)
                merge_runs(self._runs, drafted_runs(delta.text, delta.drafted, getattr(delta, "token_texts", None)))

    def prefill(self, progress: PrefillProgress) -> None:
        with self._lock:
            self._numbers.prefill_done, self._numbers.prefill_total = progress.done, progress.total
            self._numbers.prompt_tokens = progress.prompt_tokens or self._numbers.prompt_tokens
            self._numbers.dropped_messages = progress.dropped_messages
            self._changed = True

    def finish(self, final: TurnDone | TurnFailed) -> None:
        with self._lock:
            self._final = final

    def take(self) -> tuple[TurnChunk | None, TurnDone | TurnFailed | None]:
        """What arrived since the last call, and the end of the turn once it has come."""
        with self._lock:
            chunk = None
            if self._text or self._changed:
                self._changed = False
                self._numbers.elapsed_s = time.perf_counter() - self._start
                chunk = TurnChunk("".join(self._text), list(self._runs),
                                  TurnNumbers(**self._numbers.__dict__))
                self._text.clear()
                self._runs.clear()
            return chunk, self._final

    @property
    def live(self) -> TurnNumbers:
        with self._lock:
            self._numbers.elapsed_s = time.perf_counter() - self._start
            return TurnNumbers(**self._numbers.__dict__)


def run_turn(engine, messages: list[dict], params: GenerationParams, cancel: threading.Event,
             buffer: TurnBuffer) -> None:
    try:
        for event in engine.generate(messages, params, cancel):
            if isinstance(event, TextDelta):
                buffer.add(event)
            elif isinstance(event, PrefillProgress):
                buffer.prefill(event)
            elif isinstance(event, Finished):
                live = buffer.live
                buffer.finish(TurnDone(event, TurnNumbers.from_finished(event.stats, live, event.stop_reason)))
                return
        buffer.finish(TurnFailed("the engine stopped without finishing the reply", buffer.live))
    except BaseException as exc:  # noqa: BLE001 - the app must survive any engine failure
        buffer.finish(TurnFailed(describe_error(exc), buffer.live))
