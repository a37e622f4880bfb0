"""Search, cutting a conversation back (edit and resend, regenerate), export with closed fences and
times: chat/history.py over a real SQLite file."""

from __future__ import annotations

import time

from eaglechat.chat.history import close_fences, delete_from, export_markdown, search, when
from eaglechat.chat.store import Store


def test_export_markdown(tmp_path):
    store = Store(tmp_path / "history.sqlite3")
    conv = store.new_conversation("Title", model="m", system_prompt="sys")
    store.add_message(conv.id, "user", "question")
    store.add_message(conv.id, "assistant", "```py\nprint(1)\n```")
    store.add_message(conv.id, "user", "more")
    store.add_message(conv.id, "assistant", "Sure:\n\n```python\nfor i in range(3):\n",
                      stats={"stop_reason": "cancelled"})
    text = export_markdown(store.conversation(conv.id), store.messages(conv.id))
    assert text.startswith("# Title\n")
    assert "## System\n\nsys" in text and "\n\nquestion\n" in text
    assert "```py\nprint(1)\n```" in text
    # the stopped reply's open fence is closed, so the document ends outside code
    assert text.rstrip().endswith("for i in range(3):\n```")
    assert text.count("```") % 2 == 0 and "*(stopped)*" in text
    assert f"## You ({time.strftime('%Y-%m-%d')}" in text


def test_close_fences():
    assert close_fences("a\n```\nb\n```\n") == "a\n```\nb\n```\n"
    assert close_fences("a\n~~~~js\nb") == "a\n~~~~js\nb\n~~~~"
    assert close_fences("```\nx\n~~~\ny") == "```\nx\n~~~\ny\n```"  # ~~~ does not close ```
    assert close_fences("no code") == "no code"


def test_search_titles_and_messages_most_recent_first(tmp_path):
    store = Store(tmp_path / "history.sqlite3")
    a = store.new_conversation("Rust lifetimes")
    store.add_message(a.id, "user", "what is a borrow checker?")
    b = store.new_conversation("Cooking")
    store.add_message(b.id, "user", "a recipe for bread with 100% whole wheat, please")
    store.add_message(b.id, "assistant", "Mix the flour with the BORROWED starter ...")
    assert [h.conversation.title for h in search(store, "borrow")] == ["Cooking", "Rust lifetimes"]
    assert search(store, "lifetimes")[0].snippet == "Rust lifetimes"
    assert "100% whole" in search(store, "100%")[0].snippet
    assert search(store, "1_0") == [] and search(store, "nothing like it") == []
    assert len(search(store, "")) == 2


def test_delete_from_cuts_the_message_and_what_follows(tmp_path):
    store = Store(tmp_path / "history.sqlite3")
    conv = store.new_conversation("c")
    ids = [store.add_message(conv.id, role, text).id
           for role, text in [("user", "1"), ("assistant", "2"), ("user", "3"), ("assistant", "4")]]
    other = store.new_conversation("other")
    store.add_message(other.id, "user", "keep me")
    delete_from(store, conv.id, ids[2])
    assert [m.content for m in store.messages(conv.id)] == ["1", "2"]
    assert [m.content for m in store.messages(other.id)] == ["keep me"]


def test_when_shows_the_date_only_for_other_days():
    now = time.mktime((2026, 11, 30, 18, 0, 0, 0, 0, -1))
    assert when(now - 3600, now) == "17:00"
    assert when(now - 3 * 86400, now) == "Nov 27 18:00"
    assert when(now - 400 * 86400, now).startswith("Oct 26 2025")
