"""Tree verification through the stock transformers forward equals sequential decoding, per family."""

import random

import pytest
import torch
from tiny_models import ALL, tiny_model

from eaglechat.engine.decode import Decoder
from eaglechat.engine.tree import STATIC_TREE_26, select_tree, static_levels, tree_from_parents


def random_tree(rng: random.Random, size: int, vocab: int):
    parents = [-1] + [rng.randrange(0, i) for i in range(1, size)]
    return tree_from_parents([rng.randrange(vocab) for _ in range(size)], parents)


@pytest.mark.parametrize("family", sorted(ALL))
def test_tree_node_logits_equal_sequential_path_logits(family):
    model = tiny_model(family)
    own = model.config._attn_implementation  # transformers' own attention (eager for gpt-oss) is the reference
    rng = random.Random(0)
    vocab = model.config.vocab_size
    for trial in range(3):
        prefix = [rng.randrange(vocab) for _ in range(7 + trial * 5)]
        decoder = Decoder(model, None, 256)
        decoder.target.forward_chain(torch.tensor(prefix))
        tree = random_tree(rng, 12, vocab)
        tree_logits = decoder.target.logits(decoder.target.forward(tree.tokens, tree.depth, tree.ancestors)[0])
        tree_attention = model.config._attn_implementation
        model.set_attn_implementation(own)
        for node in range(tree.size):
            path = prefix + tree.tokens[torch.nonzero(tree.ancestors[node]).flatten().tolist()].tolist()
            with torch.no_grad():
                reference = model(torch.tensor([path])).logits[0, -1]
            assert (tree_logits[node] - reference).abs().max().item() <= 1e-4, (family, trial, node)
        model.set_attn_implementation(tree_attention)


def test_wrong_mask_is_detected():
    """Control: the scaled tiny models make a causal (non-tree) mask visibly wrong."""
    model = tiny_model("llama")
    rng = random.Random(1)
    prefix = [rng.randrange(96) for _ in range(9)]
    decoder = Decoder(model, None, 256)
    chain = torch.arange(len(prefix))
    decoder.target.forward(torch.tensor(prefix), chain, chain[:, None] >= chain[None, :])
    tree = tree_from_parents([5, 6, 7, 8], [-1, 0, 0, 1])
    causal = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    wrong = decoder.target.logits(decoder.target.forward(tree.tokens, tree.depth, causal)[0])
    with torch.no_grad():
        reference = model(torch.tensor([prefix + [5, 7]])).logits[0, -1]
    assert (wrong[2] - reference).abs().max().item() > 1e-2


def test_select_tree_keeps_a_connected_subtree_even_with_ties():
    rng = random.Random(3)
    for _ in range(300):
        k, levels = rng.randint(1, 4), rng.randint(1, 4)
        tokens, scores, parents = [], [], []
        frontier = [(-1, 0.0)]
        for level in range(levels):
            new = []
            for parent, score in frontier[:k]:
                for _ in range(k):
                    s = score + rng.choice([0.0, -0.5, -1.0])  # many exact ties
                    tokens.append(rng.randrange(50))
                    scores.append(s)
                    parents.append(parent)
                    new.append((len(tokens) - 1, s))
            new.sort(key=lambda x: -x[1])
            frontier = new
        total = rng.randint(1, len(tokens))
        tree = select_tree(9, torch.tensor(tokens), torch.tensor(scores), torch.tensor(parents), total)
        assert tree.size == total + 1 and tree.parents[0] == -1
        assert all(0 <= p < i for i, p in enumerate(tree.parents) if i)
        assert tree.ancestors.diagonal().all()
        for i in range(1, tree.size):
            assert tree.depth[i] == tree.depth[tree.parents[i]] + 1


def test_static_tree_shape():
    levels = static_levels(STATIC_TREE_26)
    assert sum(len(lv) for lv in levels) == 25 and len(levels) == 5
    for level in levels[1:]:
        for path in level:
            assert path[:-1] in {p for lv in levels for p in lv}
