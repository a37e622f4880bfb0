"""Reading a head folder: config.json plus its weights, in any of the layouts the Hugging Face tooling
writes: one `model.safetensors`, one `pytorch_model.bin`, or either sharded with an index
(`model.safetensors.index.json` / `pytorch_model.bin.index.json`, whose "weight_map" names the shard
holding each tensor, as `transformers.modeling_utils` writes them). Pickled files are read with
`torch.load(weights_only=True)`: tensors only, never code.
"""

from __future__ import annotations

import json
import pickle
import re
import warnings
from pathlib import Path

import torch

from eaglechat.errors import WeightsError

SINGLE = ("model.safetensors", "pytorch_model.bin")
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def read_config(head_dir: Path) -> dict:
    cfg_path = head_dir / "config.json"
    if not cfg_path.is_file():
        raise WeightsError(f"draft head folder {head_dir} has no config.json")
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise WeightsError(f"cannot read {cfg_path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise WeightsError(f"head config {cfg_path} must be a JSON object, got a {type(raw).__name__}")
    return raw


def _load_one(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            with warnings.catch_warnings():  # torch's note on unusual pickle protocols: the error below says it
                warnings.simplefilter("ignore")
                state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" not in str(exc):
            raise WeightsError(f"draft head weights {path} are corrupt or truncated (UnpicklingError)") from None
        # torch's weights-only unpickler met something that is not a tensor: a call into Python
        found = re.search(r"GLOBAL (\S+)", str(exc))
        calls = f" (it calls {found.group(1)})" if found else ""
        raise WeightsError(f"draft head weights {path} hold code, not weights{calls}; refused: eaglechat loads tensors only") from None
    except Exception as exc:  # corrupt or truncated file: safetensors/pickle errors vary by version
        raise WeightsError(f"draft head weights {path} are corrupt or truncated ({type(exc).__name__})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise WeightsError(f"draft head weights {path} are not a state dict of tensors")
    return state


def _load_sharded(head_dir: Path, index_path: Path) -> dict[str, torch.Tensor]:
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WeightsError(f"cannot read the shard index {index_path} ({type(exc).__name__})") from None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise WeightsError(f"shard index {index_path} has no weight_map of tensor names to shard files")
    suffix = ".safetensors" if index_path.name.startswith("model.safetensors") else ".bin"
    state: dict[str, torch.Tensor] = {}
    held: dict[str, set[str]] = {}  # shard -> the tensor names it holds
    for shard in sorted(set(weight_map.values())):
        path = head_dir / shard
        if Path(shard).name != shard or not shard.endswith(suffix):  # a bare file name in this folder
            raise WeightsError(f"shard index {index_path} names {shard!r}, not a {suffix} file in the head folder")
        if not path.is_file():
            raise WeightsError(f"draft head shard {path} is missing (named by {index_path.name})")
        part = _load_one(path)
        held[shard] = set(part)
        state.update(part)
    listed, found = set(weight_map), set(state)
    if listed != found:
        key = sorted(listed ^ found)[0]
        where = "lack" if key in listed else "hold unlisted"
        raise WeightsError(f"draft head shards {where} {key} ({index_path.name} and the shards disagree)")
    for key, shard in weight_map.items():  # each tensor where the index says it is
        if key not in held[shard]:
            raise WeightsError(f"shard index {index_path.name} puts {key} in {shard}, which does not hold it")
    return state


def read_weights(head_dir: Path) -> dict[str, torch.Tensor]:
    for name in SINGLE:
        if (head_dir / name).is_file():
            return _load_one(head_dir / name)
    for name in INDEXES:
        if (head_dir / name).is_file():
            return _load_sharded(head_dir, head_dir / name)
    raise WeightsError(f"draft head folder {head_dir} has no model.safetensors or pytorch_model.bin (nor a sharded index)")


def read_head_files(head_dir: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json as read, state dict) of a head folder; each problem is one WeightsError line."""
    head_dir = Path(head_dir)
    raw = read_config(head_dir)
    refuse_a_base_model(raw, head_dir)  # before its weights: a base's are gigabytes
    return raw, read_weights(head_dir)


def refuse_a_base_model(raw: dict, head_dir: Path) -> None:
    """A draft head has one decoder layer (EAGLE-1/2/3 alike); a folder whose config.json has more than two, or
    more than one beside a tokenizer (which heads do not ship), is a base model given where the head goes, and is
    said so, not refused over the first key it has. (A two-layer draft is refused by formats.py, by that key.)"""
    layers = raw.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 2 or "speculators_model_type" in raw:
        return
    tokenizer = any((head_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    if layers > 2 or tokenizer:
        kind = raw.get("model_type") or "transformers"
        raise WeightsError(f"{head_dir} is a base model ({kind}, {layers} layers), not a draft head: give it as the "
                           "model, and --head an EAGLE head folder (one decoder layer)")
