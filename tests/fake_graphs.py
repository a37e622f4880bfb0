"""A stand-in for CUDA-graph capture on a CPU (tests only), passing the same contract as
engine/compile.py `CudaGraphs`:

- `warm(step)` runs the step (it is a real step: its result is used);
- `capture(step, buffers)` leaves the decoder's state as it found it (a real capture runs no kernel): the
  step runs once to record what it does, then every buffer it may change is put back; a buffer the runner
  forgot to list stays changed, and decoding then differs from eager decoding;
- `replay()` does what was captured and leaves the summary in the captured output tensor (the same
  tensor every replay): the step runs again, and must run the very same aten ops on the same shapes,
  else the replay raises (a real graph would silently replay the captured shapes).
`fail` makes every capture raise, as a kernel that cannot be captured does.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpTrace(TorchDispatchMode):
    """The aten ops a call runs, with the shapes of their tensor arguments."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        self.ops.append((str(func), shapes))
        return func(*args, **(kwargs or {}))


class FakeCaptured:
    def __init__(self, step, output: torch.Tensor, ops: list[tuple], owner: "FakeGraphs"):
        self.step, self.output, self.ops, self.owner = step, output, ops, owner

    def replay(self) -> None:
        with OpTrace() as trace:
            out = self.step()
        if trace.ops != self.ops:
            raise AssertionError("a replay ran other ops or shapes than its capture")
        if isinstance(out, torch.Tensor):  # a step's summary (a timed forward may return other things)
            self.output.copy_(out)
        self.owner.replays += 1


class FakeGraphs:
    def __init__(self, fail: Exception | None = None):
        self.fail = fail
        self.captures = 0
        self.replays = 0
        self.warm_ups = 0

    def warm(self, step):
        self.warm_ups += 1
        return step()

    def capture(self, step, buffers: list[torch.Tensor]) -> FakeCaptured:
        if self.fail is not None:
            raise self.fail
        saved = [b.clone() for b in buffers]
        with OpTrace() as trace:
            out = step()
        for buffer, before in zip(buffers, saved):
            buffer.copy_(before)
        self.captures += 1
        return FakeCaptured(step, out.clone() if isinstance(out, torch.Tensor) else out, trace.ops, self)
