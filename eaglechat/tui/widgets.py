"""The chat screen's widgets: message views (streamed Markdown, a reasoning model's thinking folded
above the answer), the chat log, the prompt, the conversation list and the status bar."""

from __future__ import annotations

import re

from rich.markdown import Markdown as RichMarkdown
from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Collapsible, Input, Label, ListItem, ListView, Static, TextArea

from eaglechat.chat.reasoning import split_reasoning
from eaglechat.chat.store import Conversation
from eaglechat.tui.generation import merge_runs

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
DRAFT_STYLE = "bold #7fd7a0 on #1d3a2a"


def code_blocks(markdown: str) -> list[str]:
    """Fenced code blocks of a Markdown text; an unclosed fence at the end counts as one."""
    blocks = [m.group(2) for m in FENCE.finditer(markdown)]
    open_tail = re.search(r"^(```|~~~)[^\n]*\n(.*)\Z", FENCE.sub("", markdown), re.MULTILINE | re.DOTALL)
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


def tail_runs(runs: list[tuple[int, bool]], start: int) -> list[tuple[int, bool]]:
    """The runs of the text from `start` on (the answer after a reasoning model's thinking)."""
    out: list[tuple[int, bool]] = []
    for length, drafted in runs:
        if start >= length:
            start -= length
            continue
        out.append((length - start, drafted))
        start = 0
    return out


def fit_runs(runs: list[tuple[int, bool]], length: int) -> list[tuple[int, bool]]:
    """`runs` cut or padded (as not drafted) to cover exactly `length` characters."""
    out, left = [], length
    for n, drafted in runs:
        if left <= 0:
            break
        out.append((min(n, left), drafted))
        left -= n
    if left > 0:
        out.append((left, False))
    return out


SEGMENT_CHARS = 2000  # a streamed reply is frozen into segments of about this size
_FENCE_LINE = re.compile(r"^ {0,3}(```|~~~)", re.MULTILINE)


def safe_cut(text: str, min_chars: int = SEGMENT_CHARS) -> int:
    """Index of the last blank line of `text` outside a code fence, past `min_chars`; -1 if none.
    Text before it can be rendered on its own and never changes again."""
    if len(text) < min_chars:
        return -1
    idx = text.rfind("\n\n")
    while idx >= min_chars // 2:
        if len(_FENCE_LINE.findall(text, 0, idx)) % 2 == 0:
            return idx
        idx = text.rfind("\n\n", 0, idx)
    return -1


