"""Gemma 4 (and Gemma 2's soft-capping, Gemma 3n's KV sharing) under tree verification, through eaglechat's real engine in fp32:
per-layer attention shapes (one KV buffer per shape), KV-shared layers (no cache of their own), final and
attention logit soft-capping, the multimodal checkpoint's language model, and the one refused mode
(bidirectional attention over text). Greedy EAGLE == plain for the tiny Gemma 4 also runs with every
architecture in test_engine_lossless.py and test_engine_tree.py (tests/tiny_models.py GEMMA4)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import GEMMA4, TINY, build_model, random_head, tiny_model, tiny_tokenizer
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.cache_utils import DummyLayer

from eaglechat.cli import main
from eaglechat.engine.cache import ContiguousLayer
from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.engine.recurrent import layer_kinds
from eaglechat.engine.target import Target
from eaglechat.engine.tree import tree_from_parents
from eaglechat.errors import UnsupportedModel

# Gemma 2: attention logits capped (eager attention in transformers: sdpa cannot cap), final logits capped;
# caps low enough that dropping either changes the logits
GEMMA2 = dict(sliding_window=4, attn_logit_softcapping=1.0, final_logit_softcapping=2.0, query_pre_attn_scalar=16)
PROMPT = [5, 17, 33, 2, 9, 11, 40, 3]
GEMMA4_LAYOUT = {k: GEMMA4[k] for k in ("num_hidden_layers", "layer_types", "sliding_window", "num_kv_shared_layers")}


def gemma2():
    return build_model(AutoConfig.for_model("gemma2", **{**TINY, **GEMMA2}), scale=4.0)


def decode(model, head, prompt, n, budget=TreeBudget(8, 3, 4), decoder=None):
    decoder = decoder or Decoder(model, head, 256)
    params = GenerationParams(max_new_tokens=n, speculate=head is not None)
    return [t for s in decoder.generate(prompt, params, budget, set()) for t in s.tokens]


@pytest.mark.parametrize("family", ["gemma4_text", "gemma2"])
def test_each_tree_node_gets_the_models_own_logits_for_its_path(family):
    """One verify forward over a branching tree: every node's logits equal what transformers' model computes
    for the prompt + that node's path alone (soft-capped final logits and, on Gemma 2, soft-capped attention
    scores; the references are taken before eaglechat switches the model to its tree attention)."""
    model = tiny_model(family) if family == "gemma4_text" else gemma2()
    tree = tree_from_parents([7, 8, 9, 10], [-1, 0, 0, 1])  # two siblings, one grandchild
    paths = [[0], [0, 1], [0, 2], [0, 1, 3]]
    with torch.no_grad():
        expected = [model(torch.tensor([PROMPT + [7 + j for j in path]])).logits[0, -1] for path in paths]
    target = Target(model, 64)
    target.forward_chain(torch.tensor(PROMPT))
    got = target.logits(target.forward(tree.tokens, tree.depth, tree.ancestors)[0])
    for node, logits in enumerate(expected):
        torch.testing.assert_close(got[node], logits, rtol=0, atol=1e-5)
    assert got.abs().max() <= model.config.final_logit_softcapping  # capped: tanh never reaches the cap


def test_plain_decoding_is_the_models_greedy_continuation_and_eagle_matches_it():
    """Plain decoding through the engine follows the model's uncached argmax token by token, and greedy EAGLE
    equals it for several budgets (static trees included)."""
    model = tiny_model("gemma4_text")
    expected = decode(model, None, PROMPT, 24)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + expected])).logits[0, len(PROMPT) - 1:-1]
    assert logits.argmax(-1).tolist() == expected
    head = random_head(model)
    for budget in (TreeBudget(4, 1, 4), TreeBudget(12, 4, 3), TreeBudget(kind="static")):
        assert decode(model, head, PROMPT, 24, budget) == expected, budget


def test_kv_groups_and_shared_layers_in_the_cache():
    """Sliding layers (2 KV heads of 16) and global ones (1 of 32) each share one buffer, compacted as one;
    the KV-shared layers hold nothing (they attend over their producer's keys and values)."""
    model = tiny_model("gemma4_text")
    assert layer_kinds(model.config) == ["attention"] * 4 + ["shared"] * 2
    decoder = Decoder(model, random_head(model), 256)
    decode(model, None, PROMPT, 10, decoder=decoder)
    cache = decoder.cache
    assert [type(layer) for layer in cache.layers] == [ContiguousLayer] * 4 + [DummyLayer] * 2
    assert cache.is_fused and cache.fused is None  # two groups: no single buffer
    assert [tuple(g.shape[:3]) + (g.shape[-1],) for g in cache.groups] == [(4, 1, 2, 16), (4, 1, 1, 32)]
    keys = cache.attention[1].keys  # a global layer: a view of the second group's buffer
    assert keys.shape[-1] == 32 and keys.data_ptr() == cache.groups[1].data_ptr()
    assert cache.memory_bytes() == sum(g.numel() * 4 for g in cache.groups)


def test_the_next_turn_reuses_the_prefix_and_a_grown_cache_stays_exact():
    model = tiny_model("gemma4_text")
    head = random_head(model)
    decoder = Decoder(model, head, 64)
    first = decode(model, head, PROMPT, 12, decoder=decoder)
    assert first == decode(model, None, PROMPT, 12)
    second = PROMPT + first + [20, 21]
    decoder.cache.reserve(128)  # every group grown, views re-pointed
    assert decode(model, head, second, 12, decoder=decoder) == decode(model, None, second, 12)
    assert decoder.stats.reused_tokens >= len(PROMPT) + len(first) - 2


def test_a_gemma4_head_reads_embedding_rows_as_stored():
    """Gemma 4's embedding multiplies its rows by sqrt(hidden_size) in its forward, as Gemma 3's does; a head
    is fed the rows as stored (what SpecForge and speculators trained on), times its config's embed_scale."""
    from eaglechat.engine.heads.common import embed_rows

    model = tiny_model("gemma4_text")
    embedding, tokens = model.get_input_embeddings(), torch.tensor([3, 50, 7])
    assert torch.allclose(embedding(tokens), embedding.weight[tokens] * 8.0)
    assert torch.equal(embed_rows(random_head(model).embed_tokens, tokens), embedding.weight[tokens])


def test_a_multimodal_checkpoint_loads_its_language_model_only(tmp_path):
    """gemma-4-*-it checkpoints are Gemma4ForConditionalGeneration: the loader hands the engine the language
    model (Gemma4ForCausalLM on the same modules), which computes what the whole model does on text."""
    from eaglechat.loader import load_base

    text = AutoConfig.for_model("gemma4_text", **{**TINY, **GEMMA4, "vocab_size": 320})
    vision = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=16, position_embedding_size=64)
    torch.manual_seed(0)
    full = AutoModelForCausalLM.from_config(AutoConfig.for_model("gemma4", text_config=text.to_dict(),
                                                                 vision_config=vision, audio_config=None))
    assert type(full).__name__ == "Gemma4ForConditionalGeneration"
    full.eval().save_pretrained(tmp_path / "gemma4")
    tiny_tokenizer().save_pretrained(tmp_path / "gemma4")
    model, _ = load_base(tmp_path / "gemma4", device="cpu", dtype=torch.float32)
    assert type(model).__name__ == "Gemma4ForCausalLM" and not hasattr(model.model, "vision_tower")
    with torch.no_grad():  # the whole model builds its masks its own way: equal up to float rounding
        torch.testing.assert_close(model(torch.tensor([PROMPT])).logits, full(torch.tensor([PROMPT])).logits,
                                   rtol=0, atol=1e-6)
    assert decode(model, random_head(model), PROMPT, 12) == decode(model, None, PROMPT, 12)


