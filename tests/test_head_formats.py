"""Every published head format loads faithfully: a head written in a format's own layout (its config
schema and key names, as its own code writes them) loads with every weight in its place, computes what
the format's model code computes (transformers' own decoder layers as the reference where the format
builds on them), and drafts exactly what the same weights draft in eaglechat's own layout. Sharded
weights, scaled RoPE, and one-line refusals of what eaglechat does not implement."""

import copy
import json

import pytest
import torch
from safetensors.torch import save_file
from test_eagle3 import V, deep_model, draft_vocab, plain, prefill, spec
from transformers import AutoConfig, LlamaConfig

from eaglechat import cli
from eaglechat.engine.decode import Decoder
from eaglechat.engine.heads import Eagle3Config, Eagle3Head, EagleHead, HeadConfig, init_weights, load_head, save_head
from eaglechat.engine.heads.eagle3 import set_draft_vocab
from eaglechat.engine.protocol import TreeBudget
from eaglechat.errors import WeightsError


def randomize(head, seed=1):
    torch.manual_seed(seed)
    init_weights(head, std=0.15)
    with torch.no_grad():  # norms away from 1 and biases away from 0, so a missing or misplaced one shows
        for name, p in head.named_parameters():
            if p.dim() == 1:
                p.copy_((1.0 if name.endswith("norm.weight") or "layernorm" in name else 0.0) + 0.3 * torch.randn_like(p))
    return head.eval()


def head3(model, ids=None, **options):
    cfg = Eagle3Config.for_base(model.config, draft_vocab_size=len(ids) if ids else 0)
    for key, value in options.items():
        setattr(cfg, key, value)
    head = randomize(Eagle3Head(cfg, model.get_input_embeddings()))
    if ids:
        set_draft_vocab(head, ids)
    return head


def write(folder, config, state, fmt="safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    state = {k: v.detach().contiguous() for k, v in state.items()}
    if fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        save_file(state, str(folder / "model.safetensors"))
    return folder


def drafts(model, head, prompt=(5, 17, 33, 2, 61, 8)):
    """(head output at the last prompt row, its logits, the dynamic tree) from the decoder's own prefill."""
    decoder = Decoder(model, head, 128)
    _, fused, root = prefill(decoder, list(prompt))
    decoder.drafter.extend(fused, torch.tensor(list(prompt[1:]) + [root]))
    h = decoder.drafter.h_last.clone()
    tree = decoder.drafter.draft(root, TreeBudget(total_tokens=12, depth=4, draft_top_k=3))
    return h, head.logits(h), tree


def assert_same_drafts(model, a, b):
    ha, la, ta = drafts(model, a)
    hb, lb, tb = drafts(model, b)
    assert torch.equal(ha, hb) and torch.equal(la, lb)
    assert ta.tokens.tolist() == tb.tokens.tolist() and ta.parents.tolist() == tb.parents.tolist()


def own_layout_twin(tmp_path, model, head):
    """The same weights, saved in eaglechat's own layout and loaded back."""
    save_head(head, tmp_path / "own")
    return load_head(tmp_path / "own", model)


def assert_weights_in_place(loaded, state, rename):
    own = loaded.head_state_dict()
    for key, value in state.items():
        target = rename(key)
        if target is None:
            continue
        assert target in own, (key, target)
        assert torch.equal(own[target].to(value.dtype), value), key


# -- SpecForge ----------------------------------------------------------------------------------

SPECFORGE_OPTIONS = [
    {},  # the gpt-oss-style config: only eagle_config.eagle_aux_hidden_state_layer_ids
    {"fc_norm": True, "norm_output": True},  # configs/qwen3-30B-A3B-eagle3.1.json
    {"norm_before_residual": True},
    {"norm_output": False},
]


@pytest.mark.parametrize("options", SPECFORGE_OPTIONS, ids=lambda o: ",".join(o) or "aux-only")
def test_specforge_heads_read_their_layer_ids_and_norm_options(tmp_path, options):
    model = deep_model("llama")  # 8 layers
    ids = draft_vocab()
    flags = {k: v for k, v in options.items() if k != "norm_output"}
    head = head3(model, ids, aux_layers=(2, 4, 6), final_norm=options.get("norm_output", True), **flags)
    # as SpecForge writes it: its draft config (configs/*-eagle3.json) + the LlamaForCausalLMEagle3 state dict
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]},  # outputs of layers 1, 3, 5
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "vocab_size": V, "draft_vocab_size": len(ids),
        "max_position_embeddings": 4096, "initializer_range": 0.02, "pad_token_id": 0, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.52.3", "use_cache": True, **options,
    }
    state = dict(head.head_state_dict())
    state["embed_tokens.weight"] = model.get_input_embeddings().weight
    if options.get("norm_output") is False:  # SpecForge keeps the module; its forward does not use it
        state["norm.weight"] = torch.ones(64)
    loaded = load_head(write(tmp_path / "specforge", config, state), model)
    assert loaded.feature_layers(8) == [2, 4, 6]  # = transformers hidden_states[i + 1]
    assert Decoder(model, loaded, 64).target.feature_layers == [2, 4, 6]
    assert loaded.config.norm_before_residual == bool(options.get("norm_before_residual"))
    assert loaded.config.fc_norm == bool(options.get("fc_norm")) and loaded.config.final_norm == (options.get("norm_output") is not False)
    unused = {"embed_tokens.weight"} | ({"norm.weight"} if options.get("norm_output") is False else set())
    assert_weights_in_place(loaded, state, lambda k: None if k in unused else k)  # embed_tokens: the base's, shared
    assert_same_drafts(model, loaded, own_layout_twin(tmp_path, model, loaded))
    if not options:  # and it decodes exactly like plain decoding
        assert spec(Decoder(model, loaded, 256), [3, 9, 27, 81], 12, TreeBudget(8, 3, 4)) == plain(model, [3, 9, 27, 81], 12)


