"""The chat app driving the real default model (smollm2-135m-eagle2) end to end. Slow: loads torch
and the model on the CPU (tens of seconds on a busy machine)."""

from __future__ import annotations

import pytest
from fake_engine import make_tui_app, wait_until

from eaglechat.loader import load_engine
from eaglechat.tui.widgets import MessageView, PromptInput, StatusBar

MODEL = "smollm2-135m-eagle2"


@pytest.mark.slow
async def test_real_default_model_in_the_chat_app(tmp_path, default_base):
    def loader(model, progress=None, **options):
        return load_engine(model, progress=progress, speculate=True, max_context=1024)

    app = make_tui_app(tmp_path, loader=loader, model=MODEL)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.engine is not None
                         or any("Could not load" in n.message for n in app._notifications),
                         timeout=300, what="the real model to load")
        assert app.engine is not None, [n.message for n in app._notifications]
        texts = {}
        # plain decoding first (it measures the baseline), then EAGLE on the same prompt, greedy, then
        # auto (the engine's choice): the replies must be the same text; the status bar shows a measured
        # speedup after EAGLE and the engine's choice after auto
        statuses = {}
        for spec in (False, True, "auto"):
            app.speculate = spec
            conv = app.store.new_conversation(model=MODEL, max_new_tokens=16)
            await app.open_conversation(conv.id)
            app.query_one(PromptInput).focus()
            await pilot.press(*"Say hello.", "enter")
            await wait_until(pilot, lambda: not app.generating, timeout=300, what="the reply")
            await pilot.pause()
            reply = [v for v in app.query(MessageView) if v.role == "assistant"][-1]
            assert reply.content.strip()
            stored = app.store.messages(conv.id)[-1]
            assert stored.role == "assistant" and stored.content == reply.content
            assert 0 < stored.stats["new_tokens"] <= 16 and stored.stats["speculate"] is bool(spec)
            status = " · ".join(app.query_one(StatusBar).parts)
            assert "tok/s" in status and "τ" in status
            texts[spec], statuses[spec] = reply.content, status
            print(f"\nreal model (speculate={spec}): {reply.content!r}\nstatus: {status}")
        assert texts[True] == texts[False] == texts["auto"]  # lossless
        assert "speedup —" not in statuses[True] and "speedup" in statuses[True]
        assert "auto" in statuses["auto"]
