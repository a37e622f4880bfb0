"""Nothing the user wrote is overwritten: every file eaglechat reads and writes back (settings, keys, profiles,
tuned records, the history database) is checked with a file it cannot read. The file keeps its bytes (or is
renamed aside, bytes intact), and the user gets one line that says where it broke."""

from __future__ import annotations

import json

import pytest
from fake_engine import FakeEngine, make_tui_app, wait_ready

from eaglechat.chat import settings
from eaglechat.chat.store import Store
from eaglechat.cli import main
from eaglechat.userfiles import UnreadableFile, read_json, read_yaml

SIZE = (80, 24)
# a settings file with a YAML typo (the persona's flow mapping is never closed) and the user's comments
BROKEN_SETTINGS = """# my chat settings
chat:
  personas:
    coder: {system_prompt: "You review Python.", temperature: 0
  defaults: {temperature: 0.7}
"""


def notes(app) -> str:
    return " | ".join(str(n.message) for n in app._notifications)


async def test_a_settings_file_with_a_typo_is_kept_and_the_chat_says_where_it_broke(tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text(BROKEN_SETTINGS)
    app = make_tui_app(tmp_path, FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)  # loading a model remembers it in settings.yaml: it used to write the file here
        told = notes(app)
    assert path.read_text() == BROKEN_SETTINGS
    assert list(tmp_path.glob("settings.yaml*")) == [path] and settings.last_model(path) == "fake-eagle"
    assert f"Settings not read: {path} line 5, column 11:" in told and "left as it is" in told
    assert told.count("left as it is") == 1  # said once


def test_saving_defaults_into_an_unreadable_settings_file_is_refused_with_line_and_column(tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text(BROKEN_SETTINGS)
    assert settings.load(path) == {} and settings.last_model(path) == settings.DEFAULT_MODEL  # defaults in use
    with pytest.raises(settings.SettingsError, match=r"settings.yaml line 5, column 11: .*left as it is"):
        settings.save_conversation_defaults({"temperature": 0.2}, path)
    settings.remember_model("other", path)  # eaglechat's own record, beside it
    assert settings.last_model(path) == "other" and path.read_text() == BROKEN_SETTINGS


@pytest.mark.parametrize("text, why", [
    ("- a list\n- not a mapping\n", "expected a mapping"),
    ("chat: just text\n", "`chat` must be a mapping"),
    (b"chat: {last_model: \xff}\n", "not UTF-8"),
])
def test_settings_that_are_yaml_but_not_settings_are_kept_too(tmp_path, text, why):
    path = tmp_path / "settings.yaml"
    raw = text if isinstance(text, bytes) else text.encode()
    path.write_bytes(raw)
    assert why in settings.problem(path)
    with pytest.raises(settings.SettingsError, match=why):
        settings.save_conversation_defaults({"temperature": 0.2}, path)
    assert path.read_bytes() == raw


def test_a_readable_settings_file_is_written_back_with_the_users_keys_and_a_copy_with_comments(tmp_path):
    path = tmp_path / "settings.yaml"
    text = "chat:\n  personas: {coder: {temperature: 0}}  # the one I use\nother: 1\n"
    path.write_text(text)
    assert settings.problem(path) is None
    settings.remember_model("m2", path)
    assert path.read_text() == text  # starting the chat writes only chat-state.yaml
    backup = settings.save_conversation_defaults({"temperature": 0.3}, path)  # f3's "default for new chats"
    assert read_yaml(path) == {"chat": {"personas": {"coder": {"temperature": 0}},
                                        "defaults": {"temperature": 0.3}}, "other": 1}
    assert backup == tmp_path / "settings.yaml.bak" and backup.read_text() == text
    assert settings.save_conversation_defaults({"temperature": 0.4}, path) is None  # no comments left to keep


def test_an_unreadable_chat_state_is_set_aside_not_written_over(tmp_path):
    path = tmp_path / "settings.yaml"
    settings.state_file(path).write_text("last_model: [x\n")
    assert settings.last_model(path) == settings.DEFAULT_MODEL
    settings.remember_model("m3", path)
    assert settings.last_model(path) == "m3"
    (aside,) = tmp_path.glob("chat-state.yaml.unreadable-*")
    assert aside.read_text() == "last_model: [x\n"


async def test_an_unreadable_keys_file_is_kept_and_reported_with_line_and_column(tmp_path):
    path = tmp_path / "keys.yaml"
    text = "send: ctrl+s\nnewline: [enter\n"
    path.write_text(text)
    app = make_tui_app(tmp_path, FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        told = notes(app)
    assert path.read_text() == text
    assert f"{path} line 3, column 1: " in told and "or ']'" in told and "default keys in use" in told


def test_an_unreadable_user_profile_is_one_line_naming_line_and_column_and_is_kept(hermetic_home, capsys):
    from eaglechat import paths

    path = paths.user_profiles_dir() / "mine.yaml"
    text = "name: cpu\ntree:\n  total_tokens: 8\n depth: 3\n"
    path.write_text(text)
    code = main(["plan", "smollm2-135m-eagle2", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code != 0
    assert err.startswith(f"eaglechat: error: cannot read profile {path} line 4, column 2: ") and err.count("\n") == 1
    assert path.read_text() == text


def test_tune_sets_an_unreadable_record_aside_before_writing_its_own(tmp_path, monkeypatch, capsys):
    from tiny_models import save_tiny_pair

    from eaglechat.fit import hardware
    from eaglechat.fit.profiles import tuned_path

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    base, head = save_tiny_pair(tmp_path)
    record = tuned_path(hardware.probe("cpu"), base.name, "none")
    record.parent.mkdir(parents=True, exist_ok=True)
    hand_edited = '{"tree": {"total_tokens": 8, "depth": 3, "top_k": 4},, "speculate": true}\n'
    record.write_text(hand_edited)
    code = main(["tune", str(base), "--head", str(head), "--device", "cpu", "--quick", "--repeats", "1",
                 "--max-new-tokens", "2", "--json"])
    err = capsys.readouterr().err
    assert code == 0
    aside = [p for p in record.parent.iterdir() if p.name.startswith(record.name + ".unreadable-")]
    assert len(aside) == 1 and aside[0].read_text() == hand_edited  # the user's bytes, under a new name
    assert f"eaglechat: {record} line 1, column 54: Expecting property name" in err and f"kept as {aside[0]}" in err
    assert read_json(record)["tree"]  # and tune's own record is in place


async def test_a_damaged_history_is_moved_aside_with_its_bytes_and_the_chat_says_so(tmp_path):
    junk = b"my conversations, damaged" * 300
    (tmp_path / "history.sqlite3").write_bytes(junk)
    app = make_tui_app(tmp_path, FakeEngine(["ok"]), store=Store(tmp_path / "history.sqlite3"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        told = notes(app)
    (aside,) = tmp_path.glob("history.sqlite3.corrupt-*")
    assert aside.read_bytes() == junk
    assert f"It was moved to {aside}" in told


def test_read_helpers_name_line_and_column(tmp_path):
    (tmp_path / "a.json").write_text('{\n  "x": 1,\n}\n')
    with pytest.raises(UnreadableFile, match=r"a.json line 3, column 1: Expecting property name"):
        read_json(tmp_path / "a.json")
    (tmp_path / "a.yaml").write_text("a: b: c\n")
    with pytest.raises(UnreadableFile, match=r"a.yaml line 1, column 5: mapping values are not allowed"):
        read_yaml(tmp_path / "a.yaml")
    assert json.loads("{}") == {}