class MessageView(Vertical, can_focus=True):
    """One message, rendered as Markdown with highlighted code.

    Why not one Textual `Markdown` widget: it mounts a widget per block, and Textual reflows every
    widget of the screen on each layout change, so frame time grows with the reply (measured: 160
    ms -> 530 ms per frame over a 10k-token reply). Here a message is a few single-widget
    segments (Rich Markdown in a Static): while streaming, finished blocks are frozen into a
    segment of ~SEGMENT_CHARS and only the live tail is re-rendered, so per-chunk cost stays flat;
    `finish()` then does one full render of the whole reply (which also fixes anything a segment
    boundary split, like the fence problem of textual #6518).

    A reasoning model's thinking (chat/reasoning.py) is kept apart from the answer: `content` is the
    answer, `reasoning` the thinking, shown folded above it; `raw` is the reply as the engine wrote it."""

    BINDINGS = [
        # no bare letters: a letter typed on a message goes to the prompt (the app moves the focus there)
        Binding("enter", "select_text", "Select text", id="select_text"),
        Binding("ctrl+y", "copy_message", "Copy", id="copy_message"),
        Binding("ctrl+k", "copy_code", "Copy code", id="copy_code"),
    ]

    class SelectText(Message):
        """enter on a message: show it as plain text to select from (the app opens the view)."""

        def __init__(self, view: MessageView) -> None:
            super().__init__()
            self.view = view
    ROLE_LABEL = {"user": "You", "assistant": "Assistant", "system": "System", "error": "Error"}

    def __init__(self, role: str, content: str = "", *, runs: list | None = None, meta: str = "",
                 message_id: int | None = None, stamp: str = "", reasoning: str = "") -> None:
        super().__init__(classes=f"message -{role}")
        self.role = role
        self.stamp = stamp  # when it was written, as shown next to the role
        self.content = content
        self.reasoning = reasoning
        self.raw = ""  # while streaming: the reply as written, thinking and answer
        self._raw_runs: list[tuple[int, bool]] = []
        self._thinking_live = False  # the reasoning is still being written
        self.runs: list[tuple[int, bool]] = [tuple(r) for r in (runs or [])]
        self.meta = meta
        self.message_id = message_id
        self.segments_frozen = 0
        self._live: Static | None = None
        self._live_text = ""

    def compose(self):
        label = self.ROLE_LABEL.get(self.role, self.role)
        yield Label(f"{label} · {self.stamp}" if self.stamp else label, classes="role", markup=False)
        if self.role == "assistant":
            thinking = Collapsible(Static(Text(self.reasoning), classes="reasoning-text"),
                                   title=self._thinking_title(False), collapsed=True, classes="reasoning")
            thinking.display = bool(self.reasoning)
            yield thinking
        with Vertical(classes="body"):
            yield Static(self._render_text(self.content), classes="segment")
        yield Static("", classes="spec")
        yield Label(self.meta, classes="meta", markup=False)

    def _render_text(self, text: str) -> RichMarkdown | Text:
        """The assistant's Markdown rendered; everything else exactly as written (a pasted traceback
        keeps its line breaks, indentation and `<module>`)."""
        return self._markdown(text) if self.role == "assistant" else Text(text)

    def _markdown(self, text: str) -> RichMarkdown:
        dark = True
        try:
            dark = self.app.current_theme.dark
        except Exception:  # noqa: BLE001 - no app yet
            pass
        return RichMarkdown(text, code_theme="monokai" if dark else "friendly", hyperlinks=True)

    @property
    def body(self) -> Vertical:
        return self.query_one(".body", Vertical)

    def show_drafts(self, on: bool) -> None:
        """Swap the Markdown body for the draft-coloured plain text (colouring inside code fences
        would break them, so the coloured view is a separate rendering)."""
        if on and self.runs:
            self.query_one(".spec", Static).update(spec_text(self.content, self.runs))
        self.set_class(on and bool(self.runs), "-drafts")

    def _thinking_title(self, live: bool) -> str:
        if live:
            return "Thinking…"
        return f"Thought ({len(self.reasoning.split())} words)"

    def _show_reasoning(self, live: bool) -> None:
        thinking = self.query_one(".reasoning", Collapsible)
        thinking.display = bool(self.reasoning)
        thinking.title = self._thinking_title(live)
        self.query_one(".reasoning-text", Static).update(Text(self.reasoning))

    def set_meta(self, meta: str) -> None:
        self.meta = meta
        self.query_one(".meta", Label).update(meta)

    # -- streaming --------------------------------------------------------------------------------

    def start_stream(self) -> None:
        self._live = self.body.query_one(".segment", Static)
        self._live_text = self.content

    def _take(self, fragment: str, runs: list[tuple[int, bool]]) -> str:
        """Add a fragment to the raw reply; the new text of the answer (the whole answer again when
        text first read as answer turned out to be thinking: `content` is then reset to "")."""
        self.raw += fragment
        merge_runs(self._raw_runs, runs)
        split = split_reasoning(self.raw)
        self.reasoning = split.reasoning
        if not split.answer.startswith(self.content):
            self.content = ""
        new = split.answer[len(self.content):]
        self.content = split.answer
        self.runs = tail_runs(self._raw_runs, split.answer_at) if split.answer_at else self._raw_runs
        self._thinking_live = split.thinking
        return new

    def append_quietly(self, fragment: str, runs: list[tuple[int, bool]]) -> None:
        """Add a fragment without rendering it (the app is closing: it is only stored)."""
        self._take(fragment, runs)

    def write(self, fragment: str, runs: list[tuple[int, bool]]) -> None:
        """Append a fragment: cost bounded by the live segment, not by the reply so far."""
        if not fragment or self._live is None:
            return
        had, reasoning = self.content, self.reasoning
        fragment = self._take(fragment, runs)
        if reasoning != self.reasoning:
            self._show_reasoning(live=self._thinking_live)
        if had and not self.content.startswith(had):  # the text shown as the answer was thinking
            self._restart_stream()
        if not fragment:
            return
        self._live_text += fragment
        cut = safe_cut(self._live_text)
        if cut > 0:
            self._live.update(self._markdown(self._live_text[:cut]))
            self._live_text = self._live_text[cut + 2:]
            self._live = Static("", classes="segment")
            self.body.mount(self._live)
            self.segments_frozen += 1
        self._live.update(self._markdown(self._live_text))
        if self.has_class("-drafts"):
            self.query_one(".spec", Static).update(spec_text(self.content, self.runs))

    def _restart_stream(self) -> None:
        for segment in list(self.body.query(".segment"))[1:]:
            segment.remove()
        self._live = self.body.query_one(".segment", Static)
        self._live_text = ""
        self._live.update("")

    def set_raw(self, text: str) -> None:
        """Replace the whole reply (rendered by the next `finish()`), keeping the draft runs aligned."""
        self.raw = text
        self._raw_runs = fit_runs(self._raw_runs, len(text))
        split = split_reasoning(text)
        self.content, self.reasoning = split.answer, split.reasoning
        self.runs = tail_runs(self._raw_runs, split.answer_at)

    async def finish(self) -> None:
        """The one full render of the whole reply."""
        self._live = None
        self._live_text = ""
        body = self.body
        old = list(body.children)
        # mount the full render before removing the segments: the height never collapses, so a
        # reader scrolled up is not snapped back to the (momentarily nearer) bottom
        await body.mount(Static(self._render_text(self.content), classes="segment"))
        await body.remove_children(old)
        if self.role == "assistant":
            self._show_reasoning(live=False)

    # -- select and copy ----------------------------------------------------------------------------

    def action_select_text(self) -> None:
        self.post_message(self.SelectText(self))

    def action_copy_message(self) -> None:
        self.app.copy_to_clipboard(self.content)
        self.notify("Message copied")
        self._back_to_prompt()

    def action_copy_code(self) -> None:
        blocks = code_blocks(self.content)
        if not blocks:
            self.notify("No code block in this message", severity="warning")
            return
        self.app.copy_to_clipboard(blocks[-1])
        self.notify("Code block copied")
        self._back_to_prompt()

    def _back_to_prompt(self) -> None:
        """Done with the message: the next thing typed goes to the prompt."""
        for prompt in self.screen.query(PromptInput):
            self.screen.set_focus(prompt)


