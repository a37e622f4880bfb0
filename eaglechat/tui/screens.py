"""Screens and dialogs: loading, help, rename/confirm, conversation settings, model picker."""

from __future__ import annotations

import time

from rich.markup import escape
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import (
    Button,
    Input,
    Label,
    Markdown,
    OptionList,
    ProgressBar,
    Static,
    TextArea,
)
from textual.widgets.option_list import Option

from eaglechat.chat.store import Conversation


class LoadingScreen(Screen):
    """Model load with its phases (tokenizer, base, draft head, warm-up), a progress bar, elapsed."""

    def __init__(self, model: str) -> None:
        super().__init__(id="loading")
        self.model = model
        self.phases: list[str] = []
        self.started = time.monotonic()

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-box"):
            yield Label(f"Loading [b]{escape(self.model)}[/b]", id="loading-title")
            yield Static("", id="loading-phases")
            yield ProgressBar(total=None, show_eta=False, id="loading-bar")
            yield Label("0.0 s", id="loading-elapsed")

    def on_mount(self) -> None:
        self.set_interval(0.25, self._tick)

    def _tick(self) -> None:
        self.query_one("#loading-elapsed", Label).update(f"{time.monotonic() - self.started:.1f} s")

    def progress(self, phase: str, fraction: float | None) -> None:
        if phase and (not self.phases or self.phases[-1] != phase):
            self.phases.append(phase)
            lines = [f"[green]✓[/] {escape(p)}" for p in self.phases[:-1]]
            lines.append(f"[b]▸ {escape(self.phases[-1])}[/b]")
            self.query_one("#loading-phases", Static).update("\n".join(lines))
        bar = self.query_one("#loading-bar", ProgressBar)
        if fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=100, progress=max(0.0, min(1.0, fraction)) * 100)


HELP = """\
# eaglechat

Replies are decoded with **EAGLE-2 speculative decoding**: a small draft head proposes a tree of
likely next tokens, the model checks the whole tree in one forward pass and keeps the longest
matching path. The text is exactly what plain decoding would produce, only faster.

## Keys

{keys}

Keys can be changed in `{keys_file}` (binding id: keys), e.g.

```yaml
send: ctrl+s
newline: enter
```

## Status bar

* **tok/s**: new tokens per second of the turn, prompt processing included.
* **τ**: tokens produced per forward pass of the model (plain decoding: 1.00).
* **accept**: accepted draft tokens / (verify steps × tree depth).
* **speedup**: this turn's decoding speed over the plain-decoding speed *measured* on this model
  and device (turn speculation off with f5 for one reply to measure it; prompt processing is
  left out on both sides). "—" until measured.
* **tree**: draft budget total tokens / depth / top-k; then device, memory held, quantization.

With **draft colours** on, the characters of tokens that came from accepted drafts are
highlighted (the reply is then shown as plain text, so code keeps its exact characters).
"""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, keys: list[tuple[str, str]], keys_file: str) -> None:
        super().__init__(id="help")
        self.keys = keys
        self.keys_file = keys_file

    def compose(self) -> ComposeResult:
        rows = "\n".join(f"| `{k}` | {d} |" for k, d in self.keys)
        table = "| Key | Action |\n|---|---|\n" + rows
        with VerticalScroll(id="help-box"):
            yield Markdown(HELP.format(keys=table, keys_file=self.keys_file))

    def action_dismiss(self) -> None:
        self.dismiss()


