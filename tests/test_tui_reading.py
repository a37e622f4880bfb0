"""Reading and taking text out of the chat: a reply's text selected and copied, the prompt's undo after a
long paste, a long conversation opened at once, a reasoning model's thinking folded apart from its
answer (and stored apart), the thinking switch, and `--remote` remembered only when asked."""

from __future__ import annotations

from fake_engine import (
    FakeEngine,
    make_tui_app,
    replies,
    status_text,
    type_and_send,
    wait_ready,
    wait_reply,
    wait_until,
)
from textual import events
from textual.widgets import Collapsible, TextArea

from eaglechat.chat.reasoning import split_reasoning
from eaglechat.chat.store import Store
from eaglechat.tui.pane import PAGE
from eaglechat.tui.select import SelectScreen
from eaglechat.tui.widgets import ChatLog, EarlierMessages, MessageView, PromptInput

SIZE = (100, 30)


async def test_enter_on_a_reply_shows_it_as_text_and_ctrl_c_copies_the_selection(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["**Bold** words and `code` here."]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "hi")
        await wait_reply(pilot)
        replies(app)[0].focus()
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SelectScreen)
        area = app.screen.query_one("#select-text", TextArea)
        assert area.read_only and area.text == "**Bold** words and `code` here."  # the reply as written
        assert app.focused is area
        await pilot.press("right", "right", *["shift+right"] * 4)  # select "Bold" with the keyboard
        await pilot.press("ctrl+c")
        assert app.clipboard == "Bold"
        assert isinstance(app.screen, SelectScreen) and app.return_code is None  # copied, nothing else
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, SelectScreen) and app.focused is app.query_one(PromptInput)


async def test_undo_after_pasting_twelve_lines_gives_the_prompt_back(tmp_path):
    app = make_tui_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press(*"keep")
        pasted = "\n".join(f"line {i}" for i in range(12))
        app.post_message(events.Paste(pasted))  # as the terminal sends it
        await pilot.pause()
        assert prompt.text == "keep" + pasted
        await pilot.press("ctrl+z")  # Textual 8.2.8 raised here and the app closed, prompt lost
        await pilot.pause()
        assert app.is_running and prompt.text == "keep"
        await pilot.press("ctrl+y")  # and redo puts it back
        await pilot.pause()
        assert prompt.text == "keep" + pasted


async def test_a_conversation_of_500_messages_opens_with_one_page_mounted_and_more_on_scrolling_up(tmp_path):
    store = Store(tmp_path / "history.sqlite3")
    conv = store.new_conversation("long", model="fake-eagle")
    for i in range(250):
        store.add_message(conv.id, "user", f"question {i}")
        store.add_message(conv.id, "assistant", f"answer {i}\n\nwith a second paragraph")
    app = make_tui_app(tmp_path, store=store)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        views = list(app.query(MessageView))
        assert len(views) == PAGE and views[-1].content.startswith("answer 249")
        assert len(list(app.query_one(ChatLog).query("*"))) < 12 * PAGE  # widgets of the log, all told
        assert app.query_one(EarlierMessages).count == 500 - PAGE
        log = app.query_one(ChatLog)
        first = views[0]
        def mounted() -> int:
            return len(app.query(MessageView))

        log.scroll_home(animate=False)  # the reader reaches the top
        await wait_until(pilot, lambda: mounted() == 2 * PAGE and log.scroll_y > 0, what="the earlier page")
        await pilot.pause()
        assert first.region.y >= log.region.y and first.region.bottom <= log.region.bottom  # still in view
        assert app.query_one(EarlierMessages).count == 500 - 2 * PAGE
        assert [v.content for v in app.query(MessageView)][0] == f"question {250 - PAGE}"


def test_reasoning_is_split_from_the_answer():
    whole = split_reasoning("<think>\nplan it\n</think>\n\nThe answer.")
    assert (whole.reasoning, whole.answer, whole.thinking) == ("plan it", "The answer.", False)
    assert "<think>\nplan it\n</think>\n\nThe answer."[whole.answer_at:] == "The answer."
    streaming = split_reasoning("<think>\nstill plann")
    assert (streaming.reasoning, streaming.answer, streaming.thinking) == ("still plann", "", True)
    r1 = split_reasoning("R1's prompt opened the block\n</think>\n\nAnswer")  # the template wrote <think>
    assert (r1.reasoning, r1.answer) == ("R1's prompt opened the block", "Answer")
    plain = split_reasoning("No thinking here.")
    assert (plain.reasoning, plain.answer, plain.answer_at) == ("", "No thinking here.", 0)
    assert split_reasoning("<thi").answer == ""  # half a tag is not shown as the answer


async def test_a_reasoning_models_thinking_is_folded_apart_from_the_answer_and_stored_apart(tmp_path):
    engine = FakeEngine(["<think>\nThe user greets me. I should greet back.\n</think>\n\nHello there!",
                         "Second answer."])
    engine.info.thinking_switch = True
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert "think on" in status_text(app)
        await type_and_send(pilot, "hi")
        await wait_reply(pilot)
        (reply,) = replies(app)
        assert reply.content == "Hello there!"
        assert reply.reasoning == "The user greets me. I should greet back."
        folded = reply.query_one(Collapsible)
        assert folded.display and folded.collapsed and "Thought (8 words)" in folded.title
        stored = app.store.messages(app.conversation.id)[-1]
        assert (stored.content, stored.reasoning) == ("Hello there!", "The user greets me. I should greet back.")
        assert engine.calls[0][1].thinking is True
        await pilot.press("ctrl+t")  # thinking off for the next reply
        assert "think off" in status_text(app)
        await type_and_send(pilot, "again")
        await wait_reply(pilot)
        history, params = engine.calls[1]
        assert params.thinking is False
        assert history[1] == {"role": "assistant", "content": "Hello there!"}  # the answer only, read back
        assert not replies(app)[1].query_one(Collapsible).display  # no thinking, nothing folded
    app = make_tui_app(tmp_path, FakeEngine())  # opened again: the thinking comes back from the history
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        first = replies(app)[0]
        assert first.reasoning.startswith("The user greets me") and first.query_one(Collapsible).display
        assert "think" not in status_text(app)  # a model without the switch shows none
        await pilot.press("ctrl+t")
        assert any("no thinking switch" in n.message for n in app._notifications)


async def test_a_remote_model_opened_with_remote_is_not_remembered_unless_asked(tmp_path):
    remote = "http://127.0.0.1:9/v1#served"
    app = make_tui_app(tmp_path, model=remote)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.model_name == remote
    from eaglechat.chat import settings

    assert settings.last_model(tmp_path / "settings.yaml") != remote
    app = make_tui_app(tmp_path, model=remote, remember_remote=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
    assert settings.last_model(tmp_path / "settings.yaml") == remote