class ChatLog(VerticalScroll):
    """The messages of one conversation; anchored to the bottom while the user does not scroll up.
    Says when the reader reaches the top, where earlier messages are mounted (chat/pane.py)."""

    class ReachedTop(Message):
        pass

    def on_mount(self) -> None:
        self.anchor()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value <= 0 < old_value and self.max_scroll_y > 0:  # scrolled there (not a layout passing by 0)
            self.post_message(self.ReachedTop())

    def on_mouse_scroll_up(self) -> None:
        if self.scroll_y <= 0:  # at the top already (or too little to scroll): still asks for more
            self.post_message(self.ReachedTop())


class EarlierMessages(Static):
    """Above the first message mounted: how many earlier ones there are (scrolling up shows them)."""

    count = reactive(0)

    def __init__(self, count: int) -> None:
        super().__init__(classes="earlier")
        self.set_reactive(EarlierMessages.count, count)

    def render(self) -> str:
        return f"↑ {self.count} earlier messages: scroll up to show them"


async def run_own_binding(widget, event) -> bool:
    """Run a non-printable key's binding on `widget` itself, now, in order with the characters typed
    before and after it. Textual runs a widget's (non-priority) bindings only once the key has bubbled
    up to the app, and then on whatever has the focus by that time: in a fast burst "abc", backspace,
    "d" came out "abc", and a ctrl+u typed before a tab cleared the next field. The widget's own
    bindings with the user's keymap applied, as the app would see them. True when one handled it."""
    if event.is_printable:
        return False
    bindings = widget._bindings.copy()
    keymap = getattr(widget.app, "_keymap", None)
    if keymap:
        bindings.apply_keymap(keymap)
    for binding in bindings.key_to_bindings.get(event.key, ()):
        if not binding.priority and await widget.app.run_action(binding.action, widget):
            event.stop()
            event.prevent_default()
            return True
    return False


class OrderedInput(Input):
    """An Input whose own keys (backspace, ctrl+u, arrows) act in typing order (see run_own_binding)."""

    async def _on_key(self, event) -> None:
        if not await run_own_binding(self, event):
            await super()._on_key(event)


