"""Stopping, quitting and where keys go: esc and ctrl+c stop a reply (at the engine's next decode step),
ctrl+q / SIGTERM / SIGHUP leave at once (the reply's thread is not waited for; what it wrote is stored,
marked stopped), and text typed or pasted anywhere on the chat screen, or on the loading screen, lands in
the prompt. A mixin of EagleChatApp."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from textual import events
from textual.css.query import NoMatches

from eaglechat.tui.screens import LoadingScreen
from eaglechat.tui.widgets import StatusBar

if TYPE_CHECKING:
    from eaglechat.tui.pane import ChatPane


class Control:
    # what this mixin uses of EagleChatApp (set in its __init__, or its properties)
    pane: ChatPane
    generating: bool
    _interrupted_at: float

    def action_stop(self) -> None:
        if self.pane.stop():
            self.query_one(StatusBar).show(["stopping at the next decode step…"], live=True)

    async def action_interrupt(self) -> None:
        """ctrl+c: copies a selection (made with the mouse anywhere, or in the prompt) first; else stops
        a reply (the habit from `ollama run` and llama-cli); else a second ctrl+c within 2 s quits."""
        selected = self.screen.get_selected_text()
        if selected:
            self.copy_to_clipboard(selected)
            self.screen.clear_selection()
            self.notify("Copied", timeout=2)
            return
        prompt = self.pane.prompt
        if self.focused is prompt and prompt.selected_text:
            prompt.action_copy()
            self.notify("Copied", timeout=2)
            return
        if self.generating:
            self.action_stop()
            return
        now = time.monotonic()
        if now - self._interrupted_at < 2.0:
            await self.action_quit()
            return
        self._interrupted_at = now
        self.notify("Press ctrl+c again to quit (or ctrl+q)", timeout=2)

    def action_focus_prompt(self) -> None:
        self.pane.focus_prompt()

    def action_scroll_chat(self, pages: int) -> None:
        """shift+pageup/pagedown: scroll the conversation without leaving the prompt."""
        self.pane.scroll_pages(pages)

    async def on_event(self, event) -> None:
        if isinstance(event, (events.Key, events.Paste)) and not event.is_forwarded:
            if self._typed_while_loading(event):
                return
            self._text_to_prompt(event)
        await super().on_event(event)

    def _typed_while_loading(self, event: events.Key | events.Paste) -> bool:
        """The loading screen covers the prompt for as long as a model loads (the first start converts
        the default model: a minute or two). What is typed there goes into the prompt behind it; enter
        sends it once the model is ready. True when the event was taken."""
        if not self.screen_stack or not isinstance(self.screen, LoadingScreen):
            return False
        try:
            prompt = self.pane.prompt
        except NoMatches:
            return False
        if isinstance(event, events.Paste):
            prompt.insert(event.text)
        elif event.key in ("enter", "ctrl+m"):
            if prompt.text.strip():
                self.pane.send_when_loaded = True
        elif event.key in ("shift+enter", "ctrl+j"):
            prompt.insert("\n")
        elif event.key == "backspace":
            prompt.action_delete_left()
        elif event.is_printable and event.character:
            prompt.insert(event.character)
        else:
            return False  # esc (cancel a pull), ctrl+q and the rest keep their meaning
        self.screen.typed(prompt.text, self.pane.send_when_loaded)
        return True

    def _text_to_prompt(self, event: events.Key | events.Paste) -> None:
        """Typing or pasting on the chat screen goes to the prompt, wherever the focus was (it was
        swallowed by the sidebar or a message). Focus moves before the event is forwarded, so the
        characters keep their order. Keys that the focused widget binds (y/u on a message) stay."""
        if not self.screen_stack or self.screen is not self.screen_stack[0]:
            return
        try:
            prompt = self.pane.prompt
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
        self.pane.abandon(why)

    def on_unmount(self) -> None:
        self.abandon_turn("quit")
