"""The Engine protocol (eaglechat/engine/protocol.py), asserted the same way for every engine: the
scripted fake the TUI tests use and the real LocalEngine (a tiny random model with a random head), so
the fake cannot drift from the engine. Add an engine by adding a fixture param."""

from __future__ import annotations

import threading

import pytest
from fake_engine import FakeEngine

from eaglechat.engine.protocol import Finished, GenerationParams, PrefillProgress, TextDelta, TreeBudget

MESSAGES = [{"role": "user", "content": "Hello world, tell me about the quick brown fox."}]
LONG_REPLY = " ".join(f"word{i}" for i in range(200))


def local_engine(tmp_path_factory):
    from tiny_models import save_tiny_pair

    from eaglechat.loader import load_engine

    base, head = save_tiny_pair(tmp_path_factory.mktemp("contract"))
    return load_engine(str(base), head=str(head), tree=TreeBudget(8, 3, 4), max_context=512)


@pytest.fixture(scope="module", params=["fake", "local", "remote"])
def engine(request, tmp_path_factory):
    if request.param == "fake":
        yield FakeEngine([LONG_REPLY], tokens_per_step=3)
    elif request.param == "local":
        yield local_engine(tmp_path_factory)
    else:  # RemoteEngine over HTTP, against a real `eaglechat serve` app on 127.0.0.1 in front of LocalEngine
        from serving import serving

        from eaglechat.engine.remote import RemoteEngine
        from eaglechat.server import create_app

        with serving(create_app(local_engine(tmp_path_factory))) as url:
            yield RemoteEngine(url)


def run(engine, params: GenerationParams, cancel=None, messages=MESSAGES) -> tuple[list, Finished]:
    events = list(engine.generate(messages, params, cancel))
    assert events and isinstance(events[-1], Finished), "Finished must come last"
    assert sum(isinstance(e, Finished) for e in events) == 1
    assert all(isinstance(e, (PrefillProgress, TextDelta)) for e in events[:-1])
    return events, events[-1]


def deltas(events) -> list[TextDelta]:
    return [e for e in events if isinstance(e, TextDelta)]


@pytest.mark.parametrize("speculate", [True, False, "auto"])
def test_event_order_first_delta_and_text(engine, speculate):
    events, fin = run(engine, GenerationParams(max_new_tokens=24, speculate=speculate))
    ds = deltas(events)
    first_delta = events.index(ds[0])
    assert all(isinstance(e, PrefillProgress) for e in events[:first_delta]), "prefill progress comes first"
    assert ds[0].step is None and len(ds[0].token_ids) == 1, "the first delta is the prefill's one token"
    if ds[-1].step is None and len(ds) > 1:  # text held back at the end (an incomplete character)
        assert ds[-1].token_ids == [] and ds[-1].text
        ds = ds[:-1]
    assert all(d.step is not None for d in ds[1:]), "every later delta is one verify step"
    assert "".join(d.text for d in deltas(events)) == fin.text
    assert [t for d in ds for t in d.token_ids] == fin.token_ids
    assert fin.stats.new_tokens == len(fin.token_ids) <= 24
    for d in ds:
        assert len(d.drafted) == len(d.token_ids) == len(d.token_texts)
        assert "".join(d.token_texts) == d.text
    assert fin.stop_reason in ("stop", "length")


@pytest.mark.parametrize("speculate", [True, False, "auto"])
def test_step_stats_and_what_decode_tokens_counts(engine, speculate):
    events, fin = run(engine, GenerationParams(max_new_tokens=24, speculate=speculate))
    ds, stats = deltas(events), fin.stats
    steps = [d.step for d in ds[1:]]
    assert stats.target_forwards == len(steps) > 0
    # decode_tokens: what the verify steps produced, the prefill token not counted, a produced stop
    # token counted, tokens cut by max_new_tokens not
    assert stats.decode_tokens == sum(s.decode_tokens for s in steps)
    assert stats.decode_tokens == stats.new_tokens - 1 + (fin.stop_reason == "stop")
    assert stats.mean_accepted == pytest.approx(stats.decode_tokens / stats.target_forwards)
    for d, s in zip(ds[1:], steps):
        assert s.decode_tokens in (len(d.token_ids), len(d.token_ids) + 1)
        assert s.accepted >= sum(d.drafted)
        if speculate is True:
            assert s.tree_size > 1
        elif not speculate or s.tree_size == 1:  # "auto": a plain step or a speculative one, step by step
            assert s.accepted == 0 and s.tree_size == 1 and s.decode_tokens <= 1
    if not speculate:
        assert stats.mean_accepted == 1.0
    if speculate == "auto":  # the head drafts (every step feeds it); the engine says what it chose
        assert stats.speculate is True and stats.speculation.startswith("auto")
    else:
        assert bool(stats.speculate) is speculate and not stats.speculation
    if fin.stop_reason == "length":
        assert stats.new_tokens == 24


def test_greedy_speculation_equals_plain(engine):
    _, spec = run(engine, GenerationParams(max_new_tokens=32, speculate=True))
    _, plain = run(engine, GenerationParams(max_new_tokens=32, speculate=False))
    assert spec.token_ids == plain.token_ids and spec.text == plain.text
    _, auto = run(engine, GenerationParams(max_new_tokens=32, speculate="auto"))  # plain and EAGLE steps mixed
    assert auto.token_ids == plain.token_ids and auto.text == plain.text


def test_cancel_during_generation_stops_after_the_current_step(engine):
    cancel = threading.Event()
    seen = []
    gen = engine.generate(MESSAGES, GenerationParams(max_new_tokens=64, speculate=True), cancel)
    for event in gen:
        seen.append(event)
        if isinstance(event, TextDelta) and event.step is not None:
            cancel.set()
            seen.extend(gen)
            break
    fin = seen[-1]
    assert isinstance(fin, Finished) and fin.stop_reason == "cancelled"
    ds = deltas(seen)
    assert len([d for d in ds if d.step is not None]) == 1, "no step after the one that saw the cancel"
    assert "".join(d.text for d in ds) == fin.text
    assert fin.stats.new_tokens == len(fin.token_ids)


def test_cancel_before_start_yields_at_most_the_prefill_token(engine):
    cancel = threading.Event()
    cancel.set()
    events, fin = run(engine, GenerationParams(max_new_tokens=64), cancel)
    assert fin.stop_reason == "cancelled"
    assert fin.stats.target_forwards == 0 and fin.stats.new_tokens <= 1
    assert all(d.step is None for d in deltas(events))


def test_a_message_longer_than_the_context_is_refused_before_any_event(engine):
    from eaglechat.errors import ContextTooLong

    huge = [{"role": "user", "content": "fox " * (engine.info.max_context + 10)}]
    assert engine.count_tokens(huge) > engine.info.max_context
    with pytest.raises(ContextTooLong):
        next(iter(engine.generate(huge, GenerationParams(max_new_tokens=4))))


def test_raw_text_completion_follows_the_same_protocol(engine):
    """`complete(prompt, params, cancel, suffix=None)` (the server's /v1/completions) where an engine has it."""
    if not hasattr(engine, "complete"):
        pytest.skip("a chat-only engine")
    events = list(engine.complete("The quick brown fox", GenerationParams(max_new_tokens=8), None))
    fin = events[-1]
    assert isinstance(fin, Finished) and sum(isinstance(e, Finished) for e in events) == 1
    assert all(isinstance(e, (PrefillProgress, TextDelta)) for e in events[:-1])
    assert "".join(d.text for d in deltas(events)) == fin.text and 0 < len(fin.token_ids) <= 8
    assert isinstance(engine.can_fill_in_middle, bool)
