"""The chat never loses what the user typed: fast bursts, text typed or pasted while the focus was
elsewhere, replies cut by quitting; and the keyboard always finds its way back to the prompt."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine, make_tui_app, replies, wait_ready, wait_reply, wait_until
from textual import events
from textual.keys import _character_to_key

from eaglechat.chat.store import Store
from eaglechat.tui.widgets import ConversationList, PromptInput, StatusBar

SIZE = (110, 36)
BURST = ("The quick brown fox jumps over the lazy dog; 0123456789, (a+b)*c = d! "
         "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c \U0001f985 'quoted' \"double\" <tag> {x} [y] ~`|\\ ") * 4


def key_event(ch: str) -> events.Key:
    if ch == "\n":
        return events.Key("enter", "\r")
    if ch == "\u2424":  # stands for shift+enter / ctrl+j: a new line inside the message
        return events.Key("ctrl+j", None)
    key = ch if ch.isalnum() and ch.isascii() else _character_to_key(ch)
    return events.Key(key, ch)


def burst(app, text: str) -> None:
    """Keys as a terminal delivers a fast burst: all queued at once, nothing processed in between
    (Pilot.press waits for the app to go idle after every key, which hides ordering bugs)."""
    for ch in text:
        app._driver.send_message(key_event(ch))


async def burst_and_reply(pilot, text: str) -> None:
    """A burst ending in enter, then wait for the reply it started (not just for 'not generating',
    which holds before the send is processed)."""
    engine = pilot.app.fake_loader.engine
    calls = len(engine.calls)
    burst(pilot.app, text + "\n")
    await wait_until(pilot, lambda: len(engine.calls) > calls, what="the message to be sent")
    await wait_reply(pilot)


def stored_messages(path) -> list[tuple[str, str]]:
    store = Store(path)  # a second connection to the real SQLite file
    try:
        conv = store.conversations()[0]
        return [(m.role, m.content) for m in store.messages(conv.id)]
    finally:
        store.close()


async def test_a_burst_of_keys_then_enter_is_sent_byte_for_byte(tmp_path):
    """Before the fix the priority enter binding read the prompt before the queued keys were
    inserted: 0-113 of several hundred characters were sent."""
    engine = FakeEngine(["ok"])
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        app.query_one(PromptInput).focus()
        await pilot.pause()
        assert len(BURST) > 300
        burst(app, BURST + "\n")
        await wait_until(pilot, lambda: engine.calls, timeout=5, what="the message to be sent")
        await wait_reply(pilot)
        assert engine.calls[0][0][-1]["content"] == BURST
    assert stored_messages(tmp_path / "history.sqlite3")[0] == ("user", BURST)


async def test_keys_after_enter_stay_in_the_prompt_and_newlines_keep_their_place(tmp_path):
    engine = FakeEngine(["ok"])
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.pause()
        burst(app, "first line\u2424second line\nnext message")
        await wait_until(pilot, lambda: engine.calls, timeout=5, what="the message to be sent")
        await wait_reply(pilot)
        assert engine.calls[0][0][-1]["content"] == "first line\nsecond line"
        assert prompt.text == "next message"


async def test_a_message_refused_while_a_reply_is_written_stays_in_the_prompt(tmp_path):
    engine = FakeEngine(["one two three four five six"], tokens_per_step=1, pause_after_steps=1)
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        prompt = app.query_one(PromptInput)
        prompt.focus()
        burst(app, "go\n")
        await wait_until(pilot, engine.paused.is_set, what="the reply to start")
        burst(app, "typed while it streams\n")
        await wait_until(pilot, lambda: any("Still writing" in n.message for n in app._notifications),
                         what="the refusal")
        assert prompt.text == "typed while it streams"
        engine.resume.set()
        await wait_reply(pilot)
        burst(app, "\n")
        await wait_until(pilot, lambda: len(engine.calls) == 2, what="the second message")
        await wait_reply(pilot)
        assert engine.calls[1][0][-1]["content"] == "typed while it streams"


async def test_typing_and_pasting_while_the_focus_is_elsewhere_land_in_the_prompt(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["a reply"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await burst_and_reply(pilot, "hello")
        prompt = app.query_one(PromptInput)
        app.query_one(ConversationList).focus()
        await pilot.pause()
        burst(app, "typed on the list")
        await pilot.pause()
        assert prompt.text == "typed on the list" and app.focused is prompt
        replies(app)[0].focus()
        await pilot.pause()
        app._driver.send_message(events.Paste(" + pasted on a message"))
        await pilot.pause()
        assert prompt.text == "typed on the list + pasted on a message"
        replies(app)[0].focus()
        await pilot.pause()
        await pilot.press("ctrl+y")  # a message's own key is still the message's: copy
        assert app.clipboard == "a reply" and prompt.text.endswith("message")
        assert app.focused is prompt  # and the focus went back to the prompt


async def test_quitting_mid_reply_stores_it_marked_as_stopped(tmp_path):
    engine = FakeEngine(["alpha beta gamma delta epsilon zeta eta theta"], tokens_per_step=2,
                        pause_after_steps=3)
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        burst(app, "go\n")
        await wait_until(pilot, engine.paused.is_set, what="the engine to pause")
        await pilot.press("ctrl+q")
    store = Store(tmp_path / "history.sqlite3")
    stored = store.messages(store.conversations()[0].id)[-1]
    # the prefill's token, then three steps of two
    assert stored.role == "assistant" and stored.content == "alpha beta gamma delta epsilon zeta eta"
    assert stored.stats["stop_reason"] == "cancelled" and "partial" not in stored.stats
    assert "stopped" in stored.stats["meta"]
    store.close()


async def test_ctrl_c_stops_a_reply_and_quits_when_idle_without_markup(tmp_path):
    engine = FakeEngine(["one two three four five six seven"], tokens_per_step=1, pause_after_steps=2)
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        burst(app, "count\n")
        await wait_until(pilot, engine.paused.is_set, what="the engine to pause")
        await pilot.press("ctrl+c")
        await wait_reply(pilot)
        assert app.store.messages(app.conversation.id)[-1].stats["stop_reason"] == "cancelled"
        assert app.is_running
        await pilot.press("ctrl+c")
        notes = [n.message for n in app._notifications]
        assert "Press ctrl+c again to quit (or ctrl+q)" in notes
        assert not any("[b]" in n for n in notes)
        assert app.is_running
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert not app.is_running


async def test_ctrl_n_three_times_keeps_no_empty_conversation(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["a reply"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await burst_and_reply(pilot, "hello")
        await pilot.press("ctrl+n", "ctrl+n", "ctrl+n")
        await pilot.pause()
        assert len(app.store.conversations()) == 1
        assert len(app.query_one(ConversationList).children) == 1
        await burst_and_reply(pilot, "second chat")
        assert [c.title for c in app.store.conversations()] == ["second chat", "hello"]


async def test_focus_returns_to_the_prompt_and_figures_reset_on_switch(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["a b c d e f g h"], tokens_per_step=4))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        prompt = app.query_one(PromptInput)
        await burst_and_reply(pilot, "first")
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert "tok/s" not in " · ".join(app.query_one(StatusBar).parts)  # reset
        await burst_and_reply(pilot, "second")
        assert "tok/s" in " · ".join(app.query_one(StatusBar).parts)
        sidebar = app.query_one(ConversationList)
        sidebar.focus()
        await pilot.press("down", "enter")  # open the older conversation
        await wait_until(pilot, lambda: app.conversation.title == "first", what="the switch")
        await pilot.pause()
        assert app.focused is prompt
        assert "tok/s" not in " · ".join(app.query_one(StatusBar).parts)
        await pilot.press("f2")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert app.focused is prompt
        sidebar.focus()
        await pilot.press("ctrl+l")
        assert app.focused is prompt


async def test_up_in_an_empty_prompt_recalls_earlier_messages(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        prompt = app.query_one(PromptInput)
        for text in ("first question", "second\nquestion"):
            await burst_and_reply(pilot, text.replace("\n", "\u2424"))
        await pilot.press("up")
        assert prompt.text == "second\nquestion"
        await pilot.press("up")  # a recalled message of several lines: up moves inside it first
        assert prompt.text == "second\nquestion" and prompt.cursor_location[0] == 0
        await pilot.press("up")
        assert prompt.text == "first question"
        await pilot.press("down")
        assert prompt.text == "second\nquestion"
        await pilot.press("down")
        assert prompt.text == ""
        await pilot.press(*"abc", "up")
        assert prompt.text == "abc"  # a prompt with text keeps its own cursor keys


if __name__ == "__main__":
    pytest.main([__file__])


async def test_editing_keys_in_a_burst_act_in_typing_order(tmp_path):
    """Backspace, arrows and ctrl+u ran only after bubbling up to the app, behind the characters typed
    after them: "abc<bs>d<left>X" came out "abcd"."""
    app = make_tui_app(tmp_path, FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.pause()
        for key in ["a", "b", "c", "backspace", "d", "left", "X", "end", "space", "e", "ctrl+w", "f"]:
            app._driver.send_message(events.Key(key, key if len(key) == 1 else (" " if key == "space" else None)))
        await pilot.pause()
        assert prompt.text == "abXd f"
        await pilot.press("f3")  # a dialog's fields too
        await pilot.pause()
        field = app.screen.query_one("#max-new-tokens")
        field.focus()
        await pilot.pause()
        for key in ["end", "ctrl+u", "4", "8"]:
            app._driver.send_message(events.Key(key, key if len(key) == 1 else None))
        await pilot.pause()
        assert field.value == "48"


async def test_tab_then_typing_in_a_burst_lands_in_the_next_field(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f3")
        await pilot.pause()
        app.screen.query_one("#top-p").focus()
        await pilot.pause()
        for key in ["tab", "end", "ctrl+u", "4", "8", "shift+tab", "end", "ctrl+u", "0", ".", "5"]:
            app._driver.send_message(key_event(key) if len(key) == 1 else events.Key(key, None))
        await pilot.pause()
        assert app.screen.query_one("#max-new-tokens").value == "48"
        assert app.screen.query_one("#top-p").value == "0.5"
