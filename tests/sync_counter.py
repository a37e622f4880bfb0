"""Counts what makes the host wait for the device (on a GPU) during a CPU run (tests only).

On CPU nothing really waits, so the calls that *would* synchronise on CUDA are counted instead:
- reads: tensor -> Python (`.item()`, `bool()`/`int()`/`float()` of a tensor, indexing with a 0-d tensor,
  all of which reach aten._local_scalar_dense), `.tolist()`, `.cpu()`, `.numpy()`, and ops whose output
  size depends on the data (nonzero, masked_select, boolean-mask indexing, unique,
  repeat_interleave with tensor repeats);
- uploads: `torch.tensor(python data)` (a host-to-device copy on a GPU).
Each event records the innermost eaglechat frame that caused it, so a failing count says where.
"""

from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
DATA_DEPENDENT = {
    aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
    aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default,
    aten.repeat_interleave.Tensor,
}


def _origin() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "eaglechat" in frame.filename and "sync_counter" not in frame.filename:
            return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} {frame.line}"
    return "?"


class SyncCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.phase = "all"
        self.reads: list[tuple[str, str]] = []  # (phase, origin)
        self.uploads: list[tuple[str, str]] = []
        self._patched = []

    def count(self, kind: str, phase: str | None = None) -> int:
        events = self.reads if kind == "reads" else self.uploads
        return sum(1 for p, _ in events if phase is None or p == phase)

    def where(self, kind: str, phase: str) -> list[str]:
        events = self.reads if kind == "reads" else self.uploads
        return [o for p, o in events if p == phase]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in DATA_DEPENDENT:
            self.reads.append((self.phase, _origin()))
        elif func is aten.index.Tensor and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or [])):
            self.reads.append((self.phase, _origin()))
        return func(*args, **(kwargs or {}))

    def _patch(self, owner, name, kind):
        original = getattr(owner, name)
        events = self.reads if kind == "reads" else self.uploads

        def wrapper(*args, **kwargs):
            events.append((self.phase, _origin()))
            return original(*args, **kwargs)

        setattr(owner, name, wrapper)
        self._patched.append((owner, name, original))

    def __enter__(self):
        for name in ("tolist", "cpu", "numpy"):
            self._patch(torch.Tensor, name, "reads")
        self._patch(torch, "tensor", "uploads")
        return super().__enter__()

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched.clear()
        return super().__exit__(*exc)


def count_decode(decoder, prompt, params, budget, stop=()):
    """Run a generation under the counter, separating prefill from the decode steps. -> (counter, tokens)."""
    counter = SyncCounter()
    read_prompt = decoder.read_prompt

    def marked(*args, **kwargs):  # the prompt-reading generator, counted as "prefill" while it runs
        chunks = read_prompt(*args, **kwargs)
        while True:
            counter.phase = "prefill"
            try:
                report = next(chunks)
            except StopIteration as end:
                return end.value
            finally:
                counter.phase = "decode"
            yield report

    decoder.read_prompt = marked
    try:
        with counter:
            tokens = [t for s in decoder.generate(prompt, params, budget, set(stop)) for t in s.tokens]
    finally:
        del decoder.read_prompt
    return counter, tokens
