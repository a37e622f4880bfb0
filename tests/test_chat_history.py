"""Search, the versions of a turn (edit and resend, regenerate keep the earlier one), export with closed fences and
times: chat/history.py over a real SQLite file."""

from __future__ import annotations

import time

from eaglechat.chat.history import (
    close_fences,
    export_markdown,
    last_versions,
    open_slot,
    put_aside,
    search,
    show_version,
    when,
)
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


def test_versions_of_the_last_turn_are_kept_and_flipped_back(tmp_path):
    store = Store(tmp_path / "history.sqlite3")
    conv = store.new_conversation("c")
    for role, text in [("user", "1"), ("assistant", "2"), ("user", "3"), ("assistant", "4")]:
        store.add_message(conv.id, role, text)
    other = store.new_conversation("other")
    store.add_message(other.id, "user", "keep me")
    assert last_versions(store, conv.id) is None

    # regenerate: the shown turn is put aside, a copy of its question starts the next version
    slot, version = put_aside(store, conv.id, store.messages(conv.id)[2:])
    assert version == 1
    store.add_message(conv.id, "user", "3", slot=slot, version=version)
    store.add_message(conv.id, "assistant", "4 again", slot=slot, version=version)
    assert [m.content for m in store.messages(conv.id)] == ["1", "2", "3", "4 again"]
    versions = last_versions(store, conv.id)
    assert versions.numbers == [0, 1] and versions.shown == 1 and versions.label() == "version 2/2"

    # edit: the whole turn is put aside; what is sent next joins it as version 2
    put_aside(store, conv.id, store.messages(conv.id)[2:])
    assert [m.content for m in store.messages(conv.id)] == ["1", "2"]
    assert last_versions(store, conv.id).shown is None
    assert open_slot(store, conv.id) == (slot, 2)
    store.add_message(conv.id, "user", "3 edited", slot=slot, version=2)
    assert open_slot(store, conv.id) is None

    show_version(store, conv.id, slot, 0)  # back to the first version: nothing was ever deleted
    assert [m.content for m in store.messages(conv.id)] == ["1", "2", "3", "4"]
    assert search(store, "4 again") == [] and search(store, "3 edited") == []  # what opening would not show
    assert len(store.messages(conv.id, archived=True)) == 7
    assert [m.content for m in store.messages(other.id)] == ["keep me"]
    store.close()
    store = Store(tmp_path / "history.sqlite3")  # a reopened store shows the same
    assert last_versions(store, conv.id).label() == "version 1/3"


def test_when_shows_the_date_only_for_other_days():
    now = time.mktime((2026, 11, 30, 18, 0, 0, 0, 0, -1))
    assert when(now - 3600, now) == "17:00"
    assert when(now - 3 * 86400, now) == "Nov 27 18:00"
    assert when(now - 400 * 86400, now).startswith("Oct 26 2025")
