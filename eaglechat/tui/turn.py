"""One chat turn and everything it holds: the reply's view, the engine's daemon thread, the buffer the
owner drains on a timer, the saves while the reply grows, and its end (stored, rendered, said).

The chat pane creates a `ChatTurn` per reply and is its only owner: the turn uses of it only what
`TurnOwner` lists. The turn is the only code that writes the reply to the store. A write that finds
the conversation deleted by another window stores the conversation again from what the window shows
(`owner.recreate_conversation`) and retries; a write SQLite refuses (disk full, read-only file) leaves
the reply on screen and says so, and the turn never claims a reply is kept that was not stored.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Protocol

from eaglechat.chat.store import Conversation, ConversationGone, Store, StoreError
from eaglechat.engine.protocol import Engine, GenerationParams
from eaglechat.tui.generation import TurnBuffer, TurnDone, TurnFailed, run_turn
from eaglechat.tui.stats import TurnNumbers, meta_line

if TYPE_CHECKING:
    from eaglechat.tui.widgets import MessageView

__all__ = ["ChatTurn", "TurnDone", "TurnFailed", "TurnOwner"]

SAVE_EVERY_S = 2.0  # a reply being written is saved this often (a crash loses at most this much)


class TurnOwner(Protocol):
    """What a turn uses of the pane that runs it."""

    store: Store
    conversation: Conversation | None
    model_name: str
    draft_colours: bool

    def conversation_alive(self) -> bool: ...
    def recreate_conversation(self, but: MessageView | None = None) -> Conversation: ...
    def notify(self, message: str, *, severity=..., timeout=...) -> None: ...


class ChatTurn:
    def __init__(self, owner: TurnOwner, engine: Engine, reply: MessageView, messages: list[dict],
                 params: GenerationParams, *, slot: int | None = None, version: int = 0) -> None:
        self.owner = owner
        self.engine = engine
        self.reply = reply
        self.messages = messages
        self.params = params
        self.slot, self.version = slot, version  # the turn version this reply belongs to
        self.cancel = threading.Event()
        depth = engine.info.tree.depth
        self.numbers = TurnNumbers(speculate=params.speculate, depth=depth)
        self.buffer = TurnBuffer(TurnNumbers(speculate=params.speculate, depth=depth))
        self.unsaved: str | None = None  # why the last write failed, while it is failing
        self.ended = False
        self._saved_at = 0.0
        self._thread: threading.Thread | None = None

    # -- running ----------------------------------------------------------------------------------

    def start(self) -> None:
        # a plain daemon thread, not a Textual thread worker: those run on asyncio's default
        # executor, which the event loop joins at exit, so quitting waited for the current step
        # (or a whole prompt's prefill: 9-12 s). A daemon thread is left behind on quit.
        self._thread = threading.Thread(
            target=run_turn, args=(self.engine, self.messages, self.params, self.cancel, self.buffer),
            name="eaglechat-turn", daemon=True)
        self._thread.start()

    def drain(self) -> tuple[bool, TurnDone | TurnFailed | None]:
        """Render what arrived since the last call: (anything arrived, the end once it has come)."""
        chunk, final = self.buffer.take()
        if chunk is not None:
            self.reply.write(chunk.text, chunk.runs)
            self.numbers = chunk.numbers
            self.save_partial()
        return chunk is not None, final

    # -- saving -----------------------------------------------------------------------------------

    def _store(self, write) -> bool:
        """Run one write of the reply; True when it is stored."""
        def again() -> None:
            self.reply.message_id = None
            self.owner.recreate_conversation(but=self.reply)  # stores what is on screen again
            write()

        try:
            if not self.owner.conversation_alive():  # checked first: a reused id is not ours
                again()
                return self._saved()
            try:
                write()
            except ConversationGone:  # deleted between the look and the write
                again()
        except StoreError as exc:
            if self.unsaved is None:
                self.owner.notify(f"The reply is not saved: {exc}. It stays on screen (ctrl+y on it copies it).",
                                  severity="error", timeout=15)
            self.unsaved = str(exc)
            return False
        return self._saved()

    def _saved(self) -> bool:
        self.unsaved = None
        return True

    def _add_or_update(self, stats: dict | None) -> bool:
        reply, owner = self.reply, self.owner

        def write() -> None:
            if reply.message_id is None:
                reply.message_id = owner.store.add_message(
                    owner.conversation.id, "assistant", reply.content, model=owner.model_name,
                    stats=stats if stats is not None else {"partial": True}, slot=self.slot,
                    version=self.version, reasoning=reply.reasoning).id
            else:
                owner.store.update_message(reply.message_id, reply.content, stats=stats, reasoning=reply.reasoning)

        return self._store(write)

    def save_partial(self) -> None:
        """Keep the reply in the store while it grows (WAL + autocommit: a crash keeps it)."""
        now = time.monotonic()
        if not self.reply.content and not self.reply.reasoning:  # still reading the prompt: nothing to keep yet
            return
        if self.reply.message_id is None or now - self._saved_at >= SAVE_EVERY_S:
            self._add_or_update(None)
            self._saved_at = now

    def save_final(self, stats: dict) -> bool:
        return self._add_or_update(stats)

    # -- the end ----------------------------------------------------------------------------------

    async def end(self, final: TurnDone | TurnFailed) -> TurnNumbers | None:
        """Render the whole reply, store it with its figures, say how it ended. The figures to show
        for the turn, or None when there are none (stopped before the reply began)."""
        self.ended = True
        owner, reply = self.owner, self.reply
        if isinstance(final, TurnDone) and final.finished.text and final.finished.text != reply.raw:
            reply.set_raw(final.finished.text)  # the engine's final word (e.g. a trimmed stop string)
        await reply.finish()
        model = owner.model_name
        if isinstance(final, TurnDone):
            numbers = final.numbers
            finished = final.finished
            if not reply.content and not reply.reasoning and finished.stop_reason == "cancelled":
                await reply.remove()  # stopped while the prompt was read: there is no reply
                owner.notify("Stopped before the reply began", timeout=3)
                return None
            meta = meta_line(numbers, model)
            stats = finished.stats.to_dict()
            stats.update(runs=reply.runs, meta=meta, stop_reason=finished.stop_reason)
            kept = self.save_final(stats)
            reply.set_meta(meta)
            if numbers.dropped_messages:
                context = getattr(self.engine.info, "max_context", "?")
                owner.notify(f"{numbers.dropped_messages} earlier messages are outside the context "
                             f"({context} tokens); the model did not see them", timeout=6)
            if finished.message:
                owner.notify(finished.message, severity="warning", timeout=8)
            elif finished.stop_reason == "cancelled":
                owner.notify("Stopped; the partial reply is kept" if kept else
                             "Stopped; the partial reply is on screen only (it could not be saved)", timeout=3)
        else:
            numbers = final.numbers
            numbers.final = True
            if reply.content or reply.reasoning:
                meta = f"{model} · interrupted by an error"
                self.save_final({"runs": reply.runs, "meta": meta, "error": final.error})
                reply.set_meta(meta)
            else:
                await reply.remove()
            owner.notify(final.error, severity="error", timeout=15)
        reply.show_drafts(owner.draft_colours)
        return numbers

    def abandon(self, why: str) -> None:
        """Quit mid-reply: cancel without waiting for the engine (its daemon thread is left behind)
        and store what was written, marked like a stopped reply."""
        self.cancel.set()
        if self.ended:
            return
        self.ended = True
        chunk, _ = self.buffer.take()
        reply = self.reply
        if chunk is not None:
            reply.append_quietly(chunk.text, chunk.runs)
            self.numbers = chunk.numbers
        if not (reply.content or reply.reasoning) or self.owner.conversation is None:
            return
        tokens = self.numbers.tokens
        meta = f"{self.owner.model_name} · {tokens} tokens · stopped ({why})"
        try:
            self.save_final({"runs": reply.runs, "meta": meta, "stop_reason": "cancelled",
                             "interrupted": why, "new_tokens": tokens})
        except Exception:  # noqa: BLE001 - leaving: the screen is going away, nothing more can be done
            pass
