"""The few things the chat app remembers between runs (settings.yaml in the config dir).

Other parts of eaglechat may keep their own keys in the same file: we read, change our keys, and
write the whole mapping back, atomically. A missing or unreadable file means defaults.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from eaglechat import paths

DEFAULT_MODEL = "smollm2-135m-eagle2"


def load(path: Path | None = None) -> dict:
    path = path or paths.settings_file()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def update(path: Path | None = None, **values) -> dict:
    path = path or paths.settings_file()
    data = load(path)
    data.update(values)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
    return data


def last_model(path: Path | None = None) -> str:
    chat = load(path).get("chat") or {}
    value = chat.get("last_model") if isinstance(chat, dict) else None
    return value if isinstance(value, str) and value else DEFAULT_MODEL


def remember_model(model: str, path: Path | None = None) -> None:
    chat = load(path).get("chat")
    chat = dict(chat) if isinstance(chat, dict) else {}
    chat["last_model"] = model
    update(path, chat=chat)