class PromptInput(TextArea):
    """Enter sends; shift+enter (or ctrl+j, for terminals that cannot tell shift+enter) adds a newline;
    Up in an empty prompt recalls earlier messages of the conversation (Down goes forward again).

    Why the actions are deferred: the bindings are `priority` (the TextArea would otherwise take
    enter itself), and priority bindings run on the app's task at once, while the typed characters
    before them are still queued on this widget. Reading `self.text` there lost every character of a
    fast burst not yet inserted (113 of 437 sent). `call_later` queues the action behind them."""

    BINDINGS = [
        Binding("enter", "submit", "Send", priority=True, id="send"),
        Binding("shift+enter,ctrl+j", "newline", "Newline", priority=True, show=False, id="newline"),
        Binding("up", "cursor_up", "Recall", show=False, id="recall"),  # in an empty prompt (action_cursor_up)
    ]

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.sent: list[str] = []  # earlier messages of this conversation, oldest first
        self._recall: int | None = None  # index into history while recalling

    async def _on_key(self, event) -> None:
        if not await run_own_binding(self, event):
            await super()._on_key(event)

    def _recompute_cursor_offset(self) -> None:
        """Textual 8's undo puts the shorter text back before the cursor, and the scrollbar change it
        causes (this prompt grows to 12 lines, then scrolls) asks for the cursor's place in the text
        in between: ctrl+z after a long paste raised and closed the app (Textualize/textual #6686).
        The place is clamped into the text, as the fix proposed upstream (#6687) does."""
        self._cursor_offset = self.wrapped_document.location_to_offset(self.clamp_visitable(self.cursor_location))

    def action_submit(self) -> None:
        self.call_later(self._submit)

    def _submit(self) -> None:
        text = self.text
        if text.strip():
            self.post_message(self.Submitted(text))

    def action_newline(self) -> None:
        self.call_later(self._newline)

    def _newline(self) -> None:
        start, end = self.selection
        self.replace("\n", start, end, maintain_selection_offset=False)

    def take(self, text: str) -> None:
        """Remove a sent message from the prompt, keeping whatever was typed after it."""
        current = self.text
        rest = current.removeprefix(text)
        self.load_text(rest)
        self.move_cursor(self.document.end)
        self._recall = None

    # -- recalling earlier messages --------------------------------------------------------------

    def action_cursor_up(self, select: bool = False) -> None:
        recalling = self._recall is not None and self.text == self.sent[self._recall]
        if not select and self.sent and (not self.text or recalling) and self.cursor_location[0] == 0:
            index = len(self.sent) - 1 if self._recall is None or not recalling else max(0, self._recall - 1)
            self._show_recalled(index)
            return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        recalling = self._recall is not None and self.text == self.sent[self._recall]
        last_row = self.cursor_location[0] == self.document.line_count - 1
        if not select and recalling and last_row:
            if self._recall + 1 < len(self.sent):
                self._show_recalled(self._recall + 1)
            else:
                self._recall = None
                self.load_text("")
            return
        super().action_cursor_down(select)

    def _show_recalled(self, index: int) -> None:
        self._recall = index
        self.load_text(self.sent[index])
        self.move_cursor(self.document.end)


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

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._shown: list[tuple[int, str]] | None = None  # (id, title) as listed now

    async def show(self, conversations: list[Conversation], current: int | None) -> None:
        shown = [(c.id, c.title) for c in conversations]
        if shown != self._shown:  # not rebuilt for nothing: another window writes to the history often
            self._shown = shown
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


def fit_parts(parts: list[str], width: int, sep: str = " · ") -> str:
    """The fields that fit in `width` cells, most important (first) kept: a narrow terminal loses
    memory and quantisation before it loses tok/s, tau and the context gauge."""
    kept = list(parts)
    while len(kept) > 1 and Text(sep.join(kept)).cell_len > width:
        kept.pop()
    return sep.join(kept)


class StatusBar(Static):
    """tok/s, tau, acceptance, speedup, context, tree budget, device, memory, quantization."""

    parts: list[str] = []

    def show(self, parts: list[str], *, live: bool) -> None:
        self.parts = parts
        self.set_class(not live, "-idle")
        self._render_parts()

    def _render_parts(self) -> None:
        width = self.content_size.width or self.app.size.width - 2
        self.update(fit_parts(self.parts, max(10, width)))

    def on_resize(self) -> None:
        self._render_parts()
