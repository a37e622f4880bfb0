"""The conversation store: one SQLite file (paths.history_db()), WAL, versioned migrations.

* Schema versions live in `PRAGMA user_version`; `MIGRATIONS[i]` upgrades version i to i+1, each in
  one transaction, so an interrupted upgrade leaves the previous version intact.
* WAL journal + a commit after every write: a crash loses at most the turn being generated.
* A damaged file (SQLite says "file is not a database" or "malformed", or `quick_check` fails) is
  renamed aside to `<name>.corrupt-<timestamp>` (with its -wal/-shm) and a fresh store is created;
  `Store.recovered` names the moved file so the UI can tell the user. Nothing is ever deleted silently.
* A lock is not damage: another chat window, a backup, a `sqlite3` shell or a VACUUM may hold the file
  for a while. Opening waits (SQLite's busy timeout), tells the user after `notice_after_s`, and after
  `lock_wait_s` gives up with one line (StoreError); the file is never moved for a lock.
* Concurrent first starts are safe: each migration runs inside `BEGIN IMMEDIATE` (one writer at a
  time) and reads `user_version` inside that transaction, so a second process sees the first one's
  work and skips it; CREATE statements also say IF NOT EXISTS.
* A file written by a newer eaglechat (user_version too high) is refused, not touched.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from eaglechat.errors import EaglechatError

MIGRATIONS: list[str] = [
    # 0 -> 1: conversations and messages
    """
    CREATE TABLE IF NOT EXISTS conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        model TEXT NOT NULL DEFAULT '',
        system_prompt TEXT NOT NULL DEFAULT '',
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE IF NOT EXISTS messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        created REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
    """,
    # 1 -> 2: per-conversation sampling settings, per-message model + speed stats
    """
    ALTER TABLE conversations ADD COLUMN temperature REAL NOT NULL DEFAULT 0.0;
    ALTER TABLE conversations ADD COLUMN top_p REAL NOT NULL DEFAULT 1.0;
    ALTER TABLE conversations ADD COLUMN max_new_tokens INTEGER NOT NULL DEFAULT 512;
    ALTER TABLE messages ADD COLUMN model TEXT NOT NULL DEFAULT '';
    ALTER TABLE messages ADD COLUMN stats TEXT NOT NULL DEFAULT '{}';
    """,
    # 2 -> 3: measured plain-decoding speed per model (the baseline every speedup is shown against)
    """
    CREATE TABLE IF NOT EXISTS baselines (
        model TEXT NOT NULL,
        device TEXT NOT NULL DEFAULT '',
        tokens_per_s REAL NOT NULL,
        measured REAL NOT NULL,
        PRIMARY KEY (model, device)
    );
    """,
    # 3 -> 4: versions of a turn (regenerate, edit and resend keep the earlier ones). Messages of a turn
    # that has versions share a `slot` (the id of its first user message) and carry their `version`;
    # the versions not shown are `archived`, never deleted.
    """
    ALTER TABLE messages ADD COLUMN slot INTEGER;
    ALTER TABLE messages ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE messages ADD COLUMN archived INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX IF NOT EXISTS messages_by_slot ON messages(conversation_id, slot, version);
    """,
    # 4 -> 5: a reasoning model's thinking, kept apart from its answer (chat/reasoning.py): `content` is
    # the answer the model reads back in later turns, `reasoning` what it thought before it
    """
    ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


class StoreError(EaglechatError):
    """The history database cannot be used (written by a newer eaglechat, locked for too long)."""


class ConversationGone(StoreError):
    """The conversation was deleted (by another window) while this one still showed it."""


class StoreWriteError(StoreError):
    """SQLite could not write (disk full, read-only file, I/O error): nothing of that write was stored."""


class _Damaged(Exception):
    """The file is there but is not a healthy SQLite database."""


class _Locked(Exception):
    """Another connection holds a lock that our busy timeout did not outwait."""


# SQLite primary result codes (https://www.sqlite.org/rescode.html)
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26


