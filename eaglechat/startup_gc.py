"""Python's cyclic garbage collector while a start imports and loads, then out of the way of decoding.

Importing torch and transformers and building a model allocate millions of objects, almost none of them
garbage; with CPython's default thresholds (700, 10, 10) the collector runs full passes over that growing
heap again and again, about 0.2-0.5 s of a 2-core warm start (BENCHMARKS.md, "Start-up without the meta-device reference kernels").
`starting()` makes collections rare for the start; `settled()`, once an engine is loaded, moves every
object alive then into the permanent generation (`gc.freeze()`, as CPython's documentation suggests for
long-lived start-up state) and puts the thresholds back, so later collections scan only what decoding and
serving make. Cyclic garbage is still collected throughout, only less often during the start.
"""

from __future__ import annotations

import gc

STARTING = (50_000, 20, 20)  # a young collection per 50k net allocations instead of 700
_before: list[tuple[int, ...]] = []


def starting() -> None:
    if not _before:
        _before.append(gc.get_threshold())
        gc.set_threshold(*STARTING)


def settled() -> None:
    """The start is over (an engine is loaded): what is alive now stays alive, collections as before."""
    if _before:
        gc.freeze()
        gc.set_threshold(*_before.pop())
