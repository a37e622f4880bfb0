"""Counts what decode steps cost the host when they are compiled (tests only): the calls into compiled
code, and the eager aten ops that run between them (each one a kernel launch on a GPU), from the first
compiled call on (prompt reading and the turn's setup come before it).

A TorchDispatchMode sees every aten op that runs eagerly; torch.compile refuses to run under a
non-infra dispatch mode, so the counting compiler steps out of the mode for the compiled call itself
(what runs inside it is one graph: the call is counted instead).
"""

from __future__ import annotations

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes


class StepOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()  # eager aten ops after the first compiled call
        self.calls = 0  # calls into compiled code

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.calls:
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    def compiler(self, backend="eager"):
        """A step compiler (Decoder.compile_steps) whose compiled calls are counted, run outside the mode."""
        def compile_one(fn):
            compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)

            def call(*args, **kwargs):
                self.calls += 1
                with _disable_current_modes():
                    return compiled(*args, **kwargs)
            return call
        return compile_one
