"""A chat process for tests/test_tui_process.py: the real app and exit path (commands/chat.run_app) on
the fake engine, in a pseudo-terminal. argv: HOME_DIR. The engine streams two steps, writes
HOME_DIR/stuck, then blocks inside a "step" that ignores cancel (like a long prefill chunk)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine, FakeLoader  # noqa: E402

from eaglechat.chat.store import Store  # noqa: E402
from eaglechat.commands.chat import run_app  # noqa: E402
from eaglechat.tui.app import EagleChatApp  # noqa: E402


class StuckEngine(FakeEngine):
    """Streams a few steps, then blocks inside a "step" that never checks cancel."""

    def generate(self, messages, params, cancel=None):
        for n, event in enumerate(super().generate(messages, params, cancel)):
            yield event
            if n == 4:
                (Path(sys.argv[1]) / "stuck").write_text("stuck")
                threading.Event().wait(60)


def main() -> int:
    home = Path(sys.argv[1])
    engine = StuckEngine(["alpha beta gamma delta epsilon zeta eta theta iota kappa"], tokens_per_step=2)
    store = Store(home / "history.sqlite3")
    app = EagleChatApp(store=store, model="fake-eagle", loader=FakeLoader(engine),
                       settings_path=home / "settings.yaml", keys_path=home / "keys.yaml", export_dir=home,
                       models=lambda: [("fake-eagle", "")], badges=lambda names: {})
    return run_app(app, store)


if __name__ == "__main__":
    sys.exit(main())
