"""The conversation list and what is done to a conversation: open, new, rename, delete, settings,
export, search, regenerate the last reply, edit and resend the last message (both keep the earlier
version, and alt+left/right flips between them), and following what other windows change in the
same history. A mixin of EagleChatApp."""

from __future__ import annotations

import re
from pathlib import Path

from eaglechat import paths
from eaglechat.chat import settings
from eaglechat.chat.history import (
    export_markdown,
    last_versions,
    put_aside,
    search,
    show_version,
)
from eaglechat.chat.store import Conversation, Store, StoreError
from eaglechat.tui.keys import key_for
from eaglechat.tui.screens import (
    ConfirmScreen,
    SearchScreen,
    SettingsScreen,
    TextPromptScreen,
)
from eaglechat.tui.widgets import ChatLog, ConversationList, MessageView, PromptInput

WATCH_S = 1.0  # how often the history file is checked for another window's changes


class ConversationActions:
    # what this mixin uses of EagleChatApp (set in its __init__)
    store: Store
    conversation: Conversation | None
    settings_path: Path | None
    export_dir: Path | None
    last_export: Path | None
    draft_colours: bool
    context_tokens: int | None
    _data_version: int

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
        if conv is not None and not self.generating and not self.conversation_alive():
            self.notify(f"“{conv.title}” was deleted in another window. It stays on screen; sending a "
                        "message saves it again as a new conversation.", severity="warning", timeout=10)
        await self.refresh_sidebar()

    def conversation_alive(self) -> bool:
        """The open conversation is still in the history. Its creation time is checked with its id:
        SQLite may give a deleted conversation's id to the next new one (another window's)."""
        conv = self.conversation
        stored = self.store.conversation(conv.id) if conv is not None else None
        return stored is not None and stored.created == conv.created

    def recreate_conversation(self, but: MessageView | None = None) -> Conversation:
        """The open conversation was deleted in another window: store it again, with every message
        this window shows (all but `but`, which its owner saves itself), as a new conversation."""
        old = self.conversation
        conv = self.store.new_conversation(old.title, model=old.model, system_prompt=old.system_prompt,
                                           temperature=old.temperature, top_p=old.top_p,
                                           max_new_tokens=old.max_new_tokens)
        for view in self.query(MessageView):
            if view is but or view.role not in ("user", "assistant") or not view.content:
                continue
            view.message_id = self.store.add_message(conv.id, view.role, view.content, stats={
                "runs": view.runs, "meta": view.meta} if view.role == "assistant" else None).id
        self.conversation = conv
        self.notify(f"“{old.title}” was deleted in another window; what this window shows is saved again "
                    "as a new conversation.", severity="warning", timeout=10)
        self.call_later(self.refresh_sidebar)
        return conv

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
        # Up recalls this conversation's messages first, then the latest of the others
        here = [v.content for v in views if v.role == "user"]
        others = self.store.recent_user_messages(exclude=self.conversation.id if self.conversation else None)
        prompt.sent = [m for m in others if m not in here] + here
        self.numbers = None  # the last turn's figures belonged to the other conversation
        self._count_context()
        self.show_versions()
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
            self.conversation = self.store.new_conversation(model=self.model_name, **self.new_conversation_settings())
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
                    settings.save_conversation_defaults(values, self.settings_path)
                except OSError as exc:
                    self.notify(f"Saved for this conversation; the default could not be saved: {exc}",
                                severity="warning", timeout=10)
                    return
                self.notify("Saved for this conversation and as the default for new ones", timeout=3)
            else:
                self.notify("Settings saved for this conversation", timeout=3)

        self.push_screen(SettingsScreen(self.conversation, settings.personas(self.settings_path),
                                        model_sampling=self.model_sampling()), done)

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
        """Write the last reply again (with the current settings and speculation switch). The reply
        shown is kept as an earlier version of the turn: alt+left brings it back."""
        messages = self._editable()
        if messages is None:
            return
        if self.engine is None:
            self.notify("No model loaded. Choose one with ctrl+o.", severity="error")
            return
        slot, version = None, 0
        if messages[-1].role == "assistant":
            users = [i for i, m in enumerate(messages) if m.role == "user"]
            if not users:
                return
            turn = messages[users[-1]:]
            question = turn[0]
            slot, version = put_aside(self.store, self.conversation.id, turn)
            # the new version starts with the same question, its own copy (a version is self-contained)
            self.store.add_message(self.conversation.id, "user", question.content, slot=slot, version=version)
        elif messages[-1].role == "user":  # no reply yet (stopped before it began): it joins its turn
            slot, version = messages[-1].slot, messages[-1].version
        else:
            return
        await self.open_conversation(self.conversation.id)
        await self._start_turn(slot=slot, version=version)

    async def action_edit_last(self) -> None:
        """Take the last message back into the prompt; enter sends the edited text as a new version of
        that turn. The message and its reply are kept: alt+left brings them back unchanged."""
        messages = self._editable()
        if messages is None:
            return
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not users:
            return
        prompt = self.query_one(PromptInput)
        if prompt.text.strip():
            self.notify("The prompt has text in it; send or clear it first", severity="warning")
            return
        question = messages[users[-1]]
        put_aside(self.store, self.conversation.id, messages[users[-1]:])
        await self.open_conversation(self.conversation.id)
        prompt.load_text(question.content)
        prompt.move_cursor(prompt.document.end)
        back = self._key("previous_version")
        self.notify(f"Edit the message; enter sends it again ({back} puts the old one back)", timeout=5)

    # -- versions of the last turn ----------------------------------------------------------------

    def _key(self, key_id: str) -> str:
        return key_for(key_id, self.keymap)

    def show_versions(self) -> None:
        """Say on the last reply which version of the turn it is, when there are several."""
        if self.conversation is None:
            return
        versions = last_versions(self.store, self.conversation.id)
        views = [v for v in self.query(MessageView) if v.role in ("user", "assistant")]
        if versions is None or versions.shown is None or not views:
            return
        last = views[-1]
        keys = f"{self._key('previous_version')}/{self._key('next_version')}"
        last.set_meta(" · ".join(p for p in (last.meta.split(" · version ")[0], f"{versions.label()} ({keys})") if p))

    async def action_previous_version(self) -> None:
        await self._flip(-1)

    async def action_next_version(self) -> None:
        await self._flip(1)

    async def _flip(self, step: int) -> None:
        if self.generating:
            self.notify("A reply is being written; stop it first (esc)", severity="warning")
            return
        versions = last_versions(self.store, self.conversation.id) if self.conversation else None
        if versions is None:
            self.notify("The last reply has no other version (ctrl+r writes one)", severity="warning", timeout=3)
            return
        if versions.shown is None:  # taken back with f9 and not sent: back to the last version
            at = len(versions.numbers) if step < 0 else -1
        else:
            at = versions.numbers.index(versions.shown)
        target = at + step
        if not 0 <= target < len(versions.numbers):
            self.notify("No earlier version" if step < 0 else "No later version", timeout=2)
            return
        prompt = self.query_one(PromptInput)
        if versions.shown is None and prompt.text.strip():  # the turn is in the prompt being edited
            taken = [m.content for m in self.store.messages(self.conversation.id, archived=True)
                     if m.slot == versions.slot and m.role == "user"]
            if prompt.text != (taken[-1] if taken else None):
                self.notify("The prompt holds an edit of this message; send or clear it first", severity="warning")
                return
            prompt.load_text("")  # unchanged: the undo of f9
        show_version(self.store, self.conversation.id, versions.slot, versions.numbers[target])
        await self.open_conversation(self.conversation.id)
