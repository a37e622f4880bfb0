"""Heads fed what their trainers fed them, on a Gemma 3 base: Gemma's embedding module multiplies its rows
by sqrt(hidden_size) in its forward (transformers `Gemma3TextScaledWordEmbedding`), while SpecForge and
speculators copy the base's `embed_tokens.weight` into a plain nn.Embedding and train on the rows as
stored. A head fed the scaled rows stays exact (verification decides) but drafts garbage, so these
tests compare eaglechat's drafts with the trainers' own modules: SpecForge's `LlamaForCausalLMEagle3`
itself (installed with `pip install --no-deps specforge`: its package requires sglang, which this test
does not need; skipped where it is absent), and speculators' forward written out from its source (its
package requires datasets, torchvision and torchaudio), as test_head_formats.py does for other bases."""

import copy
import json

import pytest
import torch
from test_eagle3 import V, draft_vocab, plain, spec
from test_head_formats import (
    randomize,
    reference_eagle3_first_layer,
    speculators_eagle3_config,
    speculators_state,
    transformer_layer_config,
    write,
)
from tiny_models import TINY, build_model
from transformers import AutoConfig

from eaglechat.engine.decode import Decoder
from eaglechat.engine.heads import Eagle3Config, Eagle3Head, load_head
from eaglechat.engine.heads.eagle3 import set_draft_vocab
from eaglechat.engine.protocol import TreeBudget

LAYERS = 8
PROMPT = [4, 8, 15, 16, 23, 42]


@pytest.fixture(scope="module")
def gemma():
    """A tiny Gemma 3 text model (8 layers, sliding and global): embed_scale sqrt(64) = 8."""
    types = ["sliding_attention", "sliding_attention", "full_attention"] * 3
    config = AutoConfig.for_model("gemma3_text", **{**TINY, "num_hidden_layers": LAYERS},
                                  sliding_window=4, layer_types=types[:LAYERS])
    model = build_model(config, seed=0, scale=2.0).requires_grad_(False)
    assert float(model.get_input_embeddings().embed_scale) == 8.0
    return model


def fused_rows(seed=7, t=6):
    torch.manual_seed(seed)
    return torch.randn(t, 3 * 64), torch.tensor([3, 8, 1, 40, 22, 9][:t])


def test_the_base_module_scales_and_a_head_reads_the_rows_as_stored(gemma):
    """What the rest of this file rests on: on Gemma the base's embedding forward is not its rows."""
    tokens = torch.tensor([3, 8, 1])
    rows = gemma.get_input_embeddings().weight[tokens]
    assert torch.allclose(gemma.get_input_embeddings()(tokens), rows * 8.0)
    head = randomize(Eagle3Head(Eagle3Config.for_base(gemma.config), gemma.get_input_embeddings()))
    seen = {}
    hook = head.midlayer.input_layernorm.register_forward_hook(lambda m, args, out: seen.setdefault("emb", args[0]))
    try:
        fused, _ = fused_rows(t=3)
        head(fused[None], tokens[None], torch.arange(3)[None])
    finally:
        hook.remove()
    assert torch.equal(seen["emb"][0], rows)


# -- SpecForge: its own module and its own export --------------------------------------------------

def specforge_export(tmp_path, gemma, ids):
    """A SpecForge EAGLE-3 head for the Gemma base, built with SpecForge's LlamaForCausalLMEagle3, its
    embedding loaded by its own `load_embedding` from the saved base, and written the way its
    `export_to_hf` ends: save_pretrained with the embedding, then `apply_legacy_rope_scaling`
    (transformers 5 writes rope_parameters; SpecForge mirrors the scaling into rope_scaling)."""
    llama3_eagle = pytest.importorskip("specforge.modeling.draft.llama3_eagle")
    from specforge.export.checkpoint_io import apply_legacy_rope_scaling
    from transformers import LlamaConfig

    base_dir = tmp_path / "gemma-base"
    gemma.save_pretrained(base_dir)
    config = LlamaConfig(
        architectures=["LlamaForCausalLMEagle3"], hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_hidden_layers=1, vocab_size=V, draft_vocab_size=len(ids),
        max_position_embeddings=4096, rms_norm_eps=1e-6, pad_token_id=0, tie_word_embeddings=False,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, target_model_type="gemma3_text",
    )
    draft = llama3_eagle.LlamaForCausalLMEagle3(config).float()
    randomize(draft, seed=5)
    with torch.no_grad():
        draft.load_embedding(str(base_dir))  # SpecForge's own: model.embed_tokens.weight of the base, as stored
        index = torch.tensor(ids)
        draft.d2t.copy_(index - torch.arange(len(ids)))
        draft.t2d.zero_()
        draft.t2d[index] = True
    draft.save_pretrained(tmp_path / "export", state_dict=dict(draft.state_dict()))
    apply_legacy_rope_scaling(str(tmp_path / "export"))
    return draft.eval(), llama3_eagle


