"""The help screen and the prompt's placeholder say the keys the chat screen really has: every key in
the help is a binding (with that id and those keys) and every binding of the chat screen is in the help."""

from __future__ import annotations

from fake_engine import make_tui_app, wait_ready
from textual.widgets import Markdown

from eaglechat.tui import keys
from eaglechat.tui.app import EagleChatApp
from eaglechat.tui.screens import HelpScreen
from eaglechat.tui.widgets import MessageView, PromptInput


def chat_screen_bindings() -> dict[str, str]:
    """id -> keys of every binding the chat screen's widgets declare."""
    out = {}
    for cls in (EagleChatApp, PromptInput, MessageView):
        for binding in cls.BINDINGS:
            assert binding.id, f"{cls.__name__}: {binding.key} -> {binding.action} has no id (keys.yaml cannot move it)"
            out[binding.id] = binding.key
    return out


def test_every_key_in_the_help_is_a_binding_with_those_keys_and_every_binding_is_in_the_help():
    bindings = chat_screen_bindings()
    assert set(keys.KEYS) == set(bindings), (sorted(set(keys.KEYS) - set(bindings)),
                                             sorted(set(bindings) - set(keys.KEYS)))
    wrong = {key_id: (default, bindings[key_id]) for key_id, (default, _) in keys.KEYS.items()
             if default != bindings[key_id]}
    assert not wrong


def test_the_placeholder_names_the_keys_that_send_add_a_line_and_open_the_help():
    bindings = chat_screen_bindings()
    text = keys.placeholder({})
    for key_id in ("send", "newline", "help"):
        assert any(f"{key}:" in text for key in bindings[key_id].split(",")), (key_id, text)
    moved = keys.placeholder({"send": "ctrl+s", "help": "f10"})
    assert "ctrl+s: send" in moved and "f10: help" in moved


async def test_the_help_screen_lists_every_key(tmp_path):
    app = make_tui_app(tmp_path)
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        shown = app.screen.query_one(Markdown).source
        for key_id, (default, text) in keys.KEYS.items():
            assert f"| `{default}` | {text} |" in shown, key_id
