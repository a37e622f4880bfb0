"""The conversation store: migrations, WAL, damaged database moved aside, settings file."""

import sqlite3

import pytest

from eaglechat.chat import settings
from eaglechat.chat.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Store,
    StoreError,
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
    path.write_text("other: {x: 1}\n")
    settings.remember_model("foo", path)
    assert settings.last_model(path) == "foo"
    assert settings.load(path)["other"] == {"x": 1}
    path.write_text(": : not yaml [")
    assert settings.last_model(path) == settings.DEFAULT_MODEL
