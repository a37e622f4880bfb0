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
    Footer,
    Input,
    Label,
    Markdown,
    OptionList,
    ProgressBar,
    Select,
    Static,
    TextArea,
)
from textual.widgets.option_list import Option

from eaglechat.chat.store import Conversation
from eaglechat.tui.widgets import OrderedInput


class LoadingScreen(Screen):
    """Model load (or pull) with its phases, a progress bar, elapsed time; esc cancels a pull."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, model: str, verb: str = "Loading", cancel=None) -> None:
        super().__init__()
        self.model, self.verb, self.cancel = model, verb, cancel
        self.phases: list[str] = []
        self.started = time.monotonic()

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-box"):
            yield Label(f"{self.verb} [b]{escape(self.model)}[/b]", id="loading-title")
            yield Static("", id="loading-phases")
            yield ProgressBar(total=None, show_eta=False, id="loading-bar")
            yield Label("0.0 s", id="loading-elapsed")
            if self.cancel is not None:
                yield Label("esc cancels (pulling again resumes)", id="loading-hint")
            yield Label("Type your message meanwhile: it goes into the prompt.", id="loading-typed",
                        markup=False)

    def check_action(self, action: str, parameters) -> bool | None:
        return self.cancel is not None if action == "cancel" else True

    def typed(self, text: str, will_send: bool) -> None:
        """Show what was typed into the prompt behind this screen (the app puts it there)."""
        line = " ".join(text.split())
        line = line if len(line) <= 50 else "…" + line[-49:]
        note = "sent once the model is ready" if will_send else "enter sends it once the model is ready"
        self.query_one("#loading-typed", Label).update(f"Your message: {line} ({note})" if line else
                                                       "Type your message meanwhile: it goes into the prompt.")

    def action_cancel(self) -> None:
        if self.cancel is not None:
            self.cancel.set()
            self.progress("cancelling…", None)

    def on_mount(self) -> None:
        self.set_interval(0.25, self._tick)

    def _tick(self) -> None:
        self.query_one("#loading-elapsed", Label).update(f"{time.monotonic() - self.started:.1f} s")

    def progress(self, phase: str, fraction: float | None) -> None:
        if phase and (not self.phases or self.phases[-1] != phase):
            self.phases.append(phase)
            lines = [f"[green]✓[/] {escape(p)}" for p in self.phases[-8:-1]]  # the last few: fits 80x24
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
* **τ**: tokens produced per forward pass of the model in decoding; the token that comes out of
  reading the prompt is not counted (plain decoding: 1.00). Live and final figures are the same count.
* **accept**: accepted draft tokens / (verify steps × tree depth).
* **speedup**: this turn's decoding speed over the plain-decoding speed *measured* on this model
  and device (turn speculation off with f5 for one reply to measure it; prompt processing is
  left out on both sides). "—" until measured, and for replies too short to measure. Under
  **spec auto** the engine measures both in the reply and says so ("auto: on 16/4/4 1.4x").
* **ctx**: tokens of this conversation in the context / the model's context limit. Past the limit
  the oldest turns are left out (the reply's footer says how many); the system prompt stays.
* **reading prompt (N tokens)**: the prompt is being read, a chunk at a time; esc stops it.
* **tree**: draft budget total tokens / depth / top-k; then device, memory held, quantization.

With **draft colours** on, the characters of tokens that came from accepted drafts are
highlighted (the reply is then shown as plain text, so code keeps its exact characters).

Typing anywhere on this screen goes to the prompt (while a model loads too). esc stops a reply at
the engine's next decode step (while a long prompt is read: at the end of its 512-token chunk).
Quitting (ctrl+q) never waits for the model: a reply being written is stored as it is, marked
"stopped". ctrl+r and f9 keep the version they replace: alt+left / alt+right flip between them.
New conversations start from the defaults f3 can save. Exports go to your documents folder.
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
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#help-box").focus()  # arrows and page keys scroll it

    def action_dismiss(self) -> None:
        self.dismiss()


class TextPromptScreen(ModalScreen[str | None]):
    """One line of text (rename)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("enter", "noop", "Save", show=True)]

    def __init__(self, title: str, value: str = "") -> None:
        super().__init__(classes="dialog")
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box"):
            yield Label(self.title_text)
            yield OrderedInput(self.value, id="prompt-value")
        yield Footer()

    def action_noop(self) -> None:
        """Only there to show "enter Save" in the footer (the Input submits on enter)."""

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("escape,n", "answer(False)", "No"), Binding("y", "answer(True)", "Yes")]

    def __init__(self, question: str, yes: str = "Delete", variant: str = "error") -> None:
        super().__init__(classes="dialog")
        self.question, self.yes, self.variant = question, yes, variant

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box"):
            yield Label(self.question, markup=False, classes="question")
            with Horizontal(classes="buttons"):
                yield Button(f"{self.yes} (y)", variant=self.variant, id="yes", compact=True)
                yield Button("Cancel (n)", id="no", compact=True)
        yield Footer()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class SettingsScreen(ModalScreen[dict | None]):
    """Per-conversation system prompt and sampling settings, a persona to start from (settings.yaml's
    chat.personas), and "default for new chats"; fits an 80x24 terminal."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save"),
                Binding("enter", "noop", "Save (in a field)", show=True)]
    AUTO_FOCUS = "#system-prompt"  # the first field, so tab counts are predictable

    def __init__(self, conversation: Conversation, personas: dict[str, dict] | None = None, *,
                 model_sampling: dict | None = None) -> None:
        super().__init__(classes="dialog")
        self.conversation = conversation
        self.personas = personas or {}
        self.model_sampling = model_sampling or {}  # the loaded model's own defaults, shown under the fields

    def compose(self) -> ComposeResult:
        c = self.conversation
        with VerticalScroll(classes="dialog-box", id="settings-box", can_focus=False):
            yield Label(f"Settings of “{c.title}”", markup=False, id="settings-title")
            if self.personas:
                with Horizontal(id="persona-row"):
                    yield Label("Persona ")
                    yield Select([(name, name) for name in self.personas], prompt="none", id="persona",
                                 compact=True)
            yield Label("System prompt (enter: new line)")
            yield TextArea(c.system_prompt, id="system-prompt", compact=True)
            with Grid(id="sampling"):
                yield Label("Temperature (0 = greedy)")
                yield OrderedInput(str(c.temperature), id="temperature", type="number", compact=True)
                yield Label("Top-p")
                yield OrderedInput(str(c.top_p), id="top-p", type="number", compact=True)
                yield Label("Max new tokens")
                yield OrderedInput(str(c.max_new_tokens), id="max-new-tokens", type="integer", compact=True)
            if self.model_sampling:
                from eaglechat.models.sampling import describe

                yield Label(f"The model's own: {describe(self.model_sampling)} (top-k and repetition penalty "
                            "apply unless the temperature is 0)", markup=False, id="model-sampling")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Save, and default for new chats", id="save-default", compact=True)
                yield Button("Cancel", id="cancel", compact=True)
        yield Footer()

    @on(Select.Changed, "#persona")
    def _persona(self, event: Select.Changed) -> None:
        values = self.personas.get(str(event.value)) if event.value is not Select.BLANK else None
        if not values:
            return
        if "system_prompt" in values:
            self.query_one("#system-prompt", TextArea).load_text(values["system_prompt"])
        for key, field in (("temperature", "#temperature"), ("top_p", "#top-p"), ("max_new_tokens", "#max-new-tokens")):
            if key in values:
                self.query_one(field, Input).value = str(values[key])

    def action_noop(self) -> None:
        """Only there to show the key in the footer (an Input submits on enter: see _submitted)."""

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#save")
    def action_save(self, as_default: bool = False) -> None:
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
            "as_default": as_default,
        })

    @on(Button.Pressed, "#save-default")
    def _save_default(self) -> None:
        self.action_save(as_default=True)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


BADGE = {"fits": "[green]fits[/]", "tight": "[yellow]tight[/]", "wont_fit": "[red]won't fit[/]"}


class ModelPickerScreen(ModalScreen[str | None]):
    """Catalog models, filterable, with a fits / tight / won't-fit badge when the planner can tell."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("enter", "noop", "Load"),
                Binding("up", "move(-1)", "Up", show=False), Binding("down", "move(1)", "Down", show=False),
                Binding("pageup", "move(-5)", show=False), Binding("pagedown", "move(5)", show=False)]

    def __init__(self, models: list[tuple[str, str]], current: str | None, badges=None) -> None:
        super().__init__(classes="dialog")
        self.models = models  # (name, description)
        self.current = current
        self.badges_fn = badges  # callable(names) -> {name: "fits"|"tight"|"wont_fit"} (slow: thread)
        self.badges: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box", id="picker-box"):
            yield Label("Choose a model: type to filter, ↑/↓ to pick, enter to load")
            yield OrderedInput(placeholder="filter", id="picker-filter", compact=True)
            yield OptionList(id="picker-list")
        yield Footer()

    def action_noop(self) -> None:
        """Shows "enter Load" in the footer; the filter box and the list act on enter themselves."""

    def action_move(self, by: int) -> None:
        """Arrow keys in the filter box move the selection (they did nothing: Down Down Enter loaded
        the first match)."""
        options = self.query_one("#picker-list", OptionList)
        if not options.option_count:
            return
        current = options.highlighted if options.highlighted is not None else 0
        options.highlighted = max(0, min(options.option_count - 1, current + by))

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


