"""The 2026 base architectures through the loader and the CLI: each loads from a model folder and decodes
exactly (speculative == --no-speculate); an architecture the engine cannot verify over a tree is refused
in one line naming the layer, before any weight loads. The per-family lossless tests are
test_engine_tree.py, test_engine_lossless.py, test_engine_sampling.py, test_engine_compile.py."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import ARCHITECTURES_KWARGS, TINY, attention_for, random_head, save_tiny_pair, tiny_model, tiny_tokenizer
from transformers import AutoConfig, AutoModelForCausalLM

from eaglechat.cli import main
from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.engine.recurrent import layer_kinds
from eaglechat.errors import UnsupportedModel


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))


def run_json(capsys, *argv) -> dict:
    code = main(["run", *argv, "--json", "--quant", "none", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_5_text"])
def test_a_model_folder_loads_and_decodes_exactly(family, tmp_path, capsys):
    base, head = save_tiny_pair(tmp_path, family)
    args = (str(base), "--head", str(head), "--max-new-tokens", "24", "hello there")
    plain = run_json(capsys, *args, "--no-speculate")
    speculative = run_json(capsys, *args, "--speculate", "on", "--total-tokens", "12", "--depth", "4", "--draft-top-k", "3")
    assert speculative["token_ids"] == plain["token_ids"] and len(plain["token_ids"]) == 24
    assert speculative["stats"]["speculate"] and not plain["stats"]["speculate"]


REFUSED = {  # model type -> (config overrides, what the line names)
    "falcon_mamba": ({}, "layer 0 is a recurrent layer that is not Gated DeltaNet"),
    "jamba": ({"attn_layer_period": 2, "attn_layer_offset": 1}, "layer 0 is a recurrent layer that is not Gated DeltaNet"),
    "llama4_text": ({"attention_chunk_size": 8, "no_rope_layers": [1, 0]}, "chunked attention"),
}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_an_architecture_without_an_exact_tree_verify_is_refused_in_one_line(kind, tmp_path, capsys):
    overrides, named = REFUSED[kind]
    folder = tmp_path / kind
    config = AutoConfig.for_model(kind, **{**TINY, **overrides})
    config.save_pretrained(folder)  # no weights: the refusal comes first
    tiny_tokenizer().save_pretrained(folder)
    code = main(["run", str(folder), "--no-speculate", "--quant", "none", "--device", "cpu", "hi"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert named in err and kind in err


def test_the_engine_refuses_what_it_cannot_verify_even_when_handed_a_model():
    model = tiny_model("llama")
    model.config._attn_implementation = "flex_attention"  # takes no 4D bool tree mask
    with pytest.raises(UnsupportedModel, match="cannot take a draft tree's mask"):
        Decoder(model, None, 64)
    with pytest.raises(UnsupportedModel, match="chunked attention"):
        layer_kinds(AutoConfig.for_model("llama4_text", **TINY, attention_chunk_size=8))


def test_recurrent_state_one_token_back_serves_the_next_turn():
    """A hybrid (Gated DeltaNet) cache reuses the previous turn up to its last token (the snapshot one
    token back), and re-reads a turn whose history was edited from the start, staying exact either way."""
    model = tiny_model("qwen3_5_text")
    decoder = Decoder(model, random_head(model), 256)

    def reply(prompt):
        steps = decoder.generate(prompt, GenerationParams(max_new_tokens=10), TreeBudget(8, 3, 4), set())
        return [t for s in steps for t in s.tokens]

    def plain(prompt):
        steps = Decoder(model, None, 256).generate(prompt, GenerationParams(max_new_tokens=10, speculate=False),
                                                     TreeBudget(), set())
        return [t for s in steps for t in s.tokens]

    first = [5, 6, 7, 8, 9]
    out = reply(first)
    cached = len(decoder.cached_ids)
    second = decoder.cached_ids + [out[-1], 10, 11]
    assert reply(second) == plain(second)
    assert decoder.stats.reused_tokens == cached - 1  # the one-back snapshot
    edited = first[:3] + [40, 41]
    assert reply(edited) == plain(edited)
    assert decoder.stats.reused_tokens == 0  # a recurrent state cannot go back to 3 tokens
    assert decoder.cache.reusable(3) == 0 and decoder.cache.reusable(decoder.cache.length) == decoder.cache.length


@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_5_text"])
def test_an_eagle3_head_on_the_2026_architectures_decodes_exactly(family):
    """EAGLE-3 heads read the inputs of base layers 2, N/2, N-3, captured in the verify forward: also
    through sink/sliding attention and Gated DeltaNet layers (8 layers, the layer pattern repeated)."""
    from test_eagle3 import random_head3

    kwargs = dict(ARCHITECTURES_KWARGS[family])
    kwargs["layer_types"] = (kwargs["layer_types"] * 4)[:8]
    torch.manual_seed(0)
    config = AutoConfig.for_model(family, **{**TINY, "num_hidden_layers": 8}, **kwargs)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attention_for(config))
    model = model.eval().requires_grad_(False)
    head = random_head3(model)
    prompt = [7, 3, 91, 40, 12, 5]
    plain = Decoder(model, None, 128).generate(prompt, GenerationParams(max_new_tokens=16, speculate=False),
                                                TreeBudget(), set())
    expected = [t for s in plain for t in s.tokens]
    decoder = Decoder(model, head, 128)
    assert decoder.target.feature_layers == [2, 4, 5]
    got = decoder.generate(prompt, GenerationParams(max_new_tokens=16), TreeBudget(12, 4, 3), set())
    assert [t for s in got for t in s.tokens] == expected


def test_a_measured_verify_leaves_a_hybrid_cache_where_it_was():
    """bench --costs and tune time a tree forward, then truncate back to the prompt: the recurrent state
    never moved (no keep_path), so that length is reachable and the next forward sees the same cache."""
    from eaglechat.engine.tree import tree_from_parents

    model = tiny_model("qwen3_5_text")
    decoder = Decoder(model, random_head(model), 128)
    list(decoder.generate([4, 5, 6, 7], GenerationParams(max_new_tokens=1), TreeBudget(8, 3, 4), set()))
    base = decoder.cache.length
    tree = tree_from_parents([9, 10, 11, 12], [-1, 0, 0, 1])
    logits = [decoder.target.logits(decoder.target.forward(tree.tokens, tree.depth, tree.ancestors)[0])]
    decoder.cache.truncate(base)
    logits.append(decoder.target.logits(decoder.target.forward(tree.tokens, tree.depth, tree.ancestors)[0]))
    decoder.cache.truncate(base)
    assert torch.equal(logits[0], logits[1]) and decoder.cache.length == base


def test_a_vision_language_checkpoint_decodes_through_its_language_model(tmp_path):
    """gemma-3-*-it checkpoints are Gemma3ForConditionalGeneration (model_type gemma3): the loader hands
    the engine the language model on the same modules, which computes what the whole model does on text."""
    from eaglechat.loader import load_base

    text = AutoConfig.for_model("gemma3_text", **{**TINY, "vocab_size": 320}, **ARCHITECTURES_KWARGS["gemma3_text"])
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    torch.manual_seed(0)
    full = AutoModelForCausalLM.from_config(AutoConfig.for_model("gemma3", text_config=text.to_dict(),
                                                                 vision_config=vision, mm_tokens_per_image=4))
    full.eval().save_pretrained(tmp_path / "gemma3")
    tiny_tokenizer().save_pretrained(tmp_path / "gemma3")
    model, _ = load_base(tmp_path / "gemma3", device="cpu", dtype=torch.float32)
    assert type(model).__name__ == "Gemma3ForCausalLM"
    prompt = [5, 9, 13, 2, 7, 11, 30]
    with torch.no_grad():
        assert torch.equal(model(torch.tensor([prompt])).logits, full(torch.tensor([prompt])).logits)
    plain = Decoder(model, None, 64).generate(prompt, GenerationParams(max_new_tokens=12, speculate=False),
                                               TreeBudget(), set())
    spec = Decoder(model, random_head(model), 64).generate(prompt, GenerationParams(max_new_tokens=12),
                                                            TreeBudget(8, 3, 4), set())
    assert [t for s in spec for t in s.tokens] == [t for s in plain for t in s.tokens]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_5_text"])
def test_greedy_eagle_equals_plain_on_cuda(family):
    """The sink attention and the tree-shaped Gated DeltaNet on a GPU (fp32; transformers' CUDA kernels
    for the prompt where installed)."""
    model = tiny_model(family).cuda()
    head = random_head(model).cuda()
    prompt = [7, 3, 91, 40, 12, 5, 60, 2]
    plain = Decoder(model, None, 128).generate(prompt, GenerationParams(max_new_tokens=32, speculate=False),
                                                TreeBudget(), set())
    expected = [t for s in plain for t in s.tokens]
    for budget in (TreeBudget(8, 3, 4), TreeBudget(30, 5, 6)):
        got = Decoder(model, head, 128).generate(prompt, GenerationParams(max_new_tokens=32), budget, set())
        assert [t for s in got for t in s.tokens] == expected, budget
