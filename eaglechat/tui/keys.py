"""Remappable keys: every binding has an id; keys.yaml in the config dir maps ids to keys.

    # ~/.config/eaglechat/keys.yaml
    send: ctrl+s          # one key, or several separated by commas
    newline: enter
    new_conversation: [ctrl+n, f9]
"""

from __future__ import annotations

from pathlib import Path

from eaglechat import paths
from eaglechat.userfiles import UnreadableFile, read_yaml

# id -> (default keys, what it does): the single list the help screen shows; every binding of the chat
# screen (the app's, the prompt's, a message's) has its id here and the same keys (tests/test_tui_help.py)
KEYS: dict[str, tuple[str, str]] = {
    "send": ("enter", "send the message"),
    "newline": ("shift+enter,ctrl+j", "new line in the message"),
    "stop": ("escape", "stop the reply at the next decode step (keeps what was written)"),
    "interrupt": ("ctrl+c", "copy the selection (mouse or prompt); else stop the reply; when idle, twice quits"),
    "focus_prompt": ("ctrl+l", "jump to the prompt (typing anywhere lands there too)"),
    "recall": ("up", "in an empty prompt: earlier messages, this conversation's first, then the others'"),
    "select_text": ("enter", "on a message (tab to it): show it as text to select with the mouse or "
                    "shift+arrows; ctrl+c copies the selection"),
    "scroll_up": ("shift+pageup", "scroll the conversation up (from the prompt)"),
    "scroll_down": ("shift+pagedown", "scroll the conversation down"),
    "new_conversation": ("ctrl+n", "new conversation"),
    "rename": ("f2", "rename conversation"),
    "settings": ("f3", "system prompt and sampling of this conversation"),
    "pick_model": ("ctrl+o,f4", "choose the model"),
    "toggle_speculation": ("f5", "speculation auto / on / off (off measures the plain-decoding baseline)"),
    "toggle_drafts": ("f6", "colour the tokens that came from accepted drafts"),
    "toggle_thinking": ("ctrl+t", "thinking on / off, for a model whose template has the switch (Qwen3); "
                        "the thinking is shown folded above the answer"),
    "regenerate": ("ctrl+r", "write the last reply again (the old one is kept as a version)"),
    "edit_last": ("f9", "edit the last message and send it again (the old turn is kept as a version)"),
    "previous_version": ("alt+left", "the last turn's earlier version (after ctrl+r or f9)"),
    "next_version": ("alt+right", "the last turn's later version"),
    "search": ("ctrl+f", "search conversations (titles and messages)"),
    "export": ("f7", "export the conversation to Markdown (your documents folder)"),
    "delete": ("f8", "delete conversation"),
    "toggle_sidebar": ("ctrl+b", "show/hide the conversation list"),
    "focus_next": ("tab", "move focus (prompt, messages, list)"),
    "focus_previous": ("shift+tab", "move focus back"),
    "copy_message": ("ctrl+y", "on a message (tab to it): copy it (in the prompt: redo)"),
    "copy_code": ("ctrl+k", "on a message: copy its last code block (in the prompt: delete to the end of the line)"),
    "help": ("f1", "this help"),
    "command_palette": ("ctrl+p", "command palette"),
    "quit": ("ctrl+q", "quit"),
}


def keys_file() -> Path:
    return paths.config_dir() / "keys.yaml"


def load_keymap(path: Path | None = None) -> tuple[dict[str, str], str | None]:
    """(keymap, warning): an unreadable file or unknown ids give a warning, never an error."""
    path = path or keys_file()
    if not path.exists():
        return {}, None
    try:
        raw = read_yaml(path) or {}
    except UnreadableFile as exc:  # the file is the user's: reported, never rewritten
        return {}, f"{exc}; default keys in use"
    except OSError as exc:
        return {}, f"{path}: {exc.strerror or exc}; default keys in use"
    if not isinstance(raw, dict):
        return {}, f"{path}: expected a mapping of binding id to keys; default keys in use"
    keymap: dict[str, str] = {}
    unknown = []
    for key_id, keys in raw.items():
        if isinstance(keys, (list, tuple)):
            keys = ",".join(str(k) for k in keys)
        if str(key_id) not in KEYS or not isinstance(keys, str) or not keys.strip():
            unknown.append(str(key_id))
            continue
        keymap[str(key_id)] = keys.replace(" ", "")
    warning = f"{path}: ignored {', '.join(unknown)}" if unknown else None
    return keymap, warning


def key_table(keymap: dict[str, str]) -> list[tuple[str, str]]:
    return [(keymap.get(key_id, default), text) for key_id, (default, text) in KEYS.items()]


def key_for(key_id: str, keymap: dict[str, str]) -> str:
    """The first key that runs `key_id` with this keymap."""
    return keymap.get(key_id, KEYS[key_id][0]).split(",")[0]


def placeholder(keymap: dict[str, str]) -> str:
    """The prompt's hint, with the keys the user has."""
    newline = keymap.get("newline", KEYS["newline"][0]).split(",")[-1]  # the default's last: every terminal sends ctrl+j
    return (f"Message · {key_for('send', keymap)}: send · {newline}: new line"
            f" · {key_for('help', keymap)}: help")
