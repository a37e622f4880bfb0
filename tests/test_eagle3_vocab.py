"""Reduced draft vocabularies: top-N reply tokens, official d2t/t2d buffers, and exactness of decoding
with a reduced vocabulary on an EAGLE-3 head built from them and on a restricted EAGLE-2 head."""

import torch
from tiny_models import random_head, tiny_model

from eaglechat.engine.decode import Decoder
from eaglechat.engine.heads import Eagle3Config, Eagle3Head, init_weights
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.train import store
from eaglechat.train.vocab import (
    build_draft_vocab,
    count_tokens,
    coverage,
    d2t_t2d,
    restrict_eagle2_head,
    top_n,
)


def test_top_n_counts_reply_tokens_and_orders_ascending():
    counts = count_tokens([[5, 5, 5, 7, 7, 1], [7, 9], []], 12)
    assert counts.tolist()[:10] == [0, 1, 0, 0, 0, 3, 0, 3, 0, 1]
    assert top_n(counts, 2) == [5, 7]  # tie 5/7: both in; ascending
    assert top_n(counts, 3) == [1, 5, 7]  # tie 1/9 by count: lower id first
    assert top_n(counts, 3, always=[11]) == [5, 7, 11]  # a forced stop token displaces the rarest
    assert top_n(counts, 6) == [0, 1, 2, 5, 7, 9]  # unseen fill by lowest id: exactly n
    assert coverage(counts, [5, 7]) == 6 / 8


def test_d2t_offsets_and_t2d_mask_are_official():
    d2t, t2d = d2t_t2d([0, 3, 4, 10], 12)
    assert d2t.dtype == torch.long and d2t.tolist() == [0, 2, 2, 7]
    assert (torch.arange(4) + d2t).tolist() == [0, 3, 4, 10]
    assert t2d.dtype == torch.bool and t2d.nonzero().flatten().tolist() == [0, 3, 4, 10]


def test_build_from_a_work_folder(tmp_path):
    store.atomic_save([{"prompt_ids": [1, 2], "reply_ids": [3, 3, 4]}], tmp_path / "distill" / store.shard_name(0))
    store.atomic_save([{"prompt_ids": [9], "reply_ids": [4, 4, 4, 8]}], tmp_path / "replies" / store.shard_name(0))
    vocab = build_draft_vocab(tmp_path, 16, 2, always=[2])
    assert vocab["ids"] == [2, 4] and vocab["reply_tokens"] == 7 and abs(vocab["coverage"] - 4 / 7) < 1e-9


def test_reduced_vocab_heads_stay_exact():
    model = tiny_model("llama")
    counts = count_tokens([[(i * 7) % 96 for i in range(300)], list(range(0, 96, 3))], 96)
    ids = top_n(counts, 32)
    prompt = [3, 14, 15, 92, 65]
    plain = [t for s in Decoder(model, None, 256).generate(prompt, GenerationParams(max_new_tokens=20, speculate=False), TreeBudget(), set()) for t in s.tokens]
    small = restrict_eagle2_head(random_head(model), ids)
    assert small.draft_lm_head.weight.shape == (32, 64) and small.lm_head.weight.shape == (96, 64)
    torch.manual_seed(2)
    cfg = Eagle3Config.for_base(model.config, draft_vocab_size=32)
    h3 = init_weights(Eagle3Head(cfg, model.get_input_embeddings()), std=0.15)
    d2t, t2d = d2t_t2d(ids, 96)
    h3.d2t.copy_(d2t)
    h3.t2d.copy_(t2d)
    h3.eval()
    for head in (small, h3):
        dec = Decoder(model, head, 256)
        got = [t for s in dec.generate(prompt, GenerationParams(max_new_tokens=20), TreeBudget(12, 4, 4), set()) for t in s.tokens]
        assert got == plain
        # drafted tokens come only from the reduced vocabulary
        tree = dec.drafter.draft(got[-1], TreeBudget(12, 4, 4))
        assert set(tree.tokens[1:].tolist()) <= set(ids)