@pytest.mark.parametrize("overrides,named", [
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention 'all'"),
    ({"num_kv_shared_layers": 6, "layer_types": ["full_attention"] * 6}, "layer 0 is a layer without a KV cache"),
], ids=["bidirectional", "all-shared"])
def test_what_a_tree_cannot_verify_is_refused_in_one_line(overrides, named, tmp_path, capsys):
    config = AutoConfig.for_model("gemma4_text", **{**TINY, **GEMMA4, **overrides})
    with pytest.raises(UnsupportedModel, match=named):
        layer_kinds(config)
    folder = tmp_path / "gemma4"
    config.save_pretrained(folder)  # no weights: the refusal comes first
    tiny_tokenizer().save_pretrained(folder)
    code = main(["run", str(folder), "--no-speculate", "--quant", "none", "--device", "cpu", "hi"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert named in err and "gemma4_text" in err


def test_an_eagle3_head_on_gemma4_decodes_exactly():
    """The speculators heads for Gemma 4 are EAGLE-3: they read base layers' inputs, captured in the verify
    forward (through KV-shared layers too: transformers then keeps every position in them)."""
    from test_eagle3 import random_head3

    model = tiny_model("gemma4_text")
    head = random_head3(model)
    decoder = Decoder(model, head, 256)
    assert decoder.target.feature_layers == [2, 3, 3]
    assert decode(model, head, PROMPT, 20, TreeBudget(12, 4, 3), decoder=decoder) == decode(model, None, PROMPT, 20)


def test_gemma3n_kv_shared_layers_take_the_same_path():
    """Gemma 3n (text model) shares KV the same way (transformers' `kv_sharing_modes`), beside AltUp, Laurel,
    per-layer inputs and activation sparsity: greedy EAGLE equals plain, which follows the uncached argmax."""
    from eaglechat.engine.heads import EagleHead, HeadConfig, init_weights

    config = AutoConfig.for_model("gemma3n_text", **{
        **TINY, **GEMMA4_LAYOUT, "intermediate_size": [128] * 6, "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": 96, "laurel_rank": 4, "altup_num_inputs": 2,
        "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0, 0.0], "final_logit_softcapping": 2.0})
    model = build_model(config, scale=2.0)
    assert layer_kinds(config) == ["attention"] * 4 + ["shared"] * 2
    torch.manual_seed(1)
    widths = AutoConfig.for_model("gemma3n_text", **{**TINY, **GEMMA4_LAYOUT, "intermediate_size": [96] + [128] * 5})
    head_config = HeadConfig.for_base(widths)  # 3n lists an MLP width per layer: a head takes the first layer's
    assert head_config.intermediate_size == 96 and head_config.hidden_size == config.hidden_size
    head = init_weights(EagleHead(head_config, model.get_input_embeddings(), model.get_output_embeddings()), std=0.1)
    expected = decode(model, None, PROMPT, 16)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + expected])).logits[0, len(PROMPT) - 1:-1]
    assert logits.argmax(-1).tolist() == expected
    for budget in (TreeBudget(8, 3, 4), TreeBudget(kind="static")):
        assert decode(model, head.eval(), PROMPT, 16, budget) == expected, budget
