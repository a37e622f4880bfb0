"""Draft-time vocabulary (eaglechat/models/draft_vocab.py, FR-Spec style): which tokens, from which ranking, and
greedy EAGLE still equal to plain greedy with it on (the sampling side: tests/test_engine_sampling.py)."""

from __future__ import annotations

import torch
from tiny_models import random_head, save_tiny_pair, tiny_model, tiny_tokenizer

from eaglechat.engine.decode import Decoder
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.models import draft_vocab


def test_sizes_and_picks():
    assert draft_vocab.draft_size("auto", 32000) == 8192 and draft_vocab.draft_size("auto", 128256) == 32064
    assert draft_vocab.draft_size("auto", 5000) == 0  # not smaller than the vocabulary: nothing to cut
    assert draft_vocab.draft_size(0, 32000) == 0 and draft_vocab.draft_size(4096, 32000) == 4096
    ranked = torch.tensor([7, 3, 99, 5, 1])  # most frequent first; 99 is outside a vocabulary of 10
    assert draft_vocab.pick(3, 10, ranked=ranked, always=[9]) == [3, 7, 9]
    counts = torch.tensor([0, 5, 5, 1, 0, 9, 0, 0, 0, 0])
    assert draft_vocab.pick(3, 10, counts=counts) == [1, 2, 5]  # ties by lower id


def test_reply_counts_are_cached_per_tokenizer(tmp_path):
    tok = tiny_tokenizer()
    convs = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "Hello world! Hello."}]}]
    counts = draft_vocab.reply_counts(tok, len(tok), tmp_path, conversations=convs)
    hello = tok("Hello", add_special_tokens=False)["input_ids"][0]
    assert counts[hello] == 2 and counts.sum() == len(tok("Hello world! Hello.", add_special_tokens=False)["input_ids"])
    again = draft_vocab.reply_counts(tok, len(tok), tmp_path, conversations=[])  # read back, not recounted
    assert torch.equal(again, counts) and len(list(tmp_path.iterdir())) == 1


def decode(decoder, prompt, speculate, n=40):
    params = GenerationParams(max_new_tokens=n, speculate=speculate)
    return [t for s in decoder.generate(prompt, params, TreeBudget(8, 3, 4), set()) for t in s.tokens]


def test_greedy_eagle_equals_plain_with_a_draft_vocabulary(tmp_path):
    model = tiny_model("llama")
    head = random_head(model)
    vocab = model.config.vocab_size
    torch.save(torch.arange(vocab - 1, -1, -1), tmp_path / draft_vocab.TOKEN_MAP)  # "most frequent": high ids
    note = draft_vocab.apply(head, 24, head_dir=tmp_path, tokenizer=None, stop_ids=[2], cache_dir=None)
    assert head.draft_to_target.tolist() == [2, *range(vocab - 23, vocab)] and "token_map.pt" in note
    eagle, plain = Decoder(model, head, 256), Decoder(model, None, 256)
    drafted = []
    draft = eagle.drafter.draft
    eagle.drafter.draft = lambda root, budget: drafted.append(tree := draft(root, budget)) or tree
    for prompt in ([3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7]):
        assert decode(eagle, prompt, True) == decode(plain, prompt, False)
    kept = set(head.draft_to_target.tolist())
    assert drafted and all(set(t.tokens[1:][t.valid[1:]].tolist()) <= kept for t in drafted)
    assert draft_vocab.apply(head, 24, head_dir=tmp_path, tokenizer=None, stop_ids=[], cache_dir=None) == ""  # kept


def test_the_loader_applies_the_profile_setting(tmp_path, monkeypatch):
    import yaml

    from eaglechat import paths
    from eaglechat.loader import load_engine

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    base, head = save_tiny_pair(tmp_path, "llama")
    torch.save(torch.arange(100, 200), head / draft_vocab.TOKEN_MAP)
    profiles = paths.user_profiles_dir()
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "cpu.yaml").write_text(yaml.safe_dump({"name": "cpu", "draft_vocab": 64}))
    notes = []
    engine = load_engine(str(base), head=str(head), quant="none", tree=TreeBudget(8, 3, 4),
                         progress=lambda phase, fraction=None: notes.append(phase))
    ids = engine.head.draft_to_target.tolist()
    assert len(ids) == 64 and set(ids) - set(range(100, 200)) <= engine.stop_ids
    assert any(n.startswith("draft vocabulary: the 64 most frequent of") for n in notes)