def specforge_forward(draft, llama3_eagle, fused, tokens, monkeypatch):
    """SpecForge's training computation of one causal pass (algorithms/eagle3/model.py: embed_input_ids,
    project_hidden_states, backbone, compute_logits); its rotary helper is torch.compile'd for GPUs:
    run as written, uncompiled."""
    rotary = llama3_eagle.apply_rotary_pos_emb
    monkeypatch.setattr(llama3_eagle, "apply_rotary_pos_emb", getattr(rotary, "_torchdynamo_orig_callable", rotary))
    t = tokens.numel()
    embeds = draft.embed_input_ids(tokens[None])
    hidden = draft.project_hidden_states(fused[None])
    mask = llama3_eagle.prepare_decoder_attention_mask(torch.ones(1, t, dtype=torch.bool), (1, t), hidden, 0)
    out = draft.backbone(embeds, hidden, None, mask, torch.arange(t)[None], use_cache=False)
    return out[0], draft.compute_logits(out)[0]


def test_a_specforge_export_on_gemma3_drafts_what_specforge_computes(tmp_path, gemma, monkeypatch):
    ids = draft_vocab()
    draft, llama3_eagle = specforge_export(tmp_path, gemma, ids)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == config["rope_scaling"]["rope_type"] == "linear"  # the mirror
    assert torch.equal(draft.embed_tokens.weight, gemma.get_input_embeddings().weight)  # an exact copy of the base's
    loaded = load_head(tmp_path / "export", gemma)
    assert loaded.own_embedding is None  # the copy is the base's tensor, shared
    fused, tokens = fused_rows()
    ref_hidden, ref_logits = specforge_forward(draft, llama3_eagle, fused, tokens, monkeypatch)
    hidden = loaded(fused[None], tokens[None], torch.arange(6)[None])[0]
    assert torch.allclose(hidden, ref_hidden, atol=1e-5), (hidden - ref_hidden).abs().max()
    assert torch.allclose(loaded.logits(hidden), ref_logits, atol=1e-5)
    assert loaded.draft_to_target.tolist() == ids
    # fed the scaled rows (the base module's forward) it computes something else; EAGLE-3's input_layernorm
    # cancels most of the factor (what is left goes through its eps), still 100 times this test's tolerance
    scaled = copy.deepcopy(loaded)
    scaled.config.embed_scale = 8.0
    assert (scaled(fused[None], tokens[None], torch.arange(6)[None])[0] - ref_hidden).abs().max() > 1e-3
    assert spec(Decoder(gemma, loaded, 256), PROMPT, 12, TreeBudget(8, 3, 4)) == plain(gemma, PROMPT, 12)


# -- speculators: its forward, written out from its source -----------------------------------------

def test_a_speculators_head_on_gemma3_drafts_what_speculators_computes(tmp_path, gemma):
    """speculators' Eagle3DraftModel embeds with its own nn.Embedding filled from the verifier's
    `embed_tokens.weight` (src/speculators/model.py): the rows as stored."""
    ids = draft_vocab()
    tlc = transformer_layer_config("qwen3", rope_theta=10000.0, rms_norm_eps=1e-6)
    cfg = Eagle3Config.for_base(gemma.config, draft_vocab_size=len(ids))
    cfg.qk_norm, cfg.aux_layers = True, (2, 4, 5)
    head = randomize(Eagle3Head(cfg, gemma.get_input_embeddings()))
    set_draft_vocab(head, ids)
    state = speculators_state(head, gemma)
    config = speculators_eagle3_config(tlc, len(ids), eagle_aux_hidden_state_layer_ids=[2, 4, 5])
    loaded = load_head(write(tmp_path / "spec3", config, state), gemma)
    fused, tokens = fused_rows()
    out = loaded(fused[None], tokens[None], torch.arange(6)[None])[0]
    ref = reference_eagle3_first_layer(tlc, state, False, fused, tokens, gemma.get_input_embeddings().weight)
    assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()
    assert spec(Decoder(gemma, loaded, 256), PROMPT, 12, TreeBudget(8, 3, 4)) == plain(gemma, PROMPT, 12)


def test_a_head_whose_config_says_embed_scale_is_fed_scaled_rows(tmp_path, gemma):
    """`embed_scale` in the head's config.json (eaglechat's key) multiplies the rows: a head trained on
    the base module's scaled forward says so and is fed that."""
    head = randomize(Eagle3Head(Eagle3Config.for_base(gemma.config), gemma.get_input_embeddings()))
    config = {**head.config.to_dict(), "embed_scale": 8.0}
    loaded = load_head(write(tmp_path / "scaled", config, head.head_state_dict()), gemma)
    assert loaded.config.embed_scale == 8.0 and loaded.config.to_dict()["embed_scale"] == 8.0
    fused, tokens = fused_rows()
    twin = Eagle3Head(head.config, torch.nn.Embedding.from_pretrained(gemma.get_input_embeddings().weight * 8.0))
    twin.load_state_dict(head.state_dict())
    assert torch.allclose(loaded(fused[None], tokens[None], torch.arange(6)[None]),
                          twin(fused[None], tokens[None], torch.arange(6)[None]), atol=1e-6)
    assert spec(Decoder(gemma, loaded, 256), PROMPT, 10, TreeBudget(8, 3, 4)) == plain(gemma, PROMPT, 10)