class SearchScreen(ModalScreen[int | None]):
    """Search all conversations (titles and messages); enter opens the highlighted one."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("enter", "noop", "Open"),
                Binding("up", "move(-1)", show=False), Binding("down", "move(1)", show=False)]

    def __init__(self, search) -> None:
        super().__init__(classes="dialog")
        self.search = search  # callable(text) -> [(conversation id, title, snippet)]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box", id="search-box"):
            yield Label("Search conversations: type, ↑/↓ to pick, enter to open")
            yield OrderedInput(placeholder="words in a title or a message", id="search-text", compact=True)
            yield OptionList(id="search-list")
        yield Footer()

    def on_mount(self) -> None:
        self._fill("")

    def _fill(self, text: str) -> None:
        options = self.query_one("#search-list", OptionList)
        options.clear_options()
        for conversation_id, title, snippet in self.search(text):
            label = f"[b]{escape(title)}[/b]"
            if snippet and snippet != title:
                label += f"\n    [dim]{escape(snippet)}[/dim]"
            options.add_option(Option(label, id=str(conversation_id)))
        if options.option_count:
            options.highlighted = 0

    @on(Input.Changed, "#search-text")
    def _changed(self, event: Input.Changed) -> None:
        self._fill(event.value)

    @on(Input.Submitted, "#search-text")
    def _submitted(self) -> None:
        options = self.query_one("#search-list", OptionList)
        if options.highlighted is not None and options.option_count:
            self.dismiss(int(options.get_option_at_index(options.highlighted).id))

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id))

    def action_move(self, by: int) -> None:
        options = self.query_one("#search-list", OptionList)
        if options.option_count:
            current = options.highlighted if options.highlighted is not None else 0
            options.highlighted = max(0, min(options.option_count - 1, current + by))

    def action_noop(self) -> None:
        """Shows "enter Open" in the footer; the box and the list act on enter themselves."""

    def action_cancel(self) -> None:
        self.dismiss(None)