def test_each_norm_option_changes_the_computation():
    """The options are read into the computation, not only into the config."""
    model = deep_model("llama")
    head = head3(model, aux_layers=(2, 4, 6))
    h, logits, _ = drafts(model, head)
    twin = copy.deepcopy(head)
    twin.config.norm_before_residual = twin.midlayer.norm_before_residual = True
    assert not torch.allclose(drafts(model, twin)[0], h)
    twin = copy.deepcopy(head)
    twin.config.final_norm = False
    assert not torch.allclose(twin.logits(h), logits)


def test_a_copied_attention_bias_flag_without_biases_in_the_checkpoint_is_a_bias_free_head(tmp_path):
    """SpecForge (llama3_eagle.py) and SafeAILab/EAGLE build q/k/v/o and the MLP with bias=False
    whatever attention_bias / mlp_bias say: the weights decide."""
    model = deep_model("llama")
    head = head3(model)
    config = {**head.config.to_dict(), "attention_bias": True, "mlp_bias": True}
    loaded = load_head(write(tmp_path / "nobias", config, head.head_state_dict()), model)
    assert not loaded.config.o_bias and not loaded.config.mlp_bias
    biased = head3(model, qkv_bias=True, o_bias=True)
    loaded = load_head(write(tmp_path / "bias", {**biased.config.to_dict(), "attention_bias": True}, biased.head_state_dict()), model)
    assert torch.equal(loaded.midlayer.self_attn.o_proj.bias, biased.midlayer.self_attn.o_proj.bias)


def test_top_level_layer_ids_are_read_as_sglang_reads_them(tmp_path):
    model = deep_model("llama")
    head = head3(model, aux_layers=(2, 4, 6))
    config = head.config.to_dict()
    del config["eagle_config"]
    for ids, expected in (([1, 3, 5], [2, 4, 6]), ([2, 4, 6], [2, 4, 6])):  # layer outputs when the first id is 1
        config["eagle_aux_hidden_state_layer_ids"] = ids
        assert load_head(write(tmp_path / f"top{ids[0]}", config, head.head_state_dict()), model).feature_layers(8) == expected


# -- speculators (vllm-project/speculators) -----------------------------------------------------

def transformer_layer_config(model_type, **extra):
    """What speculators writes: the draft layer's config, non-default values only (to_diff_dict)."""
    out = {"model_type": model_type, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 1, "vocab_size": V,
           "max_position_embeddings": 4096, "architectures": None, "transformers_version": "4.56.0", **extra}
    return out


