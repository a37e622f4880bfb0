"""The eaglechat Textual app: sidebar of conversations, streamed replies, speculation status bar.

The engine is reached only through eaglechat.engine.protocol. It is created by `loader(model,
progress)` on a daemon thread (tui/models.py; the loading screen shows the phases). The open
conversation, the prompt and the reply being written belong to the chat pane (tui/pane.py): the app
sets on it what it decides (engine, switches, keymap) and hears back from it in messages
(`TurnStarted`, `TurnProgress`, `TurnEnded`, `ConversationsChanged`). Each reply runs
`generation.run_turn` on a daemon thread that fills a buffer the pane drains on a timer; esc sets the
turn's cancel event, quitting leaves the thread behind (tui/control.py). The conversation list and
its actions live in tui/conversations.py. Engine errors become notifications; the app stays open.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Label

from eaglechat.chat import settings
from eaglechat.chat.store import Conversation, Store, StoreError
from eaglechat.engine.protocol import Engine, Speculate
from eaglechat.tui import keys as keyconf
from eaglechat.tui.control import Control
from eaglechat.tui.conversations import ConversationActions
from eaglechat.tui.models import ModelActions
from eaglechat.tui.pane import ChatPane
from eaglechat.tui.screens import HelpScreen
from eaglechat.tui.select import SelectScreen
from eaglechat.tui.sources import Loader, catalog_models, default_loader, plan_badges
from eaglechat.tui.stats import TurnNumbers, speedup, status_parts
from eaglechat.tui.widgets import ConversationList, MessageView, StatusBar, code_blocks

if TYPE_CHECKING:
    from eaglechat.fit.choose import LoadRequest


class EagleChatApp(ConversationActions, ModelActions, Control, App):
    CSS_PATH = "app.tcss"
    TITLE = "eaglechat"
    # priority: the prompt (a TextArea) would otherwise take escape, f6 and f7 first;
    # check_action turns them off while a dialog is open, and "stop" while nothing is generated
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True, id="stop"),
        Binding("ctrl+c", "interrupt", "Stop", show=False, priority=True, id="interrupt"),
        Binding("ctrl+l", "focus_prompt", "Prompt", show=False, priority=True, id="focus_prompt"),
        Binding("ctrl+n", "new_conversation", "New", priority=True, id="new_conversation"),
        Binding("f2", "rename", "Rename", show=False, priority=True, id="rename"),
        Binding("f3", "settings", "Settings", priority=True, id="settings"),
        Binding("ctrl+o,f4", "pick_model", "Model", priority=True, id="pick_model"),
        Binding("f5", "toggle_speculation", "Spec", priority=True, id="toggle_speculation"),
        Binding("f6", "toggle_drafts", "Drafts", show=False, priority=True, id="toggle_drafts"),
        Binding("ctrl+t", "toggle_thinking", "Think", show=False, priority=True, id="toggle_thinking"),
        Binding("f7", "export", "Export", show=False, priority=True, id="export"),
        Binding("f8", "delete", "Delete", show=False, priority=True, id="delete"),
        Binding("ctrl+r", "regenerate", "Again", show=False, priority=True, id="regenerate"),
        Binding("f9", "edit_last", "Edit last", show=False, priority=True, id="edit_last"),
        Binding("alt+left", "previous_version", "Earlier version", show=False, priority=True, id="previous_version"),
        Binding("alt+right", "next_version", "Later version", show=False, priority=True, id="next_version"),
        Binding("shift+pageup", "scroll_chat(-1)", "Scroll up", show=False, priority=True, id="scroll_up"),
        Binding("shift+pagedown", "scroll_chat(1)", "Scroll down", show=False, priority=True, id="scroll_down"),
        Binding("ctrl+f", "search", "Search", show=False, priority=True, id="search"),
        Binding("ctrl+b", "toggle_sidebar", "Sidebar", show=False, priority=True, id="toggle_sidebar"),
        Binding("f1", "help", "Help", priority=True, id="help"),
    ]
    _GATED = {b.action for b in BINDINGS}
    # focus moves when tab arrives, not after it bubbled up behind the keys typed next (those went to
    # the field being left: "tab tab 4 8" in a dialog lost the 48); on every screen, dialogs included
    BINDINGS += [Binding("tab", "focus_next", show=False, priority=True, id="focus_next"),
                 Binding("shift+tab", "focus_previous", show=False, priority=True, id="focus_previous"),
                 # Textual's own, given ids so keys.yaml can move them too
                 Binding("ctrl+p", "command_palette", "palette", show=False, priority=True, id="command_palette"),
                 Binding("ctrl+q", "quit", "Quit", show=False, priority=True, id="quit")]

    def __init__(self, *, store: Store, model: str | None = None, loader: Loader | None = None,
                 load_request: LoadRequest | None = None, api_key: str | None = None, resident: bool = True,
                 settings_path: Path | None = None,
                 keys_path: Path | None = None, models: Callable[[], list] | None = None,
                 badges: Callable | None = None, export_dir: Path | None = None,
                 clock: Callable[[], float] = time.time, remember_remote: bool = False) -> None:
        super().__init__()
        self.store = store
        self.settings_path = settings_path
        self.clock = clock  # wall time for timestamps (tests fix it)
        self.pane = ChatPane(store, settings_path=settings_path, clock=clock, id="chat")
        self.model_name = model or settings.last_model(settings_path)
        self.remember_remote = remember_remote  # a remote model is the last model only when asked (chat --save-remote)
        self.loader = loader or default_loader
        if load_request is None:
            from eaglechat.fit.choose import LoadRequest  # not at import: the app starts without the planner

            load_request = LoadRequest()
        self.load_request = load_request  # what to load (commands/common.load_request)
        self.api_key = api_key  # a remote server's (chat --remote)
        self.resident = resident  # False: never a running `eaglechat serve` (chat --no-resident)
        self.keys_path = keys_path
        self.models_fn = models or catalog_models
        self.badges_fn = badges if badges is not None else (
            lambda names: plan_badges(names, self.load_request.quant, self.load_request.device))
        self.export_dir = export_dir
        self.last_export: Path | None = None
        self.numbers: TurnNumbers | None = None  # the last turn's figures, for the status bar
        self.load_phases: list[str] = []  # what the last load or pull reported
        self.pull_phases: list[str] = []  # what the last pull reported
        self.baseline: float | None = None
        self.keymap: dict[str, str] = {}
        self._load_seq = 0
        self._interrupted_at = 0.0
        self._slow_hint_for: str | None = None  # the model the "plain is faster" hint was shown for
        self._load_thread = None
        self._data_version = 0  # the history file's data_version when this window last looked

    # what the chat pane holds, read and set through it (one copy of each)

    @property
    def generating(self) -> bool:
        return self.pane.generating

    @property
    def engine(self) -> Engine | None:
        return self.pane.engine

    @property
    def model_name(self) -> str:
        return self.pane.model_name

    @model_name.setter
    def model_name(self, name: str) -> None:
        self.pane.model_name = name

    @property
    def conversation(self) -> Conversation | None:
        return self.pane.conversation

    @conversation.setter
    def conversation(self, conversation: Conversation | None) -> None:
        self.pane.conversation = conversation

    @property
    def speculate(self) -> Speculate:
        return self.pane.speculate

    @speculate.setter
    def speculate(self, value: Speculate) -> None:
        self.pane.speculate = value

    def notify(self, message: str, *, title: str = "", severity="information", timeout=None,
               markup: bool = False) -> None:
        """Notifications carry engine and file-system text: no markup unless asked for."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    # -- layout and start-up ----------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="sidebar"):
                yield Label("Conversations", id="sidebar-title")
                yield ConversationList(id="conversations")
                yield Label("", id="model-label", markup=False)
            yield self.pane
        yield StatusBar(id="status", markup=False)
        yield Footer()

    async def on_mount(self) -> None:
        self._install_signal_handlers()
        self.keymap, warning = keyconf.load_keymap(self.keys_path)
        if self.keymap:
            self.set_keymap(self.keymap)
        self.pane.set_keymap(self.keymap)
        if warning:
            self.notify(warning, severity="warning", timeout=8)
        settings_problem = settings.problem(self.settings_path)
        if settings_problem:  # built-in defaults until the user fixes it; never written over
            self.notify(f"Settings not read: {settings_problem}", severity="warning", timeout=15)
        if self.store.recovered is not None:
            self.notify(f"The chat history was damaged. It was moved to {self.store.recovered} and a new "
                        "one was started.", severity="warning", timeout=15)
        conversations = self.store.conversations()
        await self.open_conversation(conversations[0].id if conversations else None)
        self.pane.prompt.focus()
        self.update_status()
        self.watch_history()
        self.load_model(self.model_name)

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one("#sidebar")
        sidebar.display = not sidebar.display

    def check_action(self, action: str, parameters) -> bool | None:
        if action in self._GATED and self.screen is not self.screen_stack[0]:
            return False  # a dialog is open: let it have its keys
        if action == "stop":
            return bool(self.generating)
        if action == "interrupt":
            return self.screen is self.screen_stack[0]
        return True

    # -- toggles, picker, help, copy --------------------------------------------------------------

    SPECULATION_CYCLE = {Speculate.AUTO: Speculate.ON, Speculate.ON: Speculate.OFF, Speculate.OFF: Speculate.AUTO}

    def action_toggle_speculation(self) -> None:
        """auto -> on -> off -> auto. Every mode emits the same tokens (greedy: token for token)."""
        self.speculate = self.SPECULATION_CYCLE[Speculate.of(self.speculate)]
        if self.speculate == "auto":
            note = "Speculation auto: the engine measures plain and EAGLE decoding and keeps the faster"
        elif self.speculate:
            note = "Speculation on: EAGLE-2 draft trees"
        else:
            note = ("Speculation off: plain decoding, one token per forward. The next reply measures "
                    "the baseline for the speedup figure.")
        self.notify(note, timeout=5)
        self.update_status()

    def action_toggle_drafts(self) -> None:
        self.pane.show_drafts(not self.pane.draft_colours)
        self.notify("Draft colours on: highlighted characters came from accepted drafts"
                    if self.pane.draft_colours else "Draft colours off", timeout=4)

    def action_toggle_thinking(self) -> None:
        """A reasoning model (its chat template reads `enable_thinking`) thinks first, or answers at once."""
        if self.engine is not None and not getattr(self.engine.info, "thinking_switch", False):
            self.notify(f"{self.model_name} has no thinking switch (its chat template does not read "
                        "enable_thinking)", severity="warning", timeout=5)
            return
        self.pane.thinking = not self.pane.thinking
        self.notify("Thinking on: the model reasons first (shown folded above the answer)" if self.pane.thinking
                    else "Thinking off: the model answers at once", timeout=4)
        self.update_status()

    def on_message_view_select_text(self, message: MessageView.SelectText) -> None:
        self.push_screen(SelectScreen(message.view.content, message.view.reasoning),
                         lambda _: self.pane.focus_prompt())

    def action_help(self) -> None:
        path = self.keys_path or keyconf.keys_file()
        self.push_screen(HelpScreen(keyconf.key_table(self.keymap), str(path)))

    def _last_reply(self) -> str | None:
        if self.conversation is None:
            return None
        replies = [m for m in self.store.messages(self.conversation.id) if m.role == "assistant"]
        return replies[-1].content if replies else None

    def action_copy_last_reply(self) -> None:
        text = self._last_reply()
        if text is None:
            self.notify("No reply to copy", severity="warning")
            return
        self.copy_to_clipboard(text)
        self.notify("Reply copied", timeout=3)

    def action_copy_last_code(self) -> None:
        blocks = code_blocks(self._last_reply() or "")
        if not blocks:
            self.notify("No code block in the last reply", severity="warning")
            return
        self.copy_to_clipboard(blocks[-1])
        self.notify("Code block copied", timeout=3)

    def get_system_commands(self, screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("New conversation", "Start a new conversation", self.action_new_conversation)
        yield SystemCommand("Rename conversation", "Rename the current conversation", self.action_rename)
        yield SystemCommand("Delete conversation", "Delete the current conversation", self.action_delete)
        yield SystemCommand("Conversation settings", "System prompt, temperature, top-p, max tokens",
                            self.action_settings)
        yield SystemCommand("Export to Markdown", "Write this conversation to a .md file in your documents",
                            self.action_export)
        yield SystemCommand("Search conversations", "Find a conversation by its title or messages", self.action_search)
        yield SystemCommand("Regenerate the last reply", "Write the last reply again", self.action_regenerate)
        yield SystemCommand("Edit the last message", "Take it back into the prompt and send it again",
                            self.action_edit_last)
        yield SystemCommand("Earlier version of the last turn", "What ctrl+r or f9 replaced (kept, not deleted)",
                            self.action_previous_version)
        yield SystemCommand("Later version of the last turn", "Forward again through the versions",
                            self.action_next_version)
        yield SystemCommand("Choose model", "Load another model", self.action_pick_model)
        yield SystemCommand("Toggle speculation", "auto, EAGLE-2 on, off (off measures the baseline)",
                            self.action_toggle_speculation)
        yield SystemCommand("Toggle draft colours", "Highlight tokens from accepted drafts",
                            self.action_toggle_drafts)
        yield SystemCommand("Copy last reply", "Copy the last reply to the clipboard", self.action_copy_last_reply)
        yield SystemCommand("Copy last code block", "Copy the last code block of the last reply",
                            self.action_copy_last_code)
        yield SystemCommand("Help", "Keys and what the status bar means", self.action_help)

    # -- status -----------------------------------------------------------------------------------

    def update_status(self) -> None:
        info = self.engine.info if self.engine is not None else None
        turn = self.pane.turn
        numbers = turn.numbers if turn is not None else self.numbers
        thinking = self.pane.thinking if getattr(info, "thinking_switch", False) else None
        parts = status_parts(info, numbers, self.baseline, self.speculate, self.pane.context_tokens, thinking)
        self.query_one(StatusBar).show(parts, live=self.generating)
        label = f"model: {self.model_name}" if info is not None else f"model: none ({self.model_name} not loaded)"
        self.query_one("#model-label", Label).update(label)

    # -- what the chat pane says ------------------------------------------------------------------

    def on_chat_pane_turn_started(self) -> None:
        self.refresh_bindings()  # esc stops the reply now
        self.update_status()

    def on_chat_pane_turn_progress(self) -> None:
        self.update_status()

    def on_chat_pane_turn_ended(self, message: ChatPane.TurnEnded) -> None:
        self.numbers = message.numbers
        if message.numbers is not None and message.stop_reason:
            self.turn_measured(message.numbers, message.stop_reason)
        self.refresh_bindings()
        self.update_status()

    async def on_chat_pane_conversations_changed(self) -> None:
        await self.refresh_sidebar()

    def turn_measured(self, numbers: TurnNumbers, stop_reason: str) -> None:
        """A finished turn's speed: a plain turn is the baseline, a speculative one is compared with it.
        A turn under speculation auto is neither: the engine measured both modes and kept the faster."""
        measured = numbers.measurable and stop_reason != "cancelled" and self.engine is not None
        if numbers.auto:
            return
        if measured and not numbers.speculate:
            self.baseline = numbers.compare_tps()
            try:
                self.store.set_baseline(self.model_name, self.baseline, self.engine.info.device)
            except StoreError:  # only a figure; the reply's own save says when the history fails
                pass
        elif measured:
            self._hint_if_speculation_is_slower(numbers)

    def _hint_if_speculation_is_slower(self, numbers: TurnNumbers) -> None:
        """The chat's own measurement says plain decoding is faster here: say so once per model, and
        offer the switch (the choice stays the user's: a different prompt can turn it around)."""
        ratio = speedup(numbers.compare_tps(), self.baseline)
        if ratio is None or ratio >= 1.0 or self._slow_hint_for == self.model_name:
            return
        self._slow_hint_for = self.model_name
        self.notify(f"Speculation ran at {ratio:.2f}× the plain-decoding speed measured here "
                    f"(τ {numbers.final_tau() or 0:.2f}): plain decoding is faster on this machine. "
                    "F5 switches speculation off.", severity="warning", timeout=12)
