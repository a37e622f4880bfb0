"""Published head formats, read into eaglechat's own layout (or refused in one line naming the key).

eaglechat's own layout is the official EAGLE one (SafeAILab/EAGLE: a LlamaConfig-style config.json;
`fc`, `layers.0.*` / `midlayer.*`, `norm`, `lm_head`, `d2t`/`t2d` keys) plus the keys SpecForge
(sgl-project/SpecForge, `specforge/modeling/draft/llama3_eagle.py`) adds for EAGLE-3. Formats read:

- official EAGLE-1/2 and EAGLE-3 folders, and SpecForge output: the same layout. SpecForge's extras:
  `eagle_config.eagle_aux_hidden_state_layer_ids` are the base layers whose *outputs* feed the head
  (SpecForge hooks `layers[i]`'s output; SGLang's `set_eagle3_layers_to_capture` adds 1 to capture
  them as the next layer's input), i.e. transformers hidden_states index i + 1. `fc_norm` (one RMSNorm
  per fused feature before fc), `norm_output` (false: logits = lm_head(h) without the final norm).
  `norm_before_residual` (vLLM `llama_eagle3.py`: the residual is the normed hidden) and `norm_before_fc`
  (one RMSNorm over the concatenated features, key `input_norm.weight`) as vLLM/SGLang read them.
  A top-level `eagle_aux_hidden_state_layer_ids` in such a config is read as SGLang reads it
  (sgl-project/sglang#25454): layer outputs when the first id is 1, hidden-state indices otherwise.
- the `speculators` format (vllm-project/speculators): `speculators_model_type` "eagle3"
  (`models/eagle3/config.py`, `core.py`, `model_definitions.py`) or "eagle" (EAGLE-1/HASS,
  `convert/eagle/eagle_legacy_model.py`), the draft layer described by a nested
  `transformer_layer_config` that carries only non-default values (`to_diff_dict`), so it is rebuilt
  with its transformers config class for the defaults. Its `eagle_aux_hidden_state_layer_ids` are
  hidden-state indices (speculators' default [2, N//2, N-3]; `launch_vllm.py` adds N for the last
  layer's output). `norm_output` there means Eagle 3.1: the normed hidden is what is fed back.
  Keys `layers.0.*` (EAGLE-3) and `fusion_fc.*` / `transformer.*` (EAGLE-1) become the official ones.

Every config key is either understood (it shapes the computation and is read) or listed as harmless
(metadata, training-only settings); any other key is refused rather than ignored.
"""

from __future__ import annotations

from eaglechat.errors import WeightsError

# -- the keys of an official / SpecForge / eaglechat config.json ----------------------------------

UNDERSTOOD = {
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size", "head_dim",
    "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
    "bias", "qkv_bias", "attention_bias", "mlp_bias", "qk_norm", "hidden_act", "num_hidden_layers",
    "draft_vocab_size", "target_hidden_size", "eagle_config", "eagle_aux_hidden_state_layer_ids",
    "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "norm_feedback", "layernorms",
    "tie_word_embeddings", "use_sliding_window", "sliding_window", "layer_types", "architectures", "model_type",
    "embed_scale",
}
# metadata or training/serving settings that do not change what a draft step computes
HARMLESS = {
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "attention_dropout", "torch_dtype",
    "dtype", "transformers_version", "use_cache", "_name_or_path", "max_window_layers", "pretraining_tp",
    "output_attentions", "output_hidden_states", "return_dict", "use_return_dict", "is_encoder_decoder",
    "tie_encoder_decoder", "chunk_size_feed_forward", "_attn_implementation_autoset", "keys_to_ignore_at_inference",
    "target_model_type",  # SpecForge: which base the head was trained for (configs/gemma3-1b-eagle3.json)
    # MoE settings left in configs copied from a MoE base; the draft layer is a dense Llama layer
    "decoder_sparse_step", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
    "output_router_logits", "router_aux_loss_coef", "mlp_only_layers",
}
EAGLE_CONFIG_KEYS = {"eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state"}

