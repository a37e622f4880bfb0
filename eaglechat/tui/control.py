"""Stopping, quitting and where keys go: esc and ctrl+c stop a reply, ctrl+q / SIGTERM / SIGHUP leave
at once (the reply's thread is not waited for; what it wrote is stored, marked stopped), and text typed
or pasted anywhere on the chat screen lands in the prompt. A mixin of EagleChatApp."""

from __future__ import annotations

import time

from textual import events
from textual.css.query import NoMatches

from eaglechat.tui.generation import merge_runs
from eaglechat.tui.widgets import PromptInput, StatusBar


class Control:
    def action_stop(self) -> None:
        if self.generating and self.cancel is not None:
            self.cancel.set()
            self.query_one(StatusBar).show(["stopping…"], live=True)

    async def action_interrupt(self) -> None:
        """ctrl+c: stops a reply (the habit from `ollama run` and llama-cli); copies a selection in the
        prompt; otherwise a second ctrl+c within 2 s quits."""
        if self.generating:
            self.action_stop()
            return
        prompt = self.query_one(PromptInput)
        if self.focused is prompt and prompt.selected_text:
            prompt.action_copy()
            return
        now = time.monotonic()
        if now - self._interrupted_at < 2.0:
            await self.action_quit()
            return
        self._interrupted_at = now
        self.notify("Press ctrl+c again to quit (or ctrl+q)", timeout=2)

    def action_focus_prompt(self) -> None:
        self.screen.set_focus(self.query_one(PromptInput))

    async def on_event(self, event) -> None:
        if isinstance(event, (events.Key, events.Paste)) and not event.is_forwarded:
            self._text_to_prompt(event)
        await super().on_event(event)

    def _text_to_prompt(self, event: events.Key | events.Paste) -> None:
        """Typing or pasting on the chat screen goes to the prompt, wherever the focus was (it was
        swallowed by the sidebar or a message). Focus moves before the event is forwarded, so the
        characters keep their order. Keys that the focused widget binds (y/u on a message) stay."""
        if not self.screen_stack or self.screen is not self.screen_stack[0]:
            return
        try:
            prompt = self.query_one(PromptInput)
        except NoMatches:
            return
        if self.focused is prompt:
            return
        if isinstance(event, events.Key) and (not event.is_printable or event.key in self.screen.active_bindings):
            return
        self.screen.set_focus(prompt)

    # -- leaving: ctrl+q, SIGTERM, SIGHUP ---------------------------------------------------------

    async def action_quit(self) -> None:
        self.abandon_turn("quit")
        self.exit()

    def _on_signal(self, name: str) -> None:
        """SIGTERM/SIGHUP: leave the way ctrl+q does, so the driver restores the terminal (raw mode,
        alternate screen, mouse tracking) and the partial reply is stored."""
        self.abandon_turn(name)
        self.exit(return_code=128 + {"SIGTERM": 15, "SIGHUP": 1}.get(name, 0))

    def _install_signal_handlers(self) -> None:
        import asyncio
        import signal

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig.name)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
                pass

    def abandon_turn(self, why: str) -> None:
        """Quit mid-reply: cancel the turn without waiting for it (its daemon thread is left behind)
        and store what was written, marked like a stopped reply."""
        if self.cancel is not None:
            self.cancel.set()
        reply, buffer = self._reply, self._buffer
        self._reply = self._buffer = None
        if reply is None or buffer is None or self.conversation is None:
            return
        chunk, _ = buffer.take()
        if chunk is not None:
            reply.content += chunk.text
            merge_runs(reply.runs, chunk.runs)
            self.turn = chunk.numbers
        if not reply.content:
            return
        tokens = self.turn.tokens if self.turn is not None else 0
        meta = f"{self.model_name} · {tokens} tokens · stopped ({why})"
        self._save_final(reply, {"runs": reply.runs, "meta": meta, "stop_reason": "cancelled",
                                 "interrupted": why, "new_tokens": tokens})

    def on_unmount(self) -> None:
        self.abandon_turn("quit")
