"""One chat turn on the worker thread: drive the blocking engine iterator, hand the UI batches.

The engine yields a TextDelta per verify step (EAGLE emits bursts of several tokens). Posting each
one would flood the UI, so deltas are merged and handed over at most `FLUSH_HZ` times a second,
together with the running numbers for the status bar. The function never raises: an engine error
becomes a `TurnFailed` (the text produced before it is kept).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from eaglechat.engine.protocol import Finished, GenerationParams, TextDelta
from eaglechat.errors import EaglechatError
from eaglechat.tui.stats import TurnNumbers

FLUSH_HZ = 30.0


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


def drafted_runs(text: str, drafted: list[bool]) -> list[tuple[int, bool]]:
    """Split `text` over its tokens in proportion (the delta does not say where each token's text
    starts) and mark the characters of drafted tokens. Exact when a delta holds one token."""
    if not text:
        return []
    if not drafted:
        return [(len(text), False)]
    runs: list[tuple[int, bool]] = []
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


def run_turn(engine, messages: list[dict], params: GenerationParams, cancel: threading.Event,
             post: Callable[[object], None], *, depth: int = 0, flush_hz: float = FLUSH_HZ) -> None:
    numbers = TurnNumbers(speculate=params.speculate, depth=depth)
    start = time.perf_counter()
    last_flush = start
    text: list[str] = []
    runs: list[tuple[int, bool]] = []

    def flush() -> None:
        nonlocal last_flush
        numbers.elapsed_s = time.perf_counter() - start
        if text:
            snapshot = TurnNumbers(**{k: v for k, v in numbers.__dict__.items()})
            post(TurnChunk("".join(text), list(runs), snapshot))
            text.clear()
            runs.clear()
        last_flush = time.perf_counter()

    try:
        for event in engine.generate(messages, params, cancel):
            if isinstance(event, TextDelta):
                numbers.add_step(event.step, len(event.token_ids))
                if event.text:
                    text.append(event.text)
                    merge_runs(runs, drafted_runs(event.text, event.drafted))
                if time.perf_counter() - last_flush >= 1.0 / flush_hz:
                    flush()
            elif isinstance(event, Finished):
                flush()
                numbers.elapsed_s = time.perf_counter() - start
                post(TurnDone(event, TurnNumbers.from_finished(event.stats, numbers, event.stop_reason)))
                return
        flush()  # an iterator that ended without Finished: treat what came as the reply
        post(TurnFailed("the engine stopped without finishing the reply", numbers))
    except BaseException as exc:  # noqa: BLE001 - the app must survive any engine failure
        try:
            flush()
        except Exception:  # pragma: no cover
            pass
        post(TurnFailed(describe_error(exc), numbers))
