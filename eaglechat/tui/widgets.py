"""The chat screen's widgets: message views (streamed Markdown), the chat log, the prompt, the
conversation list and the status bar."""

from __future__ import annotations

import asyncio
import re
import time

from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Label, ListItem, ListView, Markdown, Static, TextArea

from eaglechat.chat.store import Conversation

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
DRAFT_STYLE = "bold #7fd7a0 on #1d3a2a"


def code_blocks(markdown: str) -> list[str]:
    """Fenced code blocks of a Markdown text; an unclosed fence at the end counts as one."""
    blocks = [m.group(2) for m in FENCE.finditer(markdown)]
    open_tail = re.search(r"^(```|~~~)[^\n]*\n(.*)\Z", FENCE.sub("", markdown), re.M | re.S)
    if open_tail:
        blocks.append(open_tail.group(2))
    return blocks


def spec_text(content: str, runs: list[tuple[int, bool]]) -> Text:
    """The reply as plain text with the characters of accepted drafts highlighted."""
    text = Text()
    pos = 0
    for length, drafted in runs:
        text.append(content[pos:pos + length], style=DRAFT_STYLE if drafted else "")
        pos += length
    if pos < len(content):
        text.append(content[pos:])
    return text


class MessageView(Vertical, can_focus=True):
    """One message. Assistant replies stream in through `write()`: fragments are merged while the
    previous append is still rendering (like Textual's MarkdownStream), and `finish()` does one
    full `Markdown.update()` so fences closed late render correctly (textual #6518)."""

    BINDINGS = [
        Binding("y", "copy_message", "Copy", id="copy_message"),
        Binding("u", "copy_code", "Copy code", id="copy_code"),
    ]
    ROLE_LABEL = {"user": "You", "assistant": "Assistant", "system": "System", "error": "Error"}

    def __init__(self, role: str, content: str = "", *, runs: list | None = None, meta: str = "",
                 message_id: int | None = None) -> None:
        super().__init__(classes=f"message -{role}")
        self.role = role
        self.content = content
        self.runs: list[tuple[int, bool]] = [tuple(r) for r in (runs or [])]
        self.meta = meta
        self.message_id = message_id
        self.append_times: list[tuple[int, float]] = []  # (chars, seconds) per Markdown.append
        self._stream_pending: list[str] = []
        self._stream_wake = asyncio.Event()
        self._stream_open = False
        self._flush_task: asyncio.Task | None = None

    def compose(self):
        yield Label(self.ROLE_LABEL.get(self.role, self.role), classes="role")
        yield Markdown(self.content, classes="body")
        yield Static("", classes="spec")
        yield Label(self.meta, classes="meta")

    @property
    def body(self) -> Markdown:
        return self.query_one(".body", Markdown)

    def show_drafts(self, on: bool) -> None:
        """Swap the Markdown body for the draft-coloured plain text (code formatting would suffer
        from colouring inside fences, so the coloured view is a separate rendering)."""
        if on and self.runs:
            self.query_one(".spec", Static).update(spec_text(self.content, self.runs))
        self.set_class(on and bool(self.runs), "-drafts")

    def set_meta(self, meta: str) -> None:
        self.meta = meta
        self.query_one(".meta", Label).update(meta)

    # -- streaming --------------------------------------------------------------------------------

    def start_stream(self) -> None:
        self._stream_open = True
        self._flush_task = asyncio.create_task(self._flush_loop())

    def write(self, fragment: str, runs: list[tuple[int, bool]]) -> None:
        if not fragment:
            return
        from eaglechat.tui.generation import merge_runs

        self.content += fragment
        merge_runs(self.runs, runs)
        self._stream_pending.append(fragment)
        self._stream_wake.set()
        if self.has_class("-drafts"):
            self.query_one(".spec", Static).update(spec_text(self.content, self.runs))

    async def _flush_loop(self) -> None:
        while True:
            await self._stream_wake.wait()
            self._stream_wake.clear()
            if self._stream_pending:
                chunk = "".join(self._stream_pending)
                self._stream_pending.clear()
                t0 = time.perf_counter()
                await self.body.append(chunk)
                self.append_times.append((len(chunk), time.perf_counter() - t0))
            if not self._stream_open and not self._stream_pending:
                return

    async def finish(self) -> None:
        self._stream_open = False
        self._stream_wake.set()
        if self._flush_task is not None:
            await self._flush_task
            self._flush_task = None
        await self.body.update(self.content)  # the one full render

    def on_unmount(self) -> None:
        if self._flush_task is not None:
            self._flush_task.cancel()

    # -- copy -------------------------------------------------------------------------------------

    def action_copy_message(self) -> None:
        self.app.copy_to_clipboard(self.content)
        self.notify("Message copied")

    def action_copy_code(self) -> None:
        blocks = code_blocks(self.content)
        if not blocks:
            self.notify("No code block in this message", severity="warning")
            return
        self.app.copy_to_clipboard(blocks[-1])
        self.notify("Code block copied")


class ChatLog(VerticalScroll):
    """The messages of one conversation; anchored to the bottom while the user does not scroll up."""

    def on_mount(self) -> None:
        self.anchor()


class PromptInput(TextArea):
    """Enter sends; shift+enter (or ctrl+j, for terminals that cannot tell shift+enter) adds a newline."""

    BINDINGS = [
        Binding("enter", "submit", "Send", priority=True, id="send"),
        Binding("shift+enter,ctrl+j", "newline", "Newline", priority=True, show=False, id="newline"),
    ]

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)

    def action_submit(self) -> None:
        text = self.text
        if text.strip():
            self.post_message(self.Submitted(text))

    def action_newline(self) -> None:
        start, end = self.selection
        self.replace("\n", start, end, maintain_selection_offset=False)


class ConversationItem(ListItem):
    def __init__(self, conversation: Conversation) -> None:
        super().__init__(Label(conversation.title, markup=False), id=f"conv-{conversation.id}")
        self.conversation = conversation


class ConversationList(ListView):
    """The sidebar: conversations, most recent first."""

    class Chosen(Message):
        def __init__(self, conversation_id: int) -> None:
            super().__init__()
            self.conversation_id = conversation_id

    async def show(self, conversations: list[Conversation], current: int | None) -> None:
        await self.clear()
        await self.extend(ConversationItem(c) for c in conversations)
        for i, c in enumerate(conversations):
            if c.id == current:
                self.index = i
                break
        else:
            self.index = None

    @on(ListView.Selected)
    def _chosen(self, event: ListView.Selected) -> None:
        event.stop()
        if isinstance(event.item, ConversationItem):
            self.post_message(self.Chosen(event.item.conversation.id))


class StatusBar(Static):
    """tok/s, tau, acceptance, speedup, tree budget, device, memory, quantization."""

    def show(self, parts: list[str], *, live: bool) -> None:
        self.parts = parts
        self.set_class(not live, "-idle")
        self.update(" · ".join(parts))
