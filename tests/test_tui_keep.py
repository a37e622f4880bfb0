"""Nothing typed or written is lost: a conversation deleted by another window while (or before) this one
writes to it, a history that cannot be written, keys typed while the model loads, another window's new
conversations, and regenerate / edit keeping the earlier version of the turn."""

from __future__ import annotations

from fake_engine import (
    FakeEngine,
    FakeLoader,
    make_tui_app,
    replies,
    type_and_send,
    wait_ready,
    wait_reply,
    wait_until,
)

from eaglechat.chat.store import Store
from eaglechat.tui.screens import LoadingScreen
from eaglechat.tui.widgets import ConversationList, MessageView, PromptInput

SIZE = (80, 24)


def contents(store: Store, conversation_id: int) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in store.messages(conversation_id)]


def notes(app) -> str:
    return " | ".join(n.message for n in app._notifications)


async def test_a_reply_whose_conversation_was_deleted_elsewhere_is_kept_and_the_next_message_too(tmp_path):
    engine = FakeEngine(["one two three four five six seven eight"], tokens_per_step=2, pause_after_steps=2)
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "first question")
        await wait_until(pilot, engine.paused.is_set, what="the engine to pause")
        await wait_until(pilot, lambda: replies(app) and replies(app)[0].message_id, what="the partial save")
        other = Store(tmp_path / "history.sqlite3")  # another window deletes the conversation
        other.delete(app.conversation.id)
        engine.resume.set()
        await wait_reply(pilot)
        # the reply and the question are stored again, in a conversation that exists
        assert contents(app.store, app.conversation.id) == [
            ("user", "first question"), ("assistant", "one two three four five six seven eight")]
        assert "deleted in another window" in notes(app)
        engine.pause_after_steps = None
        await type_and_send(pilot, "second question")  # was an IntegrityError that closed the app
        await wait_until(pilot, lambda: len(engine.calls) == 2, what="the second message")
        await wait_reply(pilot)
        assert [m for m in contents(other, app.conversation.id) if m[0] == "user"] == [
            ("user", "first question"), ("user", "second question")]
        other.close()


async def test_a_stopped_reply_in_a_deleted_conversation_is_not_claimed_kept_when_it_is_not(tmp_path):
    engine = FakeEngine(["one two three four five six"], tokens_per_step=2, pause_after_steps=2)
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "q")
        await wait_until(pilot, engine.paused.is_set, what="the engine to pause")
        await wait_until(pilot, lambda: replies(app) and replies(app)[0].message_id, what="the partial save")
        Store(tmp_path / "history.sqlite3").delete(app.conversation.id)
        await pilot.press("escape")
        await wait_reply(pilot)
        stored = contents(app.store, app.conversation.id)
        assert stored[0] == ("user", "q") and stored[1][0] == "assistant" and stored[1][1].startswith("one two")
        assert "Stopped; the partial reply is kept" in notes(app)  # and it is: the rows are there


async def test_a_message_sent_after_another_window_deleted_the_conversation_recreates_it(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["an answer"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "hello")
        await wait_reply(pilot)
        other = Store(tmp_path / "history.sqlite3")
        other.delete(app.conversation.id)
        taken = other.new_conversation("the other window's")  # may get the deleted one's id
        await wait_until(pilot, lambda: "deleted in another window" in notes(app), what="the window to notice")
        await type_and_send(pilot, "still here?")
        await wait_reply(pilot)
        # SQLite may reuse the id: what matters is that this is a conversation that exists, with it all
        assert app.store.conversation(app.conversation.id) is not None
        assert contents(app.store, app.conversation.id) == [
            ("user", "hello"), ("assistant", "an answer"), ("user", "still here?"), ("assistant", "an answer")]
        assert app.conversation.id != taken.id and contents(other, taken.id) == []
        other.close()


async def test_a_history_that_cannot_be_written_keeps_the_message_in_the_prompt(tmp_path):
    engine = FakeEngine(["ok"])
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "fits")
        await wait_reply(pilot)
        # the file may not grow by one more page: SQLite answers "database or disk is full"
        pages = app.store.db.execute("PRAGMA page_count").fetchone()[0]
        app.store.db.execute(f"PRAGMA max_page_count = {pages}")
        text = "a long message " * 400
        prompt = app.query_one(PromptInput)
        prompt.load_text(text)
        await pilot.press("enter")
        await wait_until(pilot, lambda: "Not sent" in notes(app), what="the refusal")
        assert prompt.text == text and len(engine.calls) == 1
        assert "full" in notes(app)