# -- the speculators format ----------------------------------------------------------------------

SPECULATORS_UNDERSTOOD = {
    "speculators_model_type", "transformer_layer_config", "draft_vocab_size", "norm_before_residual",
    "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "norm_before_fc", "fc_norm", "norm_output",
    "layernorms", "fusion_bias", "transformer_layer_architecture", "architectures", "model_type", "tie_word_embeddings",
}
SPECULATORS_HARMLESS = {  # training flags, the proposal method and verifier name, versions
    "embed_requires_grad", "speculators_config", "speculators_version", "has_no_defaults_at_init", "auto_map",
} | HARMLESS  # the PretrainedConfig fields its to_diff_dict may write
LAYER_UNDERSTOOD = {
    "model_type", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "vocab_size", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
    "attention_bias", "mlp_bias", "hidden_act", "num_hidden_layers", "tie_word_embeddings", "use_sliding_window",
    "sliding_window", "layer_types", "architectures",
}
LAYER_HARMLESS = HARMLESS
# qwen3_moe: a config copied from a Qwen3-MoE base; the draft layer itself is dense (its MoE keys are harmless,
# expert weights in the checkpoint are refused as unexpected), with q/k norms where the checkpoint has them
LAYER_TYPES = {"eagle3": ("llama", "qwen3", "qwen3_moe"), "eagle": ("llama", "qwen2", "qwen3")}
# EAGLE-1 decoder-layer class names speculators' `transformer_layer_architecture` may give
DECODER_CLASSES = {"auto", "LlamaDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"}
DROPPED = ("verifier_lm_head.weight", "verifier_norm.weight")  # the verifier's frozen copies, for the training loss


def _refuse(where: str, key: str, why: str = "is not understood by eaglechat (refused rather than ignored)"):
    raise WeightsError(f"head config {where}: {key} {why}")


def _bool(value, key: str, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        _refuse(where, key, f"must be true or false, got {value!r}")
    return value


def _ids(value, key: str, where: str) -> list[int]:
    if (not isinstance(value, list) or not value or len(value) > 64
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 16 for i in value)):
        _refuse(where, key, f"must be a non-empty list of layer numbers, got {value!r}")
    return list(value)


def is_speculators(raw: dict) -> bool:
    return "speculators_model_type" in raw


def normalize(raw: dict, state: dict, where: str) -> tuple[dict, dict]:
    """(config, state) of any published layout -> eaglechat's own layout, or one WeightsError line."""
    if is_speculators(raw):
        return _from_speculators(raw, dict(state), where)
    out = _official(raw, where)
    # SafeAILab/EAGLE and SpecForge build their draft projections with bias=False whatever a copied
    # LlamaConfig says: the checkpoint tells whether attention_bias / mlp_bias biases exist
    for key, probe in (("attention_bias", "self_attn.o_proj.bias"), ("mlp_bias", "mlp.down_proj.bias")):
        if out.get(key) and not any(k.endswith(probe) for k in state):
            out[key] = False
    return out, state


