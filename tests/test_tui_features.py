"""What people use every day in peer chat apps (regenerate and edit: tests/test_tui_keep.py): search, timestamps, a
settings dialog that saves on enter, a model picker driven from the filter box, a status bar that
fits 80 columns."""

from __future__ import annotations

import time

from fake_engine import FIXED_TIME, FakeEngine, make_tui_app, type_and_send, wait_ready, wait_reply, wait_until

from eaglechat.tui.screens import ModelPickerScreen, SearchScreen, SettingsScreen
from eaglechat.tui.widgets import MessageView, PromptInput, StatusBar, fit_parts

SIZE = (80, 24)


async def send(pilot, text: str) -> None:
    """Type and send, then wait for the reply that this message started."""
    app = pilot.app
    calls = len(app.fake_loader.engine.calls)
    await type_and_send(pilot, text)
    await wait_until(pilot, lambda: len(app.fake_loader.engine.calls) > calls, what="the message to be sent")
    await wait_reply(pilot)


def roles_and_texts(app) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in app.store.messages(app.conversation.id)]


async def test_search_finds_a_conversation_by_its_messages_and_opens_it(tmp_path):
    engine = FakeEngine(lambda messages: f"reply about {messages[-1]['content']}")
    app = make_tui_app(tmp_path, engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "bread recipes")
        await pilot.press("ctrl+n")
        await send(pilot, "rust lifetimes")
        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: isinstance(app.screen, SearchScreen), what="the search")
        await pilot.press(*"reply about bread", "enter")
        await wait_until(pilot, lambda: app.conversation.title == "bread recipes", what="the switch")
        await pilot.pause()
        assert app.focused is app.query_one(PromptInput)


async def test_messages_show_when_they_were_written(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi")
        stamp = time.strftime("%H:%M", time.localtime(FIXED_TIME))
        labels = [str(v.query_one(".role").render()) for v in app.query(MessageView)]
        assert labels == [f"You · {stamp}", f"Assistant · {stamp}"]


async def test_enter_saves_the_settings_and_the_dialog_shows_its_keys(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen), what="settings")
        dialog = app.screen
        save = dialog.query_one("#save")
        assert save.region.bottom <= 24 and save.region.height > 0  # visible at 80x24
        footer_keys = {b.binding.description for b in dialog.active_bindings.values() if b.binding.show}
        assert {"Cancel", "Save"} <= footer_keys and "Send" not in footer_keys
        dialog.query_one("#temperature").focus()
        await pilot.press("end", "ctrl+u", *"0.5", "enter")  # ctrl+u clears the field
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
        assert app.conversation.temperature == 0.5
        assert app.focused is app.query_one(PromptInput)


async def test_arrow_keys_in_the_picker_filter_move_the_selection(tmp_path):
    app = make_tui_app(tmp_path, models=lambda: [("fake-eagle", "a"), ("other-model", "b"), ("third-model", "c")])
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPickerScreen), what="picker")
        assert app.focused.id == "picker-filter"
        await pilot.press("down", "down", "enter")
        await wait_until(pilot, lambda: app.model_name == "third-model", what="the third model")


def test_status_fields_fit_the_width_most_important_first():
    parts = ["42.0 tok/s", "τ 3.00", "accept 50%", "speedup —", "ctx 51/2048", "spec on", "tree 16/4/4",
             "cpu", "300 MiB", "fp32, no quant"]
    assert fit_parts(parts, 200) == " · ".join(parts)
    narrow = fit_parts(parts, 78)
    assert len(narrow) <= 78 and narrow.startswith("42.0 tok/s · τ 3.00") and "ctx 51/2048" in narrow


async def test_status_bar_is_not_cut_at_80_columns(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["a b c d e f g h i j k l m n o p q r"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "go")
        bar = app.query_one(StatusBar)
        shown = str(bar.render())
        assert "tok/s" in shown and "ctx" in shown
        assert len(shown) <= bar.content_size.width


async def test_settings_fields_in_tab_order_from_the_system_prompt(tmp_path):
    app = make_tui_app(tmp_path, FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen), what="settings")
        await pilot.pause()
        order = [app.focused.id]
        for _ in range(3):
            await pilot.press("tab")
            order.append(app.focused.id)
        assert order == ["system-prompt", "temperature", "top-p", "max-new-tokens"]
