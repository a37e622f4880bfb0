"""Chunked prefill: the same cache and logits as one forward over the prompt, cancellable between chunks,
with progress reports; greedy EAGLE stays equal to plain greedy for every chunk size."""

import threading

import pytest
import torch
from tiny_models import random_head, tiny_model, tiny_tokenizer

from eaglechat.engine.decode import Decoder
from eaglechat.engine.local import LocalEngine
from eaglechat.engine.protocol import EngineInfo, Finished, GenerationParams, TextDelta, TreeBudget

PROMPT = [(7 * i + 3) % 96 for i in range(23)]


def prefill_logits(decoder, prompt, cancel=None, on_progress=None):
    """Decoder.read_prompt run to its end, reporting each (read, to read); -> the logits it sampled from."""
    seen = []
    chunks = decoder.read_prompt(prompt, 0, decoder.drafter is not None,
                                 lambda logits: seen.append(logits) or logits.argmax(), cancel)
    for done, total in chunks:
        if on_progress is not None:
            on_progress(done, total)
    return seen[0] if seen else None


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_chunked_prefill_equals_one_forward(family):
    model = tiny_model(family)
    with torch.no_grad():
        reference = model(torch.tensor([PROMPT])).logits[0, -1]
    one_shot = Decoder(model, None, 64, prefill_chunk=64)
    prefill_logits(one_shot, PROMPT)
    n = len(PROMPT)
    for chunk in (1, 4, 7, 22, 23):
        decoder = Decoder(model, None, 64, prefill_chunk=chunk)
        logits = prefill_logits(decoder, PROMPT)
        assert (logits - reference).abs().max().item() <= 1e-5, (family, chunk)
        assert decoder.cache.length == n and decoder.cached_ids == PROMPT
        kv, ref_kv = decoder.cache.fused[..., :n, :], one_shot.cache.fused[..., :n, :]
        assert (kv - ref_kv).abs().max().item() <= 1e-5, (family, chunk)


def test_sliding_window_model_is_chunked_correctly():
    """A sliding window is not plain causal: the chain then goes through the explicit windowed mask."""
    from tiny_models import COMMON, build_model
    from transformers import MistralConfig

    model = build_model(MistralConfig(**COMMON, sliding_window=5), seed=0)
    with torch.no_grad():
        reference = model(torch.tensor([PROMPT])).logits[0, -1]
    for chunk in (3, 23):
        logits = prefill_logits(Decoder(model, None, 64, prefill_chunk=chunk), PROMPT)
        assert (logits - reference).abs().max().item() <= 1e-5, chunk


def test_causal_chain_passes_no_mask_to_sdpa():
    model = tiny_model("llama")
    decoder = Decoder(model, None, 64, prefill_chunk=8)
    calls = []
    forward = decoder.target.backbone.forward
    decoder.target.backbone.forward = lambda *a, **kw: calls.append(kw.get("attention_mask")) or forward(*a, **kw)
    prefill_logits(decoder, PROMPT)
    assert len(calls) == 3 and all(mask is None for mask in calls)


def plain(model, prompt, n):
    decoder = Decoder(model, None, 256)
    params = GenerationParams(max_new_tokens=n, speculate=False)
    return [t for s in decoder.generate(prompt, params, TreeBudget(), set()) for t in s.tokens]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_eagle_equals_plain_for_every_chunk_size(family):
    model = tiny_model(family)
    head = random_head(model)
    expected = plain(model, PROMPT, 16)
    for chunk in (1, 3, 8, 64):
        for budget in (TreeBudget(8, 3, 4), TreeBudget(kind="static")):
            decoder = Decoder(model, head, 256, prefill_chunk=chunk)
            got = [t for s in decoder.generate(PROMPT, GenerationParams(max_new_tokens=16), budget, set()) for t in s.tokens]
            assert got == expected, (family, chunk, budget)
            # the drafter read a verified feature for every prompt position, whatever the chunking
            assert decoder.drafter.stable == decoder.cache.length


def test_progress_is_reported_before_and_after_each_chunk():
    model = tiny_model("llama")
    decoder = Decoder(model, random_head(model), 256, prefill_chunk=10)
    seen = []
    steps = list(decoder.generate(PROMPT, GenerationParams(max_new_tokens=2), TreeBudget(8, 3, 4), set(),
                                  on_prefill_progress=lambda done, total: seen.append((done, total))))
    assert steps and seen == [(0, 23), (10, 23), (20, 23), (23, 23)]
    # the next turn reads only what is not cached
    seen.clear()
    longer = PROMPT + [s for step in steps for s in step.tokens] + [4, 5]
    list(decoder.generate(longer, GenerationParams(max_new_tokens=2), TreeBudget(8, 3, 4), set(),
                          on_prefill_progress=lambda done, total: seen.append((done, total))))
    new = len(longer) - decoder.stats.reused_tokens
    assert seen == [(0, new), (new, new)] and new <= 5


@pytest.mark.parametrize("speculate", [True, False])
def test_cancel_between_chunks_stops_and_leaves_a_reusable_cache(speculate):
    model = tiny_model("llama")
    head = random_head(model)
    decoder = Decoder(model, head, 256, prefill_chunk=5)
    cancel = threading.Event()
    seen = []

    def progress(done, total):
        seen.append(done)
        if done == 10:
            cancel.set()  # the user cancels while the third chunk is due

    params = GenerationParams(max_new_tokens=12, speculate=speculate)
    steps = list(decoder.generate(PROMPT, params, TreeBudget(8, 3, 4), set(), cancel, progress))
    assert steps == [] and decoder.stop_reason == "cancelled"
    assert seen == [0, 5, 10]  # stopped within one chunk of the cancel
    assert decoder.cache.length == 10 and decoder.cached_ids == PROMPT[:10]
    assert decoder.stats.prefill_tokens == 10
    if speculate:
        assert decoder.drafter.stable == 10
    # the next turn reuses what was read and stays exact
    got = [t for s in decoder.generate(PROMPT, params, TreeBudget(8, 3, 4), set()) for t in s.tokens]
    assert decoder.stats.reused_tokens == 9
    assert got == plain(model, PROMPT, 12)


def test_local_engine_passes_progress_and_the_chunk_from_engine_info():
    tok = tiny_tokenizer()
    model = tiny_model("llama")
    model.resize_token_embeddings(len(tok))
    info = EngineInfo(model="tiny", max_context=256, prefill_chunk=4, tree=TreeBudget(8, 3, 4))
    engine = LocalEngine(model, tok, random_head(model), info=info, stop_ids={tok.eos_token_id})
    assert engine.decoder.prefill_chunk == 4
    seen = []
    messages = [{"role": "user", "content": "Hello world! The quick brown fox."}]
    events = list(engine.generate(messages, GenerationParams(max_new_tokens=3), None, lambda d, t: seen.append((d, t))))
    total = len(engine.encode(messages))
    assert isinstance(events[-1], Finished) and any(isinstance(e, TextDelta) for e in events)
    assert seen[0] == (0, total) and seen[-1] == (total, total) and len(seen) == 2 + (total - 1) // 4
