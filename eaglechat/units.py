"""Byte units: the one GiB constant and the one way bytes are written for people (binary units);
parameter counts as people write them (135 M, 14.2 B)."""

from __future__ import annotations

KiB = 1024
MiB = 1024**2
GiB = 1024**3


def fmt_bytes(n: float | None) -> str:
    """12 B, 3 KiB, 300 MiB, 1.4 GiB; "?" when unknown. Memory and downloads alike, in binary units."""
    if n is None:
        return "?"
    size = abs(n)
    if size < KiB:
        return f"{n:.0f} B"
    if size < MiB:
        return f"{n / KiB:.0f} KiB"
    if size < GiB:
        return f"{n / MiB:.0f} MiB"
    return f"{n / GiB:.1f} GiB"


def fmt_count(n: int) -> str:
    """A parameter count: 152 K, 135 M, 14.2 B (decimal, as model sizes are named)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return str(n)
