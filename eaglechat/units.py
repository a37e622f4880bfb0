"""Byte units: the one GiB constant and the one way bytes are written for people (binary units)."""

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