def _classify(exc: sqlite3.DatabaseError) -> Exception:
    """Damage, a lock, or something else (re-raised as is). Only damage ever moves a file."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(exc).lower()
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED) or "locked" in text or "busy" in text:
        return _Locked(str(exc))
    if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or "not a database" in text or "malformed" in text:
        return _Damaged(str(exc))
    return exc


def _tell_stderr(message: str) -> None:
    print(f"eaglechat: {message}", file=sys.stderr, flush=True)


@dataclass
class Conversation:
    id: int
    title: str
    model: str = ""
    system_prompt: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    created: float = 0.0
    updated: float = 0.0


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str  # "system" | "user" | "assistant"
    content: str
    model: str = ""
    stats: dict = field(default_factory=dict)
    created: float = 0.0
    slot: int | None = None  # the turn this message is a version of (None: a turn with one version)
    version: int = 0
    archived: bool = False  # a version not shown (kept for flipping back)
    reasoning: str = ""  # a reasoning model's thinking before the answer in `content`


_CONV_COLS = "id, title, model, system_prompt, temperature, top_p, max_new_tokens, created, updated"
# the reply row that closes a turn left without one (Store.add_message): shown as its meta line
UNANSWERED = {"unanswered": True, "meta": "no reply: the turn was interrupted"}
_MSG_COLS = "id, conversation_id, role, content, model, stats, created, slot, version, archived, reasoning"


def _msg(row) -> Message:
    try:
        stats = json.loads(row[5]) if row[5] else {}
    except ValueError:
        stats = {}
    return Message(row[0], row[1], row[2], row[3], row[4], stats, row[6], row[7], row[8], bool(row[9]), row[10])


class Store:
    """The history. `on_wait(message)` is told once when opening has to wait for another program's
    lock (default: a line on stderr); `lock_wait_s` bounds that wait, and also each later write."""

    def __init__(self, path: Path | str, *, on_wait=_tell_stderr, notice_after_s: float = 2.0,
                 lock_wait_s: float = 30.0):
        self.path = Path(path)
        self.recovered: Path | None = None  # where a damaged database was moved, if it was
        self.lock_wait_s = lock_wait_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = self._open_waiting(on_wait, notice_after_s)
        except _Damaged as exc:
            self.recovered = self._move_aside(exc)
            self.db = self._open_waiting(on_wait, notice_after_s)

    # -- opening, checking, migrating ------------------------------------------------------------

    def _open_waiting(self, on_wait, notice_after_s: float) -> sqlite3.Connection:
        """Open; while someone else holds a lock, wait (saying so once) up to lock_wait_s."""
        deadline = time.monotonic() + self.lock_wait_s
        told = False
        while True:
            left = deadline - time.monotonic()
            try:
                # the first try waits only until the notice is due, so the user hears why it is slow
                return self._open(busy_s=max(0.05, min(left, notice_after_s) if not told else left))
            except _Locked:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"the chat history {self.path} is locked by another program (waited "
                        f"{self.lock_wait_s:g} s): close the other eaglechat, sqlite3 shell or backup "
                        "and try again"
                    ) from None
                if not told and on_wait is not None:
                    on_wait(f"waiting for the chat history {self.path}: another program has it locked")
                told = True

    def _open(self, busy_s: float) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=busy_s, check_same_thread=False, isolation_level=None)
        try:
            ok = db.execute("PRAGMA quick_check").fetchone()[0]
            if ok != "ok":
                raise _Damaged(f"quick_check: {ok}")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:  # checked before WAL, which would rewrite the header
                raise StoreError(
                    f"the chat history was written by a newer eaglechat (schema {version}, "
                    f"this one knows {SCHEMA_VERSION}); upgrade eaglechat"
                )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            self._migrate(db)
            # later writes (the chat saving a reply) wait as long as opening may
            db.execute(f"PRAGMA busy_timeout = {int(self.lock_wait_s * 1000)}")
        except sqlite3.DatabaseError as exc:
            db.close()
            classified = _classify(exc)
            if classified is exc:
                raise
            raise classified from exc
        except BaseException:
            db.close()
            raise
        return db

    def _move_aside(self, exc: Exception) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        self.path.rename(target)
        for suffix in ("-wal", "-shm"):
            side = self.path.with_name(self.path.name + suffix)
            if side.exists():
                side.rename(target.with_name(target.name + suffix))
        return target

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        """One migration per transaction. BEGIN IMMEDIATE takes the write lock before user_version
        is read, so of several processes starting at once exactly one applies each step and the
        others, once they get the lock, read the new version and skip it."""
        while db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            db.execute("BEGIN IMMEDIATE")
            try:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version < SCHEMA_VERSION:
                    for statement in filter(str.strip, MIGRATIONS[version].split(";")):
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version = {version + 1}")
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    @property
    def schema_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    @property
    def journal_mode(self) -> str:
        return self.db.execute("PRAGMA journal_mode").fetchone()[0]

    def close(self) -> None:
        self.db.close()

    # -- conversations ----------------------------------------------------------------------------

    def new_conversation(self, title: str = "New chat", *, model: str = "", system_prompt: str = "",
                         temperature: float = 0.0, top_p: float = 1.0,
                         max_new_tokens: int = 512) -> Conversation:
        now = time.time()
        cur = self._write(
            "INSERT INTO conversations (title, model, system_prompt, temperature, top_p,"
            " max_new_tokens, created, updated) VALUES (?,?,?,?,?,?,?,?)",
            (title, model, system_prompt, temperature, top_p, max_new_tokens, now, now),
        )
        return self.conversation(cur.lastrowid)

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute(
            f"SELECT {_CONV_COLS} FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        return Conversation(*row) if row else None

    def conversations(self) -> list[Conversation]:
        """Most recently used first."""
        rows = self.db.execute(
            f"SELECT {_CONV_COLS} FROM conversations ORDER BY updated DESC, id DESC"
        ).fetchall()
        return [Conversation(*row) for row in rows]

    def update_conversation(self, conversation_id: int, **fields) -> Conversation:
        allowed = {"title", "model", "system_prompt", "temperature", "top_p", "max_new_tokens"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"unknown conversation fields: {sorted(unknown)}")
        if fields:
            assignments = ", ".join(f"{name} = ?" for name in fields)
            self._write(
                f"UPDATE conversations SET {assignments}, updated = ? WHERE id = ?",
                (*fields.values(), time.time(), conversation_id),
            )
        return self.conversation(conversation_id)

    def rename(self, conversation_id: int, title: str) -> Conversation:
        return self.update_conversation(conversation_id, title=title)

    def delete(self, conversation_id: int) -> None:
        self._write("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages ---------------------------------------------------------------------------------

    def _write(self, sql: str, params: tuple = ()) -> sqlite3.Cursor:
        """One write; what SQLite refuses becomes a StoreError the chat can say in one line."""
        try:
            return self.db.execute(sql, params)
        except sqlite3.IntegrityError as exc:
            if "foreign key" in str(exc).lower():
                raise ConversationGone("the conversation was deleted in another window") from exc
            raise
        except sqlite3.OperationalError as exc:
            raise StoreWriteError(f"the chat history {self.path} could not be written: {exc}") from exc

    def add_message(self, conversation_id: int, role: str, content: str, *, model: str = "",
                    stats: dict | None = None, slot: int | None = None, version: int = 0,
                    reasoning: str = "") -> Message:
        """ConversationGone when the conversation no longer exists (deleted elsewhere).

        A new user message after a user message that got no reply (the app was killed while reading the
        prompt, or the engine failed before a token) first closes that turn with an empty assistant
        message marked unanswered: the history keeps each message once and its roles alternating, as
        every chat template expects."""
        now = time.time()
        if role == "user" and slot is None:
            last = self.db.execute("SELECT role FROM messages WHERE conversation_id = ? AND archived = 0"
                                   " ORDER BY id DESC LIMIT 1", (conversation_id,)).fetchone()
            if last is not None and last[0] == "user":
                self._write("INSERT INTO messages (conversation_id, role, content, model, stats, created, slot, version)"
                            " VALUES (?,?,?,?,?,?,?,?)",
                            (conversation_id, "assistant", "", model, json.dumps(UNANSWERED), now, None, 0))
        cur = self._write(
            "INSERT INTO messages (conversation_id, role, content, model, stats, created, slot, version, reasoning)"
            " VALUES (?,?,?,?,?,?,?,?,?)",
            (conversation_id, role, content, model, json.dumps(stats or {}), now, slot, version, reasoning),
        )
        self._write("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        row = self.db.execute(
            f"SELECT {_MSG_COLS} FROM messages WHERE id = ?", (cur.lastrowid,)
        ).fetchone()
        return _msg(row)

    def update_message(self, message_id: int, content: str, *, stats: dict | None = None,
                       reasoning: str | None = None) -> None:
        """Rewrite a message (a streamed reply is saved as it grows, then finalised). ConversationGone
        when the message is no longer there (its conversation was deleted elsewhere)."""
        fields = {"content": content}
        if stats is not None:
            fields["stats"] = json.dumps(stats)
        if reasoning is not None:
            fields["reasoning"] = reasoning
        assignments = ", ".join(f"{name} = ?" for name in fields)
        cur = self._write(f"UPDATE messages SET {assignments} WHERE id = ?", (*fields.values(), message_id))
        if cur.rowcount == 0:
            raise ConversationGone("the conversation was deleted in another window")

    @property
    def data_version(self) -> int:
        """Changes whenever another connection commits to the file (SQLite's PRAGMA data_version):
        a cheap poll for "another window changed the history"."""
        return self.db.execute("PRAGMA data_version").fetchone()[0]

    def messages(self, conversation_id: int, *, archived: bool = False) -> list[Message]:
        """The conversation as shown (the current version of each turn); `archived=True` adds the
        versions put aside by regenerate and edit."""
        rows = self.db.execute(
            f"SELECT {_MSG_COLS} FROM messages WHERE conversation_id = ?"
            f"{'' if archived else ' AND archived = 0'} ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [_msg(row) for row in rows]

    def recent_user_messages(self, limit: int = 200, *, exclude: int | None = None) -> list[str]:
        """The user's latest messages over all conversations (newest last, no repeats), for Up recall."""
        rows = self.db.execute(
            "SELECT content FROM messages WHERE role = 'user' AND archived = 0 AND conversation_id IS NOT ?"
            " GROUP BY content ORDER BY MAX(id) DESC LIMIT ?", (exclude, limit),
        ).fetchall()
        return [row[0] for row in reversed(rows)]

    # -- measured plain-decoding speed ------------------------------------------------------------

    def set_baseline(self, model: str, tokens_per_s: float, device: str = "") -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO baselines (model, device, tokens_per_s, measured) VALUES (?,?,?,?)",
            (model, device, tokens_per_s, time.time()),
        )

    def baseline(self, model: str, device: str = "") -> float | None:
        row = self.db.execute(
            "SELECT tokens_per_s FROM baselines WHERE model = ? AND device = ?", (model, device)
        ).fetchone()
        return row[0] if row else None