def speculators_eagle3_config(tlc, draft, **extra):
    return {
        "speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], "transformer_layer_config": tlc,
        "draft_vocab_size": draft, "norm_before_residual": False, "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": None, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
        "embed_requires_grad": False, "speculators_version": "0.3.0", "torch_dtype": "float32",
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                               "verifier": {"name_or_path": "tiny/base", "architectures": ["Qwen3ForCausalLM"]}},
        **extra,
    }


def speculators_state(head, model):
    """An Eagle3DraftModel state dict: layers.0.* keys, embed_tokens and the verifier copies it keeps."""
    state = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v
             for k, v in head.head_state_dict().items()}
    state["embed_tokens.weight"] = model.get_input_embeddings().weight
    state["verifier_lm_head.weight"] = head.lm_head.weight.detach().clone()
    state["verifier_norm.weight"] = torch.ones(64)
    return state


def reference_eagle3_first_layer(tlc, state, norm_before_residual, fused, token_ids, embed):
    """speculators' Eagle3FirstLayerMixin.forward on transformers' own Qwen3DecoderLayer (its
    model_definitions.py), with its rotary built from the doubled-width config as core.py does."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding

    cfg = AutoConfig.for_model(**tlc)
    cfg._attn_implementation = "eager"
    layer = Qwen3DecoderLayer(cfg, 0)
    h = cfg.hidden_size
    for name, width in (("q_proj", cfg.num_attention_heads), ("k_proj", cfg.num_key_value_heads), ("v_proj", cfg.num_key_value_heads)):
        setattr(layer.self_attn, name, torch.nn.Linear(2 * h, width * cfg.head_dim, bias=cfg.attention_bias))
    layer.hidden_norm = Qwen3RMSNorm(h, eps=cfg.rms_norm_eps)
    layer.load_state_dict({k[len("layers.0."):]: v for k, v in state.items() if k.startswith("layers.0.")})
    wide = copy.copy(cfg)
    wide.hidden_size *= 2
    rotary = Qwen3RotaryEmbedding(wide)
    t = fused.shape[0]
    hidden = fused @ state["fc.weight"].T
    embeds = embed[token_ids]
    positions = torch.arange(t)[None]
    cos, sin = rotary(hidden[None], positions)
    residual = hidden
    embeds, hidden = layer.input_layernorm(embeds), layer.hidden_norm(hidden)
    if norm_before_residual:
        residual = hidden
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    attn, _ = layer.self_attn(hidden_states=torch.cat([embeds, hidden], -1)[None], position_embeddings=(cos, sin), attention_mask=mask)
    x = residual + attn[0]
    return x + layer.mlp(layer.post_attention_layernorm(x))


def test_speculators_eagle3_qwen3_layer_computes_what_speculators_computes(tmp_path):
    """Qwen3 draft layer (q/k norms, attention_bias: q/k/v/o biases), yarn RoPE, norm_before_residual,
    Eagle 3.1 norm_output, hidden-state layer ids, reduced draft vocabulary with d2t/t2d."""
    model = deep_model("qwen3")
    ids = draft_vocab()
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "rope_theta": 1e6}
    tlc = transformer_layer_config("qwen3", attention_bias=True, rope_parameters=yarn, rms_norm_eps=1e-6)
    # eaglechat's own head with the same options, random weights
    cfg = Eagle3Config.for_base(model.config, draft_vocab_size=len(ids))
    cfg.qkv_bias = cfg.o_bias = cfg.qk_norm = True
    cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings = 1e6, {k: v for k, v in yarn.items() if k != "rope_theta"}, 4096
    cfg.aux_layers, cfg.norm_before_residual, cfg.norm_feedback = (2, 4, 5), True, True
    head = randomize(Eagle3Head(cfg, model.get_input_embeddings()))
    set_draft_vocab(head, ids)
    state = speculators_state(head, model)
    config = speculators_eagle3_config(tlc, len(ids), norm_before_residual=True, norm_output=True,
                                       eagle_aux_hidden_state_layer_ids=[2, 4, 5])
    loaded = load_head(write(tmp_path / "spec3", config, state), model)
    assert loaded.feature_layers(8) == [2, 4, 5]  # hidden-state indices, as vLLM captures them
    assert loaded.config.qk_norm and loaded.config.o_bias and loaded.config.norm_feedback
    assert abs(loaded.rotary.attention_scaling - 1.0) > 0.05  # yarn's attention factor is in place
    assert_weights_in_place(loaded, state, lambda k: None if k.startswith(("verifier_", "embed_tokens")) else
                            ("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k))
    # the head's causal pass over prompt rows == speculators' layer on transformers' Qwen3DecoderLayer
    torch.manual_seed(7)
    fused, tokens = torch.randn(6, 3 * 64), torch.tensor([3, 8, 1, 40, 22, 9])
    out = loaded(fused[None], tokens[None], torch.arange(6)[None])[0]
    ref = reference_eagle3_first_layer(tlc, state, True, fused, tokens, model.get_input_embeddings().weight)
    ref_normed = loaded.norm(ref)  # norm_output: the normed hidden is fed back; logits = lm_head of it
    assert torch.allclose(out, ref_normed, atol=1e-5), (out - ref_normed).abs().max()
    assert torch.allclose(loaded.logits(out), ref_normed @ state["lm_head.weight"].T, atol=1e-4)
    assert_same_drafts(model, loaded, own_layout_twin(tmp_path, model, loaded))
    prompt = [4, 8, 15, 16, 23]
    assert spec(Decoder(model, loaded, 256), prompt, 12, TreeBudget(8, 3, 4)) == plain(model, prompt, 12)


def test_the_last_layers_output_is_fused_before_the_final_norm(tmp_path):
    """Hidden state N (speculators/vLLM: the boundary after the last layer) is that layer's output,
    not transformers' normed last_hidden_state."""
    model = deep_model("llama")
    head = head3(model, aux_layers=(2, 4, 8))
    config = speculators_eagle3_config(transformer_layer_config("llama"), V, eagle_aux_hidden_state_layer_ids=[2, 4, 8])
    loaded = load_head(write(tmp_path / "last", config, speculators_state(head, model)), model)
    decoder = Decoder(model, loaded, 64)
    seen = {}
    hook = model.model.layers[7].register_forward_hook(lambda mod, args, out: seen.__setitem__("out", out[0] if isinstance(out, tuple) else out))
    try:
        feats, fused, _ = prefill(decoder, [5, 6, 7, 8])
    finally:
        hook.remove()
    assert torch.equal(fused[:, -64:], seen["out"][0]) and not torch.allclose(fused[:, -64:], feats)
    assert spec(decoder, [5, 6, 7, 8], 10, TreeBudget(8, 3, 4)) == plain(model, [5, 6, 7, 8], 10)


