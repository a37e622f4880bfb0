"""A message as plain text to select from: enter on a message opens it, the mouse or shift+arrows
select, ctrl+c copies (the selection, or the whole message when nothing is selected), esc closes.

Why a view of its own: a reply is rendered Markdown (a Rich renderable in a Static), which Textual's
mouse selection does not reach; elia and oterm open a message the same way, as a read-only text area."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, TextArea


class SelectableText(TextArea):
    BINDINGS = [
        Binding("ctrl+c", "copy_text", "Copy", priority=True, id="copy_selection"),
        Binding("ctrl+a", "select_all", "Select all", id="select_all"),
    ]

    def action_copy_text(self) -> None:
        text = self.selected_text or self.text
        self.app.copy_to_clipboard(text)
        self.notify("Selection copied" if self.selected_text else "Message copied", timeout=2)


class SelectScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape", "close", "Close", id="close_select")]

    def __init__(self, text: str, reasoning: str = "") -> None:
        super().__init__(classes="dialog")
        self.text, self.reasoning = text, reasoning

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box", id="select-box"):
            yield Label("Select with the mouse or shift+arrows · ctrl+c copies (all, when nothing is "
                        "selected) · ctrl+a selects all · esc closes", classes="question")
            if self.reasoning:
                yield Label("Thinking", classes="select-heading")
                yield SelectableText(self.reasoning, read_only=True, soft_wrap=True, id="select-reasoning",
                                     compact=True)
                yield Label("Answer", classes="select-heading")
            yield SelectableText(self.text, read_only=True, soft_wrap=True, id="select-text", compact=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#select-text", SelectableText).focus()

    def action_close(self) -> None:
        self.dismiss(None)
