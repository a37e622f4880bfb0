"""Keys that do what a person expects, messages shown as written, and what a new conversation starts
with: no bare-letter bindings where text is typed, ctrl+c copies a selection first, shift+pageup scrolls
from the prompt, the placeholder follows keys.yaml, user messages as plain text, titles as wide as the
sidebar, the pull question inside 80x24, app-wide defaults and personas, Up recall across conversations."""

from __future__ import annotations

import yaml
from fake_engine import (
    FakeEngine,
    make_tui_app,
    replies,
    type_and_send,
    wait_ready,
    wait_reply,
    wait_until,
)
from textual.content import Content
from textual.geometry import Offset
from textual.selection import Selection
from textual.widgets import Button, Label, Select, Static

from eaglechat.tui.screens import ConfirmScreen, SettingsScreen
from eaglechat.tui.widgets import ChatLog, ConversationItem, MessageView, PromptInput

SIZE = (80, 24)


async def test_letters_typed_on_a_focused_message_go_to_the_prompt_and_ctrl_y_copies_it(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["the reply\n\n```py\nx = 1\n```\n"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "hi")
        await wait_reply(pilot)
        app.copy_to_clipboard("mine")
        prompt = app.query_one(PromptInput)
        replies(app)[0].focus()
        await pilot.pause()
        await pilot.press("y", "u")  # were copy and copy-code: the clipboard was overwritten
        assert prompt.text == "yu" and app.clipboard == "mine"
        replies(app)[0].focus()
        await pilot.pause()
        await pilot.press("ctrl+k")
        assert app.clipboard == "x = 1\n"
        replies(app)[0].focus()
        await pilot.pause()
        await pilot.press("ctrl+y")
        assert app.clipboard.startswith("the reply") and app.focused is prompt


async def test_ctrl_c_copies_a_mouse_selection_before_it_arms_quit_or_stops(tmp_path):
    engine = FakeEngine(["one two three four five six"], tokens_per_step=2, pause_after_steps=2)
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "selectable words")
        await wait_until(pilot, engine.paused.is_set, what="the reply to start")
        user = [v for v in app.query(MessageView) if v.role == "user"][0]
        segment = user.query_one(".segment", Static)
        app.screen.selections = {segment: Selection.from_offsets(Offset(0, 0), Offset(10, 0))}
        await pilot.pause()
        await pilot.press("ctrl+c")
        assert app.clipboard == "selectable"
        assert app.generating  # the reply was not stopped by the copy
        await pilot.press("ctrl+c")  # nothing selected now: it stops the reply
        await wait_reply(pilot)
        assert app.return_code is None  # and never quit


async def test_shift_pageup_scrolls_the_conversation_from_the_prompt(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["\n\n".join(f"paragraph {i}" for i in range(30))]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "long please")
        await wait_reply(pilot)
        log = app.query_one(ChatLog)
        await wait_until(pilot, lambda: log.max_scroll_y > 10 and log.scroll_y == log.max_scroll_y,
                         what="the log at its bottom")
        bottom = log.scroll_y
        await pilot.press("shift+pageup")
        await pilot.pause()
        assert log.scroll_y < bottom and app.focused is app.query_one(PromptInput)
        await pilot.press("shift+pagedown")
        await pilot.pause()
        assert log.scroll_y == bottom


async def test_a_user_message_is_shown_exactly_as_written(tmp_path):
    pasted = 'Traceback (most recent call last):\n  File "x.py", line 3, in <module>\n    main()\n* not a list'
    app = make_tui_app(tmp_path, FakeEngine(["**bold** reply"]))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        prompt = app.query_one(PromptInput)
        prompt.load_text(pasted)
        await pilot.press("enter")
        await wait_reply(pilot)
        user = [v for v in app.query(MessageView) if v.role == "user"][0]
        shown = user.query_one(".segment", Static).visual
        assert isinstance(shown, Content) and shown.plain == pasted  # lines, indentation and <module> kept
        reply = replies(app)[0].query_one(".segment", Static).visual
        assert not isinstance(reply, Content)  # the assistant's Markdown is still rendered


async def test_the_placeholder_follows_keys_yaml_and_the_pull_question_fits_80x24(tmp_path):
    (tmp_path / "keys.yaml").write_text("send: ctrl+s\nnewline: enter\nhelp: f10\n")
    app = make_tui_app(tmp_path)
    question = ("vicuna-7b-eagle2 is not on this machine yet. Pull it from the Hugging Face Hub (about 13.8 GB)?")
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        placeholder = str(app.query_one(PromptInput).placeholder)
        assert "ctrl+s: send" in placeholder and "enter: new line" in placeholder and "f10: help" in placeholder
        app.push_screen(ConfirmScreen(question, yes="Pull", variant="primary"))
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        await pilot.pause()
        box = app.screen.query_one(".dialog-box")
        label = box.query(Label).first()
        assert box.content_region.contains_region(label.region)  # wrapped inside the box (it ran past it)
        lines = [line.text for line in label.render_lines(label.region.reset_offset)]
        assert " ".join(" ".join(lines).split()) == question
        for button in app.screen.query(Button):
            assert app.screen.region.contains_region(button.region)


async def test_new_conversations_start_from_the_defaults_and_a_persona_fills_the_settings(tmp_path):
    (tmp_path / "settings.yaml").write_text(yaml.safe_dump({"chat": {
        "defaults": {"system_prompt": "Answer briefly.", "temperature": 0.5, "max_new_tokens": 64},
        "personas": {"reviewer": {"system_prompt": "Review Python.", "top_p": 0.8}}}}))
    engine = FakeEngine(["ok"])
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "hi")
        await wait_reply(pilot)
        messages, params = engine.calls[0]
        assert messages[0] == {"role": "system", "content": "Answer briefly."}
        assert (params.temperature, params.top_p, params.max_new_tokens) == (0.5, 1.0, 64)

        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen), what="the settings")
        app.screen.query_one("#persona", Select).value = "reviewer"
        await pilot.pause()
        assert app.screen.query_one("#system-prompt").text == "Review Python."
        await pilot.click("#save-default")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen), what="the save")
        assert app.conversation.system_prompt == "Review Python." and app.conversation.top_p == 0.8
        saved = yaml.safe_load((tmp_path / "settings.yaml").read_text())["chat"]
        assert saved["defaults"]["system_prompt"] == "Review Python." and "reviewer" in saved["personas"]
        await pilot.press("ctrl+n")
        await type_and_send(pilot, "next")
        await wait_until(pilot, lambda: len(engine.calls) == 2, what="the new conversation's message")
        await wait_reply(pilot)
        assert engine.calls[1][0][0] == {"role": "system", "content": "Review Python."}


async def test_up_recalls_messages_of_other_conversations_and_titles_use_the_sidebar_width(tmp_path):
    title = "a conversation about borrow checker rules"
    app = make_tui_app(tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, title)
        await wait_reply(pilot)
        item = app.query_one(ConversationItem)
        assert item.conversation.title == title
        assert item.size.width >= 30  # the sidebar was 24 columns (a 21-column title) at every width
        await pilot.press("ctrl+n")
        await pilot.pause()
        await type_and_send(pilot, "asked here")
        await wait_reply(pilot)
        prompt = app.query_one(PromptInput)
        await pilot.press("up")
        assert prompt.text == "asked here"
        await pilot.press("up")
        assert prompt.text == title  # was the end of the list: only this conversation
