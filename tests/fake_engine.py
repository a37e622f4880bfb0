"""A scripted engine implementing eaglechat.engine.protocol, for the TUI tests (no model, no torch).

Text is split into word tokens, followed by a stop token the "model" produces at the end. As the
real engine does, the first token comes from the prefill (a delta without step stats); then with
speculation each verify step produces `tokens_per_step` tokens (all but the last from accepted drafts,
the last the bonus token), without it one token per step; speculate="auto" decodes as speculation on and
reports the engine's choice as `auto_label` ("auto: on 1.5x"). tests/test_engine_contract.py holds this fake
and the real LocalEngine to the same assertions. The reported tokens/s are fixed numbers, so
status-bar assertions and snapshots are deterministic.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Callable

from eaglechat.engine.context import fit_conversation, reply_reserve
from eaglechat.engine.protocol import (
    EngineInfo,
    Finished,
    GenerationParams,
    GenerationStats,
    PrefillProgress,
    StepStats,
    TextDelta,
    TreeBudget,
)
from eaglechat.units import MiB

FIXED_TIME = 1_790_000_000.0  # what the test apps' clock says


def tokenize(text: str) -> list[str]:
    return re.findall(r"\s*\S+|\s+$", text)


class FakeEngine:
    def __init__(self, replies: list[str] | Callable[[list[dict]], str] | None = None, *,
                 tokens_per_step: int = 3, step_delay: float = 0.0, spec_tps: float = 42.0,
                 plain_tps: float = 14.0, spec_decode_tps: float = 50.0, plain_decode_tps: float = 20.0, pause_after_steps: int | None = None,
                 error: BaseException | None = None, error_after_steps: int = 0,
                 model: str = "fake-eagle", max_context: int = 2048, pause_in_prefill: bool = False,
                 auto_label: str = "auto: on 1.5x") -> None:
        self.replies = replies if replies is not None else ["Hello! I am a **fake** engine."]
        self.tokens_per_step = tokens_per_step
        self.step_delay = step_delay
        self.spec_tps = spec_tps
        self.plain_tps = plain_tps
        self.spec_decode_tps = spec_decode_tps
        self.plain_decode_tps = plain_decode_tps
        self.pause_after_steps = pause_after_steps  # then wait for cancel (up to 10 s)
        self.pause_in_prefill = pause_in_prefill  # wait (for resume or cancel) while "reading the prompt"
        self.paused = threading.Event()
        self.resume = threading.Event()  # set it to continue after pause_after_steps (cancel does too)
        self.error = error
        self.error_after_steps = error_after_steps
        self.auto_label = auto_label  # what speculate="auto" says it chose (GenerationStats.speculation)
        self.calls: list[tuple[list[dict], GenerationParams]] = []
        self.info = EngineInfo(model=model, device="cpu", dtype="float32", quant="none",
                               tree=TreeBudget(total_tokens=16, depth=4, draft_top_k=4),
                               max_context=max_context, memory_bytes=300 * MiB)

    def encode(self, messages: list[dict]) -> list[int]:
        """A stand-in chat template: one token per word, two per message for the markers."""
        return [0] * sum(len(m["content"].split()) + 2 for m in messages)

    def count_tokens(self, messages: list[dict]) -> int:
        return len(self.encode(messages))

    can_fill_in_middle = False

    def complete(self, prompt: str, params: GenerationParams, cancel: threading.Event | None = None,
                 suffix: str | None = None):
        """Raw text continuation (the server's /v1/completions): the prompt is the one user message."""
        return self.generate([{"role": "user", "content": prompt}], params, cancel)

    def _reply(self, messages: list[dict]) -> str:
        if callable(self.replies):
            return self.replies(messages)
        return self.replies[(len(self.calls) - 1) % len(self.replies)]

    def generate(self, messages, params: GenerationParams, cancel: threading.Event | None = None):
        self.calls.append(([dict(m) for m in messages], params))
        words = tokenize(self._reply(messages))
        produced = [*words, None]  # None: the stop token the model produces after the reply
        speculate = bool(params.speculate)  # "auto": as the real engine, the head drafts (here: every step)
        label = self.auto_label if params.speculate == "auto" else ""
        per_step = self.tokens_per_step if speculate else 1
        start = time.perf_counter()
        pos = new = steps = decode_tokens = 0
        stop = ""

        def take(n: int) -> tuple[list[str], int, int]:
            """The next n produced tokens, cut at the stop token or max_new_tokens:
            (shown, counted for tau, produced by the step)."""
            nonlocal pos, stop
            chunk = produced[pos:pos + n]
            pos += len(chunk)
            shown: list[str] = []
            for tok in chunk:
                if tok is None:
                    stop = "stop"
                    break
                shown.append(tok)
                if new + len(shown) >= params.max_new_tokens:
                    stop = "length"
                    break
            return shown, len(shown) + (stop == "stop"), len(chunk)

        def ids(shown: list[str]) -> list[int]:
            return list(range(new, new + len(shown)))

        prompt, dropped = fit_conversation(messages, self.encode, self.info.max_context,
                                           reply_reserve(self.info.max_context, params.max_new_tokens))
        yield PrefillProgress(0, len(prompt), len(prompt), dropped)
        if self.pause_in_prefill:
            self.paused.set()
            while not self.resume.is_set() and not (cancel is not None and cancel.is_set()):
                time.sleep(0.005)
            if cancel is not None and cancel.is_set():
                stats = GenerationStats(speculate=speculate, prompt_tokens=len(prompt),
                                        dropped_messages=dropped)
                yield Finished("", [], stats, "cancelled")
                return
        yield PrefillProgress(len(prompt), len(prompt), len(prompt), dropped)
        first, _, _ = take(1)  # from the prefill
        if first:
            yield TextDelta(first[0], ids(first), [False], None, first)
            new += 1
        while not stop:
            if cancel is not None and cancel.is_set():
                stop = "cancelled"
                break
            if self.error is not None and steps >= self.error_after_steps:
                raise self.error
            shown, made, step_len = take(per_step)
            steps += 1
            decode_tokens += made
            drafted = ([True] * (per_step - 1) + [False])[:len(shown)]
            yield TextDelta("".join(shown), ids(shown), drafted,
                            StepStats(accepted=step_len - 1,
                                      tree_size=17 if speculate else 1, step_s=self.step_delay,
                                      decode_tokens=made), shown)
            new += len(shown)
            if self.pause_after_steps is not None and steps == self.pause_after_steps:
                self.paused.set()
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not self.resume.is_set():
                    if cancel is not None and cancel.is_set():
                        break
                    time.sleep(0.005)
            elif self.step_delay:
                time.sleep(self.step_delay)
        stats = GenerationStats(
            new_tokens=new, target_forwards=steps, decode_tokens=decode_tokens,
            mean_accepted=decode_tokens / steps if steps else 0.0,
            tokens_per_s=self.spec_tps if speculate else self.plain_tps,
            decode_tokens_per_s=self.spec_decode_tps if speculate else self.plain_decode_tps,
            elapsed_s=time.perf_counter() - start, speculate=speculate, prefill_tokens=len(prompt),
            prompt_tokens=len(prompt), dropped_messages=dropped, tree=TreeBudget(16, 4, 4).to_dict() if speculate else {},
            speculation=label,
        )
        yield Finished("".join(words[:new]), list(range(new)), stats, stop)


class FakeLoader:
    """loader(model, progress=...) -> engine, reporting phases; can fail or block until released."""

    def __init__(self, engine: FakeEngine | None = None, *, fail: BaseException | None = None,
                 block: bool = False) -> None:
        self.engine = engine or FakeEngine()
        self.fail = fail
        self.release = threading.Event()
        if not block:
            self.release.set()
        self.loaded: list[str] = []

    def __call__(self, model: str, progress=None, **options):
        self.loaded.append(model)
        for i, phase in enumerate(["tokenizer", "base model", "draft head", "warm-up"]):
            if progress:
                progress(f"loading {phase}", i / 4)
            if i == 1:
                self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        self.engine.info.model = model
        return self.engine


# -- helpers shared by the TUI tests -------------------------------------------------------------

def make_tui_app(home, engine: FakeEngine | None = None, *, loader: FakeLoader | None = None, **kwargs):
    """The real app on a store and config under `home`, with the fake engine behind it."""
    from eaglechat.chat.store import Store
    from eaglechat.tui.app import EagleChatApp

    home.mkdir(parents=True, exist_ok=True)
    store = kwargs.pop("store", None) or Store(home / "history.sqlite3")
    loader = loader or FakeLoader(engine)
    kwargs.setdefault("models", lambda: [("fake-eagle", "the fake engine"), ("other-model", "another one")])
    kwargs.setdefault("badges", lambda names: {"fake-eagle": "fits", "other-model": "wont_fit"})
    kwargs.setdefault("clock", lambda: FIXED_TIME)  # timestamps in footers: snapshots stay the same
    app = EagleChatApp(store=store, loader=loader, model=kwargs.pop("model", "fake-eagle"),
                       settings_path=home / "settings.yaml", keys_path=home / "keys.yaml", **kwargs)
    app.fake_loader = loader
    return app


async def wait_until(pilot, predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll instead of a single pause(): background workers finish on their own schedule."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)


async def wait_ready(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.engine is not None, what="the engine to load")
    await pilot.pause()


async def wait_reply(pilot) -> None:
    await wait_until(pilot, lambda: not pilot.app.generating, what="the reply to finish")
    await pilot.pause()


def status_text(app) -> str:
    """The status bar as the user reads it."""
    from eaglechat.tui.widgets import StatusBar

    return " · ".join(app.query_one(StatusBar).parts)


def replies(app) -> list:
    """The assistant's message views, oldest first."""
    from eaglechat.tui.widgets import MessageView

    return [v for v in app.query(MessageView) if v.role == "assistant"]


async def type_and_send(pilot, text: str) -> None:
    """Focus the prompt, type `text` key by key, press enter."""
    from eaglechat.tui.widgets import PromptInput

    pilot.app.query_one(PromptInput).focus()
    await pilot.press(*text)
    await pilot.press("enter")