@pytest.mark.parametrize("option", ["norm_before_fc", "fc_norm"])
def test_speculators_fused_feature_norms(tmp_path, option):
    model = deep_model("llama")
    head = head3(model, **{option: True})
    tlc = transformer_layer_config("llama")
    loaded = load_head(write(tmp_path / option, speculators_eagle3_config(tlc, V, **{option: True}),
                             speculators_state(head, model)), model)
    assert getattr(loaded.config, option)
    key = "input_norm.weight" if option == "norm_before_fc" else "fc_norm.2.weight"
    assert torch.equal(loaded.head_state_dict()[key], head.head_state_dict()[key])
    assert_same_drafts(model, loaded, head)


@pytest.mark.parametrize("layer_type", ["llama", "qwen2", "qwen3"])
def test_speculators_eagle1_layernorms_and_fusion_bias(tmp_path, layer_type):
    """EagleSpeculator (EAGLE-1/HASS): fusion_fc.* and transformer.* keys, layernorms=True adds the
    embedding, fc-output and pre-lm_head norms; fusion_bias the fc bias; a Llama layer with
    attention_bias and mlp_bias, a Qwen2 layer (q/k/v biases) or a Qwen3 layer (q/k norms). Reference: its forward on transformers'
    own decoder layer of that type (eagle_legacy_model.py)."""
    import importlib

    model = deep_model("llama")
    cfg = HeadConfig.for_base(model.config, bias=True)
    cfg.layernorms = True
    if layer_type == "llama":
        cfg.qkv_bias = cfg.o_bias = cfg.mlp_bias = True
        tlc = transformer_layer_config("llama", rope_theta=10000.0, attention_bias=True, mlp_bias=True)
    elif layer_type == "qwen2":  # Qwen2Attention: q/k/v biases, none on o_proj
        cfg.qkv_bias = True
        tlc = transformer_layer_config("qwen2", rope_theta=10000.0)
    else:
        cfg.qk_norm = True
        tlc = transformer_layer_config("qwen3", rope_theta=10000.0)
    head = randomize(EagleHead(cfg, model.get_input_embeddings(), model.get_output_embeddings()))
    state = {}
    for key, value in head.head_state_dict().items():
        key = key.replace("fc.", "fusion_fc.", 1) if key.startswith("fc.") else key
        state[key.replace("layers.0.", "transformer.", 1)] = value
    decoder_class = {"llama": "LlamaDecoderLayer", "qwen2": "Qwen2DecoderLayer", "qwen3": "Qwen3DecoderLayer"}[layer_type]
    config = {"speculators_model_type": "eagle", "architectures": ["EagleSpeculator", decoder_class],
              "transformer_layer_architecture": decoder_class, "transformer_layer_config": tlc,
              "layernorms": True, "fusion_bias": True, "speculators_version": "0.1.0",
              "speculators_config": {"algorithm": "eagle", "proposal_methods": [], "verifier": {"name_or_path": "tiny"}}}
    loaded = load_head(write(tmp_path / "spec1", config, state, fmt="bin"), model)
    assert isinstance(loaded, EagleHead) and loaded.config.layernorms and loaded.fc.bias is not None
    assert loaded.config.qk_norm == (layer_type == "qwen3")
    assert_weights_in_place(loaded, state, lambda k: k.replace("fusion_fc.", "fc.").replace("transformer.", "layers.0."))
    # reference: embedding_layernorm -> fusion_fc -> the decoder layer -> pre_lm_head_layernorm -> lm_head
    modeling = importlib.import_module(f"transformers.models.{layer_type}.modeling_{layer_type}")
    lcfg = AutoConfig.for_model(**{k: v for k, v in tlc.items() if k != "architectures"})
    lcfg._attn_implementation = "eager"
    layer = getattr(modeling, decoder_class)(lcfg, 0)
    layer.load_state_dict({k[len("transformer."):]: v for k, v in state.items() if k.startswith("transformer.")})
    rotary = getattr(modeling, decoder_class.replace("DecoderLayer", "RotaryEmbedding"))(lcfg)
    torch.manual_seed(3)
    feats, tokens = torch.randn(5, 64), torch.tensor([7, 1, 30, 2, 9])
    emb = loaded.embedding_layernorm(model.get_input_embeddings().weight[tokens])
    x = torch.cat([emb, feats], -1) @ state["fusion_fc.weight"].T + state["fusion_fc.bias"]
    cos, sin = rotary(x[None], torch.arange(5)[None])
    ref = layer(x[None], attention_mask=torch.full((5, 5), float("-inf")).triu(1)[None, None], position_embeddings=(cos, sin))
    ref = ref[0] if isinstance(ref, tuple) else ref
    out = loaded(feats[None], tokens[None], torch.arange(5)[None])
    assert torch.allclose(out, ref, atol=1e-5)
    ref_logits = model.get_output_embeddings()(loaded.pre_lm_head_layernorm(ref[0]))
    assert torch.allclose(loaded.logits(out[0]), ref_logits, atol=1e-4)
    assert_same_drafts(model, loaded, own_layout_twin(tmp_path, model, loaded))
    assert spec(Decoder(model, loaded, 256), [9, 8, 7, 6], 12, TreeBudget(8, 3, 4)) == plain(model, [9, 8, 7, 6], 12)


