"""What the chat does with stored conversations beyond reading and writing them: search, cutting a
the versions of a turn (regenerate and edit put the shown one aside; the earlier ones can be flipped
back), and Markdown export.

Kept apart from chat/store.py (opening, migrations, locking) on purpose: these are queries over the
same tables through the store's connection, with no schema of their own.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from eaglechat.chat.store import Conversation, Message, Store

_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)


@dataclass
class Hit:
    conversation: Conversation
    snippet: str  # the matching title, or the text around the first match in a message


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def search(store: Store, text: str, limit: int = 50) -> list[Hit]:
    """Conversations whose title or any message shown contains `text` (case-insensitive for ASCII),
    most recent first. Versions put aside are not searched: opening the hit would not show them."""
    needle = text.strip()
    if not needle:
        return [Hit(c, "") for c in store.conversations()[:limit]]
    pattern = _like(needle)
    rows = store.db.execute(
        "SELECT c.id, (SELECT m.content FROM messages m WHERE m.conversation_id = c.id"
        "   AND m.archived = 0 AND m.content LIKE ? ESCAPE '\\' ORDER BY m.id LIMIT 1)"
        " FROM conversations c WHERE c.title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m"
        "   WHERE m.conversation_id = c.id AND m.archived = 0 AND m.content LIKE ? ESCAPE '\\')"
        " ORDER BY c.updated DESC, c.id DESC LIMIT ?",
        (pattern, pattern, pattern, limit),
    ).fetchall()
    hits = []
    for conversation_id, content in rows:
        conversation = store.conversation(conversation_id)
        if conversation is not None:
            hits.append(Hit(conversation, _snippet(content, needle) if content else conversation.title))
    return hits


def _snippet(content: str, needle: str, width: int = 60) -> str:
    at = content.lower().find(needle.lower())
    start = max(0, at - width // 3)
    text = " ".join(content[start:start + width].split())
    return ("…" if start else "") + text + ("…" if start + width < len(content) else "")


# -- versions of the last turn: regenerate and edit put the shown one aside instead of deleting it --

def put_aside(store: Store, conversation_id: int, messages: list[Message]) -> tuple[int, int]:
    """Archive `messages` (the last turn: a user message and what followed it) as one version of
    their turn; -> (slot, the version number the turn's next version takes)."""
    first = messages[0]
    slot = first.slot if first.slot is not None else first.id
    ids = [m.id for m in messages]
    marks = ",".join("?" * len(ids))
    store.db.execute(f"UPDATE messages SET slot = ?, version = ?, archived = 1 WHERE id IN ({marks})",
                     (slot, first.version, *ids))
    store.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))
    return slot, next_version(store, conversation_id, slot)


def next_version(store: Store, conversation_id: int, slot: int) -> int:
    row = store.db.execute("SELECT MAX(version) FROM messages WHERE conversation_id = ? AND slot = ?",
                           (conversation_id, slot)).fetchone()
    return (row[0] or 0) + 1


def open_slot(store: Store, conversation_id: int) -> tuple[int, int] | None:
    """(slot, version) a new message joins: the last turn was taken back for editing (every version
    of it is archived and nothing came after), so what is sent next is that turn's next version."""
    row = store.db.execute("SELECT slot, archived FROM messages WHERE conversation_id = ? ORDER BY id DESC"
                           " LIMIT 1", (conversation_id,)).fetchone()
    if row is None or row[0] is None or not row[1]:
        return None
    live = store.db.execute("SELECT 1 FROM messages WHERE conversation_id = ? AND slot = ? AND archived = 0",
                            (conversation_id, row[0])).fetchone()
    return None if live else (row[0], next_version(store, conversation_id, row[0]))


@dataclass
class Versions:
    slot: int
    numbers: list[int]  # every version of the last turn, oldest first
    shown: int | None  # the one on screen (None: all put aside, the turn is being edited)

    def label(self) -> str:
        at = self.numbers.index(self.shown) + 1 if self.shown in self.numbers else 0
        return f"version {at}/{len(self.numbers)}"


def last_versions(store: Store, conversation_id: int) -> Versions | None:
    """The versions of the conversation's last turn, when it has more than the one shown."""
    row = store.db.execute("SELECT slot FROM messages WHERE conversation_id = ? ORDER BY id DESC LIMIT 1",
                           (conversation_id,)).fetchone()
    if row is None or row[0] is None:
        return None
    slot = row[0]
    rows = store.db.execute("SELECT version, MIN(archived) FROM messages WHERE conversation_id = ? AND slot = ?"
                            " GROUP BY version ORDER BY version", (conversation_id, slot)).fetchall()
    shown = next((v for v, archived in rows if not archived), None)
    return Versions(slot, [v for v, _ in rows], shown) if len(rows) > 1 or shown is None else None


def show_version(store: Store, conversation_id: int, slot: int, version: int) -> None:
    """Put the shown version of a turn aside and bring `version` back."""
    store.db.execute("BEGIN IMMEDIATE")
    try:
        store.db.execute("UPDATE messages SET archived = (version != ?) WHERE conversation_id = ? AND slot = ?",
                         (version, conversation_id, slot))
        store.db.execute("COMMIT")
    except BaseException:
        store.db.execute("ROLLBACK")
        raise


def close_fences(text: str) -> str:
    """A reply stopped inside a code block leaves its fence open, which turns the rest of a Markdown
    document into code: close it."""
    opened: str | None = None
    for match in _FENCE_LINE.finditer(text):
        fence = match.group(1)
        if opened is None:
            opened = fence
        elif fence[0] == opened[0] and len(fence) >= len(opened):
            opened = None
    if opened is None:
        return text
    return text.rstrip("\n") + "\n" + opened


def when(timestamp: float, now: float | None = None) -> str:
    """A message time: "14:05" today, "Nov 29 14:05" before, with the year when it is not this one."""
    t, today = time.localtime(timestamp), time.localtime(now if now is not None else time.time())
    if t[:3] == today[:3]:
        return time.strftime("%H:%M", t)
    return time.strftime("%b %d %H:%M" if t.tm_year == today.tm_year else "%b %d %Y %H:%M", t)


def export_markdown(conversation: Conversation, messages: list[Message]) -> str:
    """A conversation as a Markdown document (title, system prompt, turns with their times); code
    blocks left open by a stopped reply are closed."""
    out = [f"# {conversation.title}", ""]
    if conversation.model:
        out += [f"*Model: {conversation.model}*", ""]
    if conversation.system_prompt:
        out += ["## System", "", conversation.system_prompt, ""]
    for m in messages:
        heading = {"user": "You", "assistant": "Assistant", "system": "System"}.get(m.role, m.role)
        stamp = f" ({time.strftime('%Y-%m-%d %H:%M', time.localtime(m.created))})" if m.created else ""
        note = " *(stopped)*" if m.stats.get("stop_reason") == "cancelled" else ""
        out += [f"## {heading}{stamp}{note}", "", close_fences(m.content.rstrip()), ""]
    return "\n".join(out).rstrip() + "\n"
