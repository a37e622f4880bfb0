"""The conversation list and what is done to a conversation as a whole: open, new, rename, delete,
settings, export, search, and following what other windows change in the same history. The open
conversation itself (its messages, the turn, the versions of its last turn) is the chat pane's
(tui/pane.py). A mixin of EagleChatApp: it declares below what it uses of the app."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from eaglechat import paths
from eaglechat.chat import settings
from eaglechat.chat.history import export_markdown, search
from eaglechat.chat.store import Conversation, Store, StoreError
from eaglechat.tui.pane import ChatPane
from eaglechat.tui.screens import (
    ConfirmScreen,
    SearchScreen,
    SettingsScreen,
    TextPromptScreen,
)
from eaglechat.tui.stats import TurnNumbers
from eaglechat.tui.widgets import ConversationList

WATCH_S = 1.0  # how often the history file is checked for another window's changes


class ConversationActions:
    # what this mixin uses of EagleChatApp (set in its __init__, or its properties)
    store: Store
    pane: ChatPane
    conversation: Conversation | None
    model_name: str
    generating: bool
    numbers: TurnNumbers | None
    settings_path: Path | None
    export_dir: Path | None
    last_export: Path | None
    _data_version: int
    # the app's own methods, as annotations: a stub here would stand in front of them in the MRO
    update_status: Callable[[], None]
    action_focus_prompt: Callable[[], None]

    # -- conversations ----------------------------------------------------------------------------

    async def refresh_sidebar(self) -> None:
        current = self.conversation.id if self.conversation else None
        self._data_version = self.store.data_version
        await self.query_one(ConversationList).show(self.store.conversations(), current)

    def watch_history(self) -> None:
        self.set_interval(WATCH_S, self._check_history)

    async def _check_history(self) -> None:
        """Another window (or process) wrote to the history: show its conversations too. One PRAGMA
        read per tick; the list is read again only when the file changed."""
        try:
            version = self.store.data_version
        except Exception:  # noqa: BLE001 - a closing store: nothing to follow any more
            return
        if version == self._data_version:
            return
        self._data_version = version
        conv = self.conversation
        if conv is not None and not self.generating and not self.pane.conversation_alive():
            self.notify(f"“{conv.title}” was deleted in another window. It stays on screen; sending a "
                        "message saves it again as a new conversation.", severity="warning", timeout=10)
        await self.refresh_sidebar()

    async def open_conversation(self, conversation_id: int | None) -> None:
        await self.pane.open(conversation_id)
        await self._opened()

    async def _opened(self) -> None:
        """After the pane showed another conversation (or another version of this one)."""
        self.numbers = None  # the last turn's figures belonged to the other conversation
        self.update_status()
        await self.refresh_sidebar()
        self.action_focus_prompt()

    async def on_conversation_list_chosen(self, message: ConversationList.Chosen) -> None:
        if self.conversation and message.conversation_id == self.conversation.id:
            return
        if self.generating:
            self.notify("A reply is being written; stop it first (esc)", severity="warning")
            await self.refresh_sidebar()
            return
        await self.open_conversation(message.conversation_id)

    async def action_new_conversation(self) -> None:
        if self.generating:
            self.notify("A reply is being written; stop it first (esc)", severity="warning")
            return
        # nothing is stored until the first message: ctrl+n pressed three times leaves no empty entries
        await self.open_conversation(None)

    def action_rename(self) -> None:
        if self.conversation is None:
            self.notify("No conversation to rename", severity="warning")
            return

        async def done(title: str | None) -> None:
            if title and self.conversation:
                self.conversation = self.store.rename(self.conversation.id, title)
                await self.refresh_sidebar()

        self.push_screen(TextPromptScreen("Rename conversation", self.conversation.title), done)

    def action_delete(self) -> None:
        if self.conversation is None or self.generating:
            self.notify("Nothing to delete" if not self.generating else "Stop the reply first (esc)",
                        severity="warning")
            return

        async def done(yes: bool | None) -> None:
            if yes and self.conversation:
                self.store.delete(self.conversation.id)
                rest = self.store.conversations()
                await self.open_conversation(rest[0].id if rest else None)
                self.notify("Conversation deleted", timeout=3)

        self.push_screen(ConfirmScreen(f"Delete “{self.conversation.title}”?"), done)

    async def action_settings(self) -> None:
        if self.conversation is None:  # settings before the first message: the conversation starts here
            self.conversation = self.store.new_conversation(model=self.model_name, **self.pane.new_conversation_settings())
            await self.refresh_sidebar()

        def done(values: dict | None) -> None:
            if not values or not self.conversation:
                return
            as_default = values.pop("as_default", False)
            try:
                self.conversation = self.store.update_conversation(self.conversation.id, **values) or self.conversation
            except StoreError as exc:
                self.notify(f"Settings not saved: {exc}", severity="error", timeout=10)
                return
            if as_default:
                try:
                    backup = settings.save_conversation_defaults(values, self.settings_path)
                except (OSError, settings.SettingsError) as exc:
                    self.notify(f"Saved for this conversation; the default could not be saved: {exc}",
                                severity="warning", timeout=10)
                    return
                kept = f" ({backup.name} keeps the file with your comments)" if backup else ""
                self.notify(f"Saved for this conversation and as the default for new ones{kept}", timeout=3 + 5 * bool(kept))
            else:
                self.notify("Settings saved for this conversation", timeout=3)

        self.push_screen(SettingsScreen(self.conversation, settings.personas(self.settings_path),
                                        model_sampling=self.pane.model_sampling()), done)

    def action_export(self) -> None:
        if self.conversation is None:
            self.notify("No conversation to export", severity="warning")
            return
        text = export_markdown(self.conversation, self.store.messages(self.conversation.id))
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.conversation.title).strip("-").lower()[:40] or "chat"
        try:
            folder = self.export_dir or paths.exports_dir()
            path = folder / f"{slug}-{self.conversation.id}.md"
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            self.notify(f"Export failed: {exc}", severity="error")
            return
        self.last_export = path
        self.notify(f"Exported to {path}", timeout=10)

    def action_search(self) -> None:
        def hits(text: str) -> list[tuple[int, str, str]]:
            return [(h.conversation.id, h.conversation.title, h.snippet) for h in search(self.store, text)]

        async def done(conversation_id: int | None) -> None:
            if conversation_id is None:
                self.action_focus_prompt()
            elif self.generating:
                self.notify("A reply is being written; stop it first (esc)", severity="warning")
            else:
                await self.open_conversation(conversation_id)

        self.push_screen(SearchScreen(hits), done)

    # -- the last turn's versions (the pane keeps them) ------------------------------------------------

    async def action_regenerate(self) -> None:
        if await self.pane.versions.regenerate():
            self.numbers = None
            self.update_status()
            await self.refresh_sidebar()

    async def action_edit_last(self) -> None:
        if await self.pane.versions.edit_last():
            await self._opened()

    async def action_previous_version(self) -> None:
        if await self.pane.versions.flip(-1):
            await self._opened()

    async def action_next_version(self) -> None:
        if await self.pane.versions.flip(1):
            await self._opened()