def _official(raw: dict, where: str) -> dict:
    for key in raw:
        if key not in UNDERSTOOD and key not in HARMLESS:
            _refuse(where, key)
    out = dict(raw)
    act = raw.get("hidden_act")
    if act not in (None, "silu"):
        _refuse(where, "hidden_act", f"{act!r} is not supported (silu only)")
    layers = raw.get("num_hidden_layers")
    if layers not in (None, 1):
        _refuse(where, "num_hidden_layers", f"{layers!r}: eaglechat's draft heads have one decoder layer")
    types = raw.get("layer_types")
    if types is not None and (not isinstance(types, list) or not all(isinstance(t, str) for t in types)):
        _refuse(where, "layer_types", f"must be a list of layer type names, got {types!r}")
    if _bool(raw.get("use_sliding_window"), "use_sliding_window", where) or "sliding_attention" in (types or []):
        _refuse(where, "use_sliding_window", "asks for sliding-window draft attention, which eaglechat does not implement")
    for key in ("bias", "qkv_bias", "attention_bias", "mlp_bias", "qk_norm", "norm_before_residual", "norm_before_fc",
                "fc_norm", "norm_feedback", "layernorms", "tie_word_embeddings"):
        if key in raw:
            _bool(raw[key], key, where)
    if raw.get("norm_output") is not None:
        _bool(raw["norm_output"], "norm_output", where)
    if raw.get("norm_before_fc") and raw.get("fc_norm"):
        _refuse(where, "norm_before_fc", "and fc_norm are mutually exclusive")
    if raw.get("norm_feedback") and raw.get("norm_output") is False:
        _refuse(where, "norm_feedback", "needs the final norm, which norm_output: false removes")
    _rope_parameters(out, where)
    # aux layers: to SpecForge's spelling (eagle_config, layer outputs)
    nested = raw.get("eagle_config")
    if nested is not None:
        if not isinstance(nested, dict):
            _refuse(where, "eagle_config", f"must be a JSON object, got {type(nested).__name__}")
        for key in nested:
            if key not in EAGLE_CONFIG_KEYS:
                _refuse(where, f"eagle_config.{key}")
        if nested.get("use_aux_hidden_state") not in (None, True):
            _refuse(where, "eagle_config.use_aux_hidden_state", "false (an EAGLE-3 head without fused features) is not supported")
    outputs = None
    if nested and nested.get("eagle_aux_hidden_state_layer_ids") is not None:
        outputs = _ids(nested["eagle_aux_hidden_state_layer_ids"], "eagle_config.eagle_aux_hidden_state_layer_ids", where)
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    if top is not None:
        ids = _ids(top, "eagle_aux_hidden_state_layer_ids", where)
        as_outputs = ids if ids[0] == 1 else [i - 1 for i in ids]  # SGLang's reading
        if min(as_outputs) < 0:
            _refuse(where, "eagle_aux_hidden_state_layer_ids", f"{ids} selects the embeddings (hidden state 0)")
        if outputs is not None and outputs != as_outputs:
            _refuse(where, "eagle_aux_hidden_state_layer_ids", f"{ids} disagrees with eagle_config's {outputs}")
        outputs = as_outputs
        del out["eagle_aux_hidden_state_layer_ids"]
    if outputs is not None:
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": outputs}
    return out


def _rope_parameters(out: dict, where: str) -> None:
    """transformers v5 writes `rope_parameters` (theta and scaling in one dict) instead of
    `rope_theta` + `rope_scaling`: read as the latter. SpecForge's export writes both, the scaling
    mirrored into `rope_scaling` for older readers (`specforge/export/checkpoint_io.py`,
    `apply_legacy_rope_scaling`): an equal mirror is read once, an unequal one refused naming both."""
    params = out.pop("rope_parameters", None)
    if params is None:
        return
    if not isinstance(params, dict):
        _refuse(where, "rope_parameters", f"must be a JSON object, got {type(params).__name__}")
    if "sliding_attention" in params or "full_attention" in params:
        _refuse(where, "rope_parameters", "per layer type is not supported (one draft layer)")
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    mirrored = out.pop("rope_scaling", None)
    if mirrored and _rope_type_and_values(mirrored) != _rope_type_and_values(scaling):
        _refuse(where, "rope_parameters", f"{params!r} and rope_scaling {mirrored!r} disagree (one is read, so they must be the same)")
    if params.get("rope_theta") is not None:
        if out.get("rope_theta") is not None and out["rope_theta"] != params["rope_theta"]:
            _refuse(where, "rope_parameters.rope_theta", f"{params['rope_theta']!r} disagrees with rope_theta {out['rope_theta']!r}")
        out["rope_theta"] = params["rope_theta"]
    if (scaling.get("rope_type") or scaling.get("type") or "default") != "default":
        out["rope_scaling"] = scaling


