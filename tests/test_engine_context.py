"""A conversation longer than the context: the system prompt stays, the oldest turns go, the cut is
stable across turns (so the KV prefix is reused), and the output equals a fresh engine's on the
messages that were actually sent."""

from __future__ import annotations

import pytest

from eaglechat.engine.context import STRIDE, fit_conversation, reply_reserve
from eaglechat.engine.protocol import Finished, GenerationParams, PrefillProgress, TreeBudget
from eaglechat.errors import ContextTooLong


def words(messages):  # a stand-in tokenizer: one token per word, two per message for the template
    return [0] * sum(len(m["content"].split()) + 2 for m in messages)


def chat(turns: int, size: int = 8) -> list[dict]:
    out = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        out += [{"role": "user", "content": " ".join([f"q{i}"] * size)},
                {"role": "assistant", "content": " ".join([f"a{i}"] * size)}]
    return out + [{"role": "user", "content": "last question"}]


def test_fitting_keeps_the_system_prompt_and_drops_whole_oldest_turns():
    messages = chat(10)  # 1 + 20 + 1 messages, 4 + 200 + 4 = 208 tokens
    ids, dropped = fit_conversation(messages, words, max_context=120, reserve=20)
    assert dropped > 0 and dropped % 2 == 0  # whole turns (user + assistant)
    kept = [messages[0]] + messages[1 + dropped:]
    assert len(ids) == len(words(kept)) <= 100
    assert kept[1]["role"] == "user" and kept[-1]["content"] == "last question"
    assert fit_conversation(chat(2), words, 120, 20)[1] == 0  # fits: nothing dropped


def test_the_cut_is_stable_for_several_turns_so_the_prefix_is_reused():
    cuts = []
    for turns in range(8, 20):
        messages = chat(turns)
        _, dropped = fit_conversation(messages, words, max_context=200, reserve=20)
        cuts.append(messages[1 + dropped]["content"] if dropped else None)
    changes = sum(a != b for a, b in zip(cuts, cuts[1:]))
    assert cuts[-1] is not None and changes <= len(cuts) // STRIDE + 1, cuts


def test_a_single_message_longer_than_the_context_is_refused():
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": "w " * 300}]
    with pytest.raises(ContextTooLong, match="context holds 100"):
        fit_conversation(messages, words, max_context=100, reserve=10)
    assert reply_reserve(4096, 512) == 512 and reply_reserve(256, 512) == 64


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny_models import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("ctx"))


def engine_for(pair):
    from eaglechat.loader import load_engine

    base, head = pair
    return load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), max_context=192)


def run(engine, messages, max_new=12):
    events = list(engine.generate(messages, GenerationParams(max_new_tokens=max_new)))
    return events, events[-1]


def test_truncated_turns_equal_a_fresh_engine_on_what_was_sent(pair):
    engine = engine_for(pair)
    messages = [{"role": "system", "content": "You are a fox."}]
    dropped_seen = []
    for i in range(12):
        messages.append({"role": "user", "content": f"Hello world {i}! The quick brown fox jumps over the lazy dog."})
        events, fin = run(engine, messages)
        assert isinstance(fin, Finished) and fin.stop_reason in ("stop", "length")
        dropped = fin.stats.dropped_messages
        dropped_seen.append(dropped)
        progress = [e for e in events if isinstance(e, PrefillProgress)]
        assert progress and progress[-1].dropped_messages == dropped
        assert progress[-1].prompt_tokens == fin.stats.prompt_tokens <= 192
        if dropped:
            sent = messages[:1] + messages[1 + dropped:]
            _, fresh = run(engine_for(pair), sent)  # no cache, nothing to drop
            assert fresh.stats.dropped_messages == 0 and fresh.stats.reused_tokens == 0
            assert fresh.token_ids == fin.token_ids, i
        messages.append({"role": "assistant", "content": fin.text})
    assert dropped_seen[-1] > 0, dropped_seen  # the conversation did outgrow the context
    # once dropping began, turns with an unchanged cut reused the cached prefix
    assert engine.decoder.stats.reused_tokens > 0


def test_the_engine_refuses_a_message_that_cannot_fit(pair):
    engine = engine_for(pair)
    with pytest.raises(ContextTooLong):
        list(engine.generate([{"role": "user", "content": "fox " * 400}], GenerationParams(max_new_tokens=4)))
    assert engine.count_tokens([{"role": "user", "content": "fox " * 400}]) > 192
