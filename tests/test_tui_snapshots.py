"""A few SVG snapshots of the chat app (pytest-textual-snapshot). Update with
`pytest tests/test_tui_snapshots.py --snapshot-update` after looking at the report."""

from __future__ import annotations

import os
import time

import pytest
import pytest_textual_snapshot  # noqa: F401  (the snap_compare fixture: a missing plugin fails, not skips)
from fake_engine import FakeEngine, make_tui_app, wait_ready, wait_reply, wait_until

from eaglechat.tui.screens import (
    HelpScreen,
    ModelPickerScreen,
    SearchScreen,
    SettingsScreen,
)
from eaglechat.tui.widgets import PromptInput

os.environ["TZ"] = "UTC"  # footers show the fixed test clock's time: the same everywhere
time.tzset()

SIZE = (110, 34)
REPLY = """Here is a small function:

```python
def greet(name: str) -> str:
    return f"Hello, {name}!"
```

It returns a **greeting**; call it with `greet("eagle")`.
"""


async def _chat(pilot) -> None:
    app = pilot.app
    await wait_ready(pilot)
    prompt = app.query_one(PromptInput)
    prompt.cursor_blink = False
    prompt.focus()
    await pilot.press(*"write a greeting function", "enter")
    await wait_reply(pilot)
    app.clear_notifications()
    await pilot.pause()


def _app(tmp_path):
    return make_tui_app(tmp_path, FakeEngine([REPLY], tokens_per_step=4))


# the smallest terminal people use, and a wide one
SIZES = {"80x24": (80, 24), "140x40": (140, 40)}


async def _quiet(pilot) -> None:
    for widget in pilot.app.screen.query("Input, TextArea"):
        widget.cursor_blink = False
    pilot.app.clear_notifications()
    await pilot.pause()


# what each dialog looks like once it is fully up: its screen, the widget it focuses first
DIALOGS = {"f1": (HelpScreen, "help-box"), "f3": (SettingsScreen, "system-prompt"),
           "ctrl+o": (ModelPickerScreen, "picker-filter"), "ctrl+f": (SearchScreen, "search-text")}


async def _settled(pilot, screen_type, focus_id: str) -> None:
    """Wait for the state the snapshot pictures, not for a time: the dialog on top, its first field
    focused, its footer keys composed and the model badges in (a loaded machine took longer than one
    pause for each of them, and the snapshot missed a colour)."""
    app = pilot.app

    def ready() -> bool:
        screen = app.screen
        if not isinstance(screen, screen_type) or app.focused is None or app.focused.id != focus_id:
            return False
        if isinstance(screen, ModelPickerScreen) and not screen.badges:
            return False
        return bool(screen.query("FooterKey"))

    await wait_until(pilot, ready, what=f"the {screen_type.__name__} to be up")
    await _quiet(pilot)
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_chat_with_code_and_status(snap_compare, tmp_path, size):
    assert snap_compare(_app(tmp_path), terminal_size=SIZES[size], run_before=_chat)


def test_snapshot_draft_colours(snap_compare, tmp_path):
    async def run_before(pilot):
        await _chat(pilot)
        await pilot.press("f6")
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(_app(tmp_path), terminal_size=SIZE, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("key", ["f1", "f3", "ctrl+o", "ctrl+f"])
def test_snapshot_dialogs(snap_compare, tmp_path, size, key):
    """Help, settings, model picker and search: nothing clipped, their own keys in the footer."""

    async def run_before(pilot):
        await _chat(pilot)
        await pilot.press(key)
        await _settled(pilot, *DIALOGS[key])

    assert snap_compare(_app(tmp_path), terminal_size=SIZES[size], run_before=run_before)
