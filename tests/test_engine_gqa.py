"""GQA tree verify without K/V copies: folding the query groups gives the logits of transformers' sdpa
path (which repeats K/V per layer under a mask), on tiny Llama-3- and Qwen2-shaped models."""

import random

import pytest
import torch
from tiny_models import COMMON, build_model, random_head
from transformers import LlamaConfig, Qwen2Config
from transformers.integrations import sdpa_attention

from eaglechat.engine.attention import NAME
from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.engine.tree import tree_from_parents

SHAPES = {  # 8 query heads over 2 KV heads (groups of 4), as Llama-3-8B's 32/8
    "llama3": lambda: LlamaConfig(**{**COMMON, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8},
                                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                                  rope_theta=500000.0),
    "qwen2": lambda: Qwen2Config(**{**COMMON, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8}),
}


def gqa_model(shape, seed=0):
    return build_model(SHAPES[shape](), seed, scale=4.0)


def tree_logits(decoder, prefix, tree, repeats):
    """Logits of the tree's nodes after `prefix`; `repeats` counts repeat_kv calls of the tree forward."""
    chain = torch.arange(len(prefix))
    decoder.target.forward(torch.tensor(prefix), chain, chain[:, None] >= chain[None, :])
    repeats.clear()
    return decoder.target.logits(decoder.target.forward(tree.tokens, tree.depth, tree.ancestors)[0])


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_folded_gqa_equals_repeated_kv_and_copies_nothing(shape, monkeypatch):
    model = gqa_model(shape)
    repeats = []
    real_repeat = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: repeats.append(1) or real_repeat(*a))
    rng = random.Random(shape)
    for trial in range(3):
        prefix = [rng.randrange(96) for _ in range(5 + 9 * trial)]
        parents = [-1] + [rng.randrange(i) for i in range(1, 14)]
        tree = tree_from_parents([rng.randrange(96) for _ in parents], parents)
        folded = tree_logits(Decoder(model, None, 128), prefix, tree, repeats)
        assert model.config._attn_implementation == NAME
        assert repeats == []  # no layer repeated its keys/values
        stock = Decoder(model, None, 128)
        model.set_attn_implementation("sdpa")  # transformers' own path: repeat_kv under the mask
        reference = tree_logits(stock, prefix, tree, repeats)
        assert len(repeats) == 2 * model.config.num_hidden_layers  # the control copies K and V per layer
        assert (folded - reference).abs().max().item() <= 1e-5, (shape, trial)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_greedy_eagle_equals_plain_on_gqa_shapes(shape):
    model = gqa_model(shape)
    head = random_head(model)
    prompt = [4, 8, 15, 16, 23, 42]

    def run(decoder, speculate, budget):
        params = GenerationParams(max_new_tokens=24, speculate=speculate)
        return [t for s in decoder.generate(prompt, params, budget, set()) for t in s.tokens]

    expected = run(Decoder(model, None, 128), False, TreeBudget())
    for budget in (TreeBudget(8, 3, 4), TreeBudget(kind="static")):
        assert run(Decoder(model, head, 128), True, budget) == expected