async def test_keys_typed_while_the_model_loads_land_in_the_prompt_and_enter_sends_once_loaded(tmp_path):
    engine = FakeEngine(["loaded reply"])
    app = make_tui_app(tmp_path, loader=FakeLoader(engine, block=True))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, LoadingScreen), what="the loading screen")
        await pilot.press(*"hello there", "backspace", "enter")
        prompt = app.query_one(PromptInput)
        assert prompt.text == "hello ther" and engine.calls == []
        assert "hello ther" in str(app.screen.query_one("#loading-typed").render())
        app.fake_loader.release.set()
        await wait_until(pilot, lambda: engine.calls, what="the message sent after loading")
        await wait_reply(pilot)
        assert engine.calls[0][0][-1] == {"role": "user", "content": "hello ther"}
        assert prompt.text == ""


async def test_the_sidebar_shows_conversations_another_window_made(tmp_path):
    app = make_tui_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        other = Store(tmp_path / "history.sqlite3")
        made = other.new_conversation("from the other window")
        other.add_message(made.id, "user", "hi")
        await wait_until(pilot, lambda: pilot.app.query(f"#conv-{made.id}"), timeout=5,
                         what="the other window's conversation in the sidebar")
        assert len(app.query_one(ConversationList).children) == 1
        other.close()


async def test_regenerate_keeps_the_earlier_reply_as_a_version_to_flip_back_to(tmp_path):
    answers = iter(["first answer", "second answer"])
    engine = FakeEngine(lambda messages: next(answers))
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "question")
        await wait_reply(pilot)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: len(engine.calls) == 2, what="the second reply")
        await wait_reply(pilot)
        assert engine.calls[1][0] == [{"role": "user", "content": "question"}]
        assert [v.content for v in app.query(MessageView)] == ["question", "second answer"]
        assert "version 2/2" in replies(app)[0].meta
        await pilot.press("alt+left")
        await wait_until(pilot, lambda: [v.content for v in app.query(MessageView)] == ["question", "first answer"],
                         what="the first version back")
        assert contents(app.store, app.conversation.id) == [("user", "question"), ("assistant", "first answer")]
        assert "version 1/2" in replies(app)[0].meta
        await pilot.press("alt+right")
        await wait_until(pilot, lambda: replies(app)[0].content == "second answer", what="the second version")
    reopened = Store(tmp_path / "history.sqlite3")  # stored, not only shown
    conv = reopened.conversations()[0]
    assert contents(reopened, conv.id) == [("user", "question"), ("assistant", "second answer")]
    assert len(reopened.messages(conv.id, archived=True)) == 4


async def test_edit_keeps_the_old_turn_and_f9_can_be_undone(tmp_path):
    engine = FakeEngine(lambda messages: f"re: {messages[-1]['content']}")
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await type_and_send(pilot, "first")
        await wait_reply(pilot)
        await type_and_send(pilot, "typo")
        await wait_until(pilot, lambda: len(engine.calls) == 2, what="the second message")
        await wait_reply(pilot)
        prompt = app.query_one(PromptInput)
        first_turn = [("user", "first"), ("assistant", "re: first")]
        await pilot.press("f9")
        await wait_until(pilot, lambda: prompt.text == "typo", what="the message in the prompt")
        assert contents(app.store, app.conversation.id) == first_turn and app.focused is prompt
        await pilot.press("alt+left")  # changed my mind: the turn comes back, the prompt empties
        await wait_until(pilot, lambda: len(replies(app)) == 2, what="the turn back")
        assert prompt.text == "" and contents(app.store, app.conversation.id) == [
            *first_turn, ("user", "typo"), ("assistant", "re: typo")]
        await pilot.press("f9")
        await wait_until(pilot, lambda: prompt.text == "typo", what="the message in the prompt")
        await pilot.press("backspace", *"ed", "enter")
        await wait_until(pilot, lambda: len(engine.calls) == 3, what="the edited message")
        await wait_reply(pilot)
        assert engine.calls[2][0] == [{"role": "user", "content": "first"}, {"role": "assistant", "content": "re: first"},
                                      {"role": "user", "content": "typed"}]
        assert contents(app.store, app.conversation.id) == [*first_turn, ("user", "typed"), ("assistant", "re: typed")]
        await pilot.press("alt+left")
        await wait_until(pilot, lambda: replies(app)[-1].content == "re: typo", what="the old turn")
