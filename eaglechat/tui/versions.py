"""The versions of a conversation's last turn: ctrl+r writes the last reply again, f9 takes the last
message back into the prompt to edit and send again, alt+left / alt+right flip between the versions
(chat/history.py keeps them: the ones not shown are archived, never deleted). Works on the chat pane's
open conversation, through the members `VersionsOwner` lists."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from eaglechat.chat.history import last_versions, put_aside, show_version
from eaglechat.chat.store import Conversation, Store
from eaglechat.engine.protocol import Engine
from eaglechat.tui.keys import key_for
from eaglechat.tui.widgets import MessageView

if TYPE_CHECKING:
    from eaglechat.tui.widgets import PromptInput


class VersionsOwner(Protocol):
    """What the versions use of the chat pane."""

    store: Store
    conversation: Conversation | None
    engine: Engine | None
    generating: bool
    keymap: dict[str, str]
    prompt: PromptInput

    async def open(self, conversation_id: int | None) -> None: ...
    async def start_turn(self, *, slot: int | None = None, version: int = 0) -> None: ...
    def notify(self, message: str, *, severity=..., timeout=...) -> None: ...
    def query(self, selector): ...


class LastTurnVersions:
    def __init__(self, pane: VersionsOwner) -> None:
        self.pane = pane

    def _key(self, key_id: str) -> str:
        return key_for(key_id, self.pane.keymap)

    def show(self) -> None:
        """Say on the last reply which version of the turn it is, when there are several."""
        if self.pane.conversation is None:
            return
        versions = last_versions(self.pane.store, self.pane.conversation.id)
        views = [v for v in self.pane.query(MessageView) if v.role in ("user", "assistant")]
        if versions is None or versions.shown is None or not views:
            return
        last = views[-1]
        keys = f"{self._key('previous_version')}/{self._key('next_version')}"
        last.set_meta(" · ".join(p for p in (last.meta.split(" · version ")[0], f"{versions.label()} ({keys})") if p))

    def _editable(self) -> list | None:
        """The conversation's messages when one may be changed now, else None (and says why)."""
        if self.pane.generating:
            self.pane.notify("A reply is being written; stop it first (esc)", severity="warning")
            return None
        if self.pane.conversation is None or not (messages := self.pane.store.messages(self.pane.conversation.id)):
            self.pane.notify("Nothing to change in this conversation yet", severity="warning")
            return None
        return messages

    async def regenerate(self) -> bool:
        """Write the last reply again (with the current settings and speculation switch). The reply
        shown is kept as an earlier version of the turn: alt+left brings it back. True when it began."""
        messages = self._editable()
        if messages is None:
            return False
        if self.pane.engine is None:
            self.pane.notify("No model loaded. Choose one with ctrl+o.", severity="error")
            return False
        if messages[-1].role == "assistant":
            users = [i for i, m in enumerate(messages) if m.role == "user"]
            if not users:
                return False
            turn = messages[users[-1]:]
            question = turn[0]
            slot, version = put_aside(self.pane.store, self.pane.conversation.id, turn)
            # the new version starts with the same question, its own copy (a version is self-contained)
            self.pane.store.add_message(self.pane.conversation.id, "user", question.content, slot=slot, version=version)
        elif messages[-1].role == "user":  # no reply yet (stopped before it began): it joins its turn
            slot, version = messages[-1].slot, messages[-1].version
        else:
            return False
        await self.pane.open(self.pane.conversation.id)
        await self.pane.start_turn(slot=slot, version=version)
        return True

    async def edit_last(self) -> bool:
        """Take the last message back into the prompt; enter sends the edited text as a new version of
        that turn. The message and its reply are kept: alt+left brings them back unchanged. True when
        it was taken back."""
        messages = self._editable()
        if messages is None:
            return False
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not users:
            return False
        prompt = self.pane.prompt
        if prompt.text.strip():
            self.pane.notify("The prompt has text in it; send or clear it first", severity="warning")
            return False
        question = messages[users[-1]]
        put_aside(self.pane.store, self.pane.conversation.id, messages[users[-1]:])
        await self.pane.open(self.pane.conversation.id)
        prompt.load_text(question.content)
        prompt.move_cursor(prompt.document.end)
        back = self._key("previous_version")
        self.pane.notify(f"Edit the message; enter sends it again ({back} puts the old one back)", timeout=5)
        return True

    async def flip(self, step: int) -> bool:
        """alt+left / alt+right: show the last turn's earlier or later version. True when it changed."""
        if self.pane.generating:
            self.pane.notify("A reply is being written; stop it first (esc)", severity="warning")
            return False
        versions = last_versions(self.pane.store, self.pane.conversation.id) if self.pane.conversation else None
        if versions is None:
            self.pane.notify("The last reply has no other version (ctrl+r writes one)", severity="warning", timeout=3)
            return False
        if versions.shown is None:  # taken back with f9 and not sent: back to the last version
            at = len(versions.numbers) if step < 0 else -1
        else:
            at = versions.numbers.index(versions.shown)
        target = at + step
        if not 0 <= target < len(versions.numbers):
            self.pane.notify("No earlier version" if step < 0 else "No later version", timeout=2)
            return False
        prompt = self.pane.prompt
        if versions.shown is None and prompt.text.strip():  # the turn is in the prompt being edited
            taken = [m.content for m in self.pane.store.messages(self.pane.conversation.id, archived=True)
                     if m.slot == versions.slot and m.role == "user"]
            if prompt.text != (taken[-1] if taken else None):
                self.pane.notify("The prompt holds an edit of this message; send or clear it first", severity="warning")
                return False
            prompt.load_text("")  # unchanged: the undo of f9
        show_version(self.pane.store, self.pane.conversation.id, versions.slot, versions.numbers[target])
        await self.pane.open(self.pane.conversation.id)
        return True
