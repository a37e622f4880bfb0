"""The conversation list and what is done to a conversation: open, new, rename, delete, settings,
export, search, regenerate the last reply, edit and resend the last message. A mixin of EagleChatApp."""

from __future__ import annotations

import re

from eaglechat import paths
from eaglechat.chat.history import delete_from, export_markdown, search
from eaglechat.tui.screens import ConfirmScreen, SearchScreen, SettingsScreen, TextPromptScreen
from eaglechat.tui.widgets import ChatLog, ConversationList, MessageView, PromptInput


class ConversationActions:
    # -- conversations ----------------------------------------------------------------------------

    async def refresh_sidebar(self) -> None:
        current = self.conversation.id if self.conversation else None
        await self.query_one(ConversationList).show(self.store.conversations(), current)

    async def open_conversation(self, conversation_id: int | None) -> None:
        self.conversation = self.store.conversation(conversation_id) if conversation_id else None
        log = self.query_one(ChatLog)
        await log.remove_children()
        views = []
        if self.conversation is not None:
            for m in self.store.messages(self.conversation.id):
                views.append(MessageView(m.role, m.content, runs=m.stats.get("runs"),
                                         meta=m.stats.get("meta", ""), message_id=m.id, stamp=self.stamp(m.created)))
        await log.mount_all(views)
        for view in views:
            view.show_drafts(self.draft_colours)
        log.anchor()
        prompt = self.query_one(PromptInput)
        prompt.sent = [v.content for v in views if v.role == "user"]
        self.turn = None  # the last turn's figures belonged to the other conversation
        self._count_context()
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
            self.conversation = self.store.new_conversation(model=self.model_name)
            await self.refresh_sidebar()

        def done(values: dict | None) -> None:
            if values and self.conversation:
                self.conversation = self.store.update_conversation(self.conversation.id, **values)
                self.notify("Settings saved for this conversation", timeout=3)

        self.push_screen(SettingsScreen(self.conversation), done)

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

    def _count_context(self) -> None:
        """The open conversation's prompt size for the gauge (before its first turn here)."""
        count = getattr(self.engine, "count_tokens", None)
        self.context_tokens = None
        if count is None or self.conversation is None:
            return
        conv = self.conversation
        messages = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        messages += [{"role": m.role, "content": m.content} for m in self.store.messages(conv.id)
                     if m.role in ("user", "assistant")]
        if any(m["role"] == "user" for m in messages):
            try:
                self.context_tokens = count(messages)
            except Exception:  # noqa: BLE001
                self.context_tokens = None


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

    def _editable(self) -> list | None:
        """The conversation's messages when one may be changed now, else None (and says why)."""
        if self.generating:
            self.notify("A reply is being written; stop it first (esc)", severity="warning")
            return None
        if self.conversation is None or not (messages := self.store.messages(self.conversation.id)):
            self.notify("Nothing to change in this conversation yet", severity="warning")
            return None
        return messages

    async def action_regenerate(self) -> None:
        """Write the last reply again (with the current settings and speculation switch)."""
        messages = self._editable()
        if messages is None:
            return
        if self.engine is None:
            self.notify("No model loaded. Choose one with ctrl+o.", severity="error")
            return
        if messages[-1].role == "assistant":
            delete_from(self.store, self.conversation.id, messages[-1].id)
        elif messages[-1].role != "user":
            return
        await self.open_conversation(self.conversation.id)
        await self._start_turn()

    async def action_edit_last(self) -> None:
        """Take the last message back into the prompt (it and its reply leave the conversation);
        enter sends the edited text."""
        messages = self._editable()
        if messages is None:
            return
        users = [m for m in messages if m.role == "user"]
        if not users:
            return
        prompt = self.query_one(PromptInput)
        if prompt.text.strip():
            self.notify("The prompt has text in it; send or clear it first", severity="warning")
            return
        delete_from(self.store, self.conversation.id, users[-1].id)
        await self.open_conversation(self.conversation.id)
        prompt.load_text(users[-1].content)
        prompt.move_cursor(prompt.document.end)
        self.notify("Edit the message; enter sends it again", timeout=4)