# -- RoPE scaling -------------------------------------------------------------------------------

@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
], ids=lambda s: s.get("rope_type") or s["type"])
def test_scaled_rope_rotates_as_transformers_does(scaling):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = HeadConfig(64, 128, 4, 2, V, rope_theta=5e5, rope_scaling=scaling, max_position_embeddings=4096)
    from eaglechat.engine.heads.common import Rotary

    positions = torch.tensor([[0, 1, 7, 300, 3000]])
    cos, sin = Rotary(cfg)(positions, torch.float32)
    ref = LlamaRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=4096,
                                           rope_theta=5e5, rope_scaling=scaling))
    ref_cos, ref_sin = ref(torch.zeros(1), positions)
    assert torch.allclose(cos[:, 0], ref_cos, atol=1e-6) and torch.allclose(sin[:, 0], ref_sin, atol=1e-6)


def test_a_llama3_scaled_head_loads_and_decodes_exactly(tmp_path):
    model = deep_model("llama")
    head = head3(model, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    save_head(head, tmp_path / "h")
    loaded = load_head(tmp_path / "h", model)
    assert torch.equal(loaded.rotary.inv_freq, head.rotary.inv_freq)
    assert not torch.equal(loaded.rotary.inv_freq, head3(model).rotary.inv_freq)
    assert spec(Decoder(model, loaded, 256), [1, 2, 3], 10, TreeBudget(8, 3, 4)) == plain(model, [1, 2, 3], 10)


@pytest.mark.parametrize("spelling", ["rope_type", "type"])
def test_a_rope_scaling_mirrored_from_rope_parameters_is_read_once(tmp_path, spelling):
    """SpecForge's export writes transformers 5's rope_parameters and mirrors it into rope_scaling for
    older readers (specforge/export/checkpoint_io.py, apply_legacy_rope_scaling)."""
    model = deep_model("llama")
    scaling = {"rope_type": "linear", "factor": 2.0}
    head = head3(model, rope_scaling=scaling)
    config = {**head.config.to_dict(), "rope_parameters": {**scaling, "rope_theta": 10000.0},
              "rope_scaling": {spelling: "linear", "factor": 2.0}, "rope_theta": 10000.0}
    loaded = load_head(write(tmp_path / "mirror", config, head.head_state_dict()), model)
    assert torch.equal(loaded.rotary.inv_freq, head.rotary.inv_freq)
    assert not torch.equal(loaded.rotary.inv_freq, head3(model).rotary.inv_freq)
    assert spec(Decoder(model, loaded, 256), [1, 2, 3], 10, TreeBudget(8, 3, 4)) == plain(model, [1, 2, 3], 10)


# -- tie_word_embeddings ------------------------------------------------------------------------

def angelslim_config(model, draft):
    """As AngelSlim writes an EAGLE-3 draft config (train/configs/qwen3-1.7b-eagle3.json): the base's
    LlamaConfig fields, its tie_word_embeddings among them, plus draft_vocab_size."""
    c = model.config
    return {
        "architectures": ["Eagle3LlamaForCausalLM"], "model_type": "llama", "target_model_type": "qwen3",
        "torch_dtype": "bfloat16", "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": c.hidden_size, "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size, "max_position_embeddings": 40960, "max_window_layers": 28,
        "num_attention_heads": c.num_attention_heads, "num_hidden_layers": 1, "num_key_value_heads": c.num_key_value_heads,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": None,
        "tie_word_embeddings": True, "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": c.vocab_size, "draft_vocab_size": draft,
    }


def test_an_angelslim_head_marked_tied_uses_its_own_lm_head(tmp_path):
    """AngelSlim's Qwen3-1.7B/4B drafts say tie_word_embeddings: true (copied from the base's config) and
    ship their own lm_head of draft_vocab rows: its trainer builds it as its own Linear and never ties it
    (models/draft/llama_eagle3.py; its save drops the embedding)."""
    model = deep_model("qwen3")
    ids = draft_vocab()
    head = head3(model, ids)
    state = {k: v for k, v in head.head_state_dict().items() if "embed" not in k}
    loaded = load_head(write(tmp_path / "angelslim", angelslim_config(model, len(ids)), state), model)
    assert torch.equal(loaded.lm_head.weight, state["lm_head.weight"])
    assert_same_drafts(model, loaded, head)
    assert spec(Decoder(model, loaded, 256), [3, 9, 27, 81], 12, TreeBudget(8, 3, 4)) == plain(model, [3, 9, 27, 81], 12)


@pytest.mark.parametrize("own_embedding", [False, True])
def test_a_tied_head_without_an_lm_head_scores_with_its_embedding(tmp_path, own_embedding):
    """No lm_head.weight and tie_word_embeddings: true: the lm_head is the embedding, as SGLang's
    LlamaForCausalLMEagle3 ties it (full draft vocabulary): the head's own when it ships one."""
    model = deep_model("llama")
    head = head3(model)
    state = {k: v for k, v in head.head_state_dict().items() if k != "lm_head.weight"}
    embedding = model.get_input_embeddings().weight
    if own_embedding:
        embedding = embedding + 0.05 * torch.randn_like(embedding)
        state["embed_tokens.weight"] = embedding
    config = {**head.config.to_dict(), "tie_word_embeddings": True}
    loaded = load_head(write(tmp_path / "tied", config, state), model)
    assert torch.equal(loaded.lm_head.weight, embedding)
    assert loaded.lm_head.weight is loaded.embed_tokens.weight  # one tensor, no copy
    h = torch.randn(3, 64)
    assert torch.allclose(loaded.logits(h), loaded.norm(h) @ embedding.T, atol=1e-5)
    assert spec(Decoder(model, loaded, 256), [3, 9, 27, 81], 12, TreeBudget(8, 3, 4)) == plain(model, [3, 9, 27, 81], 12)


def test_a_tie_that_cannot_be_honoured_is_refused_in_one_line(tmp_path):
    model = deep_model("llama")
    ids = draft_vocab()
    head = head3(model, ids)
    state = {k: v for k, v in head.head_state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(WeightsError) as info:
        load_head(write(tmp_path / "tied", {**head.config.to_dict(), "tie_word_embeddings": True}, state), model)
    assert "cannot score a reduced draft vocabulary (40 of 96)" in str(info.value) and "\n" not in str(info.value)


def test_a_speculators_layer_config_marked_tied_keeps_its_lm_head(tmp_path):
    model = deep_model("llama")
    head = head3(model)
    config = speculators_eagle3_config(transformer_layer_config("llama", tie_word_embeddings=True), V)
    loaded = load_head(write(tmp_path / "spec-tied", config, speculators_state(head, model)), model)
    assert torch.equal(loaded.lm_head.weight, head.lm_head.weight)


# -- sharded weights ----------------------------------------------------------------------------

def shard(folder, state, fmt):
    names = sorted(state)
    parts = {f"model-0000{i + 1}-of-00002.{fmt}": names[i::2] for i in range(2)}
    weight_map = {}
    for file, keys in parts.items():
        tensors = {k: state[k].contiguous() for k in keys}
        save_file(tensors, str(folder / file)) if fmt == "safetensors" else torch.save(tensors, folder / file)
        weight_map.update({k: file for k in keys})
    index = "model.safetensors.index.json" if fmt == "safetensors" else "pytorch_model.bin.index.json"
    (folder / index).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return folder / index


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_sharded_heads_load_like_single_files(tmp_path, fmt):
    model = deep_model("llama")
    head = head3(model, draft_vocab())
    save_head(head, tmp_path / "one")
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text((tmp_path / "one" / "config.json").read_text())
    index = shard(folder, head.head_state_dict(), fmt)
    loaded = load_head(folder, model)
    for key, value in load_head(tmp_path / "one", model).head_state_dict().items():
        assert torch.equal(loaded.head_state_dict()[key], value), key
    # an index and its shards that disagree, or a missing shard: one line each
    data = json.loads(index.read_text())
    data["weight_map"]["extra.weight"] = next(iter(data["weight_map"].values()))
    index.write_text(json.dumps(data))
    with pytest.raises(WeightsError, match="shards lack extra.weight"):
        load_head(folder, model)
    data["weight_map"] = {k: "model-00009-of-00002." + fmt for k in data["weight_map"]}
    index.write_text(json.dumps(data))
    with pytest.raises(WeightsError, match="is missing"):
        load_head(folder, model)


# -- refusals -----------------------------------------------------------------------------------

OFFICIAL_REFUSALS = [
    ({"some_new_option": True}, "some_new_option is not understood"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"num_hidden_layers": 2}, "num_hidden_layers 2"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling type 'dynamic' is not supported"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, "'longrope' is not supported"),
    ({"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window"),
    ({"eagle_config": {"use_aux_hidden_state": False}}, "eagle_config.use_aux_hidden_state"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 8]}}, "fuses hidden state 9"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5], "depth": 2}}, "eagle_config.depth"),
    ({"fc_norm": True, "norm_before_fc": True}, "mutually exclusive"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
     "rope_parameters {'rope_type': 'linear', 'factor': 2.0, 'rope_theta': 10000.0} and rope_scaling {'rope_type': 'linear', 'factor': 4.0} disagree"),
    ({"embed_scale": -1}, "embed_scale"),
    ({"layer_types": True}, "layer_types must be a list"),
]


