"""Each model's own sampling: the temperature, top-p, top-k and repetition penalty its authors ship, used
wherever the user or the client does not say.

Where they come from, first found wins:
  1. the catalog manifest's `sampling:` (where eaglechat records a choice, e.g. the default model's,
     measured in BENCHMARKS.md);
  2. the base model's `generation_config.json`, read as transformers' GenerationConfig means it: with
     `do_sample: true` its temperature, top_p and top_k (only those it states: transformers would fill an
     absent top_k with 50, vLLM leaves it off, as eaglechat does); without, decoding is greedy and only
     its repetition_penalty applies (transformers applies that one under greedy decoding too).

`fill(params, defaults, given)` is the one place they are applied: the chat and `run` call it where they
build their GenerationParams, and the server calls it for the fields a request left out. An explicit
temperature of 0 is greedy decoding as asked: nothing of the model's is filled in then.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from eaglechat.engine.protocol import GenerationParams

FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty")
LABELS = {"temperature": "temperature", "top_p": "top-p", "top_k": "top-k", "repetition_penalty": "repetition penalty"}


def problem(key: str, value) -> str | None:
    """Why `value` cannot be the sampling field `key` (None: it can)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{key} must be a number, got {value!r}"
    if key == "temperature" and value < 0:
        return f"temperature must be at least 0, got {value!r}"
    if key == "top_p" and not 0 < value <= 1:
        return f"top_p must be in (0, 1], got {value!r}"
    if key == "top_k" and (value < 0 or value != int(value)):
        return f"top_k must be a whole number at least 0, got {value!r}"
    if key == "repetition_penalty" and not 0 < value <= 2:
        return f"repetition_penalty must be in (0, 2], got {value!r}"
    return None


def clean(values: dict) -> dict:
    """The valid sampling fields of `values`, as numbers eaglechat's GenerationParams takes."""
    out = {}
    for key in FIELDS:
        value = values.get(key)
        if value is not None and problem(key, value) is None:
            out[key] = int(value) if key == "top_k" else float(value)
    return out


def from_generation_config(raw) -> dict:
    """The sampling a `generation_config.json` asks for (see the module doc); {} for greedy as is."""
    if not isinstance(raw, dict):
        return {}
    fields = FIELDS if raw.get("do_sample") is True else ("repetition_penalty",)
    out = clean({k: raw.get(k) for k in fields})
    if out.get("top_k") == 0:
        del out["top_k"]  # 0 is "off", eaglechat's default
    if out.get("repetition_penalty") == 1.0:
        del out["repetition_penalty"]
    if raw.get("do_sample") is True and "temperature" not in out:
        out["temperature"] = 1.0  # GenerationConfig's default temperature when sampling
    return out


def read_generation_config(base_dir: Path) -> dict:
    """from_generation_config of the base folder's generation_config.json ({} when absent or unreadable:
    a model's own file never stops it loading)."""
    path = Path(base_dir) / "generation_config.json"
    try:
        return from_generation_config(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def for_model(base_dir: Path | None, manifest=None) -> tuple[dict, str]:
    """(the model's sampling defaults, where they came from: "catalog", "generation_config.json" or "")."""
    own = dict(getattr(manifest, "sampling", None) or {})
    if own:
        return own, "catalog"
    found = read_generation_config(base_dir) if base_dir is not None else {}
    return found, "generation_config.json" if found else ""


def fill(params: GenerationParams, defaults: dict, given) -> GenerationParams:
    """`params` with the model's `defaults` for each sampling field not in `given` (the names of the fields
    the user or client set). A given temperature of 0 asks for greedy decoding: returned as is."""
    given = set(given)
    if "temperature" in given and params.temperature == 0:
        return params
    return replace(params, **{k: v for k, v in clean(defaults or {}).items() if k not in given})


def describe(defaults: dict) -> str:
    """"temperature 0.6, top-p 0.95, top-k 20"; "greedy" (with a repetition penalty, if any) when the model
    does not sample."""
    neutral = {"top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0}  # "off": not worth a word
    values = {k: v for k, v in clean(defaults or {}).items() if neutral.get(k) != v}
    parts = [] if values.get("temperature", 0) > 0 else ["greedy"]
    parts += [f"{LABELS[k]} {values[k]:g}" for k in FIELDS if k in values and not (k == "temperature" and parts)]
    return ", ".join(parts)
