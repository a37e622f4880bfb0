"""Numbers a user can trust: live tau from the engine's one definition, no speedup from a turn too
short to measure, a plain-is-faster hint from the chat's own measurements, prompt reading progress,
the context gauge, dropped turns said in the conversation, draft colours at exact token boundaries."""

from __future__ import annotations

from fake_engine import FakeEngine, make_tui_app, status_text, type_and_send, wait_ready, wait_reply, wait_until

from eaglechat.tui.generation import drafted_runs
from eaglechat.tui.widgets import MessageView, PromptInput

SIZE = (140, 36)
LETTERS = "a b c d e f g h i j k l m n o p q r s t u v w x"  # 24 tokens


async def test_live_tau_leaves_out_the_prefill_token_and_ends_at_the_final_figure(tmp_path):
    engine = FakeEngine([LETTERS], tokens_per_step=4, pause_after_steps=2)
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "go")
        await wait_until(pilot, engine.paused.is_set, what="two steps")
        await wait_until(pilot, lambda: "τ" in status_text(app), what="live figures")
        # 9 tokens shown after two steps of 4: the old live figure was 9 / 2 = 4.50 (above the
        # maximum of depth + 1 = ... for this tree it is the step size, 4)
        assert "τ 4.00" in status_text(app), status_text(app)
        engine.resume.set()
        await wait_reply(pilot)
        assert "τ 4.00" in status_text(app)
        assert app.store.messages(app.conversation.id)[-1].stats["mean_accepted"] == 4.0


async def test_no_speedup_from_a_turn_too_short_to_measure(tmp_path):
    engine = FakeEngine(lambda messages: LETTERS if "long" in messages[-1]["content"] else "a b c")
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f5")  # plain decoding measures the baseline
        await type_and_send(pilot, "long")
        await wait_reply(pilot)
        await pilot.press("f5", "f5")  # off -> auto -> on
        await type_and_send(pilot, "short")
        await wait_reply(pilot)
        assert "speedup — (short reply)" in status_text(app), status_text(app)
        await type_and_send(pilot, "long again")
        await wait_reply(pilot)
        assert "speedup 2.50×" in status_text(app)


async def test_speculation_measured_slower_than_plain_is_said_with_the_switch(tmp_path):
    engine = FakeEngine([LETTERS], spec_decode_tps=8.0, plain_decode_tps=20.0)
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f5")
        await type_and_send(pilot, "plain")
        await wait_reply(pilot)
        await pilot.press("f5", "f5")  # off -> auto -> on
        await type_and_send(pilot, "spec")
        await wait_reply(pilot)
        hints = [n.message for n in app._notifications if "plain decoding is faster" in n.message]
        assert len(hints) == 1 and "0.40×" in hints[0] and "F5" in hints[0]
        await type_and_send(pilot, "spec again")
        await wait_reply(pilot)
        assert len([n for n in app._notifications if "plain decoding is faster" in n.message]) == 1  # once


async def test_reading_the_prompt_is_shown_and_esc_stops_it(tmp_path):
    engine = FakeEngine([LETTERS], pause_in_prefill=True)
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "one two three")
        await wait_until(pilot, engine.paused.is_set, what="the prompt to be read")
        await wait_until(pilot, lambda: "reading prompt" in status_text(app), what="the status")
        assert "reading prompt (5 tokens) 0%" in status_text(app) and "ready" not in status_text(app)
        await pilot.press("escape")
        await wait_reply(pilot)
        assert [m.role for m in app.store.messages(app.conversation.id)] == ["user"]  # no empty reply
        assert not [v for v in app.query(MessageView) if v.role == "assistant"]


async def test_context_gauge_dropped_turns_and_a_message_that_cannot_fit(tmp_path):
    engine = FakeEngine(["ten words of reply to fill the context up quickly"], max_context=80)
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert "ctx —/80" in status_text(app)
        await type_and_send(pilot, "first question here")
        await wait_reply(pilot)
        assert "ctx 15/80" in status_text(app), status_text(app)  # 5 prompt + 10 reply tokens
        for i in range(4):
            await type_and_send(pilot, f"question number {i}")
            await wait_reply(pilot)
        last = [v for v in app.query(MessageView) if v.role == "assistant"][-1]
        assert "earlier messages outside the context" in last.meta
        assert any("earlier messages are outside the context" in n.message for n in app._notifications)
        stored = app.store.messages(app.conversation.id)[-1]
        assert stored.stats["dropped_messages"] > 0 and "outside the context" in stored.stats["meta"]
        # a single message the context cannot hold: refused before sending, kept in the prompt
        calls = len(engine.calls)
        too_long = " ".join(["word"] * 90)
        app.query_one(PromptInput).text = too_long
        await pilot.press("enter")
        await pilot.pause()
        assert len(engine.calls) == calls and app.query_one(PromptInput).text == too_long
        assert any("context holds 80" in n.message for n in app._notifications)
        # the conversation goes on
        app.query_one(PromptInput).text = "short one"
        await pilot.press("enter")
        await wait_reply(pilot)
        assert len(engine.calls) == calls + 1


