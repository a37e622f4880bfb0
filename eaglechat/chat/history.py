"""What the chat does with stored conversations beyond reading and writing them: search, cutting a
conversation back to an earlier message (edit and resend, regenerate), and Markdown export.

Kept apart from chat/store.py (opening, migrations, locking) on purpose: these are queries over the
same tables through the store's connection, with no schema of their own.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from eaglechat.chat.store import Conversation, Message, Store

_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.M)


@dataclass
class Hit:
    conversation: Conversation
    snippet: str  # the matching title, or the text around the first match in a message


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def search(store: Store, text: str, limit: int = 50) -> list[Hit]:
    """Conversations whose title or any message contains `text` (case-insensitive for ASCII),
    most recent first."""
    needle = text.strip()
    if not needle:
        return [Hit(c, "") for c in store.conversations()[:limit]]
    pattern = _like(needle)
    rows = store.db.execute(
        "SELECT c.id, (SELECT m.content FROM messages m WHERE m.conversation_id = c.id"
        "   AND m.content LIKE ? ESCAPE '\\' ORDER BY m.id LIMIT 1)"
        " FROM conversations c WHERE c.title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m"
        "   WHERE m.conversation_id = c.id AND m.content LIKE ? ESCAPE '\\')"
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


def delete_from(store: Store, conversation_id: int, message_id: int) -> None:
    """Remove a message and everything after it (edit and resend, regenerate)."""
    store.db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conversation_id, message_id))
    store.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))


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
