"""A chat process for tests/test_tui_process.py: the real app and exit path (commands/chat.run_app) on
the fake engine, in a pseudo-terminal. argv: HOME_DIR [NAME].

Without NAME the engine streams two steps, writes HOME_DIR/stuck, then blocks inside a "step" that
ignores cancel (like a long prefill chunk). With NAME (two windows on one history) the engine pauses
after two steps of its first reply until HOME_DIR/NAME.go exists, and the app reports what its sidebar
shows and what it told the user in HOME_DIR/NAME.json."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine, FakeLoader

from eaglechat.chat.store import Store
from eaglechat.commands.chat import run_app
from eaglechat.tui.app import EagleChatApp
from eaglechat.tui.widgets import ConversationItem


class StuckEngine(FakeEngine):
    """Streams a few steps, then blocks inside a "step" that never checks cancel."""

    def generate(self, messages, params, cancel=None):
        for n, event in enumerate(super().generate(messages, params, cancel)):
            yield event
            if n == 4:
                (Path(sys.argv[1]) / "stuck").write_text("stuck")
                threading.Event().wait(60)


class GatedEngine(FakeEngine):
    """The first reply waits after a few events until the test creates the gate file."""

    def __init__(self, gate: Path, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = gate

    def generate(self, messages, params, cancel=None):
        first = len(self.calls) == 0
        for n, event in enumerate(super().generate(messages, params, cancel)):
            yield event
            if first and n == 3:
                self.gate.with_suffix(".paused").write_text("paused")
                while not self.gate.exists():
                    time.sleep(0.02)


class ReportingApp(EagleChatApp):
    """The real app, telling the test what its sidebar shows and what it said."""

    CSS_PATH = Path(sys.modules[EagleChatApp.__module__].__file__).with_name("app.tcss")  # not next to this file

    report: Path | None = None
    said: list[str] = []

    def on_mount(self) -> None:  # Textual runs EagleChatApp.on_mount as well (each class's handler)
        if self.report is not None:
            self.set_interval(0.2, self._report)  # the screen on top, for the test to wait on

    async def refresh_sidebar(self) -> None:
        await super().refresh_sidebar()
        self._report()

    def update_status(self) -> None:  # called at every turn's end
        super().update_status()
        self._report()

    def notify(self, message: str, **kwargs) -> None:
        super().notify(message, **kwargs)
        self.said = [*self.said, message]
        self._report()

    def _report(self) -> None:
        if self.report is None:
            return
        data = {"titles": [item.conversation.title for item in self.query(ConversationItem)],
                "said": self.said, "generating": self.generating, "screen": type(self.screen).__name__}
        tmp = self.report.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.report)


def main() -> int:
    home = Path(sys.argv[1])
    name = sys.argv[2] if len(sys.argv) > 2 else None
    if name is None:
        engine = StuckEngine(["alpha beta gamma delta epsilon zeta eta theta iota kappa"], tokens_per_step=2)
    else:
        engine = GatedEngine(home / f"{name}.go", ["alpha beta gamma delta epsilon zeta eta theta"],
                             tokens_per_step=2)
    store = Store(home / "history.sqlite3")
    app = ReportingApp(store=store, model="fake-eagle", loader=FakeLoader(engine),
                       settings_path=home / "settings.yaml", keys_path=home / "keys.yaml", export_dir=home,
                       models=lambda: [("fake-eagle", "")], badges=lambda names: {})
    if name is not None:
        app.report = home / f"{name}.json"
    return run_app(app, store)


if __name__ == "__main__":
    sys.exit(main())
