"""stdout that remembers a failed write, so a full disk or an I/O error under `eaglechat list > FILE` is told
in one line (and a fault elsewhere, writing a model to the cache say, is not mistaken for it)."""

from __future__ import annotations

import contextlib
import os
import sys


class WatchedStdout:
    """The stream it wraps, with `failed` set to the OSError a write or flush raised (then raised on)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.failed: OSError | None = None

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as exc:
            self.failed = exc
            raise

    def flush(self):
        try:
            return self._stream.flush()
        except OSError as exc:
            self.failed = exc
            raise

    def __getattr__(self, name):  # isatty, fileno, encoding, buffer, ...: the stream's own
        return getattr(self._stream, name)


@contextlib.contextmanager
def watched_stdout():
    """sys.stdout wrapped for the block; restored after, flushed inside it so that a failure at the last
    flush is seen too."""
    stream = sys.stdout
    watched = WatchedStdout(stream)
    sys.stdout = watched
    try:
        yield watched
        if stream is not None:
            watched.flush()
    finally:
        sys.stdout = stream


def silence_stdout() -> None:
    """Point fd 1 at /dev/null: the interpreter's own flush at exit then has nothing left to fail on
    (it printed a second report, 'Exception ignored ... OSError')."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
