"""Stop strings for a streamed reply: text is released only once no stop string can still begin in it."""

from __future__ import annotations


class StopScanner:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1  # a stop may straddle two deltas
        self.text = ""
        self.sent = 0
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Add a delta; return the text that is now safe to send (cut before a stop string, if one appeared)."""
        if self.stopped:
            return ""
        self.text += delta
        start = max(0, self.sent - self.hold)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self.text = self.text[: min(hits)]
            return self.flush()
        safe = len(self.text) - self.hold
        if safe <= self.sent:
            return ""
        out, self.sent = self.text[self.sent:safe], safe
        return out

    def flush(self) -> str:
        out, self.sent = self.text[self.sent:], len(self.text)
        return out
