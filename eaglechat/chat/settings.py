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


def save_conversation_defaults(values: dict, path: Path | None = None) -> None:
    chat = _chat(path)
    chat["defaults"] = _valid(values)
    update(path, chat=chat)


def personas(path: Path | None = None) -> dict[str, dict]:
    """Named sets of system prompt and sampling, offered in a conversation's settings."""
    raw = _chat(path).get("personas")
    if not isinstance(raw, dict):
        return {}
    return {str(name): _valid(values) for name, values in raw.items() if _valid(values)}
