"""Typed reads of values from user files (YAML profiles, JSON configs): each check names the key and
shows the bad value in one line; the caller prefixes the file. A leaf module: the engine may use it."""

from __future__ import annotations

import math


class SchemaError(ValueError):
    """`key: problem`; the caller prefixes the file."""


def show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def integer(value, key: str, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"{key} must be an integer, got {show(value)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise SchemaError(f"{key} must be {span}, got {value}")
    return value


def number(value, key: str, lo: float | None = None, hi: float | None = None, *, above: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SchemaError(f"{key} must be a number, got {show(value)}")
    if lo is not None and (value <= lo if above else value < lo):
        raise SchemaError(f"{key} must be {'above' if above else 'at least'} {lo:g}, got {value:g}")
    if hi is not None and value > hi:
        raise SchemaError(f"{key} must be at most {hi:g}, got {value:g}")
    return float(value)


def boolean(value, key: str) -> bool:
    if not isinstance(value, bool):
        raise SchemaError(f"{key} must be true or false, got {show(value)}")
    return value


def text(value, key: str) -> str:
    if not isinstance(value, str):
        raise SchemaError(f"{key} must be text, got {show(value)}")
    return value


def mapping(value, key: str, allowed: tuple[str, ...] | None = None) -> dict:
    if not isinstance(value, dict):
        raise SchemaError(f"{key} must be a mapping, got {show(value)}")
    if allowed is not None:
        unknown = sorted(str(k) for k in value if k not in allowed)
        if unknown:
            raise SchemaError(f"{key} has unknown keys {unknown} (known: {', '.join(allowed)})")
    return value


def listing(value, key: str) -> list:
    if not isinstance(value, list):
        raise SchemaError(f"{key} must be a list, got {show(value)}")
    return value
