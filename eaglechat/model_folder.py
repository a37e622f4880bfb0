"""A Hugging Face model folder's config.json, read directly and checked before transformers sees it.

* Remote code never runs. transformers loads a folder whose `model_type` it does not know through the
  folder's own Python files (`auto_map` in config.json / tokenizer_config.json) and, unless told
  `trust_remote_code=False`, asks "Do you wish to run the custom code? [y/N]" on stdin. eaglechat passes
  `trust_remote_code=False` on every load (`NO_REMOTE_CODE`) and refuses such a folder here first, in
  one line, before any prompt could appear.
* A config.json that is not a JSON object, or whose sizes are not positive integers, is one line naming
  the file and the key (transformers would fail later with a division by zero or a pydantic dump).
"""

from __future__ import annotations

import json
from pathlib import Path

from eaglechat.errors import WeightsError
from eaglechat.validate import SchemaError, integer

NO_REMOTE_CODE = {"trust_remote_code": False}  # every AutoConfig/AutoTokenizer/AutoModel* call passes it

# positive integers wherever a model config states them (absent or null: transformers' default)
SIZES = {
    "hidden_size": 1 << 20, "intermediate_size": 1 << 22, "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12, "num_hidden_layers": 1 << 12, "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 26, "head_dim": 1 << 16,
}


def read_json_object(path: Path, what: str = "config") -> dict:
    """The JSON object in `path`, or one line naming the file."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WeightsError(f"{path.parent} has no {path.name}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise WeightsError(f"cannot read {what} {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise WeightsError(f"{what} {path} must be a JSON object, got a {type(raw).__name__}")
    return raw


def check_sizes(raw: dict, path: Path, what: str = "config") -> None:
    """Each size the config states (an explicit null included) is a positive integer; a multimodal
    config's text_config is checked the same way."""
    nested = raw.get("text_config")
    if nested is not None and not isinstance(nested, dict):
        raise WeightsError(f"{what} {path}: text_config must be a JSON object, got a {type(nested).__name__}")
    for key, hi in SIZES.items():
        for where, source in (("", raw), ("text_config.", nested or {})):
            if key in source:
                try:
                    integer(source[key], where + key, 1, hi)
                except SchemaError as exc:
                    raise WeightsError(f"{what} {path}: {exc}") from None


def check_base_folder(folder: Path) -> dict:
    """config.json of a base model folder: a JSON object of a model type transformers knows (no code
    of the folder's own), with sane sizes. Returns the parsed config."""
    path = Path(folder) / "config.json"
    raw = read_json_object(path)
    kind = raw.get("model_type")
    if kind is not None and (not isinstance(kind, str) or not kind):
        raise WeightsError(f"config {path}: model_type must name a transformers architecture, got {kind!r}")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if kind not in CONFIG_MAPPING_NAMES:
        if "auto_map" in raw:
            raise WeightsError(
                f"{folder}: model type {kind!r} is not built into transformers and the folder brings its own "
                "Python code for it (auto_map in config.json); eaglechat never runs code from a model folder"
            )
        if kind is not None:
            raise WeightsError(f"config {path}: model type {kind!r} is not known to this transformers")
    check_sizes(raw, path)
    heads, hidden = raw.get("num_attention_heads"), raw.get("hidden_size")
    if heads and hidden and not raw.get("head_dim") and hidden % heads:
        raise WeightsError(f"config {path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    return raw