def _rope_type_and_values(scaling: dict) -> tuple:
    """A rope dict compared by meaning: its type (under `rope_type` or the older `type`) and its numbers."""
    if not isinstance(scaling, dict):
        return (scaling,)
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    return kind, sorted((k, v) for k, v in scaling.items() if k not in ("rope_type", "type", "rope_theta"))


def _layer_config(tlc, kind: str, where: str):
    """The nested transformer_layer_config, rebuilt with its transformers config class (its own
    defaults fill what to_diff_dict left out), with each key understood, harmless or refused."""
    if not isinstance(tlc, dict):
        _refuse(where, "transformer_layer_config", "must be a JSON object")
    for key in tlc:
        if key not in LAYER_UNDERSTOOD and key not in LAYER_HARMLESS:
            _refuse(where, f"transformer_layer_config.{key}")
    model_type = tlc.get("model_type") or ("qwen3" if kind == "eagle3" else "llama")  # the formats' defaults
    if not isinstance(model_type, str) or model_type not in LAYER_TYPES[kind]:
        _refuse(where, "transformer_layer_config.model_type",
                f"{model_type!r} is not supported for {kind} (supported: {', '.join(LAYER_TYPES[kind])})")
    from transformers import AutoConfig

    from eaglechat.engine.heads.rope import _quiet_transformers

    try:
        with _quiet_transformers():
            return AutoConfig.for_model(model_type, **{k: v for k, v in tlc.items() if k != "model_type"}), model_type
    except Exception as exc:  # transformers' own validation of the values
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WeightsError(f"head config {where}: transformer_layer_config is not a valid {model_type} config ({msg})") from None


def _from_speculators(raw: dict, state: dict, where: str) -> tuple[dict, dict]:
    kind = raw.get("speculators_model_type")
    if not isinstance(kind, str) or kind not in LAYER_TYPES:
        _refuse(where, "speculators_model_type", f"{kind!r} is not supported (supported: eagle3, eagle)")
    for key in raw:
        if key not in SPECULATORS_UNDERSTOOD and key not in SPECULATORS_HARMLESS:
            _refuse(where, key)
    if _bool(raw.get("tie_word_embeddings"), "tie_word_embeddings", where):
        _refuse(where, "tie_word_embeddings", "true would tie the draft lm_head to the embedding: not supported")
    if "transformer_layer_config" not in raw:
        _refuse(where, "transformer_layer_config", "is missing (the speculators format describes its draft layer there)")
    layer, model_type = _layer_config(raw["transformer_layer_config"], kind, where)
    prefix = "transformer_layer_config."
    if getattr(layer, "hidden_act", "silu") != "silu":
        _refuse(where, prefix + "hidden_act", f"{layer.hidden_act!r} is not supported (silu only)")
    if int(layer.num_hidden_layers) != 1:
        _refuse(where, prefix + "num_hidden_layers", f"{layer.num_hidden_layers}: eaglechat's draft heads have one decoder layer")
    if "sliding_attention" in (getattr(layer, "layer_types", None) or []):
        _refuse(where, prefix + "layer_types", "asks for sliding-window draft attention, which eaglechat does not implement")
    rope = dict(getattr(layer, "rope_parameters", None) or {})
    if "sliding_attention" in rope or "full_attention" in rope:
        _refuse(where, prefix + "rope_parameters", "per layer type is not supported (one draft layer)")
    out = {
        "hidden_size": layer.hidden_size, "intermediate_size": layer.intermediate_size,
        "num_attention_heads": layer.num_attention_heads,
        "num_key_value_heads": layer.num_key_value_heads or layer.num_attention_heads,
        "head_dim": getattr(layer, "head_dim", None) or layer.hidden_size // layer.num_attention_heads,
        "vocab_size": layer.vocab_size, "rms_norm_eps": layer.rms_norm_eps,
        "max_position_embeddings": layer.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "mlp_bias": bool(getattr(layer, "mlp_bias", False)),  # Qwen2/Qwen3 MLPs have no bias
        # Qwen3Attention: RMSNorm over each q and k head before RoPE
        "qk_norm": model_type == "qwen3" or (model_type == "qwen3_moe" and any(
            k.endswith("self_attn.q_norm.weight") for k in state)),
    }
    if model_type == "qwen2":  # Qwen2Attention: q/k/v biases, none on o_proj
        out["qkv_bias"] = True
    elif getattr(layer, "attention_bias", False):  # Llama/Qwen3 attention_bias: q, k, v and o_proj
        out["attention_bias"] = True
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    if (scaling.get("rope_type") or "default") != "default":
        out["rope_scaling"] = scaling
    if kind == "eagle3":
        if _bool(layer.tie_word_embeddings, prefix + "tie_word_embeddings", where):
            out["tie_word_embeddings"] = True  # eagle3.build: the checkpoint's lm_head, as speculators trains it
        return _speculators_eagle3(raw, state, out, where)
    return _speculators_eagle(raw, state, out, where)


