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


def config_value(config, name: str, default=None, layer: int | None = None):
    """A transformers model config's `name`, `default` where it is missing or None. On a heterogeneous
    config (transformers' `per_layer_config`: Gemma 4's global layers have their own head_dim and KV head
    count) reading such a value off the whole config raises; it is read from layer `layer` there (None:
    layer 0, whose value is the config's top-level one)."""
    if layer is None:
        try:
            value = getattr(config, name, None)
        except RuntimeError as exc:  # transformers' AmbiguousGlobalPerLayerAttributeError
            if type(exc).__name__ != "AmbiguousGlobalPerLayerAttributeError":
                raise
            value = getattr(config.per_layer_config[0], name, None)
    else:
        layers = getattr(config, "per_layer_config", None)
        value = getattr(layers[layer] if layers is not None else config, name, None)
    return default if value is None else value


def per_layer(config, name: str, default=None) -> list:
    """`config_value` of each of the config's `num_hidden_layers` layers."""
    return [config_value(config, name, default, layer=i) for i in range(int(config.num_hidden_layers))]


def grouped_query(config) -> bool:
    """Some layer has fewer KV heads than query heads (grouped-query attention)."""
    heads = int(config.num_attention_heads)
    return any(kv != heads for kv in per_layer(config, "num_key_value_heads", heads))
