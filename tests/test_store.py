"""The conversation store: migrations, WAL, damaged database moved aside, settings file."""

import sqlite3

import pytest

from eaglechat.chat import settings
from eaglechat.chat.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    ConversationGone,
    Store,
    StoreError,
    StoreWriteError,
)


@pytest.fixture
def store_path(tmp_path):
    return tmp_path / "history.sqlite3"


def test_fresh_store_is_current_and_wal(store_path):
    store = Store(store_path)
    assert store.schema_version == SCHEMA_VERSION
    assert store.journal_mode == "wal"
    assert store.recovered is None


def test_crud_roundtrip_survives_reopen(store_path):
    store = Store(store_path)
    conv = store.new_conversation("first", model="m", system_prompt="be brief", temperature=0.7)
    store.add_message(conv.id, "user", "hi")
    store.add_message(conv.id, "assistant", "hello", model="m", stats={"tokens_per_s": 12.5})
    store.rename(conv.id, "renamed")
    other = store.new_conversation("second")
    store.set_baseline("m", 10.0, "cpu")
    store.close()

    store = Store(store_path)
    titles = [c.title for c in store.conversations()]
    assert titles == ["second", "renamed"]  # most recent first
    msgs = store.messages(conv.id)
    assert [(m.role, m.content) for m in msgs] == [("user", "hi"), ("assistant", "hello")]
    assert msgs[1].stats == {"tokens_per_s": 12.5}
    assert store.conversation(conv.id).system_prompt == "be brief"
    assert store.conversation(conv.id).temperature == 0.7
    assert store.baseline("m", "cpu") == 10.0 and store.baseline("m", "cuda") is None
    store.delete(conv.id)
    assert [c.id for c in store.conversations()] == [other.id]
    assert store.messages(conv.id) == []  # cascade


def test_migrates_a_version_1_database(store_path):
    db = sqlite3.connect(store_path)
    for statement in filter(str.strip, MIGRATIONS[0].split(";")):
        db.execute(statement)
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES (1,'user','q',1)")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()

    store = Store(store_path)
    assert store.schema_version == SCHEMA_VERSION
    conv = store.conversations()[0]
    assert conv.title == "old" and conv.max_new_tokens == 512 and conv.top_p == 1.0
    assert store.messages(conv.id)[0].stats == {}


def test_damaged_database_is_moved_aside_not_wiped(store_path):
    junk = b"this is not sqlite at all" * 100
    store_path.write_bytes(junk)
    store = Store(store_path)
    assert store.recovered is not None and store.recovered.exists()
    assert store.recovered.read_bytes() == junk  # the user's bytes are kept
    assert ".corrupt-" in store.recovered.name
    assert store.conversations() == []
    store.new_conversation("works")
    assert len(store.conversations()) == 1


def test_newer_schema_is_refused_untouched(store_path):
    db = sqlite3.connect(store_path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    db.commit()
    db.close()
    before = store_path.read_bytes()
    with pytest.raises(StoreError, match="newer eaglechat"):
        Store(store_path)
    assert store_path.read_bytes() == before


def test_settings_remember_model_keeps_other_keys(tmp_path):
    path = tmp_path / "settings.yaml"
    assert settings.last_model(path) == settings.DEFAULT_MODEL
    path.write_text("other: {x: 1}  # mine\nchat: {last_model: bar}\n")
    assert settings.last_model(path) == "bar"  # set by hand (or by an older eaglechat)
    settings.remember_model("foo", path)
    assert settings.last_model(path) == "foo"
    assert path.read_text() == "other: {x: 1}  # mine\nchat: {last_model: bar}\n"  # the user's file is not written
    path.write_text(": : not yaml [")
    assert settings.last_model(path) == "foo"
    settings.state_file(path).unlink()
    assert settings.last_model(path) == settings.DEFAULT_MODEL


def test_writes_to_a_conversation_deleted_elsewhere_say_so(store_path):
    store, other = Store(store_path), Store(store_path)
    conv = store.new_conversation("c")
    reply = store.add_message(conv.id, "assistant", "partial")
    before = store.data_version
    other.delete(conv.id)
    assert store.data_version != before  # the cheap poll that tells a window another one wrote
    with pytest.raises(ConversationGone):  # was sqlite3.IntegrityError: FOREIGN KEY constraint failed
        store.add_message(conv.id, "user", "next")
    with pytest.raises(ConversationGone):  # was a silent no-op: the reply "kept" was stored nowhere
        store.update_message(reply.id, "partial and more")


def test_a_full_history_is_a_store_error_with_one_line(store_path):
    store = Store(store_path)
    conv = store.new_conversation("c")
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StoreWriteError, match="could not be written: database or disk is full"):
        store.add_message(conv.id, "user", "x" * 100_000)
    assert isinstance(StoreWriteError("x"), StoreError)


def test_migrating_a_version_3_database_keeps_its_messages_as_single_versions(store_path):
    db = sqlite3.connect(store_path)
    for migration in MIGRATIONS[:3]:
        for statement in filter(str.strip, migration.split(";")):
            db.execute(statement)
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES (1,'user','q',1)")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    store = Store(store_path)
    assert store.schema_version == SCHEMA_VERSION
    (message,) = store.messages(1)
    assert (message.content, message.slot, message.version, message.archived) == ("q", None, 0, False)


def test_defaults_and_personas_ignore_values_a_conversation_cannot_take(tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text("chat:\n  defaults: {temperature: -1, top_p: 0.5, max_new_tokens: 'many', system_prompt: hi}\n"
                    "  personas: {ok: {temperature: 0.2}, bad: {top_p: 7}, odd: 3}\n")
    assert settings.conversation_defaults(path) == {"top_p": 0.5, "system_prompt": "hi"}
    assert settings.personas(path) == {"ok": {"temperature": 0.2}}
    settings.save_conversation_defaults({"temperature": 0.3}, path)
    assert settings.conversation_defaults(path) == {"temperature": 0.3} and "ok" in settings.personas(path)


def test_a_turn_left_without_a_reply_is_closed_unanswered_before_the_next(tmp_path):
    """A kill while the prompt is read leaves the user message with no reply; the next message does not
    sit beside it: the turn is closed by an empty reply marked unanswered (roles alternate, each once)."""
    from eaglechat.chat.store import UNANSWERED, Store

    store = Store(tmp_path / "chats.db")
    conv = store.new_conversation()
    store.add_message(conv.id, "user", "first")
    store.add_message(conv.id, "assistant", "answer")
    store.add_message(conv.id, "user", "second")  # killed before any token of its reply
    store.close()
    store = Store(tmp_path / "chats.db")  # the next run
    store.add_message(conv.id, "user", "third")
    got = [(m.role, m.content) for m in store.messages(conv.id)]
    assert got == [("user", "first"), ("assistant", "answer"), ("user", "second"), ("assistant", ""),
                   ("user", "third")]
    assert store.messages(conv.id)[3].stats == UNANSWERED
    store.add_message(conv.id, "assistant", "ok")
    store.add_message(conv.id, "user", "fourth")  # an answered turn: nothing added
    assert [m.role for m in store.messages(conv.id)][-3:] == ["user", "assistant", "user"]
