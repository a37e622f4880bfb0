"""Streaming text: deltas joined equal the full decode (multi-byte characters never split, spaces kept),
and the engine's event stream follows the protocol."""

import threading

import pytest
from tiny_models import save_tiny_pair, tiny_tokenizer

from eaglechat.engine.protocol import Finished, GenerationParams, PrefillProgress, TextDelta, TreeBudget
from eaglechat.engine.text import Detokenizer
from eaglechat.loader import load_engine

TEXTS = ["caf\u00e9 na\u00efve \u00fcber", " leading space and  double", "\u65e5\u672c\u8a9e \U0001f985 eagle!", "a\nb\n\n  c"]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_join_to_the_full_text_one_token_at_a_time(text):
    tok = tiny_tokenizer()
    ids = tok(text)["input_ids"]
    detok = Detokenizer(tok)
    deltas = [detok.add([i]) for i in ids] + [detok.flush()]
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in d for d in deltas)


def test_deltas_with_uneven_chunks():
    tok = tiny_tokenizer()
    text = "".join(TEXTS)
    ids = tok(text)["input_ids"]
    detok = Detokenizer(tok)
    out, i, step = [], 0, 1
    while i < len(ids):
        out.append(detok.add(ids[i:i + step]))
        i, step = i + step, step % 4 + 1
    out.append(detok.flush())
    assert "".join(out) == text


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    base, head = save_tiny_pair(tmp_path_factory.mktemp("pair"))
    return load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4))


def test_event_stream_follows_the_protocol(engine):
    messages = [{"role": "user", "content": "Hello world"}]
    events = [e for e in engine.generate(messages, GenerationParams(max_new_tokens=24))
              if not isinstance(e, PrefillProgress)]  # (tests/test_engine_contract.py checks those)
    assert isinstance(events[-1], Finished) and all(isinstance(e, TextDelta) for e in events[:-1])
    final = events[-1]
    assert "".join(e.text for e in events[:-1]) == final.text
    ids = [t for e in events[:-1] for t in e.token_ids]
    assert ids == final.token_ids and final.stats.new_tokens == len(ids)
    assert all(len(e.drafted) == len(e.token_ids) for e in events[:-1])
    assert final.stop_reason in ("stop", "length")
    plain = list(engine.generate(messages, GenerationParams(max_new_tokens=24, speculate=False)))[-1]
    assert plain.token_ids == final.token_ids and plain.stats.mean_accepted == 1.0


def test_second_turn_reuses_the_conversation_cache(engine):
    first = [{"role": "user", "content": "Hello world"}]
    reply = list(engine.generate(first, GenerationParams(max_new_tokens=8)))[-1]
    second = first + [{"role": "assistant", "content": reply.text}, {"role": "user", "content": "Again"}]
    final = list(engine.generate(second, GenerationParams(max_new_tokens=8)))[-1]
    assert final.stats.reused_tokens >= len(engine.encode(first)) - 1
    list(engine.generate([{"role": "user", "content": "x"}], GenerationParams(max_new_tokens=1)))  # another conversation in between
    again = list(engine.generate(second, GenerationParams(max_new_tokens=8)))[-1]
    assert again.token_ids == final.token_ids


def test_cancel_from_another_thread_keeps_what_was_produced(engine):
    cancel = threading.Event()
    events = []
    for event in engine.generate([{"role": "user", "content": "Hello"}], GenerationParams(max_new_tokens=500), cancel):
        events.append(event)
        cancel.set()
    assert events[-1].stop_reason == "cancelled"
    assert events[-1].text == "".join(e.text for e in events[:-1] if isinstance(e, TextDelta))


def test_out_of_memory_shrinks_the_tree_then_the_context_then_reports(tmp_path, monkeypatch):
    from eaglechat.engine import target
    from eaglechat.errors import OutOfMemory

    base, head = save_tiny_pair(tmp_path)
    eng = load_engine(str(base), head=str(head), tree=TreeBudget(16, 4, 4), max_context=2048)
    real_features = target.Target.features  # the device work of every tree and prompt forward
    limit = {"tree": 5}

    def features(self, ids, depth, visible):  # a device that only fits small trees (prompt chains pass)
        import torch

        is_tree = not torch.equal(visible, torch.tril(torch.ones_like(visible)))
        if is_tree and ids.numel() > limit["tree"]:
            raise torch.OutOfMemoryError("fake: CUDA out of memory")
        return real_features(self, ids, depth, visible)

    monkeypatch.setattr(target.Target, "features", features)
    messages = [{"role": "user", "content": "Hello world, hello"}]
    final = list(eng.generate(messages, GenerationParams(max_new_tokens=12)))[-1]
    assert eng.info.tree.total_tokens < 16  # the tree was shrunk
    if final.stop_reason == "oom":  # the first oversized tree came after some text: kept, turn ended
        assert "draft tree reduced" in final.message and final.token_ids
    limit["tree"] = 0  # nothing fits any more: shrink down to the floor, then one clear error
    with pytest.raises(OutOfMemory, match="out of memory"):
        for _ in range(10):
            list(eng.generate(messages, GenerationParams(max_new_tokens=12)))