@pytest.mark.parametrize("change,needle", OFFICIAL_REFUSALS, ids=lambda x: x if isinstance(x, str) else None)
def test_what_eaglechat_does_not_implement_is_refused_in_one_line(tmp_path, change, needle):
    model = deep_model("llama")
    head = head3(model)
    config = {**head.config.to_dict(), **change}
    with pytest.raises(WeightsError) as info:
        load_head(write(tmp_path / "h", config, head.head_state_dict()), model)
    assert needle in str(info.value) and "\n" not in str(info.value)


SPECULATORS_REFUSALS = [
    ({"speculators_model_type": "mlp_speculator"}, "speculators_model_type 'mlp_speculator' is not supported"),
    ({"speculators_model_type": ["eagle3"]}, "speculators_model_type ['eagle3'] is not supported"),
    ({"transformer_layer_config": transformer_layer_config("llama", hidden_size="wide")}, "not a valid llama config"),
    ({"transformer_layer_config": transformer_layer_config("gemma3_text")}, "transformer_layer_config.model_type 'gemma3_text'"),
    ({"transformer_layer_config": transformer_layer_config("llama", num_hidden_layers=2)}, "transformer_layer_config.num_hidden_layers 2"),
    ({"transformer_layer_config": transformer_layer_config("qwen3", use_sliding_window=True, sliding_window=8, max_window_layers=0)}, "transformer_layer_config.layer_types"),
    ({"transformer_layer_config": transformer_layer_config("llama", hidden_act="gelu")}, "transformer_layer_config.hidden_act"),
    ({"transformer_layer_config": transformer_layer_config("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})}, "'dynamic' is not supported"),
    ({"transformer_layer_config": transformer_layer_config("llama", partial_rotary_factor=0.5)}, "transformer_layer_config.partial_rotary_factor"),
    ({"speculator_extra_flag": 1}, "speculator_extra_flag is not understood"),
    ({"eagle_aux_hidden_state_layer_ids": [2, 4, 9]}, "fuses hidden state 9"),
]


@pytest.mark.parametrize("change,needle", SPECULATORS_REFUSALS, ids=lambda x: x if isinstance(x, str) else None)
def test_speculators_configs_eaglechat_cannot_run_are_refused(tmp_path, change, needle):
    model = deep_model("llama")
    head = head3(model)
    config = {**speculators_eagle3_config(transformer_layer_config("llama"), V), **change}
    with pytest.raises(WeightsError) as info:
        load_head(write(tmp_path / "h", config, speculators_state(head, model)), model)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_refused_head_is_one_line_and_a_non_zero_exit_from_the_cli(tmp_path, capsys):
    from tiny_models import save_tiny_pair

    base, head_dir = save_tiny_pair(tmp_path / "pair")
    config = json.loads((head_dir / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
    (head_dir / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    code = cli.main(["run", str(base), "hi", "--head", str(head_dir), "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("eaglechat: error:")]
    assert code != 0 and "Traceback" not in err
    assert len(lines) == 1 and "rope_scaling type 'dynamic'" in lines[0], err


def test_a_sharded_or_bin_head_exports_for_a_server_as_it_is(tmp_path):
    """show --serve --export-head copies any head layout the loader reads (official EAGLE-1 heads
    ship pytorch_model.bin; big heads come sharded)."""
    from eaglechat.models.launch import export_head_for_server

    model = deep_model("llama")
    head = head3(model)
    single = write(tmp_path / "bin", head.config.to_dict(), head.head_state_dict(), fmt="bin")
    assert export_head_for_server(single, tmp_path / "out-bin", "vllm") is None
    assert sorted(p.name for p in (tmp_path / "out-bin").iterdir()) == ["config.json", "pytorch_model.bin"]
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(head.config.to_dict()))
    shard(folder, head.head_state_dict(), "safetensors")
    export_head_for_server(folder, tmp_path / "out-sharded", "sglang")
    exported = load_head(tmp_path / "out-sharded", model)
    assert all(torch.equal(exported.head_state_dict()[k], v) for k, v in head.head_state_dict().items())
