"""One chat turn and everything it holds: the reply's view, the engine's daemon thread, the buffer the UI
drains on a timer, the saves while the reply grows, and its end (stored, figures, notices).

The app creates a `ChatTurn` per reply and keeps it as `app.chat_turn` while it runs; the turn is the only
code that writes the reply to the store. A write that finds the conversation deleted by another window
stores the conversation again from what this window shows (`app.recreate_conversation`) and retries; a
write SQLite refuses (disk full, read-only file) leaves the reply on screen and says so, and the turn
never claims a reply is kept that was not stored.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from textual.message import Message

from eaglechat.chat.store import ConversationGone, StoreError
from eaglechat.engine.protocol import GenerationParams
from eaglechat.tui.generation import (
    DRAIN_HZ,
    TurnBuffer,
    TurnDone,
    merge_runs,
    run_turn,
)
from eaglechat.tui.stats import TurnNumbers, meta_line

if TYPE_CHECKING:
    from eaglechat.tui.app import EagleChatApp
    from eaglechat.tui.widgets import MessageView

SAVE_EVERY_S = 2.0  # a reply being written is saved this often (a crash loses at most this much)


class ChatTurn:
    class Ended(Message):
        """Posted to the app when the engine is done: the end runs as a message handler, so the final
        render is not awaited inside the drain timer."""

        def __init__(self, turn: ChatTurn, final) -> None:
            super().__init__()
            self.turn, self.final = turn, final

    def __init__(self, app: EagleChatApp, reply: MessageView, messages: list[dict], params: GenerationParams,
                 *, slot: int | None = None, version: int = 0) -> None:
        self.app = app
        self.reply = reply
        self.messages = messages
        self.params = params
        self.slot, self.version = slot, version  # the turn version this reply belongs to
        self.cancel = threading.Event()
        depth = app.engine.info.tree.depth
        self.numbers = TurnNumbers(speculate=params.speculate, depth=depth)
        self.buffer = TurnBuffer(TurnNumbers(speculate=params.speculate, depth=depth))
        self.unsaved: str | None = None  # why the last write failed, while it is failing
        self._saved_at = 0.0
        self._timer = None
        self._thread: threading.Thread | None = None

    # -- running ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._timer = self.app.set_interval(1 / DRAIN_HZ, self.drain)
        # a plain daemon thread, not a Textual thread worker: those run on asyncio's default
        # executor, which the event loop joins at exit, so quitting waited for the current step
        # (or a whole prompt's prefill: 9-12 s). A daemon thread is left behind on quit.
        self._thread = threading.Thread(
            target=run_turn, args=(self.app.engine, self.messages, self.params, self.cancel, self.buffer),
            name="eaglechat-turn", daemon=True)
        self._thread.start()

    def drain(self) -> None:
        """Timer tick: render what arrived; at the end hand over to `end` (via Ended)."""
        if self._timer is None:
            return
        chunk, final = self.buffer.take()
        if chunk is not None:
            self.reply.write(chunk.text, chunk.runs)
            self.numbers = chunk.numbers
            self.save_partial()
            if final is None:
                self.app.update_status()
        if final is None:
            return
        self._timer.stop()
        self._timer = None
        self.app.post_message(self.Ended(self, final))

    # -- saving -----------------------------------------------------------------------------------

    def _store(self, write) -> bool:
        """Run one write of the reply; True when it is stored."""
        def again() -> None:
            self.reply.message_id = None
            self.app.recreate_conversation(but=self.reply)  # stores what is on screen again
            write()

        try:
            if not self.app.conversation_alive():  # checked first: a reused id is not ours
                again()
                return self._saved()
            try:
                write()
            except ConversationGone:  # deleted between the look and the write
                again()
        except StoreError as exc:
            if self.unsaved is None:
                self.app.notify(f"The reply is not saved: {exc}. It stays on screen (ctrl+y on it copies it).",
                                severity="error", timeout=15)
            self.unsaved = str(exc)
            return False
        return self._saved()

    def _saved(self) -> bool:
        self.unsaved = None
        return True

    def _add_or_update(self, stats: dict | None) -> bool:
        reply, app = self.reply, self.app

        def write() -> None:
            if reply.message_id is None:
                reply.message_id = app.store.add_message(
                    app.conversation.id, "assistant", reply.content, model=app.model_name,
                    stats=stats if stats is not None else {"partial": True}, slot=self.slot,
                    version=self.version).id
            else:
                app.store.update_message(reply.message_id, reply.content, stats=stats)

        return self._store(write)

    def save_partial(self) -> None:
        """Keep the reply in the store while it grows (WAL + autocommit: a crash keeps it)."""
        now = time.monotonic()
        if not self.reply.content:  # still reading the prompt: nothing to keep yet
            return
        if self.reply.message_id is None or now - self._saved_at >= SAVE_EVERY_S:
            self._add_or_update(None)
            self._saved_at = now

    def save_final(self, stats: dict) -> bool:
        return self._add_or_update(stats)

    # -- the end ----------------------------------------------------------------------------------

    async def end(self, final) -> None:
        app, reply = self.app, self.reply
        if isinstance(final, TurnDone) and final.finished.text and final.finished.text != reply.content:
            reply.set_content(final.finished.text)  # the engine's final word (e.g. a trimmed stop string)
        if not reply.is_attached:  # the app is closing (its widgets are gone): abandon saves
            return
        await reply.finish()
        app.chat_turn = None
        app.refresh_bindings()
        model = app.model_name
        if isinstance(final, TurnDone):
            app.numbers = numbers = final.numbers
            finished = final.finished
            app.context_tokens = numbers.context_tokens or app.context_tokens
            if not reply.content and finished.stop_reason == "cancelled":
                await reply.remove()  # stopped while the prompt was read: there is no reply
                app.numbers = None  # no figures to show for it
                app.notify("Stopped before the reply began", timeout=3)
                app.update_status()
                return
            meta = meta_line(numbers, model)
            stats = finished.stats.to_dict()
            stats.update(runs=reply.runs, meta=meta, stop_reason=finished.stop_reason)
            kept = self.save_final(stats)
            reply.set_meta(meta)
            app.turn_measured(numbers, finished.stop_reason)
            if numbers.dropped_messages:
                app.notify(f"{numbers.dropped_messages} earlier messages are outside the context "
                           f"({app.engine.info.max_context if app.engine else '?'} tokens); the model "
                           "did not see them", timeout=6)
            if finished.message:
                app.notify(finished.message, severity="warning", timeout=8)
            elif finished.stop_reason == "cancelled":
                app.notify("Stopped; the partial reply is kept" if kept else
                           "Stopped; the partial reply is on screen only (it could not be saved)", timeout=3)
        else:
            app.numbers = final.numbers
            app.numbers.final = True
            if reply.content:
                meta = f"{model} · interrupted by an error"
                self.save_final({"runs": reply.runs, "meta": meta, "error": final.error})
                reply.set_meta(meta)
            else:
                await reply.remove()
            app.notify(final.error, severity="error", timeout=15)
        reply.show_drafts(app.draft_colours)
        app.show_versions()
        app.update_status()

    def abandon(self, why: str) -> None:
        """Quit mid-reply: cancel without waiting for the engine (its daemon thread is left behind)
        and store what was written, marked like a stopped reply."""
        self.cancel.set()
        if self._timer is None:
            return  # already ended
        self._timer = None
        chunk, _ = self.buffer.take()
        reply = self.reply
        if chunk is not None:
            reply.content += chunk.text
            merge_runs(reply.runs, chunk.runs)
            self.numbers = chunk.numbers
        if not reply.content or self.app.conversation is None:
            return
        tokens = self.numbers.tokens
        meta = f"{self.app.model_name} · {tokens} tokens · stopped ({why})"
        try:
            self.save_final({"runs": reply.runs, "meta": meta, "stop_reason": "cancelled",
                             "interrupted": why, "new_tokens": tokens})
        except Exception:  # noqa: BLE001 - leaving: the screen is going away, nothing more can be done
            pass