def _speculators_eagle3(raw: dict, state: dict, out: dict, where: str) -> tuple[dict, dict]:
    out["architectures"] = ["LlamaForCausalLMEagle3"]
    # the pydantic defaults of Eagle3SpeculatorConfig
    draft = raw.get("draft_vocab_size", 32000)
    out["draft_vocab_size"] = draft
    if raw.get("target_hidden_size") is not None:
        out["target_hidden_size"] = raw["target_hidden_size"]
    out["norm_before_residual"] = _bool(raw.get("norm_before_residual"), "norm_before_residual", where)
    out["norm_before_fc"] = _bool(raw.get("norm_before_fc"), "norm_before_fc", where)
    out["fc_norm"] = _bool(raw.get("fc_norm"), "fc_norm", where)
    out["norm_feedback"] = _bool(raw.get("norm_output"), "norm_output", where)  # Eagle 3.1: feed back the normed hidden
    if out["norm_before_fc"] and out["fc_norm"]:
        _refuse(where, "norm_before_fc", "and fc_norm are mutually exclusive")
    if raw.get("eagle_aux_hidden_state_layer_ids") is not None:
        ids = _ids(raw["eagle_aux_hidden_state_layer_ids"], "eagle_aux_hidden_state_layer_ids", where)
        if 0 in ids:
            _refuse(where, "eagle_aux_hidden_state_layer_ids", f"{ids} selects the embeddings (hidden state 0)")
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids]}  # hidden-state index -> layer output
    renamed = {}
    for key, value in state.items():
        if key in DROPPED:
            continue
        if key.startswith("layers."):
            index, _, rest = key[len("layers."):].partition(".")
            if index != "0":
                raise WeightsError(f"draft head weights have unexpected key {key} (eaglechat's heads have one decoder layer)")
            key = "midlayer." + rest
        renamed[key] = value
    return out, renamed


def _speculators_eagle(raw: dict, state: dict, out: dict, where: str) -> tuple[dict, dict]:
    arch = raw.get("transformer_layer_architecture", "auto")
    if not isinstance(arch, str) or arch not in DECODER_CLASSES:
        _refuse(where, "transformer_layer_architecture", f"{arch!r} is not supported (supported: {', '.join(sorted(DECODER_CLASSES))})")
    out["architectures"] = ["LlamaForCausalLM"]
    out["bias"] = _bool(raw.get("fusion_bias"), "fusion_bias", where)  # HASS: a bias on the fusion fc
    out["layernorms"] = _bool(raw.get("layernorms"), "layernorms", where)
    renamed = {}
    for key, value in state.items():
        if key in DROPPED:
            continue
        if key.startswith("fusion_fc."):
            key = "fc." + key[len("fusion_fc."):]
        elif key.startswith("transformer."):
            key = "layers.0." + key[len("transformer."):]
        renamed[key] = value
    return out, renamed