def test_draft_runs_follow_the_engine_token_texts():
    # "Fran" drafted, "ce" the bonus token: the old proportional split coloured "Fran|ce" as 3 + 3
    assert drafted_runs("France", [True, False], ["Fran", "ce"]) == [(4, True), (2, False)]
    assert drafted_runs("France", [True, False]) == [(3, True), (3, False)]  # an engine that does not say
    assert drafted_runs(" functio" + "n", [False, True, True], [" fun", "ctio", "n"]) == [(4, False), (5, True)]


async def test_reply_runs_in_the_app_are_exact(tmp_path):
    engine = FakeEngine(["A bb cccc dddddddd eeeeeeeeeeeeeeee"], tokens_per_step=3)
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "go")
        await wait_reply(pilot)
        reply = [v for v in app.query(MessageView) if v.role == "assistant"][-1]
        # "A" from the prefill; then " bb" " cccc" drafted and " dddddddd" the bonus; " eee…" drafted
        # (the step ends at the stop token, which is the bonus there)
        assert reply.runs == [(1, False), (8, True), (9, False), (17, True)]


def test_remote_figures_are_rendered_when_the_engine_gives_them():
    from eaglechat.engine.protocol import EngineInfo, GenerationStats
    from eaglechat.tui.stats import TurnNumbers, meta_line, status_parts

    stats = GenerationStats(new_tokens=40, target_forwards=20, decode_tokens=39, mean_accepted=1.95,
                            tokens_per_s=30.0, ttft_s=0.25, server_wide=True, speculate=True)
    numbers = TurnNumbers.from_finished(stats, TurnNumbers(), "stop")
    line = meta_line(numbers, "http://box:8000/v1#vicuna")
    assert "τ 1.95 (server-wide)" in line and "first text after 0.25 s" in line
    info = EngineInfo(model="vicuna", device="remote", server="vllm")
    assert "remote (vllm)" in status_parts(info, numbers, None, True)


def test_the_engines_own_speculation_choice_is_in_the_status_bar():
    """speculate="auto": the engine tries both modes and keeps the faster; the status bar says what it chose
    and what it measured instead of the bare switch."""
    from eaglechat.engine.protocol import EngineInfo, GenerationStats
    from eaglechat.tui.stats import TurnNumbers, status_parts

    info = EngineInfo(model="m", device="cpu")
    chose = GenerationStats(new_tokens=40, target_forwards=30, speculate=True, speculation="auto: off 0.7x")
    parts = status_parts(info, TurnNumbers.from_finished(chose, TurnNumbers(), "stop"), None, "auto")
    assert "auto: off 0.7x" in parts and "spec auto" not in parts
    # the engine's measurement stands for the speedup (no baseline comparison for a turn that mixed modes)
    assert not any(p.startswith("speedup") for p in parts), parts
    # the switch moved on (F5): the bar says what the next reply does
    assert "spec on" in status_parts(info, TurnNumbers.from_finished(chose, TurnNumbers(), "stop"), None, True)
    forced = GenerationStats(new_tokens=40, target_forwards=20, speculate=True)
    assert "spec on" in status_parts(info, TurnNumbers.from_finished(forced, TurnNumbers(), "stop"), None, True)
    # before a turn, and during one before the engine has measured
    assert "spec auto" in status_parts(info, None, None, "auto")
    live = TurnNumbers(speculate="auto", tokens=5, steps=2, decode_tokens=5)
    assert live.auto and live.speculate is True
    parts = status_parts(info, live, 20.0, "auto")
    assert "spec auto" in parts and "speedup …" in parts
    # auto on an engine without a head decodes plainly: said, but not a baseline turn
    plain = GenerationStats(new_tokens=40, target_forwards=40, speculate=False)
    numbers = TurnNumbers.from_finished(plain, TurnNumbers(speculate="auto"), "stop")
    assert numbers.auto and "plain decoding" in status_parts(info, numbers, None, "auto")
    assert "plain decoding (baseline)" not in status_parts(info, numbers, None, "auto")