class TextPromptScreen(ModalScreen[str | None]):
    """One line of text (rename)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, value: str = "") -> None:
        super().__init__(classes="dialog")
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box"):
            yield Label(self.title_text)
            yield Input(self.value, id="prompt-value")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("escape,n", "answer(False)", "No"), Binding("y", "answer(True)", "Yes")]

    def __init__(self, question: str) -> None:
        super().__init__(classes="dialog")
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box"):
            yield Label(self.question, markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Delete", variant="error", id="yes")
                yield Button("Cancel", id="no")

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class SettingsScreen(ModalScreen[dict | None]):
    """Per-conversation system prompt and sampling settings."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, conversation: Conversation) -> None:
        super().__init__(classes="dialog")
        self.conversation = conversation

    def compose(self) -> ComposeResult:
        c = self.conversation
        with Vertical(classes="dialog-box", id="settings-box"):
            yield Label(f"Settings of “{c.title}”", markup=False)
            yield Label("System prompt")
            yield TextArea(c.system_prompt, id="system-prompt")
            with Grid(id="sampling"):
                yield Label("Temperature (0 = greedy)")
                yield Input(str(c.temperature), id="temperature", type="number")
                yield Label("Top-p")
                yield Input(str(c.top_p), id="top-p", type="number")
                yield Label("Max new tokens")
                yield Input(str(c.max_new_tokens), id="max-new-tokens", type="integer")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        try:
            temperature = float(self.query_one("#temperature", Input).value)
            top_p = float(self.query_one("#top-p", Input).value)
            max_new = int(self.query_one("#max-new-tokens", Input).value)
        except ValueError:
            self.notify("Temperature and top-p must be numbers, max new tokens an integer",
                        severity="error")
            return
        if temperature < 0 or not 0 < top_p <= 1 or max_new < 1:
            self.notify("Need temperature ≥ 0, 0 < top-p ≤ 1, max new tokens ≥ 1", severity="error")
            return
        self.dismiss({
            "system_prompt": self.query_one("#system-prompt", TextArea).text,
            "temperature": temperature,
            "top_p": top_p,
            "max_new_tokens": max_new,
        })

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


BADGE = {"fits": "[green]fits[/]", "tight": "[yellow]tight[/]", "wont_fit": "[red]won't fit[/]"}


class ModelPickerScreen(ModalScreen[str | None]):
    """Catalog models, filterable, with a fits / tight / won't-fit badge when the planner can tell."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, models: list[tuple[str, str]], current: str | None, badges=None) -> None:
        super().__init__(classes="dialog")
        self.models = models  # (name, description)
        self.current = current
        self.badges_fn = badges  # callable(names) -> {name: "fits"|"tight"|"wont_fit"} (slow: thread)
        self.badges: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box", id="picker-box"):
            yield Label("Choose a model: type to filter, enter to load")
            yield Input(placeholder="filter", id="picker-filter")
            yield OptionList(id="picker-list")

    def on_mount(self) -> None:
        self._fill("")
        if self.badges_fn is not None:
            self._load_badges()

    @work(thread=True, exit_on_error=False)
    def _load_badges(self) -> None:
        try:
            badges = self.badges_fn([name for name, _ in self.models])
        except Exception:  # noqa: BLE001 - badges are optional
            return
        self.app.call_from_thread(self._set_badges, badges)

    def _set_badges(self, badges: dict[str, str]) -> None:
        self.badges = badges
        self._fill(self.query_one("#picker-filter", Input).value)

    def _fill(self, text: str) -> None:
        options = self.query_one("#picker-list", OptionList)
        options.clear_options()
        needle = text.lower().strip()
        for name, desc in self.models:
            if needle and needle not in name.lower() and needle not in desc.lower():
                continue
            mark = "● " if name == self.current else "  "
            badge = BADGE.get(self.badges.get(name, ""), "")
            label = f"{mark}[b]{escape(name)}[/b] {badge}"
            if desc:
                label += f"\n    [dim]{escape(desc)}[/dim]"
            options.add_option(Option(label, id=name))
        if options.option_count:
            options.highlighted = 0

    @on(Input.Changed, "#picker-filter")
    def _filter(self, event: Input.Changed) -> None:
        self._fill(event.value)

    @on(Input.Submitted, "#picker-filter")
    def _typed(self, event: Input.Submitted) -> None:
        options = self.query_one("#picker-list", OptionList)
        if options.highlighted is not None and options.option_count:
            self.dismiss(options.get_option_at_index(options.highlighted).id)
        elif event.value.strip():
            self.dismiss(event.value.strip())

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
