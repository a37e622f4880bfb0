"""A Hugging Face model folder's config.json, read directly and checked before transformers sees it.

* Remote code never runs. transformers loads a folder whose `model_type` it does not know through the
  folder's own Python files (`auto_map` in config.json / tokenizer_config.json) and, unless told
  `trust_remote_code=False`, asks "Do you wish to run the custom code? [y/N]" on stdin. eaglechat passes
  `trust_remote_code=False` on every load (`NO_REMOTE_CODE`) and refuses such a folder here first, in
  one line, before any prompt could appear.
* A config.json that is not a JSON object, or whose sizes are not positive integers, is one line naming
  the file and the key (transformers would fail later with a division by zero or a pydantic dump).
* Only causal language models chat: transformers maps BERT onto a causal head too (BertLMHeadModel,
  randomly initialized), so a folder whose `architectures` name no causal LM class is refused by name.
* A config whose size is absurd for its weight files (4000 layers over a 135 M-parameter checkpoint) is
  refused before anything is allocated: transformers would build the whole random model first. The
  config's count (layers x (attention + MLP or every expert) + vocabulary) is checked against the
  tensor elements in the safetensors headers (read without loading a tensor), or, for a quantized or
  pickled checkpoint, against the files' bytes at one bit a parameter.
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
    check_causal_lm(raw, path)
    check_size_against_files(raw, Path(folder))
    return raw


def check_causal_lm(raw: dict, path: Path) -> None:
    """The folder holds a causal (decoder) language model: its `architectures` name a class of
    transformers' causal-LM mapping, or, without architectures, its model type has one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = set()
    for names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        causal.update([names] if isinstance(names, str) else names)
    kind = raw.get("model_type")
    archs = raw.get("architectures")
    if isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs):
        if not any(a in causal or a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) for a in archs):
            raise WeightsError(f"{path.parent}: {', '.join(archs)} is not a causal language model "
                               f"({kind or 'model'} folders cannot chat); eaglechat needs a ...ForCausalLM model")
    elif kind is not None and kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise WeightsError(f"{path.parent}: model type {kind!r} has no causal language model in transformers")
    if raw.get("is_encoder_decoder"):
        raise WeightsError(f"{path.parent}: {kind or 'this model'} is an encoder-decoder model; eaglechat needs a "
                           "decoder-only causal language model")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def config_params_floor(raw: dict) -> int:
    """A floor on the parameters the config asks for: per layer at least the query and output
    projections (2 x hidden^2), plus one embedding table. GPT-2 spells the sizes n_embd / n_layer."""
    text = {**(raw.get("text_config") or {}), **raw}

    def size(*keys):
        for key in keys:
            if isinstance(text.get(key), int) and not isinstance(text.get(key), bool):
                return text[key]
        return 0

    hidden, layers = size("hidden_size", "n_embd", "d_model"), size("num_hidden_layers", "n_layer", "num_layers")
    return layers * 2 * hidden * hidden + size("vocab_size") * hidden


def config_params(raw: dict, folder: Path) -> tuple[int, str]:
    """(parameters the config asks for, how they were counted): the planner's count, layers x
    (attention + MLP, or every expert's MLP) + embeddings, when it can read the config; else the floor."""
    from eaglechat.fit.memory import ModelShape

    try:
        shape = ModelShape.from_config_json(Path(folder) / "config.json")
    except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError):
        layers = raw.get("num_hidden_layers") or raw.get("n_layer")
        hidden = raw.get("hidden_size") or raw.get("n_embd")
        return config_params_floor(raw), f"at least; {layers} layers x hidden {hidden}"
    experts = f" x {shape.num_experts} experts" if shape.is_moe else ""
    width = shape.moe_intermediate_size if shape.is_moe else shape.intermediate_size
    return shape.params, (f"{shape.num_layers} layers x hidden {shape.hidden_size} x intermediate {width}{experts}, "
                          f"vocabulary {shape.vocab_size}")


def safetensors_params(files: list[Path]) -> int | None:
    """Tensor elements in safetensors files, from their headers alone (no tensor is read); None when
    a file is not safetensors or its header cannot be read (loading then says why)."""
    import math

    from safetensors import SafetensorError, safe_open

    total = 0
    for path in files:
        if not path.name.endswith(".safetensors"):
            return None
        try:
            with safe_open(str(path), framework="numpy") as f:
                total += sum(math.prod(f.get_slice(key).get_shape()) for key in f.keys())
        except (OSError, SafetensorError, ValueError, TypeError):
            return None
    return total


# a config may count up to this many times the parameters its checkpoint holds: the planner's count
# treats every layer alike (Llama 4 Maverick's MoE layers alternate with dense ones: ~1.9x over)
CLAIM_SLACK = 3
# below this a wrong config costs little to build, and transformers names the problem key by key
CLAIM_FLOOR = 100_000_000


def check_size_against_files(raw: dict, folder: Path) -> None:
    """Refuse a config that asks for far more parameters than its checkpoint holds, before transformers
    allocates them: against the tensor elements in the safetensors headers (a checkpoint that is not
    quantized), else against the weight files' bytes at one bit a parameter (quantized checkpoints go
    down to 2-4 bits)."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.name.endswith(WEIGHT_SUFFIXES)) if folder.is_dir() else []
    try:
        stored = sum(p.stat().st_size for p in files)  # stat follows the HF cache's symlinks
    except OSError:
        return
    if not stored:
        return
    claimed, counted = config_params(raw, folder)
    if claimed <= CLAIM_FLOOR:
        return
    from eaglechat.units import fmt_bytes, fmt_count

    quantized = bool(raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config"))
    safetensors = [p for p in files if p.name.endswith(".safetensors")]
    held = None if quantized or not safetensors else safetensors_params(safetensors)
    if held is not None:
        if claimed <= CLAIM_SLACK * held:
            return
        holds = f"its safetensors headers hold {fmt_count(held)} ({fmt_bytes(stored)})"
    elif claimed <= 8 * stored:
        return
    else:
        holds = f"its weight files hold {fmt_bytes(stored)}, room for {fmt_count(8 * stored)} at one bit each"
    raise WeightsError(f"{folder}/config.json asks for {fmt_count(claimed)} parameters ({counted}) but {holds}; "
                       "the config does not belong to these weights")
