"""The user's chat settings (settings.yaml in the config dir) and the model the chat last opened.

settings.yaml is the user's file: eaglechat writes it only when asked (f3's "default for new chats"), keeping
every key it does not change (and, since PyYAML drops comments, a NAME.bak copy of a file that has some).
A missing file means defaults; so does one that cannot be read (a YAML typo, not a mapping), which is never
written over: `problem()` says where it broke (line and column), and each save refuses with that line.
The last model is eaglechat's own record, chat-state.yaml beside it, so starting the chat writes nothing
of the user's.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml

from eaglechat import paths
from eaglechat.errors import EaglechatError
from eaglechat.userfiles import UnreadableFile, read_yaml, set_aside

DEFAULT_MODEL = "smollm2-135m-eagle2"


class SettingsError(EaglechatError):
    """The settings file exists but cannot be used, so it is not written (one line: where and why)."""


def _read(path: Path) -> dict:
    """The file's mapping ({} when it is absent or empty); SettingsError when it cannot be used."""
    try:
        data = read_yaml(path)
    except FileNotFoundError:
        return {}
    except UnreadableFile as exc:
        raise SettingsError(f"{exc}; the file is left as it is") from None
    except OSError as exc:
        raise SettingsError(f"{path}: {exc.strerror or exc}; the file is left as it is") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping (key: value lines), got {type(data).__name__}; "
                            "the file is left as it is")
    return data


def problem(path: Path | None = None) -> str | None:
    """One line when the settings file exists and cannot be used (built-in defaults apply), else None."""
    try:
        data = _read(path or paths.settings_file())
    except SettingsError as exc:
        return str(exc)
    if "chat" in data and data["chat"] is not None and not isinstance(data["chat"], dict):
        return f"{path or paths.settings_file()}: `chat` must be a mapping; the file is left as it is"
    return None


def load(path: Path | None = None) -> dict:
    """The settings, or {} when the file cannot be used (see problem())."""
    try:
        return _read(path or paths.settings_file())
    except SettingsError:
        return {}


def _write_yaml(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def update(path: Path | None = None, **values) -> Path | None:
    """Set top-level keys and write the file back; SettingsError (the file untouched) when the file on
    disk cannot be read, since writing would lose what the user wrote. PyYAML writes no comments, so a
    file that has some is first copied to NAME.bak, whose path is returned (else None)."""
    path = path or paths.settings_file()
    data = _read(path)
    data.update(values)
    backup = None
    if path.is_file() and "#" in path.read_text(encoding="utf-8"):
        backup = path.with_name(path.name + ".bak")
        shutil.copy2(path, backup)
    _write_yaml(path, data)
    return backup


# -- the model the chat opens with: eaglechat's own record, beside the user's settings.yaml -----------
# (kept apart so that starting the chat never rewrites the user's file)


def state_file(path: Path | None = None) -> Path:
    return (path or paths.settings_file()).with_name("chat-state.yaml")


def last_model(path: Path | None = None) -> str:
    """The model the chat last loaded; else settings.yaml's chat.last_model; else the default."""
    try:
        state = read_yaml(state_file(path))
    except (OSError, UnreadableFile):
        state = None
    value = state.get("last_model") if isinstance(state, dict) else None
    if not (isinstance(value, str) and value):
        chat = load(path).get("chat") or {}
        value = chat.get("last_model") if isinstance(chat, dict) else None
    return value if isinstance(value, str) and value else DEFAULT_MODEL


def remember_model(model: str, path: Path | None = None) -> None:
    state = state_file(path)
    try:
        data = read_yaml(state)
    except FileNotFoundError:
        data = None
    except UnreadableFile:  # eaglechat's record, but edited by someone: kept under a new name
        set_aside(state)
        data = None
    data = data if isinstance(data, dict) else {}
    if data.get("last_model") != model:
        _write_yaml(state, {**data, "last_model": model})


def _chat_for_update(path: Path | None) -> dict:
    """The `chat` mapping to change and write back; SettingsError rather than replace one that is not."""
    found = problem(path)
    if found:
        raise SettingsError(found)
    return dict(load(path).get("chat") or {})


# -- what a new conversation starts with ------------------------------------------------------------
#
#     chat:
#       defaults: {system_prompt: "Answer briefly.", temperature: 0.7, top_p: 0.9, max_new_tokens: 1024}
#       personas:
#         coder: {system_prompt: "You are a careful Python reviewer.", temperature: 0}
#
# Values a conversation cannot take are ignored (the built-in default stays), never an error.

CONVERSATION_KEYS = ("system_prompt", "temperature", "top_p", "max_new_tokens")


def _valid(values) -> dict:
    out: dict = {}
    if not isinstance(values, dict):
        return out
    prompt = values.get("system_prompt")
    if isinstance(prompt, str):
        out["system_prompt"] = prompt
    temperature = values.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature >= 0:
        out["temperature"] = float(temperature)
    top_p = values.get("top_p")
    if isinstance(top_p, (int, float)) and not isinstance(top_p, bool) and 0 < top_p <= 1:
        out["top_p"] = float(top_p)
    max_new = values.get("max_new_tokens")
    if isinstance(max_new, int) and not isinstance(max_new, bool) and max_new >= 1:
        out["max_new_tokens"] = max_new
    return out


def _chat(path: Path | None) -> dict:
    chat = load(path).get("chat")
    return dict(chat) if isinstance(chat, dict) else {}


def conversation_defaults(path: Path | None = None) -> dict:
    """System prompt and sampling for a new conversation (only the keys the user set)."""
    return _valid(_chat(path).get("defaults"))


def save_conversation_defaults(values: dict, path: Path | None = None) -> Path | None:
    """Write chat.defaults; the copy of a file with comments that update() kept, if it kept one."""
    chat = _chat_for_update(path)
    chat["defaults"] = _valid(values)
    return update(path, chat=chat)


def personas(path: Path | None = None) -> dict[str, dict]:
    """Named sets of system prompt and sampling, offered in a conversation's settings."""
    raw = _chat(path).get("personas")
    if not isinstance(raw, dict):
        return {}
    return {str(name): _valid(values) for name, values in raw.items() if _valid(values)}
