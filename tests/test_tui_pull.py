"""Pulling a catalog model from the chat's model picker, with progress, against the local fake Hub
(tests/hubserver.py through the real huggingface_hub client, as tests/test_hub.py does)."""

from __future__ import annotations

import threading

import pytest
from fake_engine import make_tui_app, wait_ready, wait_until
from test_hub import fake_hub, tiny_folders  # noqa: F401  (fixtures: the fake Hub and its tiny repos)

from eaglechat.errors import Interrupted
from eaglechat.models import hub
from eaglechat.models.catalog import resolve
from eaglechat.tui.screens import ConfirmScreen, LoadingScreen, ModelPickerScreen
from eaglechat.tui.sources import catalog_models, pull_model, pull_size


async def test_picking_a_model_that_is_not_pulled_pulls_it_with_progress_then_loads_it(fake_hub, tmp_path):  # noqa: F811
    assert not hub.is_pulled(resolve("tiny-a"))
    assert pull_size("tiny-a") == pytest.approx(0.002)
    assert dict(catalog_models())["tiny-a"].startswith("not pulled: enter pulls it (about 0.0 GB)")
    app = make_tui_app(tmp_path / "chat", models=catalog_models)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPickerScreen), what="the picker")
        await pilot.press(*"tiny-a", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        assert "Pull it from the Hugging Face Hub (about 0.0 GB)?" in app.screen.question

        await pilot.press("y")
        await wait_until(pilot, lambda: isinstance(app.screen, LoadingScreen) or app.model_name == "tiny-a",
                         what="the pull to start")
        await wait_until(pilot, lambda: app.model_name == "tiny-a" and app.engine is not None, timeout=60,
                         what="the pull and the load")
    assert hub.is_pulled(resolve("tiny-a"))
    assert any(p.startswith("pulling base") for p in app.pull_phases), app.pull_phases
    assert "success" in app.pull_phases
    assert app.fake_loader.loaded[-1] == "tiny-a"
    assert any("tiny-a pulled" in n.message for n in app._notifications)


def test_a_cancelled_pull_stops_and_says_nothing_was_pulled(fake_hub):  # noqa: F811
    cancel = threading.Event()
    seen = []

    def progress(phase, fraction):
        seen.append(phase)
        if phase.startswith("pulling"):
            cancel.set()  # the user pressed esc once bytes started to move

    with pytest.raises(Interrupted, match="again to resume"):
        pull_model("tiny-a", progress, cancel)
    assert not hub.is_pulled(resolve("tiny-a")) and any(p.startswith("pulling") for p in seen)
