"""`speculate="auto"`: speculation only where this machine measures it faster than plain decoding.

Both modes emit exactly the same tokens (greedy: token for token; sampling: the same distribution), so
the engine may switch between them at any step. The chooser runs the two modes interleaved for a few
steps (A B A B: load changes hit both alike), keeps the faster by the median tokens per second of its
recent steps, and probes the other mode again every `recheck` steps, so a change of load (another
program on the CPU, a thermal limit) is noticed. Its state lasts across turns.
"""

from __future__ import annotations

import statistics
from collections import deque


class SpeculationChooser:
    def __init__(self, probe: int = 4, recheck: int = 64, window: int = 8):
        self.probe, self.recheck = probe, recheck
        self.rates = {True: deque(maxlen=window), False: deque(maxlen=window)}  # tokens/s of recent steps
        self.choice = True
        self.queue: list[bool] = [m for _ in range(probe) for m in (True, False)]  # steps still to probe
        self.since = 0  # steps since the last probe ended
        self.ratio: float | None = None  # EAGLE tokens/s over plain's when the choice was made

    def next(self) -> bool:
        """The mode of the next step (True: speculative)."""
        if self.queue:
            return self.queue[0]
        if self.since >= self.recheck:  # a fresh probe: the load may have changed since the last one
            self.queue = [m for _ in range(self.probe) for m in (not self.choice, self.choice)]
            for samples in self.rates.values():
                samples.clear()
            return self.queue[0]
        return self.choice

    def record(self, speculate: bool, tokens: int, seconds: float) -> None:
        """What a step of that mode produced, in how long."""
        if seconds > 0:
            self.rates[speculate].append(tokens / seconds)
        if self.queue and self.queue[0] == speculate:
            self.queue.pop(0)
            if not self.queue:
                self.since = 0
                self.choice = self._faster()
        else:
            self.since += 1

    def rate(self, speculate: bool) -> float | None:
        samples = self.rates[speculate]
        return statistics.median(samples) if samples else None

    def _faster(self) -> bool:
        on, off = self.rate(True), self.rate(False)
        if on is None or off is None:
            return on is not None
        self.ratio = on / off if off > 0 else None
        return on > off

    def label(self) -> str:
        """For the status bar: 'auto: on 1.4x' (EAGLE over plain, as measured), 'auto: off 0.7x', 'auto'."""
        if self.ratio is None:
            return "auto"
        return f"auto: {'on' if self.choice else 'off'} {self.ratio:.1f}x"
