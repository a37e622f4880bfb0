"""Models in the chat: loading one on a daemon thread with its phases on the loading screen, the model
picker, and pulling a catalog model from the Hub before loading it. A mixin of EagleChatApp.

Daemon threads, not Textual thread workers: those run on asyncio's default executor, which the event
loop joins at exit, so quitting during a load waited ~20 s for it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

from textual.message import Message

from eaglechat.chat import settings
from eaglechat.chat.store import Store
from eaglechat.engine.protocol import Engine, Speculate
from eaglechat.fit.exactness import exactness, is_token_exact
from eaglechat.fit.memory import format_for
from eaglechat.tui.generation import describe_error
from eaglechat.tui.pane import ChatPane
from eaglechat.tui.screens import ConfirmScreen, LoadingScreen, ModelPickerScreen
from eaglechat.tui.sources import is_remote, pull_model, pull_size
from eaglechat.tui.stats import TurnNumbers

if TYPE_CHECKING:
    from eaglechat.fit.choose import LoadRequest


class ModelActions:
    # what this mixin uses of EagleChatApp (set in its __init__, or its properties)
    store: Store
    pane: ChatPane
    engine: Engine | None
    model_name: str
    generating: bool
    speculate: Speculate
    numbers: TurnNumbers | None
    baseline: float | None
    settings_path: object
    remember_remote: bool
    loader: object
    load_request: LoadRequest
    api_key: str | None
    resident: bool
    models_fn: object
    badges_fn: object
    load_phases: list[str]
    pull_phases: list[str]
    _load_seq: int
    _load_thread: threading.Thread | None
    # the app's own methods, as annotations: a stub here would stand in front of them in the MRO
    update_status: Callable[[], None]
    action_focus_prompt: Callable[[], None]

    class Progress(Message):
        def __init__(self, phase: str, fraction: float | None) -> None:
            super().__init__()
            self.phase, self.fraction = phase, fraction

    class Loaded(Message):
        def __init__(self, model: str, engine: Engine, seq: int = 0) -> None:
            super().__init__()
            self.model, self.engine, self.seq = model, engine, seq

    class LoadFailed(Message):
        def __init__(self, model: str, error: str, seq: int = 0) -> None:
            super().__init__()
            self.model, self.error, self.seq = model, error, seq

    # -- model loading ----------------------------------------------------------------------------

    def load_model(self, model: str) -> None:
        if self.generating:
            self.notify("Stop the reply first (esc)", severity="warning")
            return
        self.pane.loading = model
        self.load_phases = []
        self.push_screen(LoadingScreen(model))
        self._load(model)

    def _load(self, model: str) -> None:
        """Load on a daemon thread (not a Textual worker, which the loop joins at exit: quitting during
        a load waited ~20 s for it); a superseded load's result is dropped."""
        self._load_seq += 1
        seq = self._load_seq

        def post(message: Message) -> None:
            try:
                self.post_message(message)
            except RuntimeError:  # the app has closed its loop: nobody is listening any more
                pass

        def load() -> None:
            def progress(phase: str, fraction: float | None = None) -> None:
                post(self.Progress(phase, fraction))

            try:
                engine = self.loader(model, request=self.load_request, progress=progress, api_key=self.api_key,
                                     resident=self.resident)
            except BaseException as exc:  # noqa: BLE001 - shown as a notification
                post(self.LoadFailed(model, describe_error(exc), seq))
                return
            post(self.Loaded(model, engine, seq))

        self._load_thread = threading.Thread(target=load, name="eaglechat-load", daemon=True)
        self._load_thread.start()

    def _close_loading(self) -> None:
        self.pane.loading = None
        if isinstance(self.screen, LoadingScreen):
            self.pop_screen()

    def on_model_actions_progress(self, message: Progress) -> None:
        if not self.load_phases or self.load_phases[-1] != message.phase:
            self.load_phases.append(message.phase)
        for screen in self.screen_stack:
            if isinstance(screen, LoadingScreen):
                screen.progress(message.phase, message.fraction)

    def on_model_actions_loaded(self, message: Loaded) -> None:
        if message.seq != self._load_seq:
            return
        self._close_loading()
        self.pane.engine_ready(message.engine, message.model)  # a message typed while it loaded is sent
        self.numbers = None
        self.baseline = self.store.baseline(self.model_name, self.engine.info.device)
        if self.remember_remote or not is_remote(self.model_name):  # `chat --remote URL` is for one run
            try:
                settings.remember_model(self.model_name, self.settings_path)
            except OSError as exc:
                self.notify(f"Could not save settings: {exc}", severity="warning")
        self.sub_title = self.model_name
        self.update_status()
        self.notify(f"{self.model_name} ready on {self.engine.info.device}", timeout=3)
        fmt = format_for(self.engine.info.quant, self.engine.info.dtype)
        if self.engine.info.head and not self.engine.info.server and not is_token_exact(fmt):
            self.notify(f"{fmt}: {exactness(fmt)}", timeout=10)  # where EAGLE is not token for token
        if self.speculate is Speculate.OFF and self.engine.info.head:  # pinned: a profile's `speculate: false`
            self.notify("Speculation is off: the profile sets speculate: false. F5 switches it to auto "
                        "(the engine measures plain and EAGLE decoding and keeps the faster), then on.", timeout=8)
        if getattr(self.engine.info, "tuned_under_load", ""):  # that measurement may not hold on an idle machine
            self.notify(f"The tuned settings were measured on a busy machine ({self.engine.info.tuned_under_load}); "
                        "rerun `eaglechat tune` when it is idle.", severity="warning", timeout=10)

    def on_model_actions_load_failed(self, message: LoadFailed) -> None:
        if message.seq != self._load_seq:
            return
        self._close_loading()
        self.pane.send_when_loaded = False  # what was typed stays in the prompt
        keep = f" Still using {self.model_name}." if self.engine is not None else " Pick another model with ctrl+o."
        self.notify(f"Could not load {message.model}: {message.error}{keep}", severity="error", timeout=15)
        self.update_status()

    def action_pick_model(self) -> None:
        def done(name: str | None) -> None:
            if not name or (name == self.model_name and self.engine is not None):
                return
            size = pull_size(name)
            if size is None:
                self.load_model(name)
                return

            def confirmed(yes: bool | None) -> None:
                if yes:
                    self.pull_then_load(name)
                else:
                    self.action_focus_prompt()

            self.push_screen(ConfirmScreen(f"{name} is not on this machine yet. Pull it from the Hugging Face "
                                           f"Hub (about {size:.1f} GB)?", yes="Pull", variant="primary"), confirmed)

        self.push_screen(ModelPickerScreen(self.models_fn(), self.model_name, self.badges_fn), done)

    def pull_then_load(self, model: str) -> None:
        """The pull runs on a daemon thread with its progress on the loading screen; esc cancels it."""
        if self.generating:
            self.notify("Stop the reply first (esc)", severity="warning")
            return
        cancel = threading.Event()
        self.pane.loading = model
        self.load_phases = []
        self.push_screen(LoadingScreen(model, verb="Pulling", cancel=cancel))

        def post(message: Message) -> None:
            try:
                self.post_message(message)
            except RuntimeError:  # the app has closed
                pass

        def pull() -> None:
            try:
                pull_model(model, lambda phase, fraction=None: post(self.Progress(phase, fraction)), cancel)
            except BaseException as exc:  # noqa: BLE001 - shown as a notification
                why = ("Pull cancelled; pulling again resumes where it stopped." if cancel.is_set()
                       else f"Could not pull {model}: {describe_error(exc)}")
                post(self.Pulled(model, why))
                return
            post(self.Pulled(model, None))

        self._load_thread = threading.Thread(target=pull, name="eaglechat-pull", daemon=True)
        self._load_thread.start()

    class Pulled(Message):
        def __init__(self, model: str, error: str | None) -> None:
            super().__init__()
            self.model, self.error = model, error

    def on_model_actions_pulled(self, message: Pulled) -> None:
        self.pull_phases = list(self.load_phases)
        self._close_loading()
        if message.error:
            self.pane.send_when_loaded = False  # what was typed stays in the prompt
            self.notify(message.error, severity="warning" if "cancelled" in message.error else "error", timeout=12)
            self.update_status()
            return
        self.notify(f"{message.model} pulled", timeout=3)
        self.load_model(message.model)

